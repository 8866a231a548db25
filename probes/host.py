"""CPU, memory and IO of a trial's process tree and of the host, sampled with psutil.

The tree is the root process, all its descendants, and every process whose process group is the
root's (a trial runs in its own group, so a double-forked helper that re-parented to init is still
counted). The group rule is skipped when the root shares this process's own group: it would count
autotune itself. Processes come and go between samples; one that vanishes mid-read is simply left out
of that sample.

Host memory matters beside the GPU's: CPU offload and vLLM sleep level 1 keep weights and optimizer
states in host RAM, and a host OOM kill looks like a crash without this column.

Columns (one ``source="host"``, ``device=-1`` row per sample, see :data:`probes.timeline.HOST_METRICS`):
``cpu_pct`` is the tree's CPU time over the interval, percent of one core summed over its processes
(200 = two cores busy); ``host_cpu_pct`` is the whole machine, percent of all its ``host_cpu_count``
cores. ``other_cpu_cores`` is what *other* processes use: the machine's busy cores minus the trial's tree
and autotune's own process (the one sampling), in cores - on a shared host it says whether a neighbour
slowed the trial down; ``load_avg_1m`` is the machine's load average beside it. Rates need two samples,
so the first row has no ``cpu_pct``, ``host_cpu_pct``, ``other_cpu_cores`` or IO rates. CPU time of
processes that ended between two samples is lost (psutil cannot read a reaped process), so a trial that
starts and reaps many short processes reads as a little load from others.

Cost: each sample reads the known tree and lists the root's process group (one ``getpgid`` per pid);
the full descendant scan, which reads every process's ``/proc/<pid>/stat``, and the disk and network
counters run about once a second (so IO rates are 1 s averages on every fourth row at 4 Hz).
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil
from autotune.probes._threads import join_or_abandon
from autotune.probes.timeline import HOST_METRICS, RowBuffer

__all__ = ["HostSampler", "process_tree_pids", "cpu_cores", "other_busy_cores"]

log = logging.getLogger(__name__)

_COL = {name: i + 3 for i, name in enumerate(HOST_METRICS)}


def cpu_cores() -> int:
    """Cores this process may run on (its CPU affinity), else the logical core count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def other_busy_cores(
    host_busy_s: float, host_total_s: float, host_cpus: int, ours_cpu_s: float, interval_s: float
) -> float:
    """CPU cores other processes kept busy over one interval.

    Args:
        host_busy_s: busy CPU time of the whole machine over the interval, summed over its CPUs.
        host_total_s: all CPU time of the machine over the interval (busy + idle), summed over its CPUs.
        host_cpus: the machine's logical CPUs.
        ours_cpu_s: CPU time of the trial's tree and of autotune itself over the interval.
        interval_s: the interval's wall time.

    Returns:
        The machine's busy cores (busy share × CPUs) minus ours (CPU time ÷ wall time), at least 0.
    """
    if host_total_s <= 0 or interval_s <= 0:
        return 0.0
    busy_cores = host_busy_s / host_total_s * host_cpus
    return max(0.0, busy_cores - ours_cpu_s / interval_s)


def process_tree_pids(root_pid: int, *, include_group: bool = True) -> set[int]:
    """Pids of ``root_pid``, its descendants and - with ``include_group`` - every process in the root's
    process group (unless that group is this process's own, which would count autotune itself).

    One full process-table scan per call: meant for about 1 Hz (``NvmlSampler(pids=...)`` calls it at
    most once per ``slow_interval_s``). Returns an empty set when nothing of the tree is left.
    """
    pids: set[int] = set()
    try:
        root = psutil.Process(root_pid)
        pids.add(root.pid)
        pids.update(child.pid for child in root.children(recursive=True))
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        pass
    if include_group:
        try:
            pgid = os.getpgid(root_pid)
        except OSError:
            pgid = None
        if pgid is not None and pgid != os.getpgrp():
            pids.update(_group_members(pgid))
    return pids


