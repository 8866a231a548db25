"""The columnar timeline of one trial (parquet) and what the report and the study read from it.

One row per sample per device. ``t_mono_s`` is ``time.monotonic()`` (CLOCK_MONOTONIC, system-wide on
Linux) and ``t_wall_s`` is ``time.time()`` - the same clocks the step records and the phase markers use,
so the three line up without conversion. Metric columns are float64; NaN (None in rows) means "not
measured at this sample", never zero.

Summaries (:func:`summarize`) separate *totals* from *rates*:

* totals and peaks (``peak_mem_bytes``, ``energy_j``, ``peak_rss_bytes``) cover the whole timeline:
  the true peak can happen while the model loads or in the first step;
* means, percentiles, idle share, per-step figures and phase shares cover the *steady window*, from the
  end of the first step record to the end of the last one (``steps - 1`` steps): start-up and the
  warm-up step would otherwise dominate a short trial. With one step whose duration is known the window
  is that step; without steps it is the whole timeline and the per-step figures are None.

Averages are time-weighted: each sample holds until the next sample of the same series, at most three
median sample intervals (so a gap - a lost GPU, a stalled sampler - is not filled in).

pandas and numpy are imported inside the functions that need them: the samplers import this module
for its schema and :class:`RowBuffer` and must stay light.
"""

from __future__ import annotations

import math
import os
import tempfile
import threading
from array import array
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune.probes._timeline_phases import (
    InferenceThresholds,
    fill_segments,
    marker_segments,
    overlay,
    phase_intervals,
    phase_intervals_of,
)
from autotune.probes._timeline_steps import (
    SteadyWindow,
    gpu_rows,
    held_samples,
    normalize_steps,
    steady_window,
)
from autotune.probes.phases import PHASES
from autotune.probes.summary import TimelineSummary

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pandas as pd

__all__ = [
    "KEY_COLUMNS",
    "GPU_METRICS",
    "HOST_METRICS",
    "METRIC_COLUMNS",
    "COLUMNS",
    "PHASES",
    "InferenceThresholds",
    "RowBuffer",
    "write_timeline",
    "read_timeline",
    "empty_timeline",
    "phase_intervals",
    "summarize",
]

KEY_COLUMNS: tuple[str, ...] = ("t_mono_s", "t_wall_s", "source", "device")
GPU_METRICS: tuple[str, ...] = (
    "gpu_util_pct",  # nvidia-smi utilization.gpu: share of time >= 1 kernel ran
    "mem_util_pct",  # utilization.memory: share of time device memory was read or written
    "mem_used_bytes",  # memory.used
    "mem_total_bytes",  # memory.total
    "power_w",  # power.draw
    "power_limit_w",  # enforced.power.limit
    "sm_clock_mhz",  # clocks.sm
    "pcie_tx_bytes_s",  # bytes/s between two reads of the PCIe byte counters (else NVML 20 ms KiB/s x 1024)
    "pcie_rx_bytes_s",
    "temperature_c",  # temperature.gpu
    "clock_event_reasons",  # clocks_event_reasons.active (bitmask)
    "proc_mem_bytes",  # GPU memory held by the trial's process tree
    "gpm_sm_util_pct",  # Hopper+: NVML GPM SM_UTIL
    "gpm_sm_occupancy_pct",  # Hopper+: GPM SM_OCCUPANCY
    "gpm_tensor_util_pct",  # Hopper+: GPM ANY_TENSOR_UTIL
    "energy_mj",  # total energy counter since driver load (mJ)
)
HOST_METRICS: tuple[str, ...] = (
    "cpu_pct",  # trial process tree, percent of one core, summed over processes
    "rss_bytes",  # trial process tree, summed resident set
    "threads",  # trial process tree, summed thread count
    "host_mem_available_bytes",  # whole host
    "host_cpu_pct",  # whole host, percent of all cores (0-100)
    "disk_read_bytes_s",
    "disk_write_bytes_s",
    "net_rx_bytes_s",
    "net_tx_bytes_s",
    "cpu_cores",  # cores this process may run on (affinity), for reading cpu_pct
    # added later: older timelines lack them (read as NaN)
    "other_cpu_cores",  # whole host minus the trial's tree and autotune itself, in cores (1 = one core)
    "load_avg_1m",  # the host's 1-minute load average (runnable + uninterruptible tasks)
    "host_cpu_count",  # logical CPUs of the host (what host_cpu_pct is a percent of)
)
METRIC_COLUMNS: tuple[str, ...] = GPU_METRICS + HOST_METRICS
COLUMNS: tuple[str, ...] = KEY_COLUMNS + METRIC_COLUMNS

