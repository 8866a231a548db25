"""The memory gate tested by a memory probe: a wider margin for the one run a strategy asks for, and a
run stopped early for being slow teaches the gate its measured peak."""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.records import GpuInfo, Hardware, HostInfo, SteadyEstimate, TrialResult, TrialStatus
from autotune.study.memory_gate import PROBE_MARGIN, EstimateMemo, EstimatorGate
from autotune.workload.models import resolve_model

HOST = HostInfo(
    hostname="h", cpu_cores_logical=2, cpu_cores_physical=2, ram_total_bytes=2**36, platform="linux"
)
A10 = GpuInfo(index=0, name="NVIDIA A10", memory_total_bytes=24 * 2**30)
JOB = {"global_batch": 16, "num_generations": 4, "max_completion_length": 256}
# Qwen2.5-1.5B on one A10, no checkpointing: batch 8 is predicted at 1.39 x capacity, batch 4 at 0.95 x
OVER = {"per_device_train_batch_size": 8, "gradient_checkpointing": False}
DERIVED = {"world_size": 1, "gradient_accumulation_steps": 2}


@pytest.fixture
def gate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> EstimatorGate:
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))  # no calibration table of this machine's
    return _gate()


def _gate(memo: EstimateMemo | None = None) -> EstimatorGate:
    built = EstimatorGate.build(
        Hardware(gpus=(A10,), host=HOST),
        resolve_model("Qwen2.5-1.5B"),
        "trl",
        JOB,
        lambda p: {"world_size": 1, "gradient_accumulation_steps": 16 // p["per_device_train_batch_size"]},
        memo=memo,
    )
    assert built is not None
    return built


def test_a_probe_is_refused_only_beyond_the_probe_margin(gate: EstimatorGate) -> None:
    reason, breakdown = gate.check(OVER, DERIVED)
    assert breakdown is not None
    load = breakdown["peak_bytes"] / breakdown["capacity_bytes"]
    assert 1.15 < load < 1 + PROBE_MARGIN  # over the gate's own margin, within a probe's
    assert reason is not None and reason.startswith("predicted not to fit")
    assert gate.check(OVER, DERIVED, margin=PROBE_MARGIN)[0] is None
    assert gate.check(OVER, DERIVED, margin=load - 1 - 0.01)[0] is not None  # the margin is what decides


def _ran(status: TrialStatus, steps: int, peak_frac: float) -> TrialResult:
    steady = SteadyEstimate(step_time_s=2.0, rel_ci95=0.02, steady_steps=3, warmup_steps=1, throughput=8.0)
    return TrialResult(
        number=5,
        params=dict(OVER),
        derived=dict(DERIVED),
        status=status,
        reason="slower than the best" if status is TrialStatus.PRUNED else "",
        steps=steps,
        steady=steady if steps else None,
        peak_mem_bytes=[int(peak_frac * A10.memory_total_bytes)] if steps else [],
    )


def test_a_probe_stopped_early_for_being_slow_calibrates_the_gate(gate: EstimatorGate) -> None:
    """The probe ran whole steps at 85 % of the GPU: the gate learns that its estimate was pessimistic
    and lets the configuration through; a PRUNED trial that never launched teaches nothing."""
    gate.observe(_ran(TrialStatus.PRUNED, 0, 0.0).model_copy(update={"number": 4}))  # refused before launch
    assert gate.calibration.observations == []
    gate.observe(_ran(TrialStatus.PRUNED, 4, 0.85))
    assert len(gate.calibration.observations) == 1
    assert gate.calibration.factor < 1.0
    assert gate.check(OVER, DERIVED)[0] is None  # seen to run: never predicted not to fit again


def test_gates_sharing_a_memo_share_estimates_and_never_calibration(
    gate: EstimatorGate, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second gate of the same job reads the first one's raw estimates (computed once), and each
    applies only its own calibration: one that learned from a probe lets OVER through, a fresh one
    still refuses it, as a gate with a memo of its own does."""
    import autotune.estimate

    calls: list[object] = []
    estimate = autotune.estimate.estimate_memory
    monkeypatch.setattr(autotune.estimate, "estimate_memory", lambda *a: calls.append(a) or estimate(*a))
    other, fresh = _gate(gate.memo), _gate()
    assert gate.check(OVER, DERIVED) == fresh.check(OVER, DERIVED)
    assert len(calls) == 2  # one per memo
    gate.observe(_ran(TrialStatus.PRUNED, 4, 0.85))  # the probe ran at 85 %: this gate was pessimistic
    assert gate.check(OVER, DERIVED)[0] is None
    assert other.check(OVER, DERIVED) == fresh.check(OVER, DERIVED)
    assert other.check(OVER, DERIVED)[0] is not None
    assert len(calls) == 2  # the shared memo answered every other check
