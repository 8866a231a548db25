"""A trial's ceiling in its result: the configuration's bound on the study's hardware, and the measured
step (and phases, where split) against it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from autotune.estimate import CPU_DEVICE, MeasuredPeaks, cached_peaks, machine_id, store_peaks
from autotune.records import GpuInfo, Hardware, HostInfo, ModelRef, SteadyEstimate, TrialResult, TrialStatus
from autotune.study.ceiling import TrialCeilings, measured_phase_seconds
from autotune.workload.models import resolve_model

HOST = HostInfo(
    hostname="h", cpu_cores_logical=2, cpu_cores_physical=2, ram_total_bytes=2**34, platform="linux"
)
H100 = GpuInfo(index=0, name="NVIDIA H100 80GB HBM3", memory_total_bytes=85_520_809_984)


@dataclass
class Settings:
    model: ModelRef
    hardware: Hardware
    backend: str = "trl"
    global_batch: int = 16
    num_generations: int = 4
    max_completion_length: int = 256
    fixed: dict[str, Any] = field(default_factory=dict)


def _result(
    step_s: float, *, tokens_per_s: float | None = None, phases: dict[str, float] | None = None
) -> TrialResult:
    summary = {"phases": {"source": "markers", "seconds": phases}} if phases else None
    return TrialResult(
        number=3,
        params={"per_device_train_batch_size": 4},
        derived={"world_size": 2, "gradient_accumulation_steps": 2},
        status=TrialStatus.COMPLETE,
        reason="ok",
        steady=SteadyEstimate(
            step_time_s=step_s,
            rel_ci95=0.05,
            steady_steps=3,
            warmup_steps=1,
            throughput=16 / step_s,
            tokens_per_s=tokens_per_s,
        ),
        timeline_summary=summary,
    )


def test_a_gpu_trial_gets_catalog_ceilings_and_phase_fractions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    hardware = Hardware(gpus=(H100, H100.model_copy(update={"index": 1})), host=HOST)
    ceilings = TrialCeilings.for_study(Settings(resolve_model("Qwen2.5-0.5B"), hardware))
    assert ceilings is not None
    # 160 completion tokens per sample measured (of 256 allowed); the timeline splits 8 s per step 3:1
    result = ceilings.attach(
        _result(8.0, tokens_per_s=16 * 160 / 8.0, phases={"rollout": 30.0, "train": 10.0})
    )
    c = result.ceiling
    assert c is not None and c.basis_source == "catalog" and "H100" in c.basis
    assert "160 completion tokens per sample (measured)" in c.work
    assert c.step_measured_s == 8.0
    assert c.step_fraction == pytest.approx(c.step_ceiling_s / 8.0)
    assert c.phase_measured_s == pytest.approx({"rollout": 6.0, "train": 2.0})
    assert c.phase_fraction["rollout"] == pytest.approx(c.phase_ceiling_s["rollout"] / 6.0)
    assert c.phase_fraction["train"] == pytest.approx(c.phase_ceiling_s["train"] / 2.0)
    assert 0 < c.step_fraction < 1 and not c.beats_ceiling
    # the declared maximum gives a larger ceiling than the measured completions
    declared = ceilings.attach(_result(8.0))
    assert declared.ceiling is not None and declared.ceiling.step_ceiling_s > c.step_ceiling_s
    assert "declared maximum" in declared.ceiling.work
    # written to and read back from result.json
    again = TrialResult.model_validate_json(result.model_dump_json())
    assert again.ceiling == c


def test_a_step_faster_than_its_ceiling_is_flagged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    hardware = Hardware(gpus=(H100,), host=HOST)
    ceilings = TrialCeilings.for_study(Settings(resolve_model("Qwen2.5-7B"), hardware, global_batch=64))
    assert ceilings is not None
    result = ceilings.attach(_result(1e-4))
    assert result.ceiling is not None and result.ceiling.beats_ceiling


def test_a_cpu_study_measures_host_peaks_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    calls: list[float] = []
    fake = MeasuredPeaks(CPU_DEVICE, 5e10, 1e10, None, None, 1, machine_id(), "2026-01-01T00:00:00+00:00")

    def measure(seconds: float) -> MeasuredPeaks:
        calls.append(seconds)
        return fake

    monkeypatch.setattr("autotune.estimate.measure_host_peaks", measure)
    settings = Settings(resolve_model("Qwen2.5-0.5B"), Hardware(gpus=(), host=HOST))
    for _ in range(2):  # two studies on one machine: the second reads the cache
        ceilings = TrialCeilings.for_study(settings)
        assert ceilings is not None
        c = ceilings.attach(_result(30.0)).ceiling
        assert c is not None and c.basis_source == "measured" and "cpu" in c.basis
    assert len(calls) == 1 and cached_peaks(CPU_DEVICE) == fake


def test_measured_peaks_of_the_gpu_replace_the_catalog(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    store_peaks(
        MeasuredPeaks(
            H100.name, 6e14, 2.8e12, 5e10, None, 1, machine_id((H100.name,)), "2026-01-01T00:00:00+00:00"
        )
    )
    ceilings = TrialCeilings.for_study(
        Settings(resolve_model("Qwen2.5-0.5B"), Hardware(gpus=(H100,), host=HOST))
    )
    assert ceilings is not None and ceilings.basis.source == "measured" and ceilings.basis.flops_per_s == 6e14


def test_no_ceiling_without_architecture_or_steps() -> None:
    unknown = ModelRef(name="org/x", path_or_id="org/x", local=False, facts={})
    assert TrialCeilings.for_study(Settings(unknown, Hardware(gpus=(H100,), host=HOST))) is None
    ceilings = TrialCeilings.for_study(
        Settings(resolve_model("Qwen2.5-0.5B"), Hardware(gpus=(H100,), host=HOST))
    )
    assert ceilings is not None
    failed = _result(1.0).model_copy(update={"steady": None, "status": TrialStatus.OOM})
    assert ceilings.attach(failed).ceiling is None


def test_phase_split_only_from_the_framework_or_markers() -> None:
    inferred = _result(4.0, phases={"rollout": 1.0})
    assert inferred.timeline_summary is not None
    inferred.timeline_summary = replace(
        inferred.timeline_summary, phases=replace(inferred.timeline_summary.phases, source="inferred")
    )
    assert measured_phase_seconds(inferred) == {}
    assert measured_phase_seconds(_result(4.0, phases={"rollout": 3.0, "train": 1.0, "other": 0.0})) == {
        "rollout": 3.0,
        "train": 1.0,
        "other": 0.0,
    }


def test_the_gate_bounds_a_configuration_by_its_ceiling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autotune.estimate import PeakBasis, find_gpu, step_ceiling_s
    from autotune.study.memory_gate import EstimatorGate

    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    hardware = Hardware(gpus=(H100, H100.model_copy(update={"index": 1})), host=HOST)
    job = {"global_batch": 16, "num_generations": 4, "max_completion_length": 256}
    gate = EstimatorGate.build(
        hardware,
        resolve_model("Qwen2.5-0.5B"),
        "trl",
        job,
        lambda p: {"world_size": 2, "gradient_accumulation_steps": 2},
    )
    assert gate is not None
    params = {"per_device_train_batch_size": 4, "use_vllm": True}
    shape = gate._shape(params)
    gpu = find_gpu("H100")
    assert gpu is not None
    bound = gate.ceiling_s(params)
    assert bound == step_ceiling_s(shape, PeakBasis.from_gpu(gpu))
    assert 0 < bound < sum(gate.phase_times(params).values())  # the gate's own prediction is slower


def test_an_unknown_gpu_gets_no_ceiling_until_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    odd = GpuInfo(index=0, name="NVIDIA Future 9000", memory_total_bytes=200 * 2**30)
    settings = Settings(resolve_model("Qwen2.5-0.5B"), Hardware(gpus=(odd,), host=HOST))
    assert TrialCeilings.for_study(settings) is None  # its peaks would be a guess, not a bound
    store_peaks(
        MeasuredPeaks(odd.name, 2e15, 8e12, 1e11, None, 1, machine_id((odd.name,)), "2026-01-01T00:00Z")
    )
    ceilings = TrialCeilings.for_study(settings)
    assert ceilings is not None and ceilings.basis.source == "measured" and ceilings.basis.flops_per_s == 2e15
