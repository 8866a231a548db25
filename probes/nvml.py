"""GPU detection and sampling through NVML (``nvidia-ml-py``, imported as ``pynvml``).

Every NVML call of the sampler goes through one gate, :class:`NvmlGate`: a metric the GPU or driver
does not support becomes None and is reported once in ``warnings``; a lost GPU stops being asked and
its later rows are empty; any other failed read is None for that sample only. Nothing raised by a read
can end the sampling thread. Initialisation failures (no library, no driver, a GPU index that does not
exist) raise one :class:`NvmlUnavailable` at ``start()``, whose ``str()`` the CLI prints as one line.

GPU indices are NVML indices (the order of ``nvidia-smi``), not indices inside ``CUDA_VISIBLE_DEVICES``.

Cadence (``NvmlSampler``), per GPU, chosen to keep 8 GPUs at 10 Hz near 1 % of one core
(``bench/probe_overhead.py``):

* every tick (``interval_s``, 10 Hz by default): memory used/total; GPU utilization and power only
  while the driver's sample buffer does not deliver them (see below);
* on slow reads (``slow_interval_s``, 1 s by default, staggered so that a tick holds the slow reads
  of a few GPUs at most): the energy and PCIe byte counters in one ``nvmlDeviceGetFieldValues`` call
  and the driver's sample buffers, both on every second slow read (the counters are cumulative, so
  only their time resolution depends on it; a buffer seen to overflow between two reads is read on
  every slow read from then on);
* one "state" read per slow read, in rotation: utilization (for memory utilization, while the
  driver's buffer carries GPU utilization), per-process memory, GPM (SM utilization, occupancy,
  tensor activity: averages over the window between two GPM samples, so a longer window loses no
  activity), SM clock, temperature, clock-event reasons, enforced power limit. With all seven on,
  each is read every 7 s by default; metrics switched off leave the rotation.

PCIe traffic comes from the driver's byte counters (``NVML_FI_DEV_PCIE_COUNT_TX/RX_BYTES``): the rate
stored is the average since the previous counter read, so bytes per step are exact. Where the driver
refuses a counter field, that metric falls back to its own call: ``nvmlDeviceGetTotalEnergyConsumption``
or ``nvmlDeviceGetPcieThroughput`` (which measures 20 ms *inside the call* and blocks the thread that
long - the reason counters come first).

The driver's buffer (``nvmlDeviceGetSamples``) holds utilization and power at the driver's own rate;
those samples become extra rows at their own timestamps, converted from the driver's wall clock
(microseconds) to the monotonic clock. Power is polled on every tick only while that buffer does not
deliver: ``nvmlDeviceGetPowerUsage`` is a one-second average on Ampere and newer (A100 excepted), so
polling it at 10 Hz adds calls, not information, where the buffer has the driver's own samples.

CPU: with the call counts fixed by the cadence above, the sampler's own cost per tick is kept small.
The memory read of every tick calls the function bound at start (its errors still go through the
gate, :meth:`NvmlGate.failed`); rows are ``array("d")`` copies of a per-GPU template, collected over
the tick and stored under one lock; the wait between ticks is a deadline-based ``time.sleep`` (a
timed ``Event.wait`` costs about twice as much CPU per wake-up). ``tests/probes/test_nvml_rows.py``
holds the rows, warnings and calls of a scripted run recorded before these changes.
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from autotune.probes._threads import join_or_abandon
from autotune.probes.timeline import GPU_METRICS, RowBuffer

__all__ = [
    "NvmlUnavailable",
    "DeviceFacts",
    "GpuDetection",
    "NvmlGate",
    "NvmlSampler",
    "detect_gpus",
    "gpu_processes",
    "memory_used",
    "load_nvml",
]

log = logging.getLogger(__name__)

_PCIE_UNIT_BYTES = 1024  # NVML reports PCIe throughput in KB/s; nvitop and nvidia-smi read KiB
# column -> NVML field id of the counter read in one nvmlDeviceGetFieldValues call on slow reads
_COUNTER_FIELDS = (
    ("energy_mj", "NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
    ("pcie_tx_bytes_s", "NVML_FI_DEV_PCIE_COUNT_TX_BYTES"),
    ("pcie_rx_bytes_s", "NVML_FI_DEV_PCIE_COUNT_RX_BYTES"),
)
_COUNTERS_EVERY = 2  # slow reads between two reads of the energy and PCIe counters (cumulative: no loss)
_BUFFER_PROBE_US = 2_000_000  # at start, ask the driver's buffers for the last 2 s to see if they deliver
_RATE_COLUMNS = frozenset({"pcie_tx_bytes_s", "pcie_rx_bytes_s"})  # counters stored as bytes per second


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


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _init(nvml: ModuleType) -> None:
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise NvmlUnavailable(
            f"NVML could not start: {exc}; install or load the NVIDIA driver, or run on CPU"
        ) from exc


def _shutdown(nvml: ModuleType) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - nothing useful to do when shutdown fails
        pass


def detect_gpus(nvml: ModuleType | None = None) -> GpuDetection:
    """Initialise NVML and list the GPUs. Raises :class:`NvmlUnavailable` with the reason."""
    nvml = nvml or load_nvml()
    _init(nvml)
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
        _shutdown(nvml)


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception:  # noqa: BLE001 - an optional fact; detection goes on without it
        return None


def _handles(nvml: ModuleType, indices: Sequence[int]) -> dict[int, Any]:
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
    _init(nvml)
    try:
        out: dict[int, list[tuple[int, int | None]]] = {}
        for index, handle in _handles(nvml, indices).items():
            try:
                procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except _binding_errors(nvml) as exc:
                raise NvmlUnavailable(f"GPU {index}: cannot list its processes ({exc})") from exc
            out[index] = [
                (int(p.pid), int(p.usedGpuMemory) if p.usedGpuMemory is not None else None) for p in procs
            ]
        return out
    finally:
        _shutdown(nvml)


def memory_used(indices: Sequence[int], nvml: ModuleType | None = None) -> dict[int, int]:
    """Device memory in use on each GPU, in bytes (``nvidia-smi --query-gpu=memory.used``).

    Raises:
        NvmlUnavailable: NVML cannot start, or a GPU cannot be opened or read.
    """
    nvml = nvml or load_nvml()
    _init(nvml)
    try:
        out: dict[int, int] = {}
        for index, handle in _handles(nvml, indices).items():
            try:
                out[index] = int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
            except _binding_errors(nvml) as exc:
                raise NvmlUnavailable(f"GPU {index}: cannot read its memory ({exc})") from exc
        return out
    finally:
        _shutdown(nvml)


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
        *args: Any,
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


def _overflowed(last_us: int, stamps: list[int]) -> bool:
    """True when the oldest new sample is much later than the last one taken: the driver's ring buffer
    wrapped between two reads and samples were lost (needs >= 3 new samples to know their spacing)."""
    if len(stamps) < 3:
        return False
    gaps = sorted(b - a for a, b in zip(stamps, stamps[1:], strict=False))
    spacing = gaps[len(gaps) // 2]
    return spacing > 0 and stamps[0] - last_us > 3 * spacing


# ----------------------------------------------------------------------------------------- sampler
_COL = {name: i + 3 for i, name in enumerate(GPU_METRICS)}  # offset past t_mono_s, t_wall_s, device
_MEM_USED, _MEM_TOTAL = _COL["mem_used_bytes"], _COL["mem_total_bytes"]
_NAN = math.nan
_SLEEP_MAX_S = 0.1  # waits up to this long between ticks sleep; longer ones wait on the stop event
# A numeric field of an answer, without pynvml's Python-level ``__getattribute__`` (whose only work,
# turning bytes into str, never applies to a number); for other objects the same lookup as ``getattr``
# minus ``__getattr__`` fallbacks. The hot paths use it; a value it cannot read goes the checked way.
_field = object.__getattribute__
_GPM_METRICS = (
    ("gpm_sm_util_pct", "NVML_GPM_METRIC_SM_UTIL"),
    ("gpm_sm_occupancy_pct", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("gpm_tensor_util_pct", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
)
_VALUE_FIELDS = {  # nvmlValueType_t -> field of c_nvmlValue_t
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}


@dataclass
class _Device:
    index: int
    handle: Any
    slow_phase: int  # this GPU's slow reads happen on ticks where tick % slow_every == slow_phase
    gpm: list[Any] = field(default_factory=list)  # two GPM sample buffers when GPM is on
    gpm_have_prev: bool = False
    last_sample_us: dict[int, int] = field(default_factory=dict)  # sampling type -> newest timestamp
    power_from_buffer: bool = False  # the driver's power buffer delivered at the last slow read
    util_from_buffer: bool = False  # the driver's utilization buffer delivered at the last slow read
    counters_off: set[str] = field(default_factory=set)  # columns read by their own call instead
    counter_prev: dict[str, tuple[int, float]] = field(default_factory=dict)  # column -> (t_us, bytes)
    state_cursor: int = 0  # position in the rotation of state reads
    slow_count: int = 0  # slow reads so far
    buffer_every: int = 2  # slow reads between two reads of the driver's buffers (1 after an overflow)
    # every metric NaN, ``device`` set: a tick's rows are copies (an array row is stored by one memcpy)
    blank_row: array[float] = field(default_factory=lambda: array("d"))

    def new_row(self, t_mono: float, t_wall: float) -> array[float]:
        """A blank row of this GPU at the given time."""
        row = self.blank_row[:]
        row[0] = t_mono
        row[1] = t_wall
        return row


class NvmlSampler:
    """Samples the given GPUs in a background thread.

    Each tick appends one row per GPU (schema: :data:`probes.timeline.GPU_METRICS`); the driver's
    finer samples add rows holding only ``gpu_util_pct`` or ``power_w``. A metric not read on a tick
    is None in that row - values are never carried forward.

    Args:
        indices: NVML indices of the GPUs to sample.
        interval_s: polling interval of utilization and memory (and of power while the driver's
            power buffer does not deliver).
        nvml: the ``pynvml`` module, or a fake (``probes.testing``); loaded on ``start()`` when None.
        pids: returns the trial's process-tree pids; GPU memory of those processes becomes
            ``proc_mem_bytes``. Called at most once per ``slow_interval_s``, from the sampling thread.
        slow_interval_s: interval of the slow reads (see the module docstring).
        driver_samples: read the driver's utilization/power sample buffer (``nvmlDeviceGetSamples``).
        gpm: read GPM SM utilization, occupancy and tensor activity where the GPU supports GPM.

    Lifecycle: ``start()`` once (raises :class:`NvmlUnavailable`), ``rows()`` any time, ``stop()``
    any number of times. Also a context manager.
    """

    def __init__(
        self,
        indices: Sequence[int],
        *,
        interval_s: float = 0.1,
        nvml: ModuleType | None = None,
        pids: Callable[[], set[int]] | None = None,
        slow_interval_s: float = 1.0,
        driver_samples: bool = True,
        gpm: bool = True,
    ) -> None:
        if not interval_s > 0 or not math.isfinite(interval_s):
            raise ValueError(f"interval_s must be a positive number of seconds, got {interval_s!r}")
        if not slow_interval_s > 0:
            raise ValueError(f"slow_interval_s must be positive, got {slow_interval_s!r}")
        self.indices = tuple(int(i) for i in indices)
        if len(set(self.indices)) != len(self.indices):
            raise ValueError(f"GPU indices repeat: {list(self.indices)}")
        self.interval_s = float(interval_s)
        self.slow_every = max(1, round(slow_interval_s / interval_s))
        self._nvml_arg = nvml
        self._pids = pids
        self._driver_samples = driver_samples
        self._gpm = gpm
        self._buffer = RowBuffer("gpu", GPU_METRICS)
        self._ticks = array("d")
        self._gate: NvmlGate | None = None
        self._nvml: ModuleType | None = None
        self._devices: list[_Device] = []
        self._thread: threading.Thread | None = None
        self._stop_event = threading.Event()
        self._state = "new"  # new -> running -> stopped
        self._own_warnings: list[str] = []
        self._wall_minus_mono_s = 0.0
        self._start_wall_us = 0
        self._pid_cache: set[int] | None = None
        self._counter_fields: tuple[tuple[str, int], ...] = ()
        self._own_reads: dict[str, tuple[str, tuple[Any, ...], float]] = {}
        self._state_reads: tuple[tuple[str, str, tuple[Any, ...], float], ...] = ()
        self._pid_cache_tick = -(10**9)
        self._memory_info: Callable[..., Any] | None = None

    # -- public API -----------------------------------------------------------------------------
    @property
    def warnings(self) -> list[str]:
        """Each unavailable metric, lost GPU or sampler problem, once, in the order met."""
        gate = self._gate.warnings if self._gate else []
        return [*gate, *self._own_warnings]

    @property
    def ticks(self) -> list[float]:
        """``time.monotonic()`` of every polling tick (for the achieved rate and its jitter)."""
        return self._ticks.tolist()

    def rows(self) -> list[dict[str, Any]]:
        """All samples so far, one dict per row (timeline schema; None = not measured).

        Rows are in the order they were taken: a driver sample is older than the poll that fetched
        it. :func:`probes.timeline.write_timeline` sorts by time.
        """
        return self._buffer.rows()

    def samples_since(self, cursor: int, columns: Sequence[str]) -> tuple[list[tuple[float, ...]], int]:
        """A live view for a reader in another thread: the rows taken since ``cursor``, as tuples.

        ``columns`` names any of ``t_mono_s``, ``t_wall_s``, ``device`` and the
        :data:`probes.timeline.GPU_METRICS`; each row holds them in that order (floats, NaN = not
        measured on that row). Returns the rows and the cursor of the next call (start with 0). Costs
        only the new rows and never blocks the sampling thread for longer than one copy; the rows are
        the same ones :meth:`rows` returns at the end. The trial runner reads utilization and power
        through it while the trial runs.

        Raises:
            KeyError: a column the timeline does not have.
        """
        return self._buffer.since(cursor, columns)

    def start(self) -> None:
        """Initialise NVML, open the GPUs, start the sampling thread.

        Raises:
            NvmlUnavailable: NVML cannot start or a GPU index cannot be opened.
            RuntimeError: the sampler was started before.
        """
        if self._state != "new":
            raise RuntimeError("an NvmlSampler can be started once; create a new one")
        nvml = self._nvml_arg or load_nvml()
        _init(nvml)
        try:
            handles = _handles(nvml, self.indices)
        except NvmlUnavailable:
            _shutdown(nvml)
            raise
        self._nvml = nvml
        self._gate = NvmlGate(nvml)
        reasons_fn = "nvmlDeviceGetCurrentClocksEventReasons"
        if not hasattr(nvml, reasons_fn):  # nvidia-ml-py before 12.535
            reasons_fn = "nvmlDeviceGetCurrentClocksThrottleReasons"
        # counter fields this binding knows: (column, field id)
        self._counter_fields = tuple(
            (column, getattr(nvml, const)) for column, const in _COUNTER_FIELDS if hasattr(nvml, const)
        )
        # (column, NVML function, arguments after the handle, scale to the column's unit)
        self._own_reads = {
            "energy_mj": ("nvmlDeviceGetTotalEnergyConsumption", (), 1.0),
            "pcie_tx_bytes_s": (
                "nvmlDeviceGetPcieThroughput",
                (nvml.NVML_PCIE_UTIL_TX_BYTES,),
                _PCIE_UNIT_BYTES,
            ),
            "pcie_rx_bytes_s": (
                "nvmlDeviceGetPcieThroughput",
                (nvml.NVML_PCIE_UTIL_RX_BYTES,),
                _PCIE_UNIT_BYTES,
            ),
        }
        self._state_reads = (
            ("sm_clock_mhz", "nvmlDeviceGetClockInfo", (nvml.NVML_CLOCK_SM,), 1.0),
            ("temperature_c", "nvmlDeviceGetTemperature", (nvml.NVML_TEMPERATURE_GPU,), 1.0),
            ("clock_event_reasons", reasons_fn, (), 1.0),
            ("power_limit_w", "nvmlDeviceGetEnforcedPowerLimit", (), 1e-3),  # mW -> W
        )
        n = max(1, len(self.indices))
        self._devices = [
            _Device(
                index=i,
                handle=handles[i],
                slow_phase=(k * self.slow_every) // n,
                blank_row=array("d", self._buffer.blank(_NAN, _NAN, i)),
            )
            for k, i in enumerate(self.indices)
        ]
        # the one read of every tick, bound once; a binding without it is left to the gate (warned)
        self._memory_info = getattr(nvml, "nvmlDeviceGetMemoryInfo", None)
        if self._gpm:
            for dev in self._devices:
                self._setup_gpm(dev)
        mono, wall = time.monotonic(), time.time()
        self._wall_minus_mono_s = wall - mono
        self._start_wall_us = int(wall * 1e6)
        for dev in self._devices:
            for kind in (nvml.NVML_GPU_UTILIZATION_SAMPLES, nvml.NVML_TOTAL_POWER_SAMPLES):
                dev.last_sample_us[kind] = self._start_wall_us
            if self._driver_samples:  # learn now whether the buffers deliver, rather than poll until then
                probed: list[array[float]] = []
                self._read_driver_samples(dev, probed, since_us=self._start_wall_us - _BUFFER_PROBE_US)
                self._buffer.extend(probed)
        self._state = "running"
        self._thread = threading.Thread(target=self._run, name="autotune-nvml-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop sampling and release NVML. Idempotent.

        Escalates: ask the thread to stop and wait two intervals; then wait up to ``timeout_s``; a
        thread still stuck inside a driver call after that is abandoned (it is a daemon) with a
        warning, and NVML is left initialised rather than shut down under it.
        """
        if self._state != "running":
            self._state = "stopped"
            return
        self._state = "stopped"
        self._stop_event.set()
        messages = {
            "slow": "GPU sampler slow to stop; waiting for its current NVML call",
            "abandoned": f"GPU sampler still inside an NVML call after {timeout_s:.0f} s; abandoned it",
        }
        if self._thread is not None and not join_or_abandon(
            self._thread,
            interval_s=self.interval_s,
            timeout_s=timeout_s,
            warn=lambda k: self._own_warnings.append(messages[k]),
        ):
            return  # NVML is left initialised rather than shut down under a call in flight
        self._release()

    def __enter__(self) -> NvmlSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals ----------------------------------------------------------------------------------
    def _release(self) -> None:
        nvml, gate = self._nvml, self._gate
        if nvml is None or gate is None:
            return
        for dev in self._devices:
            for sample in dev.gpm:
                gate.call(dev.index, "gpm_free", "nvmlGpmSampleFree", sample)
            dev.gpm = []
        _shutdown(nvml)

    def _setup_gpm(self, dev: _Device) -> None:
        nvml, gate = self._nvml, self._gate
        if nvml is None or gate is None:
            return
        needed = ("c_nvmlGpmMetricsGet_t", "NVML_GPM_METRICS_GET_VERSION", *(c for _, c in _GPM_METRICS))
        if not all(hasattr(nvml, name) for name in needed):
            gate.disable(dev.index, "gpm_sm_util_pct")
            gate.warn_once(
                ("gpm", "binding"), "gpm_sm_util_pct: this nvidia-ml-py has no GPM API; left empty"
            )
            return
        support = gate.call(dev.index, "gpm_sm_util_pct", "nvmlGpmQueryDeviceSupport", dev.handle)
        if support is None:
            return
        if not getattr(support, "isSupportedDevice", 0):
            gate.disable(dev.index, "gpm_sm_util_pct")
            gate.warn_once(
                ("gpm", "unsupported"),
                f"gpm_sm_util_pct: GPU {dev.index} has no GPM (needs Hopper or newer); "
                "SM utilization, occupancy and tensor activity stay empty",
            )
            return
        samples = []
        for _ in range(2):
            sample = gate.call(dev.index, "gpm_sm_util_pct", "nvmlGpmSampleAlloc")
            if sample is None:
                break
            samples.append(sample)
        if len(samples) < 2:
            for sample in samples:
                gate.call(dev.index, "gpm_free", "nvmlGpmSampleFree", sample)
            gate.disable(dev.index, "gpm_sm_util_pct")
            return
        dev.gpm = samples

    def _run(self) -> None:
        """The sampling loop: one tick every ``interval_s`` on a fixed schedule (deadline-based).

        Waits of at most ``_SLEEP_MAX_S`` are a plain ``time.sleep`` (about half the CPU of a timed
        ``Event.wait`` per wake-up): ``stop()`` then takes effect at the next tick, within its first
        join of two intervals. Longer waits wait on the stop event, so ``stop()`` is immediate.
        """
        interval_s = self.interval_s
        stop = self._stop_event
        monotonic, sleep = time.monotonic, time.sleep
        tick = 0
        next_t = monotonic()
        while not stop.is_set():
            self._tick(tick)
            tick += 1
            next_t += interval_s
            now = monotonic()
            if next_t < now:  # fell behind (slow driver): skip the missed ticks, keep the phase
                missed = math.ceil((now - next_t) / interval_s)
                next_t += missed * interval_s
                tick += missed
            wait_s = next_t - now
            if wait_s <= _SLEEP_MAX_S:
                sleep(wait_s)
            else:
                stop.wait(wait_s)

    def _tick(self, tick: int) -> None:
        """One row per GPU (plus the driver's sub-samples of GPUs on a slow read), stored at once.

        The common case - a GPU whose driver buffers deliver utilization and power, on a tick without
        its slow read - is one memory read, done here inline with the function bound at start; every
        other case goes through :meth:`_read`. Both store the same values.
        """
        gate = self._gate
        if gate is None:
            return
        t_mono = time.monotonic()
        t_wall = t_mono + self._wall_minus_mono_s
        self._ticks.append(t_mono)
        phase = tick % self.slow_every
        memory_info = self._memory_info
        number_field = _field
        out: list[array[float]] = []
        for dev in self._devices:
            try:
                if (
                    dev.slow_phase == phase
                    or memory_info is None
                    or not (dev.util_from_buffer and dev.power_from_buffer)
                    or not gate.enabled(dev.index, "mem_used_bytes")
                ):
                    self._read(dev, t_mono, t_wall, dev.slow_phase == phase, tick, out)
                    continue
                row = dev.new_row(t_mono, t_wall)
                try:
                    mem = memory_info(dev.handle)
                except Exception as exc:  # noqa: BLE001 - what the gate makes of it, as in gate.call
                    gate.failed(dev.index, "mem_used_bytes", exc)
                else:
                    try:
                        row[_MEM_USED] = float(number_field(mem, "used"))
                        row[_MEM_TOTAL] = float(number_field(mem, "total"))
                    except Exception:  # noqa: BLE001 - not numbers: the checked path empties and warns
                        self._store_memory(dev, row, mem)
                out.append(row)
            except Exception as exc:  # noqa: BLE001 - a surprising value must not end sampling
                gate.warn_once(
                    ("tick", type(exc).__name__),
                    f"GPU {dev.index}: a sample could not be assembled ({type(exc).__name__}: {exc}); "
                    "sampling goes on",
                )
        if out:
            self._buffer.extend(out)

    def _store_memory(self, dev: _Device, row: array[float], mem: Any) -> None:
        if mem is not None:
            self._put(row, dev.index, "mem_used_bytes", getattr(mem, "used", None))
            self._put(row, dev.index, "mem_total_bytes", getattr(mem, "total", None))

    def _read(
        self, dev: _Device, t_mono: float, t_wall: float, slow: bool, tick: int, out: list[array[float]]
    ) -> None:
        """Every read of one GPU on one tick, in the general case; the rows go to ``out`` in order."""
        nvml, gate = self._nvml, self._gate
        if nvml is None or gate is None:
            return
        i, h = dev.index, dev.handle
        row = dev.new_row(t_mono, t_wall)
        call = gate.call
        # While the driver's utilization buffer delivers (finer than polling), utilization is polled in
        # the rotation of state reads only (for memory utilization): the buffer carries GPU utilization.
        if not dev.util_from_buffer:
            self._read_utilization(dev, row)
        self._store_memory(dev, row, call(i, "mem_used_bytes", "nvmlDeviceGetMemoryInfo", h))
        if not dev.power_from_buffer:
            self._put(row, i, "power_w", call(i, "power_w", "nvmlDeviceGetPowerUsage", h), 1e-3)  # mW -> W
        if not slow:
            out.append(row)
            return
        dev.slow_count += 1
        if i not in gate.lost:
            if (dev.slow_count - 1) % _COUNTERS_EVERY == 0:  # from the first slow read on
                self._read_counters(dev, row, t_wall)
            self._read_state(dev, row, tick)
        out.append(row)
        if self._driver_samples and i not in gate.lost and dev.slow_count % dev.buffer_every == 0:
            self._read_driver_samples(dev, out)

    def _read_counters(self, dev: _Device, row: array[float], t_wall: float) -> None:
        """Energy and PCIe bytes from the driver's counters in one call; refused fields by their own call."""
        nvml, gate = self._nvml, self._gate
        if nvml is None or gate is None:
            return
        i, h = dev.index, dev.handle
        counters_on = gate.enabled(i, "counters")
        wanted = [(c, f) for c, f in self._counter_fields if c not in dev.counters_off] if counters_on else []
        if wanted:
            got = gate.call(
                i,
                "counters",
                "nvmlDeviceGetFieldValues",
                h,
                [f for _, f in wanted],
                fallback="energy and PCIe are read with their own calls",
            )
            if got is not None:
                for (column, _), value in zip(wanted, got, strict=False):
                    self._store_counter(dev, row, column, value, t_wall)
        # the counters call now switched off, or a field it refused: that metric's own call, this tick
        by_counter = (
            {c for c, _ in wanted if c not in dev.counters_off} if gate.enabled(i, "counters") else set()
        )
        for column, (fn_name, extra, scale) in self._own_reads.items():
            if column not in by_counter:
                self._put(row, i, column, gate.call(i, column, fn_name, h, *extra), scale)

    def _store_counter(self, dev: _Device, row: array[float], column: str, value: Any, t_wall: float) -> None:
        attr = _VALUE_FIELDS.get(int(value.valueType))
        if int(value.nvmlReturn) != 0 or attr is None:  # no such counter here: its own call from now on
            dev.counters_off.add(column)
            return
        number = float(getattr(value.value, attr))
        if column not in _RATE_COLUMNS:
            self._put(row, dev.index, column, number)
            return
        t_us = int(value.timestamp) or int(t_wall * 1e6)
        prev = dev.counter_prev.get(column)
        dev.counter_prev[column] = (t_us, number)
        if prev is not None and t_us > prev[0] and number >= prev[1]:  # a wrapped counter gives no rate
            self._put(row, dev.index, column, (number - prev[1]) * 1e6 / (t_us - prev[0]))

    def _read_state(self, dev: _Device, row: array[float], tick: int) -> None:
        """One read of the rotation: process memory, GPM, then the slow-changing settings and states."""
        nvml, gate = self._nvml, self._gate
        if nvml is None or gate is None:
            return
        i, h = dev.index, dev.handle
        slots = 3 + len(self._state_reads)
        for _ in range(slots):  # the next slot still switched on; an empty one is skipped
            slot = dev.state_cursor % slots
            dev.state_cursor += 1
            if slot == 0:
                if dev.util_from_buffer and gate.enabled(i, "gpu_util_pct"):  # else polled every tick
                    self._read_utilization(dev, row)
                    return
            elif slot == 1:
                if self._pids is not None and gate.enabled(i, "proc_mem_bytes"):
                    self._read_process_memory(dev, row, tick)
                    return
            elif slot == 2:
                if dev.gpm and gate.enabled(i, "gpm_sm_util_pct"):
                    self._read_gpm(dev, row)
                    return
            else:
                column, fn_name, extra, scale = self._state_reads[slot - 3]
                if gate.enabled(i, column):
                    self._put(row, i, column, gate.call(i, column, fn_name, h, *extra), scale)
                    return

    def _read_utilization(self, dev: _Device, row: array[float]) -> None:
        gate = self._gate
        if gate is None:
            return
        util = gate.call(dev.index, "gpu_util_pct", "nvmlDeviceGetUtilizationRates", dev.handle)
        if util is not None:
            self._put(row, dev.index, "gpu_util_pct", getattr(util, "gpu", None))
            self._put(row, dev.index, "mem_util_pct", getattr(util, "memory", None))

    def _put(self, row: array[float], device: int, column: str, value: Any, scale: float = 1.0) -> None:
        """Store ``value * scale`` in ``column``; a value that is not a number leaves it empty (warned once)."""
        if value is None:
            return
        try:
            number = float(value) * scale
        except (TypeError, ValueError):
            if self._gate is not None:
                self._gate.warn_once(
                    (column, "value"), f"{column}: GPU {device} returned {value!r}, not a number; left empty"
                )
            return
        row[_COL[column]] = number

    def _trial_pids(self, tick: int) -> set[int] | None:
        if self._pid_cache is None or tick - self._pid_cache_tick >= self.slow_every:
            self._pid_cache_tick = tick
            try:
                self._pid_cache = set(self._pids()) if self._pids is not None else None
            except Exception as exc:  # noqa: BLE001 - the caller's callback must not end sampling
                self._pid_cache = None
                if self._gate is not None:
                    self._gate.warn_once(
                        ("pids", type(exc).__name__),
                        f"proc_mem_bytes: the trial's pid list could not be read ({exc})",
                    )
        return self._pid_cache

    def _read_process_memory(self, dev: _Device, row: array[float], tick: int) -> None:
        nvml, gate = self._nvml, self._gate
        if nvml is None or gate is None:
            return
        pids = self._trial_pids(tick)
        if pids is None:
            return
        procs = gate.call(dev.index, "proc_mem_bytes", "nvmlDeviceGetComputeRunningProcesses", dev.handle)
        if procs is None:
            return
        total = 0.0
        matched = False
        for proc in procs:
            if proc.pid in pids:
                used = proc.usedGpuMemory
                if used is None:  # MIG or WDDM: the driver cannot attribute memory
                    return
                total += used
                matched = True
        if procs and not matched:
            # the GPU is in use, but by none of the trial's pids as NVML numbers them: in a container
            # with its own PID namespace NVML lists host pids. Unknown, not 0.
            return
        self._put(row, dev.index, "proc_mem_bytes", total)

    def _read_gpm(self, dev: _Device, row: array[float]) -> None:
        nvml, gate = self._nvml, self._gate
        if nvml is None or gate is None:
            return
        i = dev.index
        current, previous = dev.gpm[1], dev.gpm[0]
        if gate.call(i, "gpm_sm_util_pct", "nvmlGpmSampleGet", dev.handle, current) is None:
            dev.gpm_have_prev = False
            return
        if dev.gpm_have_prev:
            request = nvml.c_nvmlGpmMetricsGet_t()
            request.version = nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(_GPM_METRICS)
            request.sample1 = previous
            request.sample2 = current
            for k, (_, const) in enumerate(_GPM_METRICS):
                request.metrics[k].metricId = getattr(nvml, const)
            result = gate.call(i, "gpm_sm_util_pct", "nvmlGpmMetricsGet", request)
            if result is not None:
                for k, (column, _) in enumerate(_GPM_METRICS):
                    metric = result.metrics[k]
                    if metric.nvmlReturn == 0:
                        self._put(row, i, column, metric.value)
                    else:
                        gate.warn_once(
                            (column, "gpm", metric.nvmlReturn),
                            f"{column}: GPM returned error {metric.nvmlReturn} on GPU {i}; left empty",
                        )
        dev.gpm.reverse()  # the current sample becomes the previous one
        dev.gpm_have_prev = True

    def _read_driver_samples(
        self, dev: _Device, out: list[array[float]], since_us: int | None = None
    ) -> None:
        """Rows (appended to ``out``) from the driver's buffers newer than the last ones taken;
        ``since_us`` widens the query (not the rows kept) to learn at start whether a buffer delivers."""
        nvml, gate = self._nvml, self._gate
        if nvml is None or gate is None:
            return
        kinds = (
            (nvml.NVML_GPU_UTILIZATION_SAMPLES, "gpu_util_pct", 1.0),
            (nvml.NVML_TOTAL_POWER_SAMPLES, "power_w", 1e-3),  # mW -> W
        )
        offset = self._wall_minus_mono_s
        for kind, column, scale in kinds:
            metric = f"{column}_samples"
            last = dev.last_sample_us[kind]
            got = gate.call(
                dev.index,
                metric,
                "nvmlDeviceGetSamples",
                dev.handle,
                kind,
                last if since_us is None else since_us,
                missing_ok=True,
            )
            # power and utilization are polled on every tick only while their buffer is not delivering;
            # "no new sample" (NotFound) keeps the last answer, switched off (unsupported) means polling
            if not gate.enabled(dev.index, metric) or got is not None:
                delivering = bool(got and got[1])
                if column == "power_w":
                    dev.power_from_buffer = delivering
                else:
                    dev.util_from_buffer = delivering
            if not got:
                continue
            value_type, samples = got
            attr = _VALUE_FIELDS.get(int(value_type))
            if attr is None:
                gate.disable(dev.index, metric)
                gate.warn_once((metric, "type"), f"{metric}: unknown sample value type {value_type}; ignored")
                continue
            col = _COL[column]
            new_row = dev.new_row
            stamps = []
            number_field = _field if samples and isinstance(samples[0], ctypes.Structure) else getattr
            for sample in samples:
                ts = int(number_field(sample, "timeStamp"))
                if ts <= last:
                    continue
                stamps.append(ts)
                t_wall = ts / 1e6
                row = new_row(t_wall - offset, t_wall)
                row[col] = float(getattr(number_field(sample, "sampleValue"), attr)) * scale
                out.append(row)
            if stamps:
                dev.last_sample_us[kind] = max(stamps)
                if since_us is None and _overflowed(last, sorted(stamps)):
                    dev.buffer_every = 1  # the driver's buffer is shorter than our reading interval
