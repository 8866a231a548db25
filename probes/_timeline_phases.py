"""Phase intervals of a run (:func:`phase_intervals`): from the framework's own per-step timings, the
phase markers, else the GPU's utilization and power signature (:class:`InferenceThresholds`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from autotune.probes._timeline_steps import (
    Step,
    finite_float,
    gpu_rows,
    held_samples,
    normalize_steps,
    step_bounds,
)
from autotune.probes.phases import PHASES

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pandas as pd


@dataclass(frozen=True)
class InferenceThresholds:
    """How a step's GPU signature is split into phases when neither the framework nor markers say.

    Each GPU sample (mean over GPUs) is labelled, then runs shorter than ``smooth_samples`` are merged
    into their neighbours:

    * utilization below ``busy_util_pct`` -> ``other`` (waiting, data loading, CPU reward, sync);
    * utilization at or above it and power below ``train_power_frac`` of the power limit ->
      ``rollout``: autoregressive decode keeps a kernel running (high "utilization") but is
      memory-bound, so the SMs draw little power;
    * utilization at or above it and power at or above ``train_power_frac`` -> ``train``
      (dense forward/backward GEMMs run near the power limit).

    Weight sync cannot be told apart from other low-utilization work by NVML counters, so inference
    never yields ``weight_sync``. Without a power limit the highest power seen on the GPU stands in.
    """

    busy_util_pct: float = 30.0
    train_power_frac: float = 0.55
    smooth_samples: int = 3


_VERL_ORDER: tuple[tuple[str, str], ...] = (
    # verl RayPPOTrainer.fit() runs these timers in this order inside timing_s/step.
    ("gen", "rollout"),
    ("gen_max", "rollout"),
    ("reward", "other"),
    ("old_log_prob", "train"),
    ("ref", "train"),
    ("values", "train"),
    ("adv", "other"),
    ("update_critic", "train"),
    ("update_actor", "train"),
    ("update_weights", "weight_sync"),
)


def _has_framework_timing(steps: list[Step]) -> bool:
    return any(finite_float(s.values.get("timing_s/gen")) is not None for s in steps)


def _framework_intervals(steps: list[Step]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    prev_end: float | None = None
    for s in steps:
        known = [(finite_float(s.values.get(f"timing_s/{key}")) or 0.0, phase) for key, phase in _VERL_ORDER]
        total = s.duration_s if s.duration_s is not None else sum(d for d, _ in known)
        t = s.t_end - total
        if prev_end is not None and t > prev_end:
            out.append(_interval(s.step, "other", prev_end, t, "framework"))
        if prev_end is not None:
            t = max(t, prev_end)
        for duration, phase in known:
            if duration <= 0 or t >= s.t_end:
                continue
            t1 = min(t + duration, s.t_end)
            out.append(_interval(s.step, phase, t, t1, "framework"))
            t = t1
        if t < s.t_end:
            out.append(_interval(s.step, "other", t, s.t_end, "framework"))
        prev_end = s.t_end
    return _merge(out)


def _interval(step: int | None, phase: str, t0: float, t1: float, source: str) -> dict[str, Any]:
    return {"step": step, "phase": phase, "t0_mono_s": t0, "t1_mono_s": t1, "source": source}


def _merge(intervals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Join touching intervals of the same step and phase; drop empty ones."""
    out: list[dict[str, Any]] = []
    for iv in intervals:
        if iv["t1_mono_s"] <= iv["t0_mono_s"]:
            continue
        last = out[-1] if out else None
        if (
            last is not None
            and last["phase"] == iv["phase"]
            and last["step"] == iv["step"]
            and abs(last["t1_mono_s"] - iv["t0_mono_s"]) < 1e-9
        ):
            last["t1_mono_s"] = iv["t1_mono_s"]
        else:
            out.append(dict(iv))
    return out


def _split_by_steps(
    segments: list[tuple[float, float, str]],
    bounds: list[tuple[float, float]],
    steps: list[Step],
    source: str,
) -> list[dict[str, Any]]:
    """Cut (t0, t1, phase) segments at step ends; label each piece with its step (None outside)."""
    import bisect

    ends = [b[1] for b in bounds]
    starts = [b[0] for b in bounds]
    cuts = sorted(set(starts + ends))
    out: list[dict[str, Any]] = []
    for t0, t1, phase in segments:
        pieces = [t0] + [c for c in cuts if t0 < c < t1] + [t1]
        for a, b in zip(pieces, pieces[1:], strict=False):
            mid = (a + b) / 2
            i = bisect.bisect_left(ends, mid)
            step = steps[i].step if i < len(steps) and starts[i] <= mid else None
            out.append(_interval(step, phase, a, b, source))
    return _merge(out)


