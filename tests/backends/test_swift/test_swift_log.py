from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from autotune.backends._loglines import parse_dict_literal
from autotune.backends.swift._log import SwiftLogParser, is_step_record, record_values
from autotune.records import StepMetrics

DATA = Path(__file__).parents[1] / "data"
V46 = DATA / "swift_v4.6_cpu_1proc.events.jsonl"
V46_2PROC = DATA / "swift_v4.6_cpu_2proc.events.jsonl"
V3 = DATA / "swift_v3.12.4_cpu_1proc.events.jsonl"


def replay(path: Path, trial_dir: Path, *, use_file: bool = True, samples: int = 8) -> list[StepMetrics]:
    """Feed a recording to a parser the way the runner does: every segment, then a poll."""
    events = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    parser = SwiftLogParser(
        jsonl_path=trial_dir / "output" / "logging.jsonl" if use_file else None, samples=samples
    )
    steps: list[StepMetrics] = []
    for ev in events:
        t = float(ev.get("t", 0.0))
        text = str(ev.get("text", "")).replace("{trial_dir}", str(trial_dir))
        if "file" in ev:
            if use_file:
                target = trial_dir / ev["file"]
                target.parent.mkdir(parents=True, exist_ok=True)
                with target.open("a") as fh:
                    fh.write(text + "\n")
        elif "stream" in ev:
            if not use_file and "The logging file will be saved in" in text:
                continue  # stdout only: never learn the file's path
            for segment in text.split("\r"):
                steps += parser.feed(ev["stream"], segment, t, 1e9 + t)
        steps += parser.poll(t, 1e9 + t)
    steps += parser.finish(1e6, 1e9 + 1e6)
    return steps


def test_real_v46_run_parses_every_step(tmp_path: Path) -> None:
    steps = replay(V46, tmp_path)
    assert [s.step for s in steps] == list(range(1, 9))
    first = steps[0]
    assert first.samples == 8 and first.tokens == pytest.approx(16.0 * 8)
    for key in (
        "loss",
        "grad_norm",
        "kl",
        "reward",
        "reward_std",
        "completions/clipped_ratio",
        "step_time",
        "elapsed_s",
    ):
        assert key in first.values, key
    assert "memory_gib" not in first.values  # CPU: ms-swift logs no memory(GiB)
    assert all(s.duration_s is not None and s.duration_s > 0 for s in steps)
    # durations telescope to ms-swift's own clock: their sum is the elapsed time of the last step
    assert sum(s.duration_s or 0 for s in steps) == pytest.approx(steps[-1].values["elapsed_s"], rel=1e-6)
    # full precision from logging.jsonl, not the 4-digit stdout text
    assert first.values["reward"] == pytest.approx(0.12014027, rel=1e-9)


def test_v3_and_v4_logs_give_the_same_step_records(tmp_path: Path) -> None:
    v4 = replay(V46, tmp_path / "v4")
    v3 = replay(V3, tmp_path / "v3")
    assert [s.step for s in v3] == [s.step for s in v4] == list(range(1, 9))
    for a, b in zip(v3, v4, strict=True):
        assert a.t_mono_s == b.t_mono_s and a.samples == b.samples and a.tokens == b.tokens
        assert set(a.values) == set(b.values)
        for key in a.values:
            assert a.values[key] == pytest.approx(b.values[key], rel=1e-5, abs=1e-9), key
        assert a.duration_s == pytest.approx(b.duration_s, rel=1e-4)


def test_stdout_alone_gives_the_same_steps(tmp_path: Path) -> None:
    """Without logging.jsonl the stdout dict lines (4.6: '.4g' text) still give every step."""
    with_file = replay(V46, tmp_path / "a")
    stdout_only = replay(V46, tmp_path / "b", use_file=False)
    assert [s.step for s in stdout_only] == [s.step for s in with_file]
    for a, b in zip(stdout_only, with_file, strict=True):
        assert set(a.values) == set(b.values)
        for key, value in b.values.items():
            assert a.values[key] == pytest.approx(value, rel=2e-3, abs=1e-9), key
        assert a.duration_s == pytest.approx(b.duration_s, rel=0.05)


def test_two_ranks_print_each_record_once_each(tmp_path: Path) -> None:
    events = [json.loads(x) for x in V46_2PROC.read_text().splitlines() if x.strip()]
    printed = [e for e in events if e.get("stream") == "stdout" and "global_step/max_steps" in e["text"]]
    assert len(printed) == 2 * 7  # 6 steps + the summary, printed by both ranks (transformers 5 on CPU)
    steps = replay(V46_2PROC, tmp_path)
    assert [s.step for s in steps] == list(range(1, 7))
    assert all(len(str(s.values["reward"])) > 7 for s in steps)  # rank 0's file values, not '.4g' text


def test_dict_literal_with_tqdm_nan_and_inf() -> None:
    line = "Train:  40%|████      | 2/5 [00:01<00:01,  1.9it/s]{'loss': nan, 'grad_norm': inf, 'kl': -inf, 'global_step/max_steps': '2/5'}"
    record = parse_dict_literal(line)
    assert (
        record is not None
        and math.isnan(record["loss"])
        and record["grad_norm"] == math.inf
        and record["kl"] == -math.inf
    )
    parser = SwiftLogParser()
    steps = parser.feed("stdout", line, 5.0, 6.0)
    assert [s.step for s in steps] == [2]
    assert math.isnan(steps[0].values["loss"]) and steps[0].t_mono_s == 5.0 and steps[0].t_wall_s == 6.0
    assert parse_dict_literal("no dict here") is None
    assert parse_dict_literal("{'a': object()}") == {}
    assert parse_dict_literal("{broken") is None