_NAN = float("nan")


# ----------------------------------------------------------------------------------------- storage
class RowBuffer:
    """Append-only columnar store of timeline rows: 8 bytes per value, NaN for "not measured".

    A sampler appends one flat row per sample; an hour of 8 GPUs at 10 Hz is about 45 MB, where a list
    of dicts would take ten times that. Appends and reads are thread-safe (one lock).

    Args:
        source: the ``source`` column of every row (``"gpu"`` or ``"host"``).
        metrics: the metric columns, in the order the rows list them.
    """

    def __init__(self, source: str, metrics: Sequence[str]) -> None:
        self.source = source
        self.columns: tuple[str, ...] = ("t_mono_s", "t_wall_s", "device", *metrics)
        self.width = len(self.columns)
        self._data = array("d")
        self._lock = threading.Lock()

    def blank(self, t_mono_s: float, t_wall_s: float, device: int) -> list[float]:
        """A row with its keys set and every metric NaN, ready to be filled and appended."""
        row = [_NAN] * self.width
        row[0], row[1], row[2] = t_mono_s, t_wall_s, float(device)
        return row

    def append(self, row: Sequence[float]) -> None:
        """Store one row (``len(row) == width``; NaN = not measured)."""
        self.extend((row,))

    def extend(self, rows: Sequence[Sequence[float]]) -> None:
        """Store several rows under one lock (each ``len(row) == width``; NaN = not measured)."""
        for row in rows:
            if len(row) != self.width:
                raise ValueError(f"row has {len(row)} values, the buffer {self.width}")
        with self._lock:
            for row in rows:
                self._data.extend(row)

    def __len__(self) -> int:
        return len(self._data) // self.width

    def since(self, start: int, names: Sequence[str]) -> tuple[list[tuple[float, ...]], int]:
        """The rows stored from row number ``start`` on, each as a tuple of the columns ``names``.

        For a reader that follows the buffer while it grows (the trial runner's live hang rule): it
        passes back the returned row number on its next call, so each call costs only the new rows.
        Values are floats, NaN = not measured. Thread-safe.

        Raises:
            KeyError: a name that is not a column.
        """
        picks = [self.columns.index(n) if n in self.columns else -1 for n in names]
        if -1 in picks:
            raise KeyError(f"no column {names[picks.index(-1)]!r}; columns: {', '.join(self.columns)}")
        width = self.width
        with self._lock:
            end = len(self._data) // width
            chunk = self._data[max(0, start) * width : end * width]
        rows = [tuple(chunk[i + k] for k in picks) for i in range(0, len(chunk), width)]
        return rows, end

    def rows(self) -> list[dict[str, Any]]:
        """Every row so far as a dict: ``source`` added, ``device`` an int, NaN turned into None."""
        with self._lock:
            data = self._data.tolist()
        width, cols, source = self.width, self.columns, self.source
        out: list[dict[str, Any]] = []
        for start in range(0, len(data), width):
            chunk = data[start : start + width]
            row: dict[str, Any] = {"source": source}
            for name, value in zip(cols, chunk, strict=True):
                row[name] = None if value != value else value  # NaN != NaN
            row["device"] = int(chunk[2])
            out.append(row)
        return out


def empty_timeline() -> pd.DataFrame:
    """A timeline with every column and no rows."""
    import pandas as pd

    return _conform(pd.DataFrame({c: [] for c in COLUMNS}))


def _conform(df: pd.DataFrame) -> pd.DataFrame:
    import pandas as pd

    for col in COLUMNS:
        if col not in df.columns:
            df[col] = pd.Series(dtype="float64" if col != "source" else "object", index=df.index)
    for col in ("t_mono_s", "t_wall_s", *METRIC_COLUMNS):
        df[col] = pd.to_numeric(df[col], errors="coerce").astype("float64")
    df["device"] = pd.to_numeric(df["device"], errors="coerce").fillna(-1).astype("int64")
    df["source"] = df["source"].astype("object")
    extra = [c for c in df.columns if c not in COLUMNS]
    ordered: pd.DataFrame = (
        df[[*COLUMNS, *extra]].sort_values(["t_mono_s", "device"], kind="stable").reset_index(drop=True)
    )
    return ordered


