"""NVML itself (``nvidia-ml-py``, imported as ``pynvml``): loading the library, finding the GPUs, the
one-shot queries (memory used, the processes on a GPU), and the gate every call of the sampler
(:class:`autotune.probes.nvml.NvmlSampler`) goes through. :mod:`autotune.probes.nvml` exports them.

Every NVML call of the sampler goes through one gate, :class:`NvmlGate`: a metric the GPU or driver
does not support becomes None and is reported once in ``warnings``; a lost GPU stops being asked and
its later rows are empty; any other failed read is None for that sample only. Nothing raised by a read
can end the sampling thread. Initialisation failures (no library, no driver, a GPU index that does not
exist) raise one :class:`NvmlUnavailable` at ``start()``, whose ``str()`` the CLI prints as one line.

GPU indices are NVML indices (the order of ``nvidia-smi``), not indices inside ``CUDA_VISIBLE_DEVICES``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = [
    "DeviceFacts",
    "GpuDetection",
    "NvmlGate",
    "NvmlUnavailable",
    "detect_gpus",
    "device_handles",
    "gpu_processes",
    "load_nvml",
    "memory_used",
    "nvml_init",
    "nvml_shutdown",
]

log = logging.getLogger(__name__)


class NvmlUnavailable(Exception):
    """NVML cannot be used here (no library, no driver, init failed). ``str()`` says why."""


@dataclass(frozen=True)
class DeviceFacts:
    """One GPU as NVML reports it. ``nvidia-smi --query-gpu=index,name,uuid,memory.total,compute_cap``."""

    index: int
    name: str
    uuid: str | None
    memory_total_bytes: int
    compute_capability: str | None


@dataclass(frozen=True)
class GpuDetection:
    driver_version: str | None
    cuda_driver_version: str | None
    devices: tuple[DeviceFacts, ...]


def load_nvml() -> ModuleType:
    """Import the ``pynvml`` module of ``nvidia-ml-py``."""
    try:
        import pynvml  # provided by nvidia-ml-py
    except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a core dependency
        raise NvmlUnavailable(f"nvidia-ml-py is not installed ({exc})") from exc
    module: ModuleType = pynvml  # the import is untyped (Any): the annotation states what it is
    return module


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def nvml_init(nvml: ModuleType) -> None:
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(
            f"NVML could not start: {exc}; install or load the NVIDIA driver, or run on CPU"
        ) from exc


def nvml_shutdown(nvml: ModuleType) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - nothing useful to do when shutdown fails
        pass


def detect_gpus(nvml: ModuleType | None = None) -> GpuDetection:
    """Initialise NVML and list the GPUs. Raises :class:`NvmlUnavailable` with the reason."""
    nvml = nvml or load_nvml()
    nvml_init(nvml)
    try:
        driver = _safe(lambda: _text(nvml.nvmlSystemGetDriverVersion()))
        cuda = _safe(lambda: nvml.nvmlSystemGetCudaDriverVersion_v2())
        cuda_s = f"{cuda // 1000}.{(cuda % 1000) // 10}" if isinstance(cuda, int) else None
        devices = []
        for i in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            mem = nvml.nvmlDeviceGetMemoryInfo(handle)
            cc = _safe(lambda h=handle: nvml.nvmlDeviceGetCudaComputeCapability(h))
            devices.append(
                DeviceFacts(
                    index=i,
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    uuid=_safe(lambda h=handle: _text(nvml.nvmlDeviceGetUUID(h))),
                    memory_total_bytes=int(mem.total),
                    compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
                )
            )
        return GpuDetection(driver_version=driver, cuda_driver_version=cuda_s, devices=tuple(devices))
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML failed while listing GPUs: {exc}") from exc
    finally:
        nvml_shutdown(nvml)


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - an optional fact; detection goes on without it
        return None


def device_handles(nvml: ModuleType, indices: Sequence[int]) -> dict[int, Any]:
    """Handles of the requested GPUs; NvmlUnavailable naming the visible range when one is missing."""
    out: dict[int, Any] = {}
    for index in indices:
        try:
            out[index] = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError as exc:
            count = _safe(nvml.nvmlDeviceGetCount)
            seen = f"NVML sees {count} GPU(s)" if isinstance(count, int) else "NVML lists no GPUs"
            raise NvmlUnavailable(
                f"GPU {index} cannot be opened ({exc}); {seen}: pick indices from 0"
            ) from exc
    return out


def _binding_errors(nvml: ModuleType) -> tuple[type[BaseException], ...]:
    """NVML errors plus the binding's own: ``nvmlDeviceGetComputeRunningProcesses`` raises
    ``NVMLLibraryMismatchError`` (not an NVMLError) when the driver lacks the versioned function."""
    return (nvml.NVMLError, _error_class(nvml, "NVMLLibraryMismatchError"), AttributeError)


def gpu_processes(
    indices: Sequence[int], nvml: ModuleType | None = None
) -> dict[int, list[tuple[int, int | None]]]:
    """The compute processes on each GPU: ``{index: [(pid, used_bytes or None), ...]}``.

    ``used_bytes`` is None where the driver cannot attribute memory (MIG, some containers). Used by
    the study to prove a GPU is free before the next trial.

    Raises:
        NvmlUnavailable: NVML cannot start, a GPU cannot be opened, or its process list cannot be read
            (a hygiene check must not pass on a GPU it could not look at).
    """
    nvml = nvml or load_nvml()
    nvml_init(nvml)
    try:
        out: dict[int, list[tuple[int, int | None]]] = {}
        for index, handle in device_handles(nvml, indices).items():
            try:
                procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except _binding_errors(nvml) as exc:
                raise NvmlUnavailable(f"GPU {index}: cannot list its processes ({exc})") from exc
            out[index] = [
                (int(p.pid), int(p.usedGpuMemory) if p.usedGpuMemory is not None else None) for p in procs
            ]
        return out
    finally:
        nvml_shutdown(nvml)


def memory_used(indices: Sequence[int], nvml: ModuleType | None = None) -> dict[int, int]:
    """Device memory in use on each GPU, in bytes (``nvidia-smi --query-gpu=memory.used``).

    Raises:
        NvmlUnavailable: NVML cannot start, or a GPU cannot be opened or read.
    """
    nvml = nvml or load_nvml()
    nvml_init(nvml)
    try:
        out: dict[int, int] = {}
        for index, handle in device_handles(nvml, indices).items():
            try:
                out[index] = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
            except _binding_errors(nvml) as exc:
                raise NvmlUnavailable(f"GPU {index}: cannot read its memory ({exc})") from exc
        return out
    finally:
        nvml_shutdown(nvml)


# ----------------------------------------------------------------------------------------- gate
def _error_class(nvml: ModuleType, name: str) -> type[BaseException]:
    cls = getattr(nvml, name, None)
    if isinstance(cls, type) and issubclass(cls, BaseException):
        return cls

    class _Never(Exception):  # a binding without this error class: nothing matches it
        pass

    return _Never


class NvmlGate:
    """The one place NVML reads pass through. Never raises.

    * NotSupported, FunctionNotFound, NoPermission, or any non-NVML exception (a binding mismatch
      such as ``NVMLLibraryMismatchError``, a function this ``nvidia-ml-py`` lacks, a wrong call): the
      (GPU, metric) pair is switched off - later reads return None without calling NVML - and one
      warning per metric and reason is recorded;
    * GpuIsLost: the GPU is marked lost, every later read on it returns None, one warning;
    * NotFound where ``missing_ok`` (the driver's sample buffer has nothing new): None, no warning;
    * any other NVMLError (Unknown, Timeout, ...): None for this read only, one warning per metric.

    Thread safety: used by one sampling thread; ``warnings`` may be read from others (appends only).
    ``lost`` (GPU indices) is for reading only.

    Args:
        nvml: the ``pynvml`` module (or a fake built from it).
    """

    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml
        self.warnings: list[str] = []
        self.lost: set[int] = set()
        self._off: set[tuple[int, str]] = set()
        self._warned: set[tuple[Any, ...]] = set()
        self._nvml_error = _error_class(nvml, "NVMLError")
        self._gpu_lost = _error_class(nvml, "NVMLError_GpuIsLost")
        self._not_found = _error_class(nvml, "NVMLError_NotFound")
        self._permanent = (
            _error_class(nvml, "NVMLError_NotSupported"),
            _error_class(nvml, "NVMLError_FunctionNotFound"),
            _error_class(nvml, "NVMLError_NoPermission"),
        )

    def warn_once(self, key: tuple[Any, ...], message: str) -> None:
        """Record ``message`` unless a warning with the same ``key`` was recorded before."""
        if key in self._warned:
            return
        self._warned.add(key)
        self.warnings.append(message)
        log.warning("%s", message)

    def enabled(self, device: int, metric: str) -> bool:
        """False once the metric is off for this GPU or the GPU is lost."""
        return device not in self.lost and (device, metric) not in self._off

    def disable(self, device: int, metric: str) -> None:
        """Stop asking for ``metric`` on ``device`` (e.g. GPM on a pre-Hopper GPU)."""
        self._off.add((device, metric))

    def call(
        self,
        device: int,
        metric: str,
        fn_name: str,
        *args: object,
        missing_ok: bool = False,
        fallback: str | None = None,
    ) -> Any:
        """``nvml.<fn_name>(*args)`` or None; see the class docstring for what each failure does.

        The function is looked up inside the gate, so one missing from an older ``nvidia-ml-py``
        switches its metric off like a function missing from the driver. ``fallback`` is what the
        warning says happens instead when the metric is switched off (default: the column stays empty).
        """
        if (self._off or self.lost) and (device in self.lost or (device, metric) in self._off):
            return None
        try:
            return getattr(self.nvml, fn_name)(*args)
        except Exception as exc:  # noqa: BLE001 - sorted out by failed(); nothing ends sampling
            self.failed(device, metric, exc, missing_ok=missing_ok, fallback=fallback)
        return None

    def failed(
        self,
        device: int,
        metric: str,
        exc: Exception,
        *,
        missing_ok: bool = False,
        fallback: str | None = None,
    ) -> None:
        """Record what a failed read of ``metric`` on ``device`` means (see the class docstring).

        :meth:`call` uses it; so does a caller that binds an NVML function once and calls it itself
        on its hot path (the same outcome as going through :meth:`call`, without the lookup).
        """
        if isinstance(exc, self._gpu_lost):
            self.lost.add(device)
            self.warn_once(("lost", device), f"GPU {device} was lost ({exc}); its later samples are empty")
        elif isinstance(exc, self._permanent):
            self._off.add((device, metric))
            consequence = fallback or (
                "only polled values are recorded" if metric.endswith("_samples") else "the column stays empty"
            )
            self.warn_once(
                (metric, type(exc).__name__),
                f"{metric}: not available on GPU {device} ({exc}); {consequence}",
            )
        elif isinstance(exc, self._not_found):
            if not missing_ok:
                self.warn_once(
                    (metric, "NotFound"), f"{metric}: GPU {device} returned Not Found; read skipped"
                )
        elif isinstance(exc, self._nvml_error):
            self.warn_once(
                (metric, "transient", type(exc).__name__),
                f"{metric}: read failed on GPU {device} ({exc}); that sample is empty, sampling goes on",
            )
        else:  # a binding mismatch or a bug: switched off, it would fail again
            self._off.add((device, metric))
            self.warn_once(
                (metric, "error", type(exc).__name__),
                f"{metric}: unexpected {type(exc).__name__} on GPU {device} ({exc}); "
                f"{fallback or 'the column stays empty'}",
            )
