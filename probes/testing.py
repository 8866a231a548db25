"""Test doubles for the probes: a fake NVML built from the real ``pynvml`` module.

:func:`fake_nvml` returns ``unittest.mock.create_autospec`` of the real module (by default of the real
function objects the probes use, :data:`USED_FUNCTIONS`: ten times faster to build) with real constants,
error classes and ctypes structures copied in, and every function answering from :class:`FakeGpu`
state. A call with the wrong arguments fails exactly as it would against the real binding (the
autospec checks each call against the real signature); a call to a function with no behaviour here
raises AttributeError (or, with ``full_module=True``, returns a bare mock); the sampler's gate turns
either into a warning, so tests see it.

Faults are state: ``gpu.not_supported`` (function names raising ``NVMLError_NotSupported``),
``FakeNvml.missing`` (functions raising ``NVMLError_FunctionNotFound``, as with an old driver),
``gpu.lost`` (every call on the GPU raises ``NVMLError_GpuIsLost``), ``driver="no_library"`` /
``"not_loaded"`` (``nvmlInit`` fails). Calls before ``nvmlInit`` raise ``NVMLError_Uninitialized``.

Used by ``tests/probes`` and ``bench/probe_overhead.py``. Imports nothing from ``autotune``.
"""

from __future__ import annotations

import ctypes
import inspect
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, NoReturn
from unittest import mock

__all__ = [
    "FakeGpu",
    "FakeHandle",
    "FakeNvml",
    "fake_nvml",
    "wait_until",
    "plain_functions",
    "GiB",
    "USED_FUNCTIONS",
]

GiB = 1024**3


@dataclass
class FakeGpu:
    """The state one fake GPU reports. Mutate it while a sampler runs to script a timeline.

    Units follow NVML: power in mW, PCIe in KB/s, energy in mJ, clocks in MHz.
    """

    name: str = "NVIDIA H100 80GB HBM3"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    compute_capability: tuple[int, int] = (9, 0)
    memory_total_bytes: int = 80 * GiB
    memory_used_bytes: int = 2 * GiB
    gpu_util_pct: int = 0
    mem_util_pct: int = 0
    power_mw: int = 90_000
    power_limit_mw: int = 700_000
    sm_clock_mhz: int = 1980
    temperature_c: int = 35
    clock_event_reasons: int = 0x1  # idle
    pcie_tx_kb_s: int = 0
    pcie_rx_kb_s: int = 0
    energy_mj: int = 0
    # NVML field ids that ``nvmlDeviceGetFieldValues`` answers with NVML_ERROR_NOT_SUPPORTED
    unsupported_fields: set[int] = field(default_factory=set)
    # the PCIe byte counters (NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES) integrate ``pcie_*_kb_s`` over time
    pcie_counters: dict[str, float] = field(default_factory=lambda: {"tx": 0.0, "rx": 0.0, "t": -1.0})
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used bytes)
    gpm_supported: bool = True
    gpm_sm_util_pct: float = 0.0
    gpm_sm_occupancy_pct: float = 0.0
    gpm_tensor_util_pct: float = 0.0
    # Driver sample buffers: sampling type -> [(timestamp_us, value)]. When a type has no explicit
    # list, the fake synthesises samples every ``sample_period_s`` of wall-clock time with the current
    # value (``gpu_util_pct`` or ``power_mw``), as the driver's ring buffer would.
    driver_samples: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    sample_period_s: float | None = 1 / 6
    sample_buffer_len: int = 100  # samples the driver's ring buffer holds (per sampling type)
    not_supported: set[str] = field(default_factory=set)
    lost: bool = False
    # modes ``autotune doctor`` reads (NVML_DEVICE_MIG_ENABLE / NVML_FEATURE_ENABLED are 1)
    mig_mode: int = 0
    persistence_mode: int = 1
    ecc_mode: int = 1
    ecc_uncorrected_volatile: int = 0


@dataclass(frozen=True)
class FakeHandle:
    """What ``nvmlDeviceGetHandleByIndex`` returns for a fake GPU."""

    index: int