def write_timeline(path: str | os.PathLike[str], rows: Iterable[Mapping[str, Any]]) -> int:
    """Write sampler rows to one parquet file (atomically: a temporary file, then a rename).

    Rows from several samplers may be mixed in any order; the file is sorted by ``t_mono_s``. Missing
    columns are added as NaN, so an empty list still writes a file with the full schema.

    Returns:
        The number of rows written.
    """
    import pandas as pd

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    df = _conform(pd.DataFrame(list(rows)))
    # a fresh temporary file (never a link planted beside the target), removed if the write fails:
    # a half-written timeline is never left where a reader takes it for a whole one
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            df.to_parquet(fh, index=False)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return len(df)


def read_timeline(path: str | os.PathLike[str]) -> pd.DataFrame:
    """Read a timeline written by :func:`write_timeline` (or an older one missing some columns)."""
    import pandas as pd

    return _conform(pd.read_parquet(Path(path)))


# ----------------------------------------------------------------------------------------- summary
def _clean(value: Any) -> Any:
    """Plain JSON values: numpy scalars to Python, NaN/inf to None."""
    if value is None:
        return None
    if isinstance(value, (int,)) and not isinstance(value, bool):
        return int(value)
    try:
        f = float(value)
    except (TypeError, ValueError):
        return value
    return f if math.isfinite(f) else None


def _weighted(durations: np.ndarray, values: np.ndarray) -> dict[str, float | None]:
    import numpy as np

    total = float(durations.sum()) if durations.size else 0.0
    if total <= 0:
        return {"mean": None, "p50": None, "p95": None}
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(durations[order])

    def quantile(q: float) -> float:
        return float(values[order][min(int(np.searchsorted(cum, q * total)), order.size - 1)])

    return {
        "mean": float((durations * values).sum() / total),
        "p50": quantile(0.5),
        "p95": quantile(0.95),
    }


def _in_window(df: pd.DataFrame, col: str, win: SteadyWindow | None) -> tuple[np.ndarray, np.ndarray]:
    """(durations, values) of a column step-held and clipped to the window."""
    import numpy as np

    starts, ends, values = held_samples(df["t_mono_s"].to_numpy(), df[col].to_numpy())
    if win is None or starts.size == 0:
        return np.empty(0), np.empty(0)
    a = np.maximum(starts, win.t0)
    b = np.minimum(ends, win.t1)
    keep = b > a
    return (b - a)[keep], values[keep]


def _integral(df: pd.DataFrame, col: str, win: SteadyWindow | None) -> float | None:
    durations, values = _in_window(df, col, win)
    if win is None or durations.size == 0 or durations.sum() < 0.5 * win.length_s:
        return None
    return float((durations * values).sum())


def _counter_delta(df: pd.DataFrame, col: str, t0: float, t1: float) -> float | None:
    """Increase of a cumulative counter between t0 and t1 (linear between readings)."""
    import numpy as np

    d = df[["t_mono_s", col]].dropna()
    if len(d) < 2:
        return None
    t = d["t_mono_s"].to_numpy()
    v = d[col].to_numpy()
    span = t1 - t0
    # the readings must bracket the interval closely: at most 10 % of it (or 1 s) outside
    slack = max(1.0, 0.1 * span)
    if t[0] > t0 + slack or t[-1] < t1 - slack or np.any(np.diff(v) < 0):
        return None
    return float(np.interp(t1, t, v) - np.interp(t0, t, v))


def _max(df: pd.DataFrame, col: str) -> float | None:
    s = df[col].dropna()
    return float(s.max()) if len(s) else None


def _gpu_summary(
    d: pd.DataFrame,
    index: int,
    win: SteadyWindow | None,
    idle_threshold_pct: float,
    mfu: float | None,
) -> dict[str, Any]:
    util_d, util_v = _in_window(d, "gpu_util_pct", win)
    util = _weighted(util_d, util_v)
    idle_share = float(util_d[util_v < idle_threshold_pct].sum() / util_d.sum()) if util_d.sum() > 0 else None
    power = _weighted(*_in_window(d, "power_w", win))
    sm = _weighted(*_in_window(d, "gpm_sm_util_pct", win))

    t_all = d["t_mono_s"]
    energy_j = None
    if len(d):
        whole = SteadyWindow(float(t_all.min()), float(t_all.max()), None)
        mj = _counter_delta(d, "energy_mj", whole.t0, whole.t1)
        energy_j = mj / 1000.0 if mj is not None else _integral(d, "power_w", whole)
    energy_per_step = pcie_per_step = None
    if win is not None and win.steps:
        mj = _counter_delta(d, "energy_mj", win.t0, win.t1)
        window_j = mj / 1000.0 if mj is not None else _integral(d, "power_w", win)
        energy_per_step = window_j / win.steps if window_j is not None else None
        tx = _integral(d, "pcie_tx_bytes_s", win)
        rx = _integral(d, "pcie_rx_bytes_s", win)
        if tx is not None or rx is not None:
            pcie_per_step = ((tx or 0.0) + (rx or 0.0)) / win.steps
    return {
        "index": int(index),
        "util_mean_pct": util["mean"],
        "util_p50_pct": util["p50"],
        "util_p95_pct": util["p95"],
        "idle_share": idle_share,
        "peak_mem_bytes": _max(d, "mem_used_bytes"),
        "mem_total_bytes": _max(d, "mem_total_bytes"),
        "peak_proc_mem_bytes": _max(d, "proc_mem_bytes"),
        "power_mean_w": power["mean"],
        "energy_j": energy_j,
        "energy_per_step_j": energy_per_step,
        "pcie_bytes_per_step": pcie_per_step,
        "sm_util_mean_pct": sm["mean"],
        "mfu": mfu,
    }