def test_carriage_returns_inside_one_line() -> None:
    parser = SwiftLogParser()
    line = "Train:  20%|██ | 1/5 [00:00<00:02]\r{'loss': '0.5', 'global_step/max_steps': '1/5', 'train_speed(s/it)': '0.5'}\rTrain: 20%"
    assert [s.step for s in parser.feed("stdout", line, 1.0, 1.0)] == [1]


def test_records_that_are_not_steps() -> None:
    summary = {
        "train_runtime": 3.29,
        "train_loss": 6e-08,
        "global_step/max_steps": "6/6",
        "train_speed(s/it)": 0.548,
    }
    final = {"last_model_checkpoint": None, "global_step": 6, "log_history": []}
    evaluation = {"eval_loss": 0.3, "global_step/max_steps": "4/6"}
    assert not is_step_record(summary) and not is_step_record(final) and not is_step_record(evaluation)
    assert is_step_record({"loss": 0.1, "global_step/max_steps": "4/6"})
    parser = SwiftLogParser()
    assert parser.feed("stdout", str(summary), 1.0, 1.0) == []
    assert parser.feed("stdout", str(evaluation), 1.0, 1.0) == []


def test_values_are_normalised() -> None:
    v3 = record_values(
        {
            "loss": 1.5,
            "memory(GiB)": 4.87,
            "percentage": "1.06%",
            "global_step/max_steps": "4/94",
            "train_speed(iter/s)": 0.5,
        }
    )
    v4 = record_values(
        {
            "loss": "1.5",
            "memory(GiB)": "4.87",
            "global_step/max_steps": "4/94",
            "train_speed(s/it)": "2",
            "elapsed_time": "8s",
            "flag": True,
        }
    )
    assert v3 == v4 == {"loss": 1.5, "memory_gib": 4.87, "train_speed_s_per_it": 2.0, "elapsed_s": 8.0}


def test_durations_from_the_frameworks_clock() -> None:
    parser = SwiftLogParser()
    got: list[StepMetrics] = []
    for step, s_per_it in ((1, 2.0), (2, 1.5), (3, 1.4)):
        got += parser.feed(
            "stdout",
            str({"loss": 0.1, "global_step/max_steps": f"{step}/9", "train_speed(s/it)": s_per_it}),
            step,
            step,
        )
    assert [s.duration_s for s in got] == pytest.approx([2.0, 1.0, 1.2])
    old = SwiftLogParser()
    got = []
    for step, it_per_s in ((2, 0.5), (4, 0.8)):  # logging_steps 2, 3.x's iter/s
        got += old.feed(
            "stdout",
            str({"loss": 0.1, "global_step/max_steps": f"{step}/9", "train_speed(iter/s)": it_per_s}),
            step,
            step,
        )
    assert [s.duration_s for s in got] == pytest.approx([2.0, 0.5])  # (5 s - 4 s) / 2 steps


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(text)


def test_file_record_waits_and_the_stdout_time_is_kept(tmp_path: Path) -> None:
    """Another rank's stdout line may come before rank 0 wrote the file: the record waits for it."""
    path = tmp_path / "output" / "logging.jsonl"
    parser = SwiftLogParser(jsonl_path=path, grace_s=1.0)
    precise: dict[str, Any] = {
        "reward": 0.123456789,
        "global_step/max_steps": "1/5",
        "train_speed(s/it)": 0.7,
    }
    shown = {"reward": "0.1235", "global_step/max_steps": "1/5", "train_speed(s/it)": "0.7"}
    assert parser.feed("stdout", str(shown), 10.0, 110.0) == []  # no file line yet
    _write(path, json.dumps(precise))  # a partial line (no newline yet) is not read
    assert parser.poll(10.2, 110.2) == []
    _write(path, "\n")
    steps = parser.poll(10.3, 110.3)
    assert [s.step for s in steps] == [1]
    assert (
        steps[0].values["reward"] == 0.123456789 and steps[0].t_mono_s == 10.0 and steps[0].t_wall_s == 110.0
    )
    assert parser.feed("stdout", str(shown), 10.4, 110.4) == []  # the other rank's copy


def test_stdout_record_is_used_after_the_grace(tmp_path: Path) -> None:
    parser = SwiftLogParser(jsonl_path=tmp_path / "never.jsonl", grace_s=1.0)
    line = str({"reward": "0.1235", "global_step/max_steps": "3/5", "train_speed(s/it)": "0.7"})
    assert parser.feed("stdout", line, 10.0, 10.0) == []
    assert parser.poll(10.5, 10.5) == []
    steps = parser.poll(11.0, 11.0)
    assert (
        [s.step for s in steps] == [3] and steps[0].t_mono_s == 10.0 and steps[0].values["reward"] == 0.1235
    )
    pending = SwiftLogParser(jsonl_path=tmp_path / "never.jsonl")
    pending.feed("stdout", line, 1.0, 1.0)
    assert [s.step for s in pending.finish(1.1, 1.1)] == [3]


def test_announced_path_replaces_the_expected_one(tmp_path: Path) -> None:
    real = tmp_path / "output" / "v0-20250422-101811" / "logging.jsonl"
    parser = SwiftLogParser(jsonl_path=tmp_path / "output" / "logging.jsonl")
    parser.feed("stderr", f"[INFO:swift] The logging file will be saved in: {real}", 1.0, 1.0)
    assert parser.jsonl_path == real
    _write(real, json.dumps({"loss": 0.2, "global_step/max_steps": "1/3", "train_speed(s/it)": 1.0}) + "\n")
    assert [s.step for s in parser.poll(2.0, 2.0)] == [1]
