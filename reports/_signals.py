"""Numbers derived from one trial's timeline, phases and result: what the diagnosis rules read.

Phase-resolved numbers are computed over the *steady window* (from the first step's first phase to the
end of the trial), so model loading at start-up never counts as idle training time. Where the timeline
is missing, the trial's ``timeline_summary`` stands in; where both are missing the value is None.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from autotune.probes.phases import PHASES
from autotune.probes.summary import TimelineSummary
from autotune.reports._load import StudyData, TrialData

from autotune.recommend import allocator_cache_bytes

__all__ = ["IDLE_PCT", "HOST_BUSY_PCT", "TrialSignals", "signals"]

IDLE_PCT = 5.0  # a GPU sample below this utilization counts as idle (same as probes.timeline)
HOST_BUSY_PCT = 90.0  # host CPU at or above this share of all cores counts as saturated


@dataclass
class TrialSignals:
    """Derived numbers of one trial. Every field may be None when the evidence is missing.

    Attributes:
        capacity_bytes / peak_bytes / headroom_bytes: per selected GPU (position order); headroom is
            judged on the need (the peak less allocator_cache_bytes, as the recommendation judges it).
        util_mean_pct / idle_share: over all GPUs and the whole trial (the summary's numbers).
        window_s: length of the steady window; window_idle_share: GPU-idle share inside it.
        phase_seconds / idle_share_by_phase / pcie_bytes_s_by_phase: per phase inside the window
            (PCIe is tx + rx per GPU, bytes/s).
        host_busy_idle_share: of the GPU-idle time in the window, the share with the host CPU saturated;
            host_cpu_idle_mean_pct: the host CPU (% of all cores) during that idle time.
        sync_peak_bytes / rest_peak_bytes: highest memory on any GPU inside / outside weight-sync phases.
        open_phase: the phase the trial was in when it ended without closing it (died or hung there).
        silence_s: time from the last step record (or the first phase) to the end of the trial;
        silence_util_pct / silence_power_frac: GPU utilization and power ÷ limit during it.
    """

    number: int
    capacity_bytes: list[int | None] = field(default_factory=list)
    peak_bytes: list[int | None] = field(default_factory=list)
    # torch's free cache at its peak (reserved - allocated): NVML counts it, the job did not need it
    allocator_cache_bytes: int = 0
    util_mean_pct: float | None = None
    idle_share: float | None = None
    window_s: float | None = None
    window_idle_share: float | None = None
    phase_seconds: dict[str, float] = field(default_factory=dict)
    idle_share_by_phase: dict[str, float | None] = field(default_factory=dict)
    pcie_bytes_s_by_phase: dict[str, float | None] = field(default_factory=dict)
    phase_source: str = "none"
    host_busy_idle_share: float | None = None
    host_cpu_idle_mean_pct: float | None = None
    gpu_idle_s: float | None = None
    sync_peak_bytes: int | None = None
    rest_peak_bytes: int | None = None
    open_phase: str | None = None
    step_time_s: float | None = None
    last_step: int | None = None
    silence_s: float | None = None
    silence_util_pct: float | None = None
    silence_power_frac: float | None = None
    host_peak_rss_bytes: int | None = None
    host_min_available_bytes: int | None = None

    @property
    def headroom_bytes(self) -> list[int | None]:
        return [
            (c - max(0, p - self.allocator_cache_bytes)) if c is not None and p is not None else None
            for c, p in zip(self.capacity_bytes, self.peak_bytes, strict=False)
        ]

    def min_headroom(self) -> tuple[int, int, int] | None:
        """(position, headroom bytes, capacity bytes) of the GPU with the least memory left."""
        best: tuple[int, int, int] | None = None
        for i, (h, c) in enumerate(zip(self.headroom_bytes, self.capacity_bytes, strict=False)):
            if h is None or c is None:
                continue
            if best is None or h < best[1]:
                best = (i, h, c)
        return best

    def idle_seconds_by_phase(self) -> dict[str, float]:
        """Seconds of GPU-idle time per phase (phase seconds × idle share)."""
        out = {}
        for phase, seconds in self.phase_seconds.items():
            share = self.idle_share_by_phase.get(phase)
            if share is not None and seconds:
                out[phase] = seconds * share
        return out


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _label_phases(times: np.ndarray, trial: TrialData) -> np.ndarray:
    """The phase of each timestamp ("other" outside every span)."""
    labels = np.full(times.shape, "other", dtype=object)
    for span in trial.spans:
        inside = (times >= span.t0_mono_s) & (times < span.t1_mono_s)
        labels[inside] = span.phase if span.phase in PHASES else "other"
    return labels


def _window(trial: TrialData) -> tuple[float, float] | None:
    starts = [s.t0_mono_s for s in trial.spans]
    if trial.steps:
        first = trial.steps[0]
        starts.append(first.t_mono_s - (first.duration_s or 0.0))
    end = trial.t_end_mono_s
    if not starts or end is None:
        return None
    start = min(starts)
    return (start, end) if end > start else None


def signals(data: StudyData, trial: TrialData) -> TrialSignals:
    """Compute the derived numbers of ``trial``."""
    res = trial.result
    summary = res.timeline_summary if res.timeline_summary is not None else TimelineSummary()
    sum_gpus = summary.gpus
    gpu = trial.gpu_rows()
    n_gpus = data.gpu_count or len(sum_gpus) or (int(gpu["device"].nunique()) if gpu is not None else 0)
    sig = TrialSignals(number=trial.number, allocator_cache_bytes=allocator_cache_bytes(res))
    for pos in range(n_gpus):
        sig.capacity_bytes.append(data.capacity_bytes(pos, trial))
        peak = res.peak_mem_bytes[pos] if pos < len(res.peak_mem_bytes) else None
        if peak is None and pos < len(sum_gpus):
            peak = _int(sum_gpus[pos].peak_mem_bytes)
        if peak is None and gpu is not None and "mem_used_bytes" in gpu:
            dev = gpu[gpu["device"] == data.gpu_index(pos)]["mem_used_bytes"].dropna()
            peak = int(dev.max()) if len(dev) else None
        sig.peak_bytes.append(int(peak) if peak is not None and _num(peak) is not None else None)

    sig.util_mean_pct = _mean([g.util_mean_pct for g in sum_gpus])
    sig.idle_share = _mean([g.idle_fraction for g in sum_gpus])
    util = gpu["gpu_util_pct"].dropna() if gpu is not None and "gpu_util_pct" in gpu else None
    if sig.util_mean_pct is None and util is not None and len(util):
        sig.util_mean_pct = float(util.mean())
        sig.idle_share = float((util < IDLE_PCT).mean())

    sig.host_peak_rss_bytes = res.host_peak_rss_bytes or _int(summary.host.peak_rss_bytes)
    sig.host_min_available_bytes = _int(summary.host.min_available_bytes)
    host = trial.host_rows()
    if host is not None and sig.host_min_available_bytes is None and "host_mem_available_bytes" in host:
        avail = host["host_mem_available_bytes"].dropna()
        sig.host_min_available_bytes = int(avail.min()) if len(avail) else None

    if res.steady is not None:
        sig.step_time_s = res.steady.step_time_s
    elif len(trial.steps) >= 2:
        gaps = np.diff([s.t_mono_s for s in trial.steps])
        sig.step_time_s = float(np.median(gaps))
    sig.last_step = trial.steps[-1].step if trial.steps else None
    if trial.spans and trial.spans[-1].open:
        sig.open_phase = trial.spans[-1].phase
    elif trial.spans:
        opened = [s for s in trial.spans if s.open]
        sig.open_phase = opened[-1].phase if opened else None

    _phase_numbers(sig, trial, gpu, summary)
    _host_while_idle(sig, data, trial, gpu, host)
    _sync_peak(sig, trial, gpu)
    _silence(sig, trial, gpu)
    return sig


def _int(value: object) -> int | None:
    v = _num(value)
    return int(v) if v is not None else None


def _phase_numbers(
    sig: TrialSignals, trial: TrialData, gpu: pd.DataFrame | None, summary: TimelineSummary
) -> None:
    window = _window(trial)
    phases = summary.phases
    if trial.spans:
        sig.phase_source = trial.spans[0].source
    else:
        sig.phase_source = phases.source or "none"
    if window is not None and trial.spans:
        w0, w1 = window
        sig.window_s = w1 - w0
        seconds = dict.fromkeys(PHASES, 0.0)
        for span in trial.spans:
            phase = span.phase if span.phase in PHASES else "other"
            seconds[phase] += max(0.0, min(span.t1_mono_s, w1) - max(span.t0_mono_s, w0))
        seconds["other"] += max(0.0, sig.window_s - sum(seconds.values()))
        sig.phase_seconds = seconds
    elif phases.time_s:
        sig.phase_seconds = {k: float(v) for k, v in phases.time_s.items() if v is not None}

    if gpu is None or window is None or "gpu_util_pct" not in gpu:
        if phases.gpu_idle_fraction:
            sig.idle_share_by_phase = dict(phases.gpu_idle_fraction)
        return
    w0, w1 = window
    rows = gpu[(gpu["t_mono_s"] >= w0) & (gpu["t_mono_s"] <= w1)]
    rows = rows[rows["gpu_util_pct"].notna()]
    if not len(rows):
        return
    times = rows["t_mono_s"].to_numpy(dtype=float)
    labels = _label_phases(times, trial)
    idle = rows["gpu_util_pct"].to_numpy(dtype=float) < IDLE_PCT
    sig.window_idle_share = float(idle.mean())
    pcie = None
    if "pcie_tx_bytes_s" in rows and "pcie_rx_bytes_s" in rows:
        pcie = (rows["pcie_tx_bytes_s"].astype(float) + rows["pcie_rx_bytes_s"].astype(float)).to_numpy()
    for phase in PHASES:
        mask = labels == phase
        if not mask.any():
            sig.idle_share_by_phase[phase] = None
            sig.pcie_bytes_s_by_phase[phase] = None
            continue
        sig.idle_share_by_phase[phase] = float(idle[mask].mean())
        if pcie is not None:
            vals = pcie[mask]
            vals = vals[np.isfinite(vals)]
            sig.pcie_bytes_s_by_phase[phase] = float(vals.mean()) if len(vals) else None


def _host_cpu_pct(host: pd.DataFrame, cores: int | None) -> pd.Series | None:
    """Host CPU as % of all cores: the host-wide column, else the trial tree over the core count."""
    if "host_cpu_pct" in host and host["host_cpu_pct"].notna().any():
        return host["host_cpu_pct"].astype(float)
    if "cpu_pct" in host and cores:
        return host["cpu_pct"].astype(float) / cores
    return None


def _host_while_idle(
    sig: TrialSignals, data: StudyData, trial: TrialData, gpu: pd.DataFrame | None, host: pd.DataFrame | None
) -> None:
    window = _window(trial)
    if gpu is None or host is None or window is None or "gpu_util_pct" not in gpu:
        return
    cores = trial.result.timeline_summary.host.cpu_cores if trial.result.timeline_summary else None
    if not cores and data.hardware is not None:
        cores = data.hardware.host.cpu_cores_logical
    cpu = _host_cpu_pct(host, cores if isinstance(cores, int) else None)
    if cpu is None:
        return
    w0, w1 = window
    # One-second bins: mean utilization over every GPU against the host CPU in the same second.
    g = gpu[(gpu["t_mono_s"] >= w0) & (gpu["t_mono_s"] <= w1) & gpu["gpu_util_pct"].notna()]
    h = pd.DataFrame({"t": host["t_mono_s"].astype(float), "cpu": cpu}).dropna()
    h = h[(h["t"] >= w0) & (h["t"] <= w1)]
    if not len(g) or not len(h):
        return
    g_bins = g.groupby(np.floor(g["t_mono_s"].astype(float) - w0))["gpu_util_pct"].mean()
    h_bins = h.groupby(np.floor(h["t"] - w0))["cpu"].mean()
    joined = pd.concat([g_bins.rename("util"), h_bins.rename("cpu")], axis=1).dropna()
    if not len(joined):
        return
    idle = joined[joined["util"] < IDLE_PCT]
    sig.gpu_idle_s = float(len(idle))
    if len(idle):
        sig.host_busy_idle_share = float((idle["cpu"] >= HOST_BUSY_PCT).mean())
        sig.host_cpu_idle_mean_pct = float(idle["cpu"].mean())
    else:
        sig.host_busy_idle_share = 0.0


def _sync_peak(sig: TrialSignals, trial: TrialData, gpu: pd.DataFrame | None) -> None:
    sync_spans = [s for s in trial.spans if s.phase == "weight_sync"]
    if gpu is None or not sync_spans or "mem_used_bytes" not in gpu:
        return
    rows = gpu[gpu["mem_used_bytes"].notna()]
    if not len(rows):
        return
    times = rows["t_mono_s"].to_numpy(dtype=float)
    inside = np.zeros(times.shape, dtype=bool)
    for s in sync_spans:
        inside |= (times >= s.t0_mono_s) & (times <= s.t1_mono_s)
    mem = rows["mem_used_bytes"].to_numpy(dtype=float)
    if inside.any():
        sig.sync_peak_bytes = int(mem[inside].max())
    if (~inside).any():
        sig.rest_peak_bytes = int(mem[~inside].max())


def _silence(sig: TrialSignals, trial: TrialData, gpu: pd.DataFrame | None) -> None:
    end = trial.t_end_mono_s
    if end is None:
        return
    start = trial.steps[-1].t_mono_s if trial.steps else (trial.spans[0].t0_mono_s if trial.spans else None)
    if start is None:
        return
    sig.silence_s = max(0.0, end - start)
    if gpu is None:
        return
    after = gpu[gpu["t_mono_s"] > start]
    if "gpu_util_pct" in after:
        u = after["gpu_util_pct"].dropna()
        sig.silence_util_pct = float(u.mean()) if len(u) else None
    if "power_w" in after and "power_limit_w" in after:
        p = (after["power_w"] / after["power_limit_w"]).replace([np.inf, -np.inf], np.nan).dropna()
        sig.silence_power_frac = float(p.mean()) if len(p) else None
