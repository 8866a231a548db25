"""``autotune.search`` and ``autotune.plan`` from Python: the CLI's jobs with the CLI's options."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

import autotune
from autotune.errors import UsageError

FAULT = str(Path(__file__).resolve().parents[1] / "fixtures" / "faults" / "fault.py")
TRL_SPACE = str(Path(__file__).resolve().parents[1] / "estimate" / "data" / "trl_small.yaml")


def test_search_from_python_runs_a_real_study(tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(
        "backend: command\nknobs:\n"
        "  bs: {type: int, choices: [1, 2], default: 1}\n"
        "  wait: {type: float, choices: [0.02, 0.04], default: 0.04}\n"
    )
    out = tmp_path / "study"
    summary = autotune.search(
        [sys.executable, FAULT, "--mode", "ok", "--steps", "5", "--step-s", "{wait}"],
        backend="command",
        space=str(space),
        out=str(out),
        search="grid",
        trials=2,
        confirm_runs=0,
        startup_timeout="60s",
        pins=["wait=0.02"],
    )
    assert summary.exit_code == 0 and summary.out == out
    rec = summary.outcome.recommendation
    assert rec is not None
    assert [r.params["wait"] for r in summary.outcome.results] == [0.02, 0.02]
    assert summary.to_dict()["knobs"] == {"searched": ["bs"], "pinned": {"wait": 0.02}}
    settings = json.loads((out / "study.json").read_text())
    assert settings["command"].startswith("autotune.search(") and "pins=['wait=0.02']" in settings["command"]
    # the study reads back as DataFrames
    study = autotune.load_study(out)
    assert sorted(study.trials.index) == [r.number for r in summary.outcome.results]
    assert study.recommendation is not None and study.recommendation.trial == rec.trial
    assert study.pinned == {"wait": 0.02}


def test_plan_from_python_takes_the_cli_options() -> None:
    plan = autotune.plan(
        "Qwen2-7B", gpus=4, gpu_type="A10", space=TRL_SPACE, pins=["zero_stage=3"], knobs=["use_vllm=false"]
    )
    assert plan.n_gpus == 4 and plan.candidates
    assert {c.params["zero_stage"] for c in plan.candidates} == {3}
    assert {c.params["use_vllm"] for c in plan.candidates} == {False}
    assert plan.to_dict()["counts"]["candidates"] == len(plan.candidates)


def test_an_unknown_option_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="autotune.search.. has no option 'trails'") as info:
        autotune.search(trails=4)
    assert "trials" in (info.value.hint or "")
    with pytest.raises(UsageError, match="autotune.plan.. has no option 'gpu'") as info:
        autotune.plan("Qwen2-7B", gpu=4)
    assert "gpus" in (info.value.hint or "")