def _group_members(pgid: int) -> set[int]:
    out: set[int] = set()
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid:
                out.add(pid)
        except OSError:  # vanished between listing and asking
            continue
    return out


@dataclass
class _Tracked:
    proc: psutil.Process
    create_time: float
    cpu_s: float | None = None  # user + system at the previous sample


class HostSampler:
    """Samples a trial's process tree and the host in a background thread.

    Args:
        root_pid: the trial's root process; None samples the host only (tree columns empty).
        interval_s: sampling interval (4 Hz by default; keep it at least 2 Hz).

    Lifecycle as :class:`probes.nvml.NvmlSampler`: ``start()``, ``rows()``, ``stop()`` (idempotent,
    escalating join), ``warnings``. ``pids()`` gives the tree as last sampled - pass it to
    ``NvmlSampler(pids=...)`` to attribute GPU memory to the trial.
    """

    def __init__(self, root_pid: int | None, *, interval_s: float = 0.25) -> None:
        if not interval_s > 0 or not math.isfinite(interval_s):
            raise ValueError(f"interval_s must be a positive number of seconds, got {interval_s!r}")
        self.root_pid = root_pid
        self.interval_s = float(interval_s)
        self._buffer = RowBuffer("host", HOST_METRICS)
        self._tracked: dict[int, _Tracked] = {}
        self._pids: frozenset[int] = frozenset()
        self._pgid: int | None = None
        self._cores = float(cpu_cores())
        self._ticks = 0
        self._full_scan_every = max(1, round(1.0 / self.interval_s))
        self._prev_t: float | None = None
        self._prev_wall: float | None = None
        self._prev_host: tuple[float, float] | None = None  # (busy_s, total_s)
        self._host_cpus = psutil.cpu_count() or 1
        self._self = psutil.Process()  # autotune itself: not "another process"
        self._prev_self_cpu_s: float | None = None
        self._prev_io: dict[str, tuple[float, tuple[float, float]] | None] = {}  # name -> (t, counters)
        self._io_off: set[str] = set()
        self._warned: set[str] = set()
        self._warnings: list[str] = []
        self._stop_event = threading.Event()
        self._thread: threading.Thread | None = None
        self._state = "new"
        self._lock = threading.Lock()

    # -- public API -----------------------------------------------------------------------------
    @property
    def warnings(self) -> list[str]:
        """Each problem met while sampling, once."""
        return list(self._warnings)

    def rows(self) -> list[dict[str, Any]]:
        """All samples so far (timeline schema; None = not measured)."""
        return self._buffer.rows()

    def pids(self) -> set[int]:
        """The trial's process tree as of the last sample (empty before the first)."""
        with self._lock:
            return set(self._pids)

    def start(self) -> None:
        """Start the sampling thread; its first sample is taken at once.

        Raises:
            RuntimeError: the sampler was started before.
        """
        if self._state != "new":
            raise RuntimeError("a HostSampler can be started once; create a new one")
        if self.root_pid is not None:
            try:
                root_pgid = os.getpgid(self.root_pid)
            except OSError:
                root_pgid = None
                self._warn("root", f"trial process {self.root_pid} is already gone; sampling the host only")
            if root_pgid is not None and root_pgid != os.getpgrp():
                self._pgid = root_pgid
        self._state = "running"
        self._thread = threading.Thread(target=self._run, name="autotune-host-sampler", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop sampling. Idempotent; escalates from a short join to ``timeout_s``, then abandons the
        (daemon) thread with a warning."""
        if self._state != "running":
            self._state = "stopped"
            return
        self._state = "stopped"
        self._stop_event.set()
        if self._thread is None:
            return
        messages = {
            "slow": ("slow-stop", "host sampler slow to stop; waiting for its current read"),
            "abandoned": ("abandoned", f"host sampler still reading after {timeout_s:.0f} s; abandoned it"),
        }
        join_or_abandon(
            self._thread,
            interval_s=self.interval_s,
            timeout_s=timeout_s,
            warn=lambda k: self._warn(*messages[k]),
        )

    def __enter__(self) -> HostSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- internals ----------------------------------------------------------------------------------
    def _warn(self, key: str, message: str) -> None:
        if key in self._warned:
            return
        self._warned.add(key)
        self._warnings.append(message)
        log.warning("%s", message)

    def _run(self) -> None:
        next_t = time.monotonic()
        stop = self._stop_event
        while not stop.is_set():
            try:
                self._sample()
            except Exception as exc:  # noqa: BLE001 - one bad read must not end sampling
                self._warn(f"tick-{type(exc).__name__}", f"host sample failed ({type(exc).__name__}: {exc})")
            next_t += self.interval_s
            now = time.monotonic()
            if next_t < now:
                next_t += math.ceil((now - next_t) / self.interval_s) * self.interval_s
            stop.wait(next_t - now)

    def _scan(self) -> dict[int, psutil.Process]:
        """The tree now: the processes seen last time, the root's group, and - once a second, or
        every sample when the group rule is off - a full descendant scan, which reads every process's
        ``/proc/<pid>/stat`` and costs most of a sample."""
        found: dict[int, psutil.Process] = {}
        if self.root_pid is None:
            return found
        if self._pgid is None or self._ticks % self._full_scan_every == 1 or self._full_scan_every == 1:
            try:
                known = self._tracked.get(self.root_pid)
                root = known.proc if known is not None else psutil.Process(self.root_pid)
                if root.is_running():
                    found[root.pid] = root
                    for child in root.children(recursive=True):
                        found[child.pid] = child
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        for pid, tracked in self._tracked.items():
            found.setdefault(pid, tracked.proc)  # a vanished one fails its read and drops out
        if self._pgid is not None:
            for pid in _group_members(self._pgid):
                if pid not in found:
                    try:
                        found[pid] = psutil.Process(pid)
                    except (psutil.NoSuchProcess, psutil.AccessDenied):
                        continue
        return found

    def _sample(self) -> None:
        self._ticks += 1
        t_mono = time.monotonic()
        t_wall = time.time()
        row = self._buffer.blank(t_mono, t_wall, -1)
        dt = t_mono - self._prev_t if self._prev_t is not None else None
        tree_cpu_s = self._sample_tree(row, dt) if self.root_pid is not None else 0.0
        host = self._sample_host(row)
        self_cpu_s = self._own_cpu_s()
        if host is not None and dt is not None and dt > 0 and self_cpu_s is not None:
            busy_s, total_s = host
            row[_COL["other_cpu_cores"]] = other_busy_cores(
                busy_s, total_s, self._host_cpus, tree_cpu_s + self_cpu_s, dt
            )
        row[_COL["cpu_cores"]] = self._cores
        row[_COL["host_cpu_count"]] = float(self._host_cpus)
        try:
            row[_COL["load_avg_1m"]] = os.getloadavg()[0]
        except OSError:  # pragma: no cover - not available on this platform
            pass
        self._prev_t, self._prev_wall = t_mono, t_wall
        self._buffer.append(row)

    def _own_cpu_s(self) -> float | None:
        """CPU time autotune's own process used since the previous sample (None at the first)."""
        times = self._self.cpu_times()
        now = float(times.user + times.system)
        prev, self._prev_self_cpu_s = self._prev_self_cpu_s, now
        return None if prev is None else max(0.0, now - prev)

    def _sample_tree(self, row: list[float], dt: float | None) -> float:
        """Fill the tree's columns; return the tree's CPU time since the previous sample."""
        found = self._scan()
        cpu_delta_s = 0.0
        rss = 0.0
        threads = 0.0
        alive: dict[int, _Tracked] = {}
        for pid, proc in found.items():
            try:
                with proc.oneshot():
                    create_time = proc.create_time()
                    times = proc.cpu_times()
                    mem = proc.memory_info()
                    n_threads = proc.num_threads()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue  # vanished (or not ours to read) between the scan and the read
            cpu_s = float(times.user + times.system)
            known = self._tracked.get(pid)
            if known is not None and abs(known.create_time - create_time) < 1e-3 and known.cpu_s is not None:
                cpu_delta_s += max(0.0, cpu_s - known.cpu_s)
            elif self._prev_wall is not None and create_time >= self._prev_wall - 0.05:
                cpu_delta_s += cpu_s  # born during this interval: all its CPU time is new
            tracked = known if known is not None and abs(known.create_time - create_time) < 1e-3 else None
            tracked = tracked or _Tracked(proc=proc, create_time=create_time)
            tracked.cpu_s = cpu_s
            alive[pid] = tracked
            rss += float(mem.rss)
            threads += float(n_threads)
        self._tracked = alive
        with self._lock:
            self._pids = frozenset(alive)
        row[_COL["rss_bytes"]] = rss
        row[_COL["threads"]] = threads
        if dt is not None and dt > 0:
            row[_COL["cpu_pct"]] = 100.0 * cpu_delta_s / dt
        return cpu_delta_s

    def _sample_host(self, row: list[float]) -> tuple[float, float] | None:
        """Fill the host's columns; return the machine's (busy, total) CPU time since the previous
        sample, or None at the first."""
        row[_COL["host_mem_available_bytes"]] = float(psutil.virtual_memory().available)
        times = psutil.cpu_times()
        total = float(sum(times))
        # on Linux guest time is already inside user/nice (psutil.cpu_percent does the same)
        total -= float(getattr(times, "guest", 0.0) + getattr(times, "guest_nice", 0.0))
        idle = float(times.idle + getattr(times, "iowait", 0.0))
        busy = total - idle
        delta = None
        if self._prev_host is not None and total > self._prev_host[1]:
            delta = (max(0.0, busy - self._prev_host[0]), total - self._prev_host[1])
            row[_COL["host_cpu_pct"]] = 100.0 * delta[0] / delta[1]
        self._prev_host = (busy, total)
        if self._ticks % self._full_scan_every == 1 or self._full_scan_every == 1:  # IO rates at ~1 Hz
            t = time.monotonic()
            self._rates(row, t, "disk", self._read_disk, ("disk_read_bytes_s", "disk_write_bytes_s"))
            self._rates(row, t, "net", self._read_net, ("net_rx_bytes_s", "net_tx_bytes_s"))
        return delta

    @staticmethod
    def _read_disk() -> tuple[float, float] | None:
        io = psutil.disk_io_counters(nowrap=False)  # a wrapped counter gives one negative delta, clipped
        return (float(io.read_bytes), float(io.write_bytes)) if io is not None else None

    @staticmethod
    def _read_net() -> tuple[float, float] | None:
        io = psutil.net_io_counters(nowrap=False)
        return (float(io.bytes_recv), float(io.bytes_sent)) if io is not None else None

    def _rates(
        self,
        row: list[float],
        t_mono: float,
        name: str,
        read: Callable[[], tuple[float, float] | None],
        columns: tuple[str, str],
    ) -> None:
        if name in self._io_off:
            return
        try:
            now = read()
        except Exception as exc:  # noqa: BLE001 - e.g. no /proc/diskstats in a container: empty columns only
            self._warn(name, f"{name} IO counters unavailable ({exc}); those columns stay empty")
            self._io_off.add(name)
            return
        prev = self._prev_io.get(name)
        if now is not None and prev is not None and t_mono > prev[0]:
            for col, a, b in zip(columns, now, prev[1], strict=True):
                row[_COL[col]] = max(0.0, a - b) / (t_mono - prev[0])
        self._prev_io[name] = (t_mono, now) if now is not None else None
