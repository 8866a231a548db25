from __future__ import annotations

import json
from typing import Any

import pytest

from autotune.backends import job_shape
from autotune.estimate import (
    GIB,
    Calibration,
    MemoryEstimate,
    estimate_memory,
    find_gpu,
    find_model,
    prediction_error,
    should_prune,
)

JOB = {"global_batch": 64, "num_generations": 8, "max_completion_length": 1024, "vllm_max_model_length": 2048}


def est(params: dict[str, Any], n: int = 8, gpu: str = "A100-80G") -> MemoryEstimate:
    spec = find_model("Qwen2-7B")
    assert spec is not None
    return estimate_memory(job_shape("trl", params, {}, JOB, spec, n), find_gpu(gpu))


ZERO3 = {"zero_stage": 3, "per_device_train_batch_size": 4}
VLLM = {
    "zero_stage": 3,
    "per_device_train_batch_size": 4,
    "use_vllm": True,
    "vllm_gpu_memory_utilization": 0.5,
}


def test_fresh_calibration_changes_nothing() -> None:
    cal = Calibration()
    e = est(ZERO3)
    assert cal.factor == 1.0
    assert cal.adjust(e) == e


def test_measured_peaks_scale_the_modelled_part_only() -> None:
    cal = Calibration()
    e = est(VLLM)
    vllm = e.components_bytes["vllm_reserved"]
    measured = vllm + int(1.2 * (e.peak_bytes - vllm))
    cal.observe(e, measured, False, trial=3)
    assert cal.factor == pytest.approx(1.2, rel=1e-6)
    adj = cal.adjust(e)
    assert adj.components_bytes["vllm_reserved"] == vllm  # exact: utilization × total
    assert adj.peak_bytes == pytest.approx(measured, rel=1e-6)
    assert adj.calibration_factor == pytest.approx(1.2)
    assert cal.errors()[0]["trial"] == 3
    assert cal.errors()[0]["rel_error"] == pytest.approx(prediction_error(e.peak_bytes, measured))


def test_median_resists_one_outlier() -> None:
    cal = Calibration()
    e = est(ZERO3)
    for ratio in (1.05, 1.1, 3.0):
        cal.observe(e, int(e.peak_bytes * ratio), False)
    assert cal.factor == pytest.approx(1.1, rel=1e-6)


def test_oom_raises_the_factor_only_as_much_as_needed() -> None:
    cal = Calibration()
    oomed = est({**ZERO3, "per_device_train_batch_size": 16})
    assert oomed.fits()  # the raw model thought it fits
    cal.observe(oomed, None, True)
    adj = cal.adjust(oomed)
    assert not adj.fits()  # now it predicts the OOM ...
    assert adj.peak_bytes < adj.capacity_bytes * 1.001  # ... by the smallest step
    assert not should_prune(adj)  # and would not prune it at the default margin
    smaller = cal.adjust(est({**ZERO3, "per_device_train_batch_size": 1}))
    assert smaller.fits()


def test_an_oom_already_predicted_teaches_nothing() -> None:
    cal = Calibration()
    e = est({"zero_stage": 0, "per_device_train_batch_size": 16})
    assert not e.fits()
    cal.observe(e, None, True)
    assert cal.factor == 1.0


def test_a_trial_that_ran_is_never_predicted_not_to_fit() -> None:
    cal = Calibration()
    ran = est({**ZERO3, "per_device_train_batch_size": 8})
    cal.observe(ran, int(ran.capacity_bytes * 0.97), False)
    oom_small = est({**ZERO3, "per_device_train_batch_size": 1})  # an OOM that contradicts it
    cal.observe(oom_small, None, True)
    assert cal.adjust(ran).fits()


def test_observe_takes_an_adjusted_estimate_as_its_raw_form() -> None:
    a, b = Calibration(), Calibration()
    e = est(ZERO3)
    b.observe(e, int(e.peak_bytes * 1.3), False)
    adjusted = b.adjust(e)
    a.observe(adjusted, int(e.peak_bytes * 1.3), False)
    assert a.factor == pytest.approx(b.factor)


def test_round_trip_keeps_the_factor() -> None:
    cal = Calibration()
    e = est(VLLM)
    cal.observe(e, int(e.peak_bytes * 0.9), False, trial=1)
    cal.observe(est({**VLLM, "per_device_train_batch_size": 16}), None, True, trial=2)
    data = json.loads(json.dumps(cal.to_dict()))
    back = Calibration.from_dict(data)
    assert back.factor == pytest.approx(cal.factor)
    assert back.errors() == cal.errors()
    assert Calibration.from_dict(None).factor == 1.0


def test_cpu_only_estimates_are_ignored() -> None:
    spec = find_model("Qwen2-7B")
    assert spec is not None
    cpu = estimate_memory(job_shape("trl", {}, {}, JOB, spec, 0), None)
    cal = Calibration()
    cal.observe(cpu, 10 * GIB, False)
    assert cal.observations == [] and cal.adjust(cpu) == cpu


def test_prediction_error_sign() -> None:
    assert prediction_error(110, 100) == pytest.approx(0.1)
    assert prediction_error(90, 100) == pytest.approx(-0.1)
    assert prediction_error(1, 0) == 0.0
