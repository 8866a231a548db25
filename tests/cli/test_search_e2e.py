"""A real study through the installed CLI: TRL GRPO trials on the CPU with the tiny local model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("trl")

SPACE = """backend: trl
knobs:
  per_device_train_batch_size: {type: int, choices: [2, 4, 8], default: 8, memory: increasing}
  gradient_checkpointing: {type: bool, default: true, memory: decreasing}
"""


@pytest.mark.e2e
@pytest.mark.trl
def test_real_trl_study_recommends_reports_and_resumes(cli, tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    out = tmp_path / "study"
    # a relative --out, as people type it: trials run in their own directories, so paths must hold
    args = (
        "search", "--model", "tiny-qwen2", "--backend", "trl", "--space", str(space), "--out", "study",
        "--trials", "3", "--max-steps", "8", "--global-batch", "8", "--num-generations", "4",
        "--max-completion-length", "8",
    )  # fmt: skip
    first = cli(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    trial_dirs = sorted(p.name for p in (out / "trials").iterdir() if p.is_dir())
    assert len(trial_dirs) == 3
    results = [json.loads((out / "trials" / d / "result.json").read_text()) for d in trial_dirs]
    assert results[0]["is_baseline"] and results[0]["params"] == {
        "per_device_train_batch_size": 8,
        "gradient_checkpointing": True,
    }
    for r in results:
        assert r["status"] in ("COMPLETE", "PRUNED"), (r["number"], r["status"], r["reason"])
        trial = out / "trials" / str(r["number"])
        for name in (
            "command.sh",
            "launch.json",
            "stdout.log",
            "stderr.log",
            "metrics.jsonl",
            "timeline.parquet",
            "phases.jsonl",
            "result.json",
        ):
            assert (trial / name).exists(), (r["number"], name)
        assert r["steps"] >= 3 and r["steady"]["throughput"] > 0
    assert results[0]["status"] == "COMPLETE"
    study = json.loads((out / "study.json").read_text())
    winner = study["outcome"]["recommended_trial"]
    assert winner is not None
    assert f"best: trial {winner}" in first.stdout
    assert "speedup" in first.stdout and "over the baseline (trial 0)" in first.stdout
    for report in ("report.html", "report.md"):
        text = (out / report).read_text()
        assert f"trial {winner}" in text.lower() or f"trial&nbsp;{winner}" in text.lower(), report
    assert (out / "best" / "knobs.json").exists()
    before = {d: (out / "trials" / d / "result.json").read_bytes() for d in trial_dirs}
    again = cli(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert sorted(p.name for p in (out / "trials").iterdir() if p.is_dir()) == trial_dirs
    assert {d: (out / "trials" / d / "result.json").read_bytes() for d in trial_dirs} == before
    assert "0 trial(s) run now" in again.stdout