@dataclass
class FakeNvml:
    """A fake ``pynvml``: ``module`` is what the probes receive; the rest is state to script."""

    module: Any
    gpus: list[FakeGpu]
    missing: set[str]
    driver: str
    driver_version: str = "550.54.15"
    cuda_driver_version: int = 12040
    init_count: int = 0
    gpm_live_samples: int = 0
    gpm_owner: dict[int, int] = field(default_factory=dict)  # GPM sample address -> GPU index
    gpm_buffers: dict[int, Any] = field(default_factory=dict)  # keeps the sample memory alive
    lock: threading.Lock = field(default_factory=threading.Lock)

    def lose(self, index: int) -> None:
        """GPU ``index`` falls off the bus: every later call on it raises ``NVMLError_GpuIsLost``."""
        self.gpus[index].lost = True


USED_FUNCTIONS: tuple[str, ...] = (
    "nvmlInit",
    "nvmlInitWithFlags",
    "nvmlShutdown",
    "nvmlSystemGetDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetCudaComputeCapability",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit",
    "nvmlDeviceGetTotalEnergyConsumption",
    "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetComputeRunningProcesses",
    "nvmlDeviceGetSamples",
    "nvmlGpmQueryDeviceSupport",
    "nvmlGpmSampleAlloc",
    "nvmlGpmSampleFree",
    "nvmlGpmSampleGet",
    "nvmlGpmMetricsGet",
    "nvmlDeviceGetMigMode",
    "nvmlDeviceGetPersistenceMode",
    "nvmlDeviceGetEccMode",
    "nvmlDeviceGetTotalEccErrors",
)


def plain_functions(fake: FakeNvml) -> ModuleType:
    """The fake's behaviour without the mock machinery: a module whose functions are the behaviours
    themselves (no signature check, no call recording). For benchmarks that separate the sampler's own
    cost from the cost of ``unittest.mock``; tests use ``fake.module``."""
    import pynvml

    plain = ModuleType("pynvml_plain")
    for name in dir(pynvml):
        value = getattr(pynvml, name)
        if not name.startswith("__") and not (inspect.isfunction(value) or inspect.isbuiltin(value)):
            setattr(plain, name, value)
    for name in USED_FUNCTIONS:
        setattr(plain, name, getattr(fake.module, name).side_effect)
    return plain


def _used_subset(real: ModuleType) -> ModuleType:
    """A module holding the real function objects of USED_FUNCTIONS and every non-function value."""
    subset = ModuleType(real.__name__)
    for name in dir(real):
        value = getattr(real, name)
        if name in USED_FUNCTIONS or not (inspect.isfunction(value) or inspect.isbuiltin(value)):
            setattr(subset, name, value)
    return subset


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0, poll_s: float = 0.005) -> bool:
    """Poll ``predicate`` until it holds or ``timeout_s`` passes; returns its last value.

    For tests of background samplers: wait for an observable condition, never for a fixed time.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return bool(predicate())
        time.sleep(poll_s)


def _copy_real_values(fake: object, real: ModuleType) -> None:
    """Give the fake the real module's constants, error classes and ctypes types."""
    for name in dir(real):
        if name.startswith("__"):
            continue
        value = getattr(real, name)
        if inspect.isfunction(value) or inspect.isbuiltin(value):
            continue
        setattr(fake, name, value)


def fake_nvml(
    gpus: Sequence[FakeGpu] | int = 1,
    *,
    driver: str = "loaded",
    missing: Iterable[str] = (),
    driver_version: str = "550.54.15",
    cuda_driver_version: int = 12040,
    full_module: bool = False,
) -> FakeNvml:
    """Build a fake ``pynvml`` with ``create_autospec`` of the real module.

    Args:
        gpus: the GPUs (or how many default H100s).
        driver: ``"loaded"``; ``"no_library"`` (nvmlInit raises LibraryNotFound) or ``"not_loaded"``
            (DriverNotLoaded).
        missing: NVML function names the "driver" lacks (raise ``NVMLError_FunctionNotFound``).
        driver_version: what ``nvmlSystemGetDriverVersion`` returns.
        cuda_driver_version: what ``nvmlSystemGetCudaDriverVersion_v2`` returns (12040 = 12.4).
        full_module: autospec every function of ``pynvml`` (about 450; ~1 s to build) instead of the
            real function objects of :data:`USED_FUNCTIONS` only. Either way each call is checked
            against the real signature; with the subset, a function outside it is an AttributeError.
    """
    import pynvml

    if isinstance(gpus, int):
        gpus = [FakeGpu(uuid=f"GPU-{i:08d}-fake") for i in range(gpus)]
    module = mock.create_autospec(pynvml if full_module else _used_subset(pynvml))
    _copy_real_values(module, pynvml)
    state = FakeNvml(
        module=module,
        gpus=list(gpus),
        missing=set(missing),
        driver=driver,
        driver_version=driver_version,
        cuda_driver_version=cuda_driver_version,
    )
    _install(state, pynvml)
    return state