def _host_summary(h: pd.DataFrame, win: SteadyWindow | None, cpu_cores: int | None) -> dict[str, Any]:
    cpu = _weighted(*_in_window(h, "cpu_pct", win))
    other = _weighted(*_in_window(h, "other_cpu_cores", win))
    load = _weighted(*_in_window(h, "load_avg_1m", win))
    min_avail = h["host_mem_available_bytes"].dropna()
    if cpu_cores is None:
        cores = h["cpu_cores"].dropna()
        cpu_cores = int(cores.iloc[-1]) if len(cores) else None
    host_cpus = h["host_cpu_count"].dropna()
    return {
        "cpu_mean_pct": cpu["mean"],
        "cpu_p95_pct": cpu["p95"],
        "peak_rss_bytes": _max(h, "rss_bytes"),
        "min_available_bytes": float(min_avail.min()) if len(min_avail) else None,
        "cpu_cores": cpu_cores,
        "other_busy_cores_mean": other["mean"],
        "other_busy_cores_p95": other["p95"],
        "load_avg_1m_mean": load["mean"],
        "host_cpu_count": int(host_cpus.iloc[-1]) if len(host_cpus) else None,
    }


def _phase_summary(
    intervals: list[dict[str, Any]],
    source: str,
    win: SteadyWindow | None,
    gpu: pd.DataFrame,
    idle_threshold_pct: float,
) -> dict[str, Any]:
    import numpy as np

    none = {p: None for p in PHASES}
    if source == "none" or not intervals or win is None or win.length_s <= 0:
        return {"source": source, "seconds": dict(none), "share": dict(none), "gpu_idle_share_by_phase": none}
    cover = fill_segments(
        [(iv["t0_mono_s"], iv["t1_mono_s"], iv["phase"]) for iv in intervals], win.t0, win.t1
    )
    seconds = dict.fromkeys(PHASES, 0.0)
    for a, b, phase in cover:
        seconds[phase] += b - a
    share = {p: seconds[p] / win.length_s for p in PHASES}

    idle_s = dict.fromkeys(PHASES, 0.0)
    seen_s = dict.fromkeys(PHASES, 0.0)
    for _, d in gpu.groupby("device"):
        starts, ends, values = held_samples(d["t_mono_s"].to_numpy(), d["gpu_util_pct"].to_numpy())
        widths, vals, labels = overlay(starts, ends, values, cover)
        for phase in PHASES:
            mask = np.array([lab == phase for lab in labels], dtype=bool)
            if mask.any():
                seen_s[phase] += float(widths[mask].sum())
                idle_s[phase] += float(widths[mask & (vals < idle_threshold_pct)].sum())
    idle = {p: (idle_s[p] / seen_s[p] if seen_s[p] > 0 else None) for p in PHASES}
    return {"source": source, "seconds": seconds, "share": share, "gpu_idle_share_by_phase": idle}