def marker_segments(phases: Sequence[Mapping[str, Any]]) -> list[tuple[float, float, str]]:
    """Flatten begin/end markers: at any moment the innermost open phase wins.

    TRL nests generation inside ``training_step`` and the weight sync inside generation, so the
    time of a nested phase is taken out of its parent. An ``end`` closes the most recent open
    ``begin`` of the same phase and process; an unmatched ``end`` is ignored.
    """
    events = []
    for i, m in enumerate(phases or ()):
        t = finite_float(m.get("t_mono_s"))
        if t is None or m.get("phase") not in PHASES or m.get("event") not in ("begin", "end"):
            continue
        events.append((t, i, str(m["phase"]), str(m["event"]), m.get("pid")))
    if not events:
        return []
    events.sort()
    segments: list[tuple[float, float, str]] = []
    stack: list[tuple[str, Any]] = []
    for (t, _, phase, event, pid), nxt in zip(events, [*events[1:], None], strict=True):
        if event == "begin":
            stack.append((phase, pid))
        else:
            for j in range(len(stack) - 1, -1, -1):
                if stack[j] == (phase, pid):
                    del stack[j]
                    break
        if nxt is not None and nxt[0] > t:
            segments.append((t, nxt[0], stack[-1][0] if stack else "other"))
    return segments


def fill_segments(
    segments: list[tuple[float, float, str]], t0: float, t1: float
) -> list[tuple[float, float, str]]:
    """Cover [t0, t1] exactly: clip the segments, fill the gaps with ``other``."""
    out: list[tuple[float, float, str]] = []
    cursor = t0
    for a, b, phase in sorted(segments):
        a, b = max(a, cursor), min(b, t1)
        if b <= a:
            continue
        if a > cursor:
            out.append((cursor, a, "other"))
        out.append((a, b, phase))
        cursor = b
    if cursor < t1:
        out.append((cursor, t1, "other"))
    return out