def _install(state: FakeNvml, real: ModuleType) -> None:  # noqa: C901 - one table of behaviours
    m = state.module

    def raise_(code: int) -> NoReturn:
        raise real.NVMLError(code)

    def check_init(name: str) -> None:
        if name in state.missing:
            raise_(real.NVML_ERROR_FUNCTION_NOT_FOUND)
        if state.init_count <= 0:
            raise_(real.NVML_ERROR_UNINITIALIZED)

    def gpu_of(name: str, handle: object) -> FakeGpu:
        check_init(name)
        if not isinstance(handle, FakeHandle) or not 0 <= handle.index < len(state.gpus):
            raise_(real.NVML_ERROR_INVALID_ARGUMENT)
        gpu = state.gpus[handle.index]
        if gpu.lost:
            raise_(real.NVML_ERROR_GPU_IS_LOST)
        if name in gpu.not_supported:
            raise_(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def device(name: str, impl: Callable[..., Any]) -> None:
        def effect(handle: object, *args: object) -> Any:
            return impl(gpu_of(name, handle), *args)

        getattr(m, name).side_effect = effect

    def system(name: str, impl: Callable[..., Any]) -> None:
        def effect(*args: object) -> Any:
            check_init(name)
            return impl(*args)

        getattr(m, name).side_effect = effect

    # -- lifecycle
    def init(*_: object) -> None:
        if state.driver == "no_library":
            raise_(real.NVML_ERROR_LIBRARY_NOT_FOUND)
        if state.driver == "not_loaded":
            raise_(real.NVML_ERROR_DRIVER_NOT_LOADED)
        with state.lock:
            state.init_count += 1

    def shutdown() -> None:
        with state.lock:
            if state.init_count <= 0:
                raise_(real.NVML_ERROR_UNINITIALIZED)
            state.init_count -= 1

    m.nvmlInit.side_effect = init
    m.nvmlInitWithFlags.side_effect = init
    m.nvmlShutdown.side_effect = shutdown

    # -- system and device facts
    system("nvmlSystemGetDriverVersion", lambda: state.driver_version)
    system("nvmlSystemGetCudaDriverVersion_v2", lambda: state.cuda_driver_version)
    system("nvmlDeviceGetCount", lambda: len(state.gpus))

    def handle_by_index(index: int) -> FakeHandle:
        check_init("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(state.gpus):
            raise_(real.NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(index)

    m.nvmlDeviceGetHandleByIndex.side_effect = handle_by_index
    device("nvmlDeviceGetName", lambda g: g.name)
    device("nvmlDeviceGetUUID", lambda g: g.uuid)
    device("nvmlDeviceGetCudaComputeCapability", lambda g: g.compute_capability)

    # -- sampled metrics
    # An instant fake: a structure is built once per distinct value and handed out again while the
    # GPU's state is unchanged (callers only read it), so the fake's own cost stays out of benchmarks.
    built: dict[tuple[Any, ...], Any] = {}

    def once(key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
        value = built.get(key)
        if value is None:
            if len(built) > 4096:  # a long scripted timeline: forget old values
                built.clear()
            value = built[key] = make()
        return value

    def utilization(g: FakeGpu) -> Any:
        gpu, mem = g.gpu_util_pct, g.mem_util_pct
        return once(("util", gpu, mem), lambda: real.c_nvmlUtilization_t(gpu=gpu, memory=mem))

    device("nvmlDeviceGetUtilizationRates", utilization)

    def memory_info(g: FakeGpu, version: object = None) -> Any:
        total, used = g.memory_total_bytes, g.memory_used_bytes
        return once(
            ("mem", total, used), lambda: real.c_nvmlMemory_t(total=total, free=total - used, used=used)
        )

    device("nvmlDeviceGetMemoryInfo", memory_info)
    device("nvmlDeviceGetPowerUsage", lambda g: g.power_mw)
    device("nvmlDeviceGetEnforcedPowerLimit", lambda g: g.power_limit_mw)
    device("nvmlDeviceGetTotalEnergyConsumption", lambda g: g.energy_mj)

    def clock(g: FakeGpu, kind: int) -> int:
        if kind != real.NVML_CLOCK_SM:
            raise_(real.NVML_ERROR_NOT_SUPPORTED)
        return g.sm_clock_mhz

    device("nvmlDeviceGetClockInfo", clock)
    device("nvmlDeviceGetTemperature", lambda g, sensor: g.temperature_c)
    device("nvmlDeviceGetCurrentClocksEventReasons", lambda g: g.clock_event_reasons)
    device("nvmlDeviceGetCurrentClocksThrottleReasons", lambda g: g.clock_event_reasons)

    def pcie(g: FakeGpu, counter: int) -> int:
        if counter == real.NVML_PCIE_UTIL_TX_BYTES:
            return g.pcie_tx_kb_s
        if counter == real.NVML_PCIE_UTIL_RX_BYTES:
            return g.pcie_rx_kb_s
        raise_(real.NVML_ERROR_INVALID_ARGUMENT)
        return 0

    device("nvmlDeviceGetPcieThroughput", pcie)

    def pcie_counts(g: FakeGpu, now_s: float) -> tuple[int, int]:
        c = g.pcie_counters
        if c["t"] >= 0:
            c["tx"] += g.pcie_tx_kb_s * 1024 * (now_s - c["t"])
            c["rx"] += g.pcie_rx_kb_s * 1024 * (now_s - c["t"])
        c["t"] = now_s
        return int(c["tx"]), int(c["rx"])

    def field_values(g: FakeGpu, field_ids: Sequence[Any]) -> Any:
        now_s = time.time()
        tx, rx = pcie_counts(g, now_s)
        known = {
            real.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: g.energy_mj,
            real.NVML_FI_DEV_PCIE_COUNT_TX_BYTES: tx,
            real.NVML_FI_DEV_PCIE_COUNT_RX_BYTES: rx,
        }
        values = (real.c_nvmlFieldValue_t * len(field_ids))()
        for k, field_id in enumerate(field_ids):
            value = values[k]
            value.fieldId = field_id
            value.timestamp = int(now_s * 1e6)
            if field_id in g.unsupported_fields or field_id not in known:
                value.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
                continue
            value.nvmlReturn = real.NVML_SUCCESS
            value.valueType = real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            value.value.ullVal = int(known[field_id])
        return values

    device("nvmlDeviceGetFieldValues", field_values)

    def processes(g: FakeGpu) -> list[Any]:
        return [real.nvmlFriendlyObject({"pid": pid, "usedGpuMemory": used}) for pid, used in g.processes]

    device("nvmlDeviceGetComputeRunningProcesses", processes)

    # -- modes (autotune doctor): [current, pending] for MIG and ECC, as the binding returns them
    device("nvmlDeviceGetMigMode", lambda g: [g.mig_mode, g.mig_mode])
    device("nvmlDeviceGetPersistenceMode", lambda g: g.persistence_mode)
    device("nvmlDeviceGetEccMode", lambda g: [g.ecc_mode, g.ecc_mode])

    def ecc_errors(g: FakeGpu, error_type: int, counter_type: int) -> int:
        if error_type != real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED or counter_type != real.NVML_VOLATILE_ECC:
            raise_(real.NVML_ERROR_NOT_SUPPORTED)
        return g.ecc_uncorrected_volatile

    device("nvmlDeviceGetTotalEccErrors", ecc_errors)

    def samples(g: FakeGpu, kind: int, last_us: int) -> tuple[int, list[Any]]:
        explicit = g.driver_samples.get(kind)
        if explicit is not None:
            points = [(ts, v) for ts, v in explicit if ts > last_us]
        elif g.sample_period_s and kind in (real.NVML_GPU_UTILIZATION_SAMPLES, real.NVML_TOTAL_POWER_SAMPLES):
            # a ring buffer of ``sample_buffer_len`` samples, one every period, holding the current value
            value = g.gpu_util_pct if kind == real.NVML_GPU_UTILIZATION_SAMPLES else g.power_mw
            period_us = int(g.sample_period_s * 1e6)
            newest = int(time.time() * 1e6) // period_us * period_us
            depth = max(1, g.sample_buffer_len)
            oldest = max(newest - (depth - 1) * period_us, (last_us // period_us + 1) * period_us)
            points = [(ts, value) for ts in range(oldest, newest + 1, period_us)]
        else:
            raise_(real.NVML_ERROR_NOT_SUPPORTED)
            points = []
        if not points:
            raise_(real.NVML_ERROR_NOT_FOUND)
        out = []
        for ts, value in points:
            sample = real.c_nvmlSample_t()
            sample.timeStamp = ts
            sample.sampleValue.uiVal = int(value)
            out.append(sample)
        return real.NVML_VALUE_TYPE_UNSIGNED_INT, out

    device("nvmlDeviceGetSamples", samples)

    # -- GPM (Hopper and newer)
    def gpm_support(g: FakeGpu) -> Any:
        support = real.c_nvmlGpmSupport_t()
        support.version = real.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(g.gpm_supported)
        return support

    device("nvmlGpmQueryDeviceSupport", gpm_support)

    def address(sample: Any) -> int:
        return int(ctypes.cast(sample, ctypes.c_void_p).value or 0)

    def gpm_alloc() -> Any:
        buffer = real.struct_c_nvmlGpmSample_t()
        sample = ctypes.pointer(buffer)
        with state.lock:
            state.gpm_live_samples += 1
            state.gpm_buffers[address(sample)] = buffer
        return sample

    def gpm_free(sample: object) -> None:
        with state.lock:
            if state.gpm_buffers.pop(address(sample), None) is None:
                raise_(real.NVML_ERROR_INVALID_ARGUMENT)
            state.gpm_live_samples -= 1

    system("nvmlGpmSampleAlloc", gpm_alloc)
    system("nvmlGpmSampleFree", gpm_free)

    def gpm_sample_get(g: FakeGpu, sample: object) -> Any:
        if not g.gpm_supported:
            raise_(real.NVML_ERROR_NOT_SUPPORTED)
        if address(sample) not in state.gpm_buffers:
            raise_(real.NVML_ERROR_INVALID_ARGUMENT)
        state.gpm_owner[address(sample)] = state.gpus.index(g)
        return sample

    device("nvmlGpmSampleGet", gpm_sample_get)
    by_id = {
        real.NVML_GPM_METRIC_SM_UTIL: "gpm_sm_util_pct",
        real.NVML_GPM_METRIC_SM_OCCUPANCY: "gpm_sm_occupancy_pct",
        real.NVML_GPM_METRIC_ANY_TENSOR_UTIL: "gpm_tensor_util_pct",
    }

    def gpm_metrics_get(request: Any) -> Any:
        check_init("nvmlGpmMetricsGet")
        if request.version != real.NVML_GPM_METRICS_GET_VERSION:
            raise_(real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        owners = {
            state.gpm_owner.get(address(request.sample1)),
            state.gpm_owner.get(address(request.sample2)),
        }
        owner = owners.pop() if len(owners) == 1 else None
        if owner is None:  # both samples must have been taken on one GPU
            raise_(real.NVML_ERROR_INVALID_ARGUMENT)
        source = state.gpus[owner]
        if source.lost:
            raise_(real.NVML_ERROR_GPU_IS_LOST)
        for k in range(request.numMetrics):
            metric = request.metrics[k]
            name = by_id.get(metric.metricId)
            if name is None:
                metric.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
            else:
                metric.nvmlReturn = real.NVML_SUCCESS
                metric.value = float(getattr(source, name))
        return request

    m.nvmlGpmMetricsGet.side_effect = gpm_metrics_get
