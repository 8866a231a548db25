"""The timeline's step records and sample series, as the phase split and the summary read them: each
step's end and duration, the steady window (:mod:`autotune.probes.timeline`), a sampled series held
until its next sample (at most three median intervals, so a gap is not filled in)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np
    import pandas as pd

_HOLD_FACTOR = 3.0  # a sample holds for at most this many median intervals


@dataclass(frozen=True)
class Step:
    step: int
    t_end: float
    duration_s: float | None
    values: Mapping[str, Any]


def step_field(item: Any, name: str) -> Any:
    if isinstance(item, Mapping):
        return item.get(name)
    return getattr(item, name, None)


def finite_float(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def normalize_steps(steps: Iterable[Any]) -> list[Step]:
    out: list[Step] = []
    for item in steps or ():
        t_end = finite_float(step_field(item, "t_mono_s"))
        step = step_field(item, "step")
        if t_end is None or step is None:
            continue
        values = step_field(item, "values") or {}
        duration = finite_float(step_field(item, "duration_s"))
        if duration is None:
            duration = finite_float(values.get("timing_s/step"))
        out.append(Step(int(step), t_end, duration if duration and duration > 0 else None, values))
    out.sort(key=lambda s: s.t_end)
    return out


def step_bounds(steps: list[Step], t_first: float | None) -> list[tuple[float, float]]:
    """(start, end) of each step: a step runs from the previous step's end to its own."""
    bounds: list[tuple[float, float]] = []
    gaps = [b.t_end - a.t_end for a, b in zip(steps, steps[1:], strict=False) if b.t_end > a.t_end]
    median_gap = sorted(gaps)[len(gaps) // 2] if gaps else None
    for i, s in enumerate(steps):
        if i > 0:
            start = steps[i - 1].t_end
        elif s.duration_s is not None:
            start = s.t_end - s.duration_s
        elif median_gap is not None:
            start = s.t_end - median_gap
        else:
            start = t_first if t_first is not None and t_first < s.t_end else s.t_end
        bounds.append((start, s.t_end))
    return bounds


@dataclass(frozen=True)
class SteadyWindow:
    t0: float
    t1: float
    steps: int | None  # steps completed inside the window, None when unknown

    @property
    def length_s(self) -> float:
        return max(0.0, self.t1 - self.t0)


def steady_window(steps: list[Step], t_min: float | None, t_max: float | None) -> SteadyWindow | None:
    if len(steps) >= 2 and steps[-1].t_end > steps[0].t_end:
        return SteadyWindow(steps[0].t_end, steps[-1].t_end, len(steps) - 1)
    if len(steps) == 1 and steps[0].duration_s is not None:
        return SteadyWindow(steps[0].t_end - steps[0].duration_s, steps[0].t_end, 1)
    if t_min is not None and t_max is not None and t_max > t_min:
        return SteadyWindow(t_min, t_max, None)
    return None


def held_samples(t: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step-hold a sampled series: sample i covers [t_i, min(t_{i+1}, t_i + cap))."""
    import numpy as np

    keep = ~np.isnan(v) & ~np.isnan(t)
    t, v = t[keep], v[keep]
    if t.size == 0:
        return t, t, v
    order = np.argsort(t, kind="stable")
    t, v = t[order], v[order]
    dt = np.diff(t)
    positive = dt[dt > 0]
    cap = _HOLD_FACTOR * float(np.median(positive)) if positive.size else 1.0
    ends = np.empty_like(t)
    ends[:-1] = np.minimum(t[1:], t[:-1] + cap)
    ends[-1] = t[-1] + cap / _HOLD_FACTOR
    return t, ends, v


def gpu_rows(df: pd.DataFrame) -> pd.DataFrame:
    rows: pd.DataFrame = df[df["source"] == "gpu"]
    return rows
