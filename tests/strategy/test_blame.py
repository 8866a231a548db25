"""A failure's phase narrows the knobs it blames before any statistical blame."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from autotune.records import SteadyEstimate, TrialResult, TrialStatus
from autotune.space import SearchSpace, canonical_key, load_space
from autotune.strategy import AutoStrategy
from autotune.strategy._blame import blamed_knobs

SPACE = """
knobs:
  tp: {type: int, choices: [1, 2, 4], default: 1}
  workers: {type: int, choices: [0, 2, 4], default: 0}
  batch: {type: int, choices: [2, 4, 8], default: 2}
"""
ROLES = {"vllm_tp": "tp", "dataloader_num_workers": "workers", "per_device_batch": "batch"}


@pytest.fixture
def space(tmp_path: Path) -> SearchSpace:
    p = tmp_path / "s.yaml"
    p.write_text(SPACE)
    return load_space(p).with_roles(ROLES)


def _ok(number: int, params: dict) -> TrialResult:
    steady = SteadyEstimate(step_time_s=1.0, rel_ci95=0.01, steady_steps=4, warmup_steps=1, throughput=1.0)
    return TrialResult(
        number=number, params=params, status=TrialStatus.COMPLETE, reason="ok", steps=6, steady=steady
    )


def _hang(number: int, params: dict, phase: str | None) -> TrialResult:
    return TrialResult(
        number=number,
        params=params,
        status=TrialStatus.HANG,
        reason="no step for too long",
        steps=2,
        failed_phase=phase,
    )


def test_the_phase_names_the_knobs_through_the_space_roles(space: SearchSpace) -> None:
    p = {"tp": 4, "workers": 2, "batch": 8}
    assert blamed_knobs(space, _hang(1, p, "weight_sync")) == {"tp"}
    assert blamed_knobs(space, _hang(1, p, "train")) == {"workers", "batch"}
    assert blamed_knobs(space, _hang(1, p, "startup")) is None  # start-up: anything may be to blame
    assert blamed_knobs(space, _hang(1, p, None)) is None
    assert blamed_knobs(space, _ok(1, p)) is None


def _risk_of(space: SearchSpace, phase: str | None, probe: dict) -> float:
    """Failure risk of ``probe`` after one hang at (tp 4, workers 2, batch 2), with successes that
    refute neither tp 4 nor workers 2 alone."""
    history = [
        _ok(0, {"tp": 1, "workers": 0, "batch": 2}),
        _ok(1, {"tp": 2, "workers": 4, "batch": 4}),
        _hang(2, {"tp": 4, "workers": 2, "batch": 2}, phase),
    ]
    s = AutoStrategy(space, seed=0)
    return s.failure_risk(history, [probe])


def test_a_weight_sync_hang_blames_tensor_parallelism_not_the_data_loader(space: SearchSpace) -> None:
    same_tp = {"tp": 4, "workers": 0, "batch": 4}
    same_workers = {"tp": 1, "workers": 2, "batch": 4}
    # without a phase the two single-value culprits (tp 4, workers 2) are equally likely
    assert _risk_of(space, None, same_tp) == pytest.approx(_risk_of(space, None, same_workers))
    # the evidence says weight sync: tp 4 is the likely culprit, workers 2 is nearly cleared
    assert _risk_of(space, "weight_sync", same_tp) > 0.5
    assert _risk_of(space, "weight_sync", same_workers) < 0.1
    # and the other way round for a hang during training
    assert _risk_of(space, "train", same_workers) > 3 * _risk_of(space, "train", same_tp)


def test_refuted_phase_knobs_leave_the_blame_outside_the_phase(space: SearchSpace) -> None:
    """When a success refutes every explanation inside the phase, the evidence does not invent one:
    the failure's mass stays on the explanations that remain."""
    history = [
        _ok(0, {"tp": 4, "workers": 0, "batch": 2}),  # tp 4 works: the sync phase has no culprit left
        _hang(1, {"tp": 4, "workers": 2, "batch": 2}, "weight_sync"),
    ]
    s = AutoStrategy(space, seed=0)
    untried = [
        p for p in space.grid() if p["workers"] == 2 and canonical_key(p) != canonical_key(history[1].params)
    ]
    risks = np.array([s.failure_risk(history, [p]) for p in untried])
    assert risks.max() > 0.3


def test_a_memory_failure_also_blames_what_the_trainer_holds(tmp_path: Path) -> None:
    p = tmp_path / "z.yaml"
    p.write_text(SPACE + "  zero: {type: int, choices: [2, 3], default: 2}\n")
    space = load_space(p).with_roles({**ROLES, "zero_stage": "zero"})
    params = {"tp": 2, "workers": 2, "batch": 4, "zero": 2}
    oom = TrialResult(
        number=1, params=params, status=TrialStatus.OOM, reason="CUDA out of memory", failed_phase="rollout"
    )
    # the rollout's knobs, and the ZeRO stage that decides how much of the trainer stays on the GPU
    assert blamed_knobs(space, oom) == {"tp", "batch", "zero"}
    # a hang in the same phase is about the rollout's knobs only
    assert blamed_knobs(space, _hang(1, params, "rollout")) == {"tp", "batch"}
