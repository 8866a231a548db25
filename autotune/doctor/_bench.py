"""``autotune doctor --bench``: this machine's real peaks, cached for the estimator and the ceiling.

On GPUs (torch imported here, only for ``--bench``): dense bf16 matmul FLOP/s, device memory bandwidth
(a device-to-device copy: each byte read once and written once), pinned host→device bandwidth, and on
2+ GPUs the all-reduce bus bandwidth (NCCL, in subprocesses: :mod:`autotune.doctor._allreduce`). On a
machine without GPU the host's own (``estimate.peaks.measure_host_peaks``). Either way the record is
stored with ``estimate.peaks.store_peaks``, where ``plan``, ``search`` and the report read it.

Each rate is the best of repeated timed runs after a warm-up, for about ``seconds`` each (a peak, as
``estimate.peaks`` counts it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.doctor._allreduce import measure_allreduce
from autotune.doctor._base import Facts, Finding, Status
from autotune.errors import WriteError
from autotune.estimate import MeasuredPeaks, machine_id, measure_host_peaks, store_peaks
from autotune.jsontypes import JsonObject

__all__ = ["BenchOutcome", "GpuPeakNumbers", "measure_gpu_peaks", "run_bench"]

MATMUL_N = 8192  # bf16 8192² matmuls: large enough to reach the tensor cores' dense peak
COPY_BYTES = 1 << 30  # 1 GiB copied device to device
HOST_BYTES = 256 << 20  # 256 MiB pinned host buffer
ALLREDUCE_BYTES = 256 << 20  # nccl-tests' large-message regime


@dataclass(frozen=True)
class GpuPeakNumbers:
    """What the GPU micro-benchmarks measured (one GPU; the all-reduce across every visible one)."""

    device: str
    n_devices: int
    matmul_flops_per_s: float
    memory_bytes_per_s: float
    host_to_device_bytes_per_s: float
    allreduce_bus_bytes_per_s: float | None


@dataclass(frozen=True)
class BenchOutcome:
    """The measured record, where it was cached, and the doctor's lines about it."""

    peaks: MeasuredPeaks | None
    cache_path: Path | None
    findings: tuple[Finding, ...]

    def to_dict(self) -> JsonObject:
        from dataclasses import asdict

        return {
            "peaks": asdict(self.peaks) if self.peaks is not None else None,
            "cache_path": str(self.cache_path) if self.cache_path else None,
        }


def _best_rate(work: float, step: Callable[[], None], sync: Callable[[], None], seconds: float) -> float:
    """``work`` units per second of the fastest of repeated ``step()`` calls after one warm-up (a peak,
    as ``estimate.peaks`` counts: a busy neighbour can only lower it)."""
    step()
    sync()
    best = float("inf")
    deadline = time.perf_counter() + seconds
    repeats = 0
    while repeats < 3 or time.perf_counter() < deadline:
        t0 = time.perf_counter()
        step()
        sync()
        best = min(best, time.perf_counter() - t0)
        repeats += 1
    return work / max(best, 1e-9)


def _matmul_rate(torch: Any, dev: Any, seconds: float) -> float:  # pragma: no cover - needs a GPU
    a = torch.randn(MATMUL_N, MATMUL_N, device=dev, dtype=torch.bfloat16)
    b = torch.randn(MATMUL_N, MATMUL_N, device=dev, dtype=torch.bfloat16)
    c = torch.empty_like(a)
    return _best_rate(2.0 * MATMUL_N**3, lambda: torch.matmul(a, b, out=c), torch.cuda.synchronize, seconds)


def _copy_rate(torch: Any, dev: Any, seconds: float) -> float:  # pragma: no cover - needs a GPU
    src = torch.empty(COPY_BYTES, dtype=torch.uint8, device=dev)
    dst = torch.empty_like(src)
    return _best_rate(2.0 * COPY_BYTES, lambda: dst.copy_(src), torch.cuda.synchronize, seconds)


def _host_to_device_rate(torch: Any, dev: Any, seconds: float) -> float:  # pragma: no cover - needs a GPU
    host = torch.empty(HOST_BYTES, dtype=torch.uint8, pin_memory=True)
    target = torch.empty(HOST_BYTES, dtype=torch.uint8, device=dev)
    return _best_rate(
        float(HOST_BYTES), lambda: target.copy_(host, non_blocking=True), torch.cuda.synchronize, seconds
    )


