"""The study's pruner: ``SlowerThanBest`` stops a trial clearly slower than the best completed one;
``--no-prune`` (``MeasureEvery``) lets every trial run to its last step (what a recorded surface needs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.records import SteadyEstimate, TrialResult, TrialSpec, TrialStatus
from autotune.study.tell import MeasureEvery, SlowerThanBest
from tests.study.test_loop import make

STEPS = 8


class SteppingExecutor:
    """Reports every step to the study (its pruning hook) and stops when told to; throughput is the
    batch size, so batch 1 is far slower than the baseline's batch 2."""

    def __init__(self) -> None:
        self.steps_run: dict[int, int] = {}

    def execute(self, spec: TrialSpec, ctx: Any, *, on_step, time_left_s) -> TrialResult:  # noqa: ANN001
        tp = float(spec.params["per_device_train_batch_size"])
        status, reason, done = TrialStatus.COMPLETE, "completed", 0
        for step in range(1, STEPS + 1):
            done = step
            verdict = on_step(step, tp, tp * 1.01)
            if verdict:
                status, reason = TrialStatus.PRUNED, verdict
                break
        self.steps_run[spec.number] = done
        return TrialResult(
            number=spec.number,
            params=spec.params,
            derived=spec.derived,
            is_baseline=spec.is_baseline,
            status=status,
            reason=reason,
            steps=done,
            duration_s=float(done),
            gpu_seconds=float(done),
            steady=SteadyEstimate(
                step_time_s=16 / tp, rel_ci95=0.01, steady_steps=done, warmup_steps=0, throughput=tp
            ),
        )


def _study(tmp_path: Path, prune: bool):
    ex = SteppingExecutor()
    study, _ = make(tmp_path, n_trials=10, search="grid", executor=ex, name=f"p{prune}", prune=prune)  # type: ignore[arg-type]
    assert type(study.pruner) is (SlowerThanBest if prune else MeasureEvery)
    return study, ex


def test_the_default_pruner_stops_a_clearly_slower_trial(tmp_path: Path) -> None:
    study, ex = _study(tmp_path, prune=True)
    outcome = study.run()
    pruned = [r for r in outcome.results if r.status is TrialStatus.PRUNED]
    assert pruned and all(r.params["per_device_train_batch_size"] == 1 for r in pruned)
    assert all(ex.steps_run[r.number] < STEPS for r in pruned)


def test_no_prune_measures_every_trial_to_its_last_step(tmp_path: Path) -> None:
    study, ex = _study(tmp_path, prune=False)
    outcome = study.run()
    assert not [r for r in outcome.results if r.status is TrialStatus.PRUNED]
    slow = [r for r in outcome.results if r.params["per_device_train_batch_size"] == 1]
    assert slow and all(ex.steps_run[r.number] == STEPS for r in slow)
