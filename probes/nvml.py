"""GPU detection and sampling through NVML (``nvidia-ml-py``, imported as ``pynvml``).

Every NVML call of the sampler goes through one gate, :class:`NvmlGate` (:mod:`autotune.probes._nvml_gate`,
with the library's loading, GPU detection and the one-shot queries, all exported here); a GPU's own
state between reads is :class:`~autotune.probes._nvml_device.Device`.

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
import math
import threading
import time
from array import array
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from autotune.probes._nvml_device import GPM_METRICS, VALUE_FIELDS, Device, buffer_overflowed
from autotune.probes._nvml_gate import (
    DeviceFacts,
    GpuDetection,
    NvmlGate,
    NvmlUnavailable,
    detect_gpus,
    device_handles,
    gpu_processes,
    load_nvml,
    memory_used,
    nvml_init,
    nvml_shutdown,
)
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


# ----------------------------------------------------------------------------------------- sampler
_COL = {name: i + 3 for i, name in enumerate(GPU_METRICS)}  # offset past t_mono_s, t_wall_s, device
_MEM_USED, _MEM_TOTAL = _COL["mem_used_bytes"], _COL["mem_total_bytes"]
_NAN = math.nan
_SLEEP_MAX_S = 0.1  # waits up to this long between ticks sleep; longer ones wait on the stop event
# A numeric field of an answer, without pynvml's Python-level ``__getattribute__`` (whose only work,
# turning bytes into str, never applies to a number); for other objects the same lookup as ``getattr``
# minus ``__getattr__`` fallbacks. The hot paths use it; a value it cannot read goes the checked way.
_field = object.__getattribute__


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
        self._devices: list[Device] = []
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
        nvml_init(nvml)
        try:
            handles = device_handles(nvml, self.indices)
        except NvmlUnavailable:
            nvml_shutdown(nvml)
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
            Device(
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
        nvml_shutdown(nvml)

    def _setup_gpm(self, dev: Device) -> None:
        nvml, gate = self._nvml, self._gate
        if nvml is None or gate is None:
            return
        needed = ("c_nvmlGpmMetricsGet_t", "NVML_GPM_METRICS_GET_VERSION", *(c for _, c in GPM_METRICS))
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

    def _store_memory(self, dev: Device, row: array[float], mem: object) -> None:
        if mem is not None:
            self._put(row, dev.index, "mem_used_bytes", getattr(mem, "used", None))
            self._put(row, dev.index, "mem_total_bytes", getattr(mem, "total", None))

    def _read(
        self, dev: Device, t_mono: float, t_wall: float, slow: bool, tick: int, out: list[array[float]]
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

    def _read_counters(self, dev: Device, row: array[float], t_wall: float) -> None:
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

    def _store_counter(self, dev: Device, row: array[float], column: str, value: Any, t_wall: float) -> None:
        attr = VALUE_FIELDS.get(int(value.valueType))
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

    def _read_state(self, dev: Device, row: array[float], tick: int) -> None:
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

    def _read_utilization(self, dev: Device, row: array[float]) -> None:
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

    def _read_process_memory(self, dev: Device, row: array[float], tick: int) -> None:
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

    def _read_gpm(self, dev: Device, row: array[float]) -> None:
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
            request.numMetrics = len(GPM_METRICS)
            request.sample1 = previous
            request.sample2 = current
            for k, (_, const) in enumerate(GPM_METRICS):
                request.metrics[k].metricId = getattr(nvml, const)
            result = gate.call(i, "gpm_sm_util_pct", "nvmlGpmMetricsGet", request)
            if result is not None:
                for k, (column, _) in enumerate(GPM_METRICS):
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

    def _read_driver_samples(self, dev: Device, out: list[array[float]], since_us: int | None = None) -> None:
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
            attr = VALUE_FIELDS.get(int(value_type))
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
                if since_us is None and buffer_overflowed(last, sorted(stamps)):
                    dev.buffer_every = 1  # the driver's buffer is shorter than our reading interval
