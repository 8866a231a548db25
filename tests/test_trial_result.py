"""TrialResult's named constructors: each makes the trials it is for, and refuses what cannot hold for
them (tests/test_architecture.py checks that the package makes results no other way)."""

from __future__ import annotations

import pydantic
import pytest

from autotune.records import SteadyEstimate, TrialResult, TrialStatus

STEADY = SteadyEstimate(step_time_s=2.0, rel_ci95=0.02, steady_steps=4, warmup_steps=1, throughput=8.0)


def test_a_placeholder_and_an_interruption_carry_no_measurement() -> None:
    running = TrialResult.running(3, {"bs": 4}, derived={"world_size": 2}, is_baseline=True)
    assert (running.status, running.reason, running.is_baseline) == (TrialStatus.RUNNING, "running", True)
    assert running.derived == {"world_size": 2}
    stopped = TrialResult.interrupted(3, {"bs": 4}, reason="stopped by the user")
    for result in (running, stopped):
        assert (result.exit_code, result.steps, result.steady, result.duration_s) == (None, 0, None, 0.0)
    assert stopped.status is TrialStatus.INTERRUPTED


def test_a_trial_not_launched_is_pruned_or_invalid_and_keeps_the_gates_estimate() -> None:
    pruned = TrialResult.not_launched(
        5, {"bs": 64}, status=TrialStatus.PRUNED, reason="not launched: too big", estimate={"total": 9}
    )
    assert pruned.estimate == {"total": 9} and pruned.steps == 0
    assert TrialResult.not_launched(5, {}, status=TrialStatus.INVALID, reason="x").estimate is None
    with pytest.raises(ValueError, match="PRUNED or INVALID, not COMPLETE"):
        TrialResult.not_launched(5, {}, status=TrialStatus.COMPLETE, reason="x")


def test_a_measured_trial_has_ended_and_its_measurement_is_consistent() -> None:
    done = TrialResult.measured(
        1, {"bs": 8}, status=TrialStatus.COMPLETE, reason="ok", steps=5, steady=STEADY, duration_s=12.0
    )
    assert done.throughput == 8.0 and done.params == {"bs": 8}
    with pytest.raises(ValueError, match="cannot be RUNNING"):
        TrialResult.measured(1, {}, status=TrialStatus.RUNNING, reason="x")
    with pytest.raises(ValueError, match="negative"):
        TrialResult.measured(1, {}, status=TrialStatus.CRASH, reason="x", duration_s=-1.0)
    with pytest.raises(ValueError, match="steady-state estimate needs steps"):
        TrialResult.measured(1, {}, status=TrialStatus.COMPLETE, reason="x", steady=STEADY)


def test_a_result_reads_back_as_it_was_written() -> None:
    done = TrialResult.measured(2, {"bs": 8}, status=TrialStatus.OOM, reason="CUDA out of memory", steps=1)
    assert TrialResult.from_json(done.model_dump_json()) == done
    assert TrialResult.from_dict(done.model_dump(mode="json")) == done
    with pytest.raises(pydantic.ValidationError):
        TrialResult.from_dict(["not", "a", "result"])
