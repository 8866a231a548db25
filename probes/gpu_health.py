"""What ``autotune doctor`` reads of each GPU before a study: who holds it, and the modes that change
what a trial can do on it (MIG, persistence, ECC, clock-event reasons).

Every read goes through :class:`~autotune.probes.nvml.NvmlGate`: a query the GPU or driver does not
support is None (and one line in ``warnings``), never an exception. Initialisation failures raise
:class:`~autotune.probes.nvml.NvmlUnavailable`, like every other NVML entry point.

``nvidia-smi`` equivalents: ``--query-gpu=memory.used,utilization.gpu,mig.mode.current,
persistence_mode,ecc.mode.current,ecc.errors.uncorrected.volatile.total,clocks_event_reasons.active``
and ``--query-compute-apps=pid,used_memory``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Any

from autotune.probes.nvml import NvmlGate, NvmlUnavailable, detect_gpus, load_nvml

__all__ = ["GpuHealth", "HealthReading", "read_gpu_health", "CLOCK_EVENT_NAMES"]

#: clock-event (throttle) reason bits (``nvmlClocksEventReason*``) that slow a GPU down, by name;
#: idle (0x1), application clocks (0x2) and sync boost (0x10) are not a slowdown
CLOCK_EVENT_NAMES: dict[int, str] = {
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
}


@dataclass(frozen=True)
class GpuHealth:
    """One GPU's state as the doctor reads it. None: the driver would not say.

    Attributes:
        index: NVML index (``nvidia-smi``'s number).
        name: product name.
        uuid: ``GPU-…`` identifier.
        memory_total_bytes: device memory.
        memory_used_bytes: device memory in use by anyone.
        gpu_util_pct: percent of the last sample period a kernel ran.
        processes: compute processes on it, ``(pid, used_bytes or None)``.
        mig_enabled: MIG mode currently on.
        persistence_enabled: persistence mode on.
        ecc_enabled: ECC currently on.
        ecc_uncorrected_volatile: uncorrected ECC errors since the driver loaded.
        clock_event_reasons: the active clock-event reason bits.
    """

    index: int
    name: str
    uuid: str | None
    memory_total_bytes: int
    memory_used_bytes: int | None
    gpu_util_pct: int | None
    processes: tuple[tuple[int, int | None], ...] | None
    mig_enabled: bool | None
    persistence_enabled: bool | None
    ecc_enabled: bool | None
    ecc_uncorrected_volatile: int | None
    clock_event_reasons: int | None


@dataclass(frozen=True)
class HealthReading:
    """The driver and every GPU NVML lists, with the gate's warnings (queries the driver refused)."""

    driver_version: str | None
    cuda_driver_version: str | None
    gpus: tuple[GpuHealth, ...]
    warnings: tuple[str, ...]


def _first(value: object) -> Any:
    """The current mode of a ``[current, pending]`` answer (MIG, ECC)."""
    if isinstance(value, (list, tuple)):
        return value[0] if value else None
    return value


def _one(gate: NvmlGate, index: int, handle: object, name: str, uuid: str | None, total: int) -> GpuHealth:
    nvml = gate.nvml
    mem = gate.call(index, "memory", "nvmlDeviceGetMemoryInfo", handle)
    util = gate.call(index, "utilization", "nvmlDeviceGetUtilizationRates", handle)
    procs = gate.call(index, "processes", "nvmlDeviceGetComputeRunningProcesses", handle)
    mig = _first(gate.call(index, "mig_mode", "nvmlDeviceGetMigMode", handle))
    persistence = gate.call(index, "persistence_mode", "nvmlDeviceGetPersistenceMode", handle)
    ecc = _first(gate.call(index, "ecc_mode", "nvmlDeviceGetEccMode", handle))
    ecc_errors = (
        gate.call(
            index,
            "ecc_errors",
            "nvmlDeviceGetTotalEccErrors",
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        )
        if ecc
        else None
    )
    reasons = gate.call(index, "clock_events", "nvmlDeviceGetCurrentClocksEventReasons", handle)
    return GpuHealth(
        index=index,
        name=name,
        uuid=uuid,
        memory_total_bytes=total,
        memory_used_bytes=int(mem.used) if mem is not None else None,
        gpu_util_pct=int(util.gpu) if util is not None else None,
        processes=None
        if procs is None
        else tuple(
            (int(p.pid), int(p.usedGpuMemory) if p.usedGpuMemory is not None else None) for p in procs
        ),
        mig_enabled=None if mig is None else bool(mig == getattr(nvml, "NVML_DEVICE_MIG_ENABLE", 1)),
        persistence_enabled=None
        if persistence is None
        else bool(persistence == getattr(nvml, "NVML_FEATURE_ENABLED", 1)),
        ecc_enabled=None if ecc is None else bool(ecc == getattr(nvml, "NVML_FEATURE_ENABLED", 1)),
        ecc_uncorrected_volatile=int(ecc_errors) if ecc_errors is not None else None,
        clock_event_reasons=int(reasons) if reasons is not None else None,
    )


def read_gpu_health(nvml: ModuleType | None = None) -> HealthReading:
    """Read every GPU NVML lists (``CUDA_VISIBLE_DEVICES`` is the caller's to apply).

    Raises:
        NvmlUnavailable: NVML cannot start or cannot list the GPUs.
    """
    nvml = nvml or load_nvml()
    detection = detect_gpus(nvml)
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:  # it started a moment ago for detect_gpus: the driver went away
        raise NvmlUnavailable(f"NVML could not start: {exc}") from exc
    gate = NvmlGate(nvml)
    try:
        gpus = []
        for dev in detection.devices:
            handle = gate.call(dev.index, "handle", "nvmlDeviceGetHandleByIndex", dev.index)
            if handle is None:
                continue
            gpus.append(_one(gate, dev.index, handle, dev.name, dev.uuid, dev.memory_total_bytes))
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - nothing useful to do when shutdown fails
            pass
    return HealthReading(
        driver_version=detection.driver_version,
        cuda_driver_version=detection.cuda_driver_version,
        gpus=tuple(gpus),
        warnings=tuple(gate.warnings),
    )
