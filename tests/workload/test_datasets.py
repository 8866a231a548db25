from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.errors import UsageError
from autotune.workload.datasets import generate_tasks, read_rows, score_completion, write_prompts


def test_write_prompts_trl_rows_are_conversational(tmp_path: Path) -> None:
    path = write_prompts(tmp_path / "sub" / "p.jsonl", 20, seed=3, style="prompt")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 20
    for row in rows:
        assert set(row) == {"prompt", "solution"}
        assert row["prompt"][0]["role"] == "user"
        assert row["prompt"][0]["content"]
        assert row["solution"]


def test_write_prompts_swift_uses_messages_and_same_content(tmp_path: Path) -> None:
    trl = read_rows(write_prompts(tmp_path / "a.jsonl", 8, seed=1, style="prompt"))
    swift = read_rows(write_prompts(tmp_path / "b.jsonl", 8, seed=1, style="messages"))
    assert [r["messages"] for r in swift] == [r["prompt"] for r in trl]
    assert [r["solution"] for r in swift] == [r["solution"] for r in trl]


def test_same_seed_same_file_other_seed_other_file(tmp_path: Path) -> None:
    a = write_prompts(tmp_path / "a.jsonl", 30, seed=7).read_bytes()
    b = write_prompts(tmp_path / "b.jsonl", 30, seed=7).read_bytes()
    c = write_prompts(tmp_path / "c.jsonl", 30, seed=8).read_bytes()
    assert a == b
    assert a != c
    assert not list(tmp_path.glob(".*.tmp"))


def test_solutions_are_correct() -> None:
    for task in generate_tasks(200, seed=0):
        q = task.question
        if q.startswith("What is") and "+" in q:
            a, b = q.removeprefix("What is ").split("?")[0].split(" + ")
            assert task.solution == str(int(a) + int(b))
        elif q.startswith("How many letters"):
            word = q.split("'")[1]
            assert task.solution == str(len(word))


def test_bad_inputs_raise_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError):
        write_prompts(tmp_path / "x.jsonl", 0)
    with pytest.raises(UsageError):
        write_prompts(tmp_path / "x.jsonl", 3, style="verl")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="cannot read"):
        read_rows(tmp_path / "missing.jsonl")
    (tmp_path / "bad.jsonl").write_text('{"a": 1}\nnot json\n')
    with pytest.raises(UsageError, match="line 2"):
        read_rows(tmp_path / "bad.jsonl")


def test_read_rows_accepts_json_list(tmp_path: Path) -> None:
    (tmp_path / "d.json").write_text('[{"prompt": "hi"}, {"prompt": "yo"}]')
    assert read_rows(tmp_path / "d.json") == [{"prompt": "hi"}, {"prompt": "yo"}]


def test_score_completion_rewards_answer_and_digits() -> None:
    assert score_completion("The answer is 12", "12") > 1.0
    assert score_completion("abc", "12") == 0.0
    assert score_completion("", "1") == 0.0
    assert score_completion("1a", None) == pytest.approx(0.5)
    # varies between completions, so a group's reward_std is not zero
    assert len({score_completion(t, "99") for t in ("a1", "a12", "xyz", "7")}) == 4