def measure_gpu_peaks(n_devices: int, seconds: float) -> GpuPeakNumbers:  # pragma: no cover - needs a GPU
    """Measure GPU 0 of this process (and the all-reduce across ``n_devices``). Each benchmark's buffers
    are freed before the next one allocates."""
    import torch

    dev = torch.device("cuda", 0)
    flops = _matmul_rate(torch, dev, seconds)
    memory = _copy_rate(torch, dev, seconds)
    h2d = _host_to_device_rate(torch, dev, seconds)
    torch.cuda.empty_cache()
    allreduce = (
        measure_allreduce(n_devices, backend="nccl", nbytes=ALLREDUCE_BYTES, seconds=seconds)
        if n_devices >= 2
        else None
    )
    return GpuPeakNumbers(
        device=torch.cuda.get_device_name(dev),
        n_devices=n_devices,
        matmul_flops_per_s=flops,
        memory_bytes_per_s=memory,
        host_to_device_bytes_per_s=h2d,
        allreduce_bus_bytes_per_s=allreduce,
    )


def _gpu_record(numbers: GpuPeakNumbers, gpu_names: tuple[str, ...]) -> MeasuredPeaks:
    """The GPUs' numbers as ``estimate.peaks``' record, keyed by this machine and its GPUs' NVML names
    (the name ``plan`` and the ceiling look the GPU up by)."""
    from datetime import datetime, timezone

    return MeasuredPeaks(
        device=gpu_names[0],
        matmul_flops_per_s=numbers.matmul_flops_per_s,
        memory_bytes_per_s=numbers.memory_bytes_per_s,
        host_to_device_bytes_per_s=numbers.host_to_device_bytes_per_s,
        allreduce_bus_bytes_per_s=numbers.allreduce_bus_bytes_per_s,
        n_devices=numbers.n_devices,
        machine_id=machine_id(gpu_names),
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


def _lines(peaks: MeasuredPeaks, path: Path) -> tuple[Finding, ...]:
    def rate(v: float | None, unit: str, scale: float) -> str:
        return "—" if v is None else f"{v / scale:,.1f} {unit}"

    flops = peaks.matmul_flops_per_s
    matmul = rate(flops, "TFLOP/s", 1e12) if flops >= 1e12 else rate(flops, "GFLOP/s", 1e9)
    detail = (
        f"{peaks.device} x{peaks.n_devices}: matmul {matmul}, "
        f"memory {rate(peaks.memory_bytes_per_s, 'GB/s', 1e9)}, "
        f"host→device {rate(peaks.host_to_device_bytes_per_s, 'GB/s', 1e9)}, "
        f"all-reduce bus {rate(peaks.allreduce_bus_bytes_per_s, 'GB/s', 1e9)}; cached in {path}"
    )
    return (Finding("bench", Status.OK, detail),)


def run_bench(
    facts: Facts,
    *,
    seconds: float = 3.0,
    cache_dir: Path | None = None,
    host: Callable[[float], MeasuredPeaks] = measure_host_peaks,
    gpu: Callable[[int, float], GpuPeakNumbers] = measure_gpu_peaks,
) -> BenchOutcome:
    """Measure this machine's peaks (the GPUs' where ``facts`` has GPUs, else the host's) and cache them.

    A benchmark that fails is a ``fail`` line naming it; the cache keeps what it held.

    Args:
        facts: the doctor's facts (which GPUs this process may use).
        seconds: about how long each micro-benchmark runs.
        cache_dir: where the record goes (default: ``store_peaks``'s).
        host: the host's measurement (tests pass a fake).
        gpu: the GPUs' measurement (tests pass a fake).
    """
    try:
        if facts.gpus:
            peaks = _gpu_record(gpu(len(facts.gpus), seconds), tuple(g.name for g in facts.gpus))
        else:
            peaks = host(seconds)
    except Exception as exc:  # noqa: BLE001 - a benchmark that breaks is reported, not raised
        where = "GPU" if facts.gpus else "host"
        finding = Finding(
            "bench",
            Status.FAIL,
            f"the {where} benchmark failed ({type(exc).__name__}: {exc})",
            "Run `autotune doctor` without --bench and fix what it reports first; "
            "plan keeps using the catalog's peaks",
        )
        return BenchOutcome(None, None, (finding,))
    try:
        path = store_peaks(peaks, cache_dir)
    except WriteError as exc:  # measured, but not kept: the cache is the problem, not the machine
        finding = Finding(
            "bench",
            Status.FAIL,
            f"measured, but the peaks cannot be cached: {exc.message}",
            "Set AUTOTUNE_CACHE_DIR to a folder this user can write (or make that one writable), then run "
            "`autotune doctor --bench` again; until then plan uses the catalog's peaks",
        )
        return BenchOutcome(peaks, None, (finding,))
    return BenchOutcome(peaks, path, _lines(peaks, path))
