"""Measured peaks of this machine: what its matmul units and memory actually reach, cached per machine.

The estimator and the ceiling (:mod:`autotune.estimate.ceiling`) use catalog peaks by default; a machine
whose peaks were measured (``measure_host_peaks`` on the CPU, ``autotune doctor --bench`` on GPUs) uses
its own numbers instead. One JSON file per machine and device lives under ``<cache>/peaks/`` (the cache
is ``$AUTOTUNE_CACHE_DIR``, else ``$XDG_CACHE_HOME/autotune``, else ``~/.cache/autotune``).

Conventions (what a number means):
    * ``matmul_flops_per_s``: ``2·n³`` FLOPs per ``n×n`` matrix product over its wall time, the best of
      several repeats (a peak, not an average).
    * ``memory_bytes_per_s``: a copy of a buffer far larger than the caches, counted as STREAM counts its
      *copy* kernel: bytes read plus bytes written, best of several repeats.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import re
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from autotune.affinity import usable_cores
from autotune.jsontypes import JsonObject

__all__ = [
    "CPU_DEVICE",
    "MeasuredPeaks",
    "cached_peaks",
    "machine_id",
    "measure_host_peaks",
    "peaks_cache_dir",
    "store_peaks",
]

log = logging.getLogger(__name__)

CPU_DEVICE = "cpu"
_FORMAT_VERSION = 1
_MATMUL_N = 512  # large enough for a BLAS to reach its peak on a CPU core, small enough to repeat
_COPY_BYTES = 64 * 1024 * 1024  # far beyond any last-level cache
_CPUINFO = Path("/proc/cpuinfo")


@dataclass(frozen=True)
class MeasuredPeaks:
    """Peaks one machine reached in micro-benchmarks.

    Attributes:
        device: ``"cpu"`` or the GPU's name as NVML gives it.
        matmul_flops_per_s: dense matmul FLOP/s (bf16 on a GPU, fp32 on the CPU).
        memory_bytes_per_s: device (or host RAM) copy bandwidth, bytes read + written per second.
        host_to_device_bytes_per_s: pinned host-to-device bandwidth; None on the CPU.
        allreduce_bus_bytes_per_s: NCCL/gloo all-reduce bus bandwidth; None with one device.
        n_devices: devices measured (1 for the CPU).
        machine_id: what the cache is keyed by (hostname + CPU/GPU identity).
        measured_at: when, ISO-8601 UTC.
    """

    device: str
    matmul_flops_per_s: float
    memory_bytes_per_s: float
    host_to_device_bytes_per_s: float | None
    allreduce_bus_bytes_per_s: float | None
    n_devices: int
    machine_id: str
    measured_at: str

    def to_dict(self) -> JsonObject:
        """The JSON form stored in the cache."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: object) -> MeasuredPeaks:
        """Read the JSON form back.

        Raises:
            ValueError: a field is missing, of the wrong type, or not a positive number.
        """
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        missing = [f.name for f in fields(cls) if f.name not in data]
        if missing:
            raise ValueError(f"missing {', '.join(missing)}")
        for name in ("device", "machine_id", "measured_at"):
            if not isinstance(data[name], str) or not data[name]:
                raise ValueError(f"{name} is not a non-empty string")
        matmul = _positive(data["matmul_flops_per_s"], "matmul_flops_per_s")
        memory = _positive(data["memory_bytes_per_s"], "memory_bytes_per_s")
        host_to_device, allreduce = (
            None if data[name] is None else _positive(data[name], name)
            for name in ("host_to_device_bytes_per_s", "allreduce_bus_bytes_per_s")
        )
        n = data["n_devices"]
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError("n_devices is not a positive integer")
        return cls(
            device=data["device"],
            matmul_flops_per_s=matmul,
            memory_bytes_per_s=memory,
            host_to_device_bytes_per_s=host_to_device,
            allreduce_bus_bytes_per_s=allreduce,
            n_devices=n,
            machine_id=data["machine_id"],
            measured_at=data["measured_at"],
        )


