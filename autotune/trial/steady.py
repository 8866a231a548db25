"""Steady-state step time: drop the warm-up, estimate the mean and how sure we are of it.

The first steps of a training run are slower (allocator growth, kernel selection, compilation, the
first weight sync). Throughput is measured on the steps after them, and a trial can stop as soon as
the estimate is stable: a relative 95 % interval (Student t) below a target over a few steady steps.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.errors import UsageError
from autotune.records import SteadyEstimate, StepMetrics

__all__ = [
    "EarlyStopConfig",
    "SETTLE_TOLERANCE",
    "is_stable",
    "step_durations",
    "steady_estimate",
    "t_quantile_975",
    "warmup_count",
]

#: A leading step counts as warm-up while it is this much slower than the settled median.
SETTLE_TOLERANCE = 0.25

# Student t, two-sided 95 % (the 0.975 quantile), for 1..30 degrees of freedom. Kept rather than
# scipy.stats.t.ppf: scipy is no core dependency (only bench's extra), and 30 published constants need none.
_T975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip
_Z975 = 1.959963984540054


@dataclass(frozen=True)
class EarlyStopConfig:
    """When a trial may stop before its last step because its step time is known well enough.

    Attributes:
        enabled: stop at steady state; when False a trial runs until the framework ends it.
        min_steady_steps: steady steps the estimate needs at least.
        target_rel_ci95: stop when the 95 % interval's half-width is at most this fraction of the mean.
        min_steps: never stop before this many step records.
        max_warmup_steps: at most this many leading steps are dropped as warm-up.
    """

    enabled: bool = True
    min_steady_steps: int = 3
    target_rel_ci95: float = 0.05
    min_steps: int = 5
    max_warmup_steps: int = 5

    def __post_init__(self) -> None:
        if self.min_steady_steps < 2:
            raise UsageError(
                f"min_steady_steps must be at least 2, got {self.min_steady_steps}",
                hint="An interval needs two or more steady steps",
            )
        if not (self.target_rel_ci95 > 0):
            raise UsageError(
                f"target_rel_ci95 must be above 0, got {self.target_rel_ci95}",
                hint="Give a fraction such as 0.05 for 5 %",
            )
        for name in ("min_steps", "max_warmup_steps"):
            if getattr(self, name) < 0:
                raise UsageError(
                    f"{name} must not be negative, got {getattr(self, name)}", hint="Give 0 or more"
                )


def t_quantile_975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (two-sided 95 %).

    A table for 1–30; above that the Cornish–Fisher expansion (error below 1e-4 there).
    """
    if df < 1:
        raise ValueError(f"degrees of freedom must be at least 1, got {df}")
    if df <= len(_T975):
        return _T975[df - 1]
    z = _Z975
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    return z + g1 / df + g2 / df**2 + g3 / df**3


def step_durations(steps: Sequence[StepMetrics]) -> tuple[list[float], list[StepMetrics], int]:
    """Per-step durations in step order.

    Uses each step's own ``duration_s`` when every step has one; otherwise the differences of
    consecutive ``t_mono_s`` divided by the difference of step numbers (so a framework that logs every
    5th step still gives per-step times). The first record then only marks a start.

    Returns:
        (durations, the step each duration belongs to, records used only as a start boundary).
    """
    ordered: dict[int, StepMetrics] = {}
    for s in steps:
        ordered.setdefault(s.step, s)  # a repeated step number keeps its first record
    seq = [ordered[k] for k in sorted(ordered)]
    if seq and all(s.duration_s is not None for s in seq):
        pairs = [(float(s.duration_s), s) for s in seq if _usable(s.duration_s)]  # type: ignore[arg-type]
        return [d for d, _ in pairs], [s for _, s in pairs], 0
    durations: list[float] = []
    owners: list[StepMetrics] = []
    for prev, cur in zip(seq, seq[1:], strict=False):
        d = (cur.t_mono_s - prev.t_mono_s) / (cur.step - prev.step)
        if _usable(d):
            durations.append(d)
            owners.append(cur)
    return durations, owners, min(1, len(seq))


def warmup_count(durations: Sequence[float], max_warmup: int) -> int:
    """Leading durations to drop: those more than :data:`SETTLE_TOLERANCE` above the settled median.

    The settled median is taken over the later part of the run (from ``min(max_warmup, n // 2)`` on),
    so a slow start cannot pull the reference up. At least two durations are always kept.
    """
    n = len(durations)
    limit = min(max_warmup, n - 2)
    if limit <= 0:
        return 0
    reference = statistics.median(durations[min(max_warmup, n // 2) :])
    w = 0
    while w < limit and durations[w] > reference * (1 + SETTLE_TOLERANCE):
        w += 1
    return w


def steady_estimate(
    steps: Sequence[StepMetrics], global_batch: int, *, max_warmup: int = 5
) -> SteadyEstimate | None:
    """Steady-state step time and throughput, or None when fewer than two steady durations exist.

    Args:
        steps: step records in any order (repeated step numbers keep their first record).
        global_batch: completions per optimizer step (throughput = global_batch / step time).
        max_warmup: at most this many leading durations are dropped as warm-up.

    Returns:
        The mean steady step time, the half-width of its 95 % interval relative to the mean, how many
        steps were used and dropped, completions per second and, when every steady step reports
        ``tokens``, tokens per second.
    """
    durations, owners, boundary = step_durations(steps)
    w = warmup_count(durations, max_warmup)
    steady = durations[w:]
    n = len(steady)
    if n < 2:
        return None
    mean = statistics.fmean(steady)
    if mean <= 0:
        return None
    sd = statistics.stdev(steady)
    rel_ci95 = t_quantile_975(n - 1) * sd / math.sqrt(n) / mean
    tokens = [s.tokens for s in owners[w:]]
    tokens_per_s = None
    if all(t is not None and math.isfinite(t) for t in tokens):
        tokens_per_s = statistics.fmean(float(t) for t in tokens if t is not None) / mean
    return SteadyEstimate(
        step_time_s=mean,
        rel_ci95=rel_ci95,
        steady_steps=n,
        warmup_steps=w + boundary,
        throughput=global_batch / mean,
        tokens_per_s=tokens_per_s,
    )


def is_stable(est: SteadyEstimate | None, cfg: EarlyStopConfig) -> bool:
    """True when ``est`` has enough steady steps and a narrow enough interval to stop the trial."""
    return (
        est is not None and est.steady_steps >= cfg.min_steady_steps and est.rel_ci95 <= cfg.target_rel_ci95
    )


#: the shortest step a training job can make: a shorter one is a clock the script got wrong (stamps
#: 10^-12 s apart would otherwise give 10^13 completions/s), and is not used
MIN_STEP_S = 1e-4


def _usable(d: float | None) -> bool:
    return d is not None and math.isfinite(d) and d >= MIN_STEP_S