def overlay(
    starts: np.ndarray, ends: np.ndarray, values: np.ndarray, cover: list[tuple[float, float, str]]
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Intersect a held series with labelled cover segments: (durations, values, labels) pieces."""
    import numpy as np

    if starts.size == 0 or not cover:
        return np.empty(0), np.empty(0), []
    c0 = np.array([c[0] for c in cover])
    c1 = np.array([c[1] for c in cover])
    bounds = np.unique(np.concatenate([starts, ends, c0, c1]))
    mids = (bounds[:-1] + bounds[1:]) / 2
    widths = np.diff(bounds)
    si = np.searchsorted(starts, mids, side="right") - 1
    ci = np.searchsorted(c0, mids, side="right") - 1
    ok = (si >= 0) & (ci >= 0)
    si_c, ci_c = np.clip(si, 0, None), np.clip(ci, 0, None)
    ok &= (mids < ends[si_c]) & (mids < c1[ci_c])
    labels = [cover[i][2] for i in ci_c[ok]]
    return widths[ok], values[si_c[ok]], labels


def _infer_segments(
    gpu: pd.DataFrame, t0: float, t1: float, th: InferenceThresholds
) -> list[tuple[float, float, str]]:
    import numpy as np

    devices = sorted(gpu["device"].unique())
    util_series, power_series = [], []
    for dev in devices:
        d = gpu[gpu["device"] == dev]
        util_series.append(held_samples(d["t_mono_s"].to_numpy(), d["gpu_util_pct"].to_numpy()))
        power = d["power_w"].to_numpy()
        limit = d["power_limit_w"].to_numpy()
        lim = float(np.nanmax(limit)) if np.any(~np.isnan(limit)) else math.nan
        if not lim > 0:
            lim = float(np.nanmax(power)) if np.any(~np.isnan(power)) else math.nan
        power_series.append(
            held_samples(d["t_mono_s"].to_numpy(), power / lim if lim > 0 else power * math.nan)
        )
    grid = np.unique(np.concatenate([s[0] for s in util_series]))
    grid = grid[(grid >= t0 - 1e-9) & (grid < t1)]
    if grid.size == 0:
        return []

    def at(series: tuple[np.ndarray, np.ndarray, np.ndarray], times: np.ndarray) -> np.ndarray:
        starts, ends, values = series
        if starts.size == 0:
            return np.full(times.size, np.nan)
        i = np.searchsorted(starts, times, side="right") - 1
        ic = np.clip(i, 0, None)
        return np.where((i >= 0) & (times < ends[ic]), values[ic], np.nan)

    with np.errstate(all="ignore"):
        util = np.nanmean(np.vstack([at(s, grid) for s in util_series]), axis=0)
        pfrac = np.nanmean(np.vstack([at(s, grid) for s in power_series]), axis=0)
    codes = np.where(
        np.isnan(util) | (util < th.busy_util_pct),
        0,
        np.where(np.nan_to_num(pfrac, nan=0.0) >= th.train_power_frac, 2, 1),
    )
    codes = _smooth(codes, th.smooth_samples)
    names = ("other", "rollout", "train")
    edges = np.append(grid, t1)
    segments: list[tuple[float, float, str]] = []
    start = 0
    for i in range(1, codes.size + 1):
        if i == codes.size or codes[i] != codes[start]:
            segments.append((float(edges[start]), float(edges[i]), names[int(codes[start])]))
            start = i
    return segments


def _smooth(codes: np.ndarray, min_run: int) -> np.ndarray:
    """Give runs shorter than ``min_run`` samples the label of their longer neighbouring run.

    Vectorised passes (each O(samples)); a few suffice, since every pass removes the short runs
    that have a long neighbour.
    """
    import numpy as np

    if min_run <= 1 or codes.size == 0:
        return codes
    for _ in range(8):
        change = np.flatnonzero(np.diff(codes)) + 1
        starts = np.concatenate([[0], change])
        lengths = np.diff(np.concatenate([starts, [codes.size]]))
        short = lengths < min_run
        if starts.size == 1 or not short.any():
            break
        values = codes[starts]
        left_len = np.concatenate([[0], lengths[:-1]])
        right_len = np.concatenate([lengths[1:], [0]])
        left_val = np.concatenate([values[:1], values[:-1]])
        right_val = np.concatenate([values[1:], values[-1:]])
        merged = np.where(short, np.where(left_len >= right_len, left_val, right_val), values)
        if np.array_equal(merged, values):
            break
        codes = np.repeat(merged, lengths)
    return codes


def phase_source(steps: list[Step], phases: Sequence[Mapping[str, Any]], df: pd.DataFrame | None) -> str:
    if _has_framework_timing(steps):
        return "framework"
    if marker_segments(phases):
        return "markers"
    if df is not None and len(steps) >= 1 and gpu_rows(df)["gpu_util_pct"].notna().any():
        return "inferred"
    return "none"


def phase_intervals(
    steps: Iterable[Any],
    phases: Sequence[Mapping[str, Any]],
    df: pd.DataFrame | None,
    *,
    thresholds: InferenceThresholds | None = None,
) -> list[dict[str, Any]]:
    """Split the run into phase intervals from the best evidence available.

    Evidence in order: the framework's own per-step timings (verl ``timing_s/*``, laid out in the
    order verl runs them, ending at the step record), phase markers (``probes.phases``; the innermost
    open phase wins), else the GPU utilization and power signature (see
    :class:`InferenceThresholds`).

    Args:
        steps: step records (dicts or objects) with ``step``, ``t_mono_s`` (when the step ended) and
            optionally ``duration_s`` and ``values``.
        phases: phase markers as returned by :func:`probes.phases.read_phases`.
        df: the timeline (only needed for inference).
        thresholds: inference thresholds; the documented defaults when None.

    Returns:
        Non-overlapping intervals sorted by time, each ``{"step", "phase", "t0_mono_s",
        "t1_mono_s", "source"}``; ``step`` is None outside the step records. Gaps between markers are
        ``other``. An empty list when there is no evidence.
    """
    return phase_intervals_of(normalize_steps(steps), phases, df, thresholds or InferenceThresholds())


def phase_intervals_of(
    norm: list[Step],
    phases: Sequence[Mapping[str, Any]],
    df: pd.DataFrame | None,
    thresholds: InferenceThresholds,
) -> list[dict[str, Any]]:
    source = phase_source(norm, phases, df)
    if source == "framework":
        return _framework_intervals(norm)
    t_first = float(df["t_mono_s"].min()) if df is not None and len(df) else None
    bounds = step_bounds(norm, t_first)
    if source == "markers":
        segments = marker_segments(phases)
        t0 = min([segments[0][0]] + [b[0] for b in bounds[:1]])
        t1 = max([segments[-1][1]] + [b[1] for b in bounds[-1:]])
        return _split_by_steps(fill_segments(segments, t0, t1), bounds, norm, "markers")
    if source == "inferred" and df is not None:
        t0, t1 = bounds[0][0], bounds[-1][1]
        segments = _infer_segments(gpu_rows(df), t0, t1, thresholds)
        return _split_by_steps(fill_segments(segments, t0, t1), bounds, norm, "inferred")
    return []