def _positive(value: object, name: str) -> float:
    """``value`` as a float when it is a finite number above 0 (not a bool), else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ValueError(f"{name} is not a positive number")
    return float(value)


# ------------------------------------------------------------------------------------------ identity


def _cpu_model(cpuinfo: Path = _CPUINFO) -> str:
    """The CPU's model name from ``cpuinfo`` (Linux), else the platform's processor or machine name."""
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    found = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return (found.group(1).strip() if found else platform.processor()) or platform.machine() or "cpu"


def machine_id(gpu_names: tuple[str, ...] = ()) -> str:
    """What this machine's peaks are keyed by: hostname, CPU model and cores, and its GPUs (if given).

    Args:
        gpu_names: NVML names of the GPUs measured (empty for the host's own peaks).
    """
    parts = [socket.gethostname() or "localhost", f"{_cpu_model()} x{os.cpu_count() or 1}"]
    if gpu_names:
        parts.append(f"{len(gpu_names)}x {'+'.join(sorted(set(gpu_names)))}")
    return " | ".join(parts)


def peaks_cache_dir(cache_dir: Path | None = None) -> Path:
    """The folder the peaks files live in (``<cache>/peaks``)."""
    from autotune.cachedir import default_cache_dir

    return (cache_dir if cache_dir is not None else default_cache_dir()) / "peaks"


def _file_name(device: str) -> str:
    host = re.sub(r"[^A-Za-z0-9.-]+", "-", socket.gethostname() or "localhost").strip("-")[:40]
    key = hashlib.sha256(f"{machine_id()}\0{device}".encode()).hexdigest()[:16]
    return f"{host or 'host'}-{key}.json"


# ------------------------------------------------------------------------------------------ measuring


def _best_rate(
    work: float, run: Callable[[], None], seconds: float, clock: Callable[[], float] = time.perf_counter
) -> float:
    """``work`` per second of the fastest of repeated ``run()`` calls: at least 3, then more until
    ``seconds`` have passed by ``clock`` (a run timed at 0 s counts as 1 ns)."""
    run()  # warm-up: allocation, thread pool, first-touch pages
    best = math.inf
    deadline = clock() + seconds
    repeats = 0
    while repeats < 3 or clock() < deadline:
        start = clock()
        run()
        best = min(best, clock() - start)
        repeats += 1
    return work / max(best, 1e-9)


class _Kernels(Protocol):
    """The two timed micro-benchmarks on fp32 operands made once: ``out = a @ b`` (``n×n``) and
    ``dst[:] = src``."""

    def matmul(self) -> None: ...

    def copy(self) -> None: ...


class _TorchKernels:
    """The kernels in torch, on the CPU."""

    def __init__(self, torch: Any, n: int, copy_elems: int) -> None:
        self._mm = torch.mm
        self.a = torch.rand(n, n, dtype=torch.float32)
        self.b = torch.rand(n, n, dtype=torch.float32)
        self.out = torch.empty(n, n, dtype=torch.float32)
        self.src = torch.rand(copy_elems, dtype=torch.float32)
        self.dst = torch.empty_like(self.src)

    def matmul(self) -> None:
        self._mm(self.a, self.b, out=self.out)

    def copy(self) -> None:
        self.dst.copy_(self.src)


class _NumpyKernels:
    """The kernels in numpy (when torch is not installed)."""

    def __init__(self, n: int, copy_elems: int) -> None:
        rng = np.random.default_rng()
        self.a = rng.random((n, n), dtype=np.float32)
        self.b = rng.random((n, n), dtype=np.float32)
        self.out = np.empty((n, n), dtype=np.float32)
        self.src = rng.random(copy_elems, dtype=np.float32)
        self.dst = np.empty_like(self.src)

    def matmul(self) -> None:
        np.matmul(self.a, self.b, out=self.out)

    def copy(self) -> None:
        np.copyto(self.dst, self.src)


def _torch_runs(n: int, copy_elems: int) -> _Kernels | None:
    """The kernels in torch using every usable core, or None when torch is not installed."""
    try:
        import torch
    except ImportError:
        return None
    torch.set_num_threads(_usable_cores())  # the peak of the whole host, whatever OMP_NUM_THREADS says
    return _TorchKernels(torch, n, copy_elems)


def _usable_cores() -> int:
    """Cores this process may run on (:func:`autotune.affinity.usable_cores`), at least one."""
    return len(usable_cores()) or 1


def _torch_threads() -> int | None:
    try:
        import torch
    except ImportError:
        return None
    return int(torch.get_num_threads())


def _set_torch_threads(threads: int | None) -> None:
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


def measure_host_peaks(seconds: float = 3.0) -> MeasuredPeaks:
    """Measure this host's dense fp32 matmul FLOP/s and RAM copy bandwidth (torch if importable, else
    numpy), about ``seconds`` in all.

    Each number is the best of repeats (a peak: a busy neighbour can only lower it, so a shared machine
    under-reports rather than over-reports).
    """
    copy_elems = _COPY_BYTES // 4
    threads = _torch_threads()
    try:
        kernels = _torch_runs(_MATMUL_N, copy_elems) or _NumpyKernels(_MATMUL_N, copy_elems)
        flops = _best_rate(2.0 * _MATMUL_N**3, kernels.matmul, seconds / 2)
        bandwidth = _best_rate(2.0 * _COPY_BYTES, kernels.copy, seconds / 2)
    finally:
        _set_torch_threads(threads)
    return MeasuredPeaks(
        device=CPU_DEVICE,
        matmul_flops_per_s=flops,
        memory_bytes_per_s=bandwidth,
        host_to_device_bytes_per_s=None,
        allreduce_bus_bytes_per_s=None,
        n_devices=1,
        machine_id=machine_id(),
        measured_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


# ------------------------------------------------------------------------------------------ the cache


def store_peaks(peaks: MeasuredPeaks, cache_dir: Path | None = None) -> Path:
    """Write ``peaks`` to this machine's cache (replacing the earlier entry for its device).

    ``peaks.machine_id`` must be this machine's (:func:`machine_id`, given the measured GPUs' NVML
    names for GPU peaks): :func:`cached_peaks` reads only this machine's peaks.

    Returns:
        The file written.

    Raises:
        UsageError: ``peaks`` were not measured on this machine.
        WriteError: the cache cannot be written (set ``AUTOTUNE_CACHE_DIR`` to a writable folder).
    """
    from autotune.errors import UsageError
    from autotune.studydir import write_json_atomic

    if not peaks.machine_id.startswith(machine_id()):
        raise UsageError(
            f"peaks of {peaks.machine_id!r} are not this machine's ({machine_id()!r})",
            hint="Measure on this machine; give GPU peaks machine_id(gpu_names)",
        )

    path = peaks_cache_dir(cache_dir) / _file_name(peaks.device)
    write_json_atomic(path, {"version": _FORMAT_VERSION, "peaks": peaks.to_dict()})
    return path


def _read(path: Path) -> MeasuredPeaks | None:
    """The peaks in ``path``, or None (with a logged note) when the file is damaged."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or data.get("version") != _FORMAT_VERSION:
            raise ValueError(f"not a version-{_FORMAT_VERSION} peaks file")
        return MeasuredPeaks.from_dict(data.get("peaks"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        log.warning("ignoring the damaged peaks cache %s (%s); measure again to replace it", path, exc)
        return None


def cached_peaks(device: str | None = None, cache_dir: Path | None = None) -> MeasuredPeaks | None:
    """This machine's measured peaks for ``device`` (``"cpu"``, or a GPU's NVML name), or None.

    Args:
        device: the device; None: the most recently measured device of this machine.
        cache_dir: the cache root (default: ``$AUTOTUNE_CACHE_DIR``, else ``~/.cache/autotune``).

    A damaged file is ignored with a logged note (never an exception); peaks measured on another
    machine (a cache folder shared over NFS) are not used.
    """
    folder = peaks_cache_dir(cache_dir)
    if device is not None:
        paths = [folder / _file_name(device)]
    else:
        try:
            paths = sorted(folder.glob("*.json"))
        except OSError:
            return None
    me = machine_id()
    found = [
        p
        for p in (_read(path) for path in paths if path.is_file())
        if p is not None and (device is None or p.device == device) and p.machine_id.startswith(me)
    ]
    return max(found, key=lambda p: p.measured_at, default=None)
