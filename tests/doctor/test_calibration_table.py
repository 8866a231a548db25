"""``--calibrate``'s parts that need no GPU: trial results (as a GPU study records them) turned into
points, the table's comparison and files, and the memory gate of a new study starting from it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.app.calibrate import points_from_results, run_calibration
from autotune.backends import ModelRef, backend_class, job_shape
from autotune.doctor import Status
from autotune.estimate import (
    build_table,
    cached_table,
    estimate_memory,
    estimate_step_time,
    find_model,
    resolve_gpu,
    seed_calibration,
    store_table,
)
from autotune.records import GpuInfo, Hardware, HostInfo, SteadyEstimate, TrialResult, TrialStatus
from tests.doctor.conftest import gpu_facts

GiB = 1024**3
H100 = "NVIDIA H100 80GB HBM3"
JOB = {"global_batch": 64, "num_generations": 4, "max_completion_length": 256}


def _batch() -> str:
    return backend_class("trl").knob_roles()["per_device_batch"]


def _recorded(number: int, bs: int, *, measured_ratio: float | None, step_s: float | None) -> TrialResult:
    """A result as a GPU study records it: the gate's estimate, the NVML peak, the steady step time."""
    spec = find_model("Qwen2.5-0.5B")
    gpu = resolve_gpu(H100, 80 * GiB)
    assert spec is not None and gpu is not None
    params = {_batch(): bs}
    derived = {"world_size": 1, "gradient_accumulation_steps": JOB["global_batch"] // bs}
    est = estimate_memory(job_shape("trl", params, derived, JOB, spec, 1), gpu)
    oom = measured_ratio is None
    return TrialResult(
        number=number,
        params=params,
        derived=derived,
        status=TrialStatus.OOM if oom else TrialStatus.COMPLETE,
        reason="CUDA out of memory" if oom else "completed",
        estimate=est.to_dict(),
        peak_mem_bytes=[] if oom else [int(est.peak_bytes * measured_ratio)],
        steady=None
        if step_s is None
        else SteadyEstimate(
            step_time_s=step_s, rel_ci95=0.02, steady_steps=5, warmup_steps=1, throughput=64 / step_s
        ),
    )


def _predict(params: dict, derived: dict) -> float:
    spec, gpu = find_model("Qwen2.5-0.5B"), resolve_gpu(H100, 80 * GiB)
    assert spec is not None and gpu is not None
    return estimate_step_time(job_shape("trl", params, derived, JOB, spec, 1), gpu).total_s


def _table():
    ok = [_recorded(0, 2, measured_ratio=1.2, step_s=3.0), _recorded(1, 8, measured_ratio=1.1, step_s=2.0)]
    oom = [_recorded(2, 64, measured_ratio=None, step_s=None)]
    points = points_from_results(ok, predict_step_s=_predict) + points_from_results(
        oom, predict_step_s=None, expected_oom=True
    )
    spec = find_model("Qwen2.5-0.5B")
    assert spec is not None
    return build_table(H100, "Qwen2.5-0.5B", spec.params, points, "2026-11-25T20:00:00+00:00")


def test_points_set_the_measurements_beside_the_predictions() -> None:
    table = _table()
    a, b, c = table.points
    assert a.memory_ratio == pytest.approx(1.2, rel=1e-6) and b.memory_ratio == pytest.approx(1.1, rel=1e-6)
    assert a.predicted_step_s == pytest.approx(
        _predict({_batch(): 2}, {"world_size": 1, "gradient_accumulation_steps": 32})
    )
    assert a.step_ratio == pytest.approx(3.0 / a.predicted_step_s)
    assert (c.status, c.expected_oom, c.measured_peak_bytes, c.predicted_step_s) == ("OOM", True, None, None)
    assert table.step_time_ratio == pytest.approx((a.step_ratio + b.step_ratio) / 2)  # the median of two
    assert table.oom_classified is True
    # the memory correction is Calibration's, from the two measured ratios (1.2, 1.1): the deliberate OOM
    # (predicted to fit: it was sized by another mechanism) is not evidence of the estimate's error
    assert table.calibration().factor == pytest.approx(1.15, rel=1e-3)
    assert len(table.calibration().observations) == 2


def test_a_deliberate_oom_that_was_not_classified_oom_is_said() -> None:
    wrong = _recorded(2, 64, measured_ratio=0.5, step_s=1.0)  # ran to the end: not classified OOM
    points = points_from_results([wrong], predict_step_s=None, expected_oom=True)
    table = build_table(H100, "m", 1, points, "t")
    assert table.oom_classified is False


def test_stored_table_reads_back_and_seeds_a_study_of_the_same_model(tmp_path: Path) -> None:
    table = _table()
    path = store_table(table, tmp_path)
    assert path.parent == tmp_path / "calibration" and json.loads(path.read_text())["device"] == H100
    back = cached_table(H100, tmp_path)
    assert back == table
    assert "| 2 | " in back.to_markdown() and "(sized to OOM)" in back.to_markdown()
    seeded = seed_calibration(H100, table.model_params, tmp_path)
    assert seeded is not None and seeded.factor == pytest.approx(table.calibration().factor)
    assert all(o.trial is None for o in seeded.observations)  # not this study's trial numbers
    assert seed_calibration(H100, table.model_params + 1, tmp_path) is None  # another model
    assert seed_calibration("NVIDIA A10", table.model_params, tmp_path) is None  # another GPU


def test_a_damaged_table_is_ignored(tmp_path: Path) -> None:
    path = store_table(_table(), tmp_path)
    path.write_text("{not json")
    assert cached_table(H100, tmp_path) is None and seed_calibration(H100, 1, tmp_path) is None


def test_a_new_studys_memory_gate_starts_from_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autotune.study.memory_gate import EstimatorGate

    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    table = _table()
    spec = find_model("Qwen2.5-0.5B")
    assert spec is not None
    hw = Hardware(
        gpus=(GpuInfo(index=0, name=H100, memory_total_bytes=80 * GiB),),
        host=HostInfo(
            hostname="h", cpu_cores_logical=2, cpu_cores_physical=1, ram_total_bytes=GiB, platform="x"
        ),
    )
    model = ModelRef(name="Qwen2.5-0.5B", path_or_id="Qwen/Qwen2.5-0.5B", local=False, facts=_facts(spec))

    def build(calibration=None):  # noqa: ANN001, ANN202
        return EstimatorGate.build(hw, model, "trl", JOB, lambda p: {"world_size": 1}, calibration)

    assert build().calibration.factor == 1.0  # no table yet
    store_table(table)
    assert build().calibration.factor == pytest.approx(table.calibration().factor)
    own = {"observations": [o.to_dict() for o in table.calibration().observations[:1]]}
    assert build(own).calibration.observations[0].trial == 0  # a resumed study keeps its own evidence


def _facts(spec) -> dict:  # noqa: ANN001
    from dataclasses import asdict

    return {k: v for k, v in asdict(spec).items() if v is not None}


def test_calibrate_on_a_cpu_machine_says_it_needs_a_gpu(tmp_path: Path) -> None:
    facts = gpu_facts(1, driver="no_library")
    outcome = run_calibration(facts, out_dir=tmp_path)
    assert outcome.table is None and outcome.paths == ()
    (finding,) = outcome.findings
    assert finding.status is Status.WARN and "needs a GPU" in finding.detail
    assert "GPU host" in finding.fix
    assert list(tmp_path.iterdir()) == []  # nothing was run or written


def test_a_trial_stopped_as_slower_still_counts_and_one_never_launched_does_not() -> None:
    ran = _recorded(3, 4, measured_ratio=1.0, step_s=2.5).model_copy(
        update={"status": TrialStatus.PRUNED, "steps": 4, "reason": "pruned: clearly below the best"}
    )
    never = _recorded(4, 64, measured_ratio=None, step_s=None).model_copy(
        update={"status": TrialStatus.PRUNED, "steps": 0, "reason": "not launched: predicted not to fit"}
    )
    points = points_from_results([ran, never], predict_step_s=_predict)
    assert [(p.trial, p.status, p.measured_step_s) for p in points] == [(3, "PRUNED", 2.5)]
    # a slower trial's peak is evidence of the memory estimate like any other
    memory = build_table(H100, "m", 1, points, "t").calibration()
    assert [o.trial for o in memory.observations] == [3] and memory.factor == pytest.approx(1.0, rel=1e-3)
