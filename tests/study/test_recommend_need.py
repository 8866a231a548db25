"""The headroom rule judges what a trial needed, not the caching allocator's reserve that NVML sees.

Numbers from the first H200 run (docs/gpu/h200-2026-11-28, trial 5 of the TRL study): NVML's peak was
150,732,668,928 of 150,754,820,096 bytes, so every trial was refused "no headroom" and the study
recommended nothing, while the trainer ran at 98 GB after generate's cache was handed back.
"""

from __future__ import annotations

from autotune.recommend import headroom_bytes, needed_bytes, recommend
from autotune.records import GpuInfo, Hardware, HostInfo, SteadyEstimate, TrialResult, TrialStatus

H200_TOTAL = 150_754_820_096
NVML_PEAK = 150_732_668_928
GIB = 2**30


def _hardware() -> Hardware:
    return Hardware(
        gpus=(GpuInfo(index=0, name="NVIDIA H200", memory_total_bytes=H200_TOTAL),),
        host=HostInfo(
            hostname="h",
            cpu_cores_logical=16,
            cpu_cores_physical=16,
            ram_total_bytes=128 * GIB,
            platform="Linux",
        ),
    )


def _trial(number: int, throughput: float, **memory: int | None) -> TrialResult:
    return TrialResult(
        number=number,
        params={"per_device_train_batch_size": 64},
        status=TrialStatus.COMPLETE,
        reason="completed 3 steps",
        steps=3,
        steady=SteadyEstimate(
            step_time_s=9.0, rel_ci95=0.03, steady_steps=2, warmup_steps=1, throughput=throughput
        ),
        peak_mem_bytes=[NVML_PEAK],
        **memory,
    )


def test_nvml_peak_alone_still_refuses_a_full_gpu() -> None:
    t = _trial(5, 56.8)
    assert needed_bytes(t) == [NVML_PEAK]
    assert recommend([t], _hardware()) is None


def test_allocator_cache_is_room_not_need() -> None:
    t = _trial(5, 56.8, framework_peak_mem_bytes=NVML_PEAK - GIB, framework_alloc_peak_bytes=92 * GIB)
    cache = NVML_PEAK - GIB - 92 * GIB
    assert needed_bytes(t) == [NVML_PEAK - cache]
    assert headroom_bytes(t, _hardware()) == [H200_TOTAL - (NVML_PEAK - cache)]
    rec = recommend([t], _hardware())
    assert rec is not None and rec.trial == 5


def test_a_reserve_without_the_allocated_peak_changes_nothing() -> None:
    t = _trial(5, 56.8, framework_peak_mem_bytes=NVML_PEAK - GIB)  # ms-swift logs its reserve only
    assert needed_bytes(t) == [NVML_PEAK]
    assert recommend([t], _hardware()) is None


def test_a_job_that_really_needed_the_gpu_is_still_refused() -> None:
    t = _trial(
        1, 59.0, framework_peak_mem_bytes=NVML_PEAK - GIB, framework_alloc_peak_bytes=NVML_PEAK - 2 * GIB
    )
    assert recommend([t], _hardware()) is None