def summarize(
    df: pd.DataFrame | None,
    steps: Iterable[Any],
    phases: Sequence[Mapping[str, Any]],
    *,
    model_flops_per_step: float | None = None,
    peak_flops: float | None = None,
    idle_threshold_pct: float = 5.0,
    thresholds: InferenceThresholds | None = None,
    cpu_cores: int | None = None,
) -> TimelineSummary:
    """Summarize one trial's timeline: per GPU, the host, and the phase split.

    Args:
        df: the timeline (:func:`read_timeline`); None or empty on a run without samples.
        steps: step records with ``step``, ``t_mono_s`` (step end) and optional ``duration_s`` and
            ``values`` (dicts, or objects with those attributes such as ``StepMetrics``).
        phases: phase markers (:func:`probes.phases.read_phases`).
        model_flops_per_step: model FLOPs of one optimizer step summed over all GPUs (for MFU).
        peak_flops: peak FLOP/s of one GPU at the training precision (for MFU).
        idle_threshold_pct: a GPU sample below this utilization counts as idle.
        thresholds: phase-inference thresholds (see :class:`InferenceThresholds`).
        cpu_cores: cores of the host; read from the timeline's ``cpu_cores`` column when None.

    Returns:
        The :class:`~autotune.probes.summary.TimelineSummary`, whose JSON (``to_json``) is (None where
        unknown)::

            {"duration_s", "sample_rate_hz", "steps",
             "window": {"t0_mono_s", "t1_mono_s", "steps"},
             "gpus": [{"index", "util_mean_pct", "util_p50_pct", "util_p95_pct", "idle_share",
                       "peak_mem_bytes", "mem_total_bytes", "peak_proc_mem_bytes", "power_mean_w",
                       "energy_j", "energy_per_step_j", "pcie_bytes_per_step", "sm_util_mean_pct",
                       "mfu"}],
             "host": {"cpu_mean_pct", "cpu_p95_pct", "peak_rss_bytes", "min_available_bytes",
                      "cpu_cores", "other_busy_cores_mean", "other_busy_cores_p95",
                      "load_avg_1m_mean", "host_cpu_count"},
             "phases": {"source": "framework"|"markers"|"inferred"|"none",
                        "seconds": {"rollout", "train", "weight_sync", "other"},
                        "share": {...}, "gpu_idle_share_by_phase": {...}}}

        ``sample_rate_hz`` is the polling rate per GPU (median over GPUs; the driver's own samples,
        which add resolution to utilization and power, are not counted), or the host sampling rate
        on a CPU-only run.
    """
    if df is None or len(df) == 0:
        df = empty_timeline()
    norm = normalize_steps(steps)
    t_min = float(df["t_mono_s"].min()) if len(df) else None
    t_max = float(df["t_mono_s"].max()) if len(df) else None
    win = steady_window(norm, t_min, t_max)
    if win is None:
        marks = marker_segments(phases)
        if marks:
            win = SteadyWindow(marks[0][0], marks[-1][1], None)

    gpu = gpu_rows(df)
    host = df[df["source"] == "host"]
    devices = sorted(int(x) for x in gpu["device"].unique())

    mfu = None
    if model_flops_per_step and peak_flops and devices and win is not None and win.steps and win.length_s > 0:
        step_time_s = win.length_s / win.steps
        mfu = model_flops_per_step / len(devices) / step_time_s / peak_flops

    gpus = [_gpu_summary(gpu[gpu["device"] == dev], dev, win, idle_threshold_pct, mfu) for dev in devices]

    rates = []
    for dev in devices:
        d = gpu[gpu["device"] == dev]
        polled = d[d["mem_used_bytes"].notna()]["t_mono_s"]  # memory is only ever polled
        s = polled if len(polled) >= 2 else d[d["gpu_util_pct"].notna()]["t_mono_s"]
        if len(s) >= 2 and s.max() > s.min():
            rates.append((len(s) - 1) / float(s.max() - s.min()))
    if not rates and len(host) >= 2 and host["t_mono_s"].max() > host["t_mono_s"].min():
        rates.append((len(host) - 1) / float(host["t_mono_s"].max() - host["t_mono_s"].min()))
    sample_rate = sorted(rates)[len(rates) // 2] if rates else None

    intervals = phase_intervals_of(norm, phases, df, thresholds or InferenceThresholds())
    source = intervals[0]["source"] if intervals else "none"
    summary = {
        "duration_s": (t_max - t_min) if t_min is not None and t_max is not None else None,
        "sample_rate_hz": sample_rate,
        "steps": len(norm),
        "window": {
            "t0_mono_s": win.t0 if win else None,
            "t1_mono_s": win.t1 if win else None,
            "steps": win.steps if win else None,
        },
        "gpus": gpus,
        "host": _host_summary(host, win, cpu_cores),
        "phases": _phase_summary(intervals, source, win, gpu, idle_threshold_pct),
    }
    return TimelineSummary.from_json(_json_clean(summary))


def _json_clean(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _json_clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_clean(v) for v in obj]
    if isinstance(obj, str):
        return obj
    return _clean(obj)
