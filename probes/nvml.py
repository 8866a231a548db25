"""GPU detection and sampling through NVML (``nvidia-ml-py``, imported as ``pynvml``).

Every NVML call goes through one gate. Initialisation failures raise :class:`NvmlUnavailable`.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = ["NvmlUnavailable", "DeviceFacts", "GpuDetection", "detect_gpus", "load_nvml"]


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
    return pynvml


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def detect_gpus(nvml: ModuleType | None = None) -> GpuDetection:
    """Initialise NVML and list the GPUs. Raises :class:`NvmlUnavailable` with the reason."""
    nvml = nvml or load_nvml()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(f"NVML could not start: {exc}") from exc
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
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - an optional fact; detection goes on without it
        return None
