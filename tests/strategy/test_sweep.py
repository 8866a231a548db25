"""The DeepSpeed-style comparison sweep: ZeRO stage, then micro-batch up to the first failure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autotune.records import SteadyEstimate, TrialResult, TrialStatus
from autotune.space import SearchSpace, load_space
from autotune.strategy import Collaborators, DeepSpeedSweep, Pending, Proposal, SweepSettings

SPACE = """
knobs:
  per_device_train_batch_size: {type: int, choices: [1, 2, 4, 8, 16], default: 1, memory: increasing}
  zero_stage: {type: int, choices: [0, 2, 3], default: 0, memory: decreasing}
  offload_optimizer: {type: bool, default: false, when: {zero_stage: [2, 3]}, memory: decreasing}
  use_vllm: {type: bool, default: true}
"""


@pytest.fixture
def space(tmp_path: Path) -> SearchSpace:
    p = tmp_path / "s.yaml"
    p.write_text(SPACE)
    return load_space(p)


BATCH = "per_device_train_batch_size"


def sweep_of(space: SearchSpace, feasible: Any = None, **settings: Any) -> DeepSpeedSweep:
    collab = Collaborators(feasible=feasible) if feasible is not None else None
    return DeepSpeedSweep(space, collab, settings=SweepSettings(batch_knob=BATCH, **settings))


def run(sweep: DeepSpeedSweep, truth: Any, limit: int = 30) -> list[TrialResult]:
    history: list[TrialResult] = []
    while len(history) < limit and isinstance(
        proposal := sweep.propose(history, Pending.of(history)), Proposal
    ):
        p = proposal.params
        status, tp = truth(p)
        steady = (
            SteadyEstimate(step_time_s=1.0, rel_ci95=0.01, steady_steps=4, warmup_steps=1, throughput=tp)
            if tp
            else None
        )
        history.append(
            TrialResult(
                number=len(history), params=p, status=status, reason="x", steps=5 if tp else 0, steady=steady
            )
        )
    return history


def test_stage_by_stage_batch_up_to_the_first_oom(space: SearchSpace) -> None:
    limit = {0: 4, 2: 8, 3: 16}  # largest batch that fits per stage

    def truth(p: dict[str, Any]) -> tuple[TrialStatus, float | None]:
        b, z = p["per_device_train_batch_size"], p["zero_stage"]
        if b > limit[z]:
            return TrialStatus.OOM, None
        return TrialStatus.COMPLETE, b * (1.0 if z < 3 else 0.9)

    sweep = sweep_of(space, base={"use_vllm": False}, stage_knob="zero_stage", stages=(0, 2, 3))
    history = run(sweep, truth)
    tried = [(r.params["zero_stage"], r.params["per_device_train_batch_size"], r.status) for r in history]
    assert tried == [
        (0, 1, TrialStatus.COMPLETE), (0, 2, TrialStatus.COMPLETE), (0, 4, TrialStatus.COMPLETE), (0, 8, TrialStatus.OOM),
        (2, 1, TrialStatus.COMPLETE), (2, 2, TrialStatus.COMPLETE), (2, 4, TrialStatus.COMPLETE), (2, 8, TrialStatus.COMPLETE),
        (2, 16, TrialStatus.OOM),
        (3, 1, TrialStatus.COMPLETE), (3, 2, TrialStatus.COMPLETE), (3, 4, TrialStatus.COMPLETE), (3, 8, TrialStatus.COMPLETE),
        (3, 16, TrialStatus.COMPLETE),
    ]  # fmt: skip
    # every other knob stays at the baseline; offload stays at its default
    assert all(r.params["use_vllm"] is False for r in history)
    assert all(r.params.get("offload_optimizer", False) is False for r in history)
    assert sweep.converged(history, Pending.of(history, 10)) is not None
    assert sweep.propose(history, Pending.of(history)) is None


def test_a_slower_stage_ends_the_sweep(space: SearchSpace) -> None:
    def truth(p: dict[str, Any]) -> tuple[TrialStatus, float | None]:
        b, z = p["per_device_train_batch_size"], p["zero_stage"]
        if b > 2:
            return TrialStatus.OOM, None
        return TrialStatus.COMPLETE, b * (1.0 if z == 0 else 0.5)

    history = run(sweep_of(space, stage_knob="zero_stage", stages=(0, 2, 3)), truth)
    assert {r.params["zero_stage"] for r in history} == {0, 2}  # stage 2 was slower: stage 3 never runs


def test_a_stage_predicted_not_to_fit_is_skipped(space: SearchSpace) -> None:
    feasible = lambda p: p["zero_stage"] != 0 or p["per_device_train_batch_size"] <= 2  # noqa: E731
    history = run(
        sweep_of(space, feasible, stage_knob="zero_stage", stages=(0, 2)),
        lambda p: (TrialStatus.COMPLETE, float(p["per_device_train_batch_size"])),
    )
    assert [(r.params["zero_stage"], r.params["per_device_train_batch_size"]) for r in history][:3] == [
        (0, 1),
        (0, 2),
        (2, 1),
    ]


def test_an_unhealthy_run_does_not_stop_the_sweep_but_is_never_its_best(space: SearchSpace) -> None:
    # DeepSpeed measures throughput only: batch 1 under ZeRO-2 does not learn, the sweep goes on
    def truth(p: dict[str, Any]) -> tuple[TrialStatus, float | None]:
        b, z = p["per_device_train_batch_size"], p["zero_stage"]
        if b > 4:
            return TrialStatus.OOM, None
        if b == 1 and z == 2:
            return TrialStatus.UNHEALTHY, 9.0  # fast, but useless
        return TrialStatus.COMPLETE, float(b) * {2: 1.0, 3: 1.5, 0: 0.5}[z]

    history = run(sweep_of(space, stage_knob="zero_stage", stages=(2, 3, 0)), truth)
    stage2 = [
        (r.params["per_device_train_batch_size"], r.status) for r in history if r.params["zero_stage"] == 2
    ]
    assert stage2[:2] == [(1, TrialStatus.UNHEALTHY), (2, TrialStatus.COMPLETE)]
    # stage 2's best is 4.0 (batch 4), not the unhealthy 9.0, so stage 3 (6.0) counts as better and
    # the sweep moves on to stage 0
    assert any(r.params["zero_stage"] == 0 for r in history)
