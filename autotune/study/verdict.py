"""Whether the winner is really faster than the baseline: an interval from re-measured runs, and the rule
that refuses to call noise a win.

After the search the study re-runs the winner, the baseline and any runner-up within the noise of the
winner, interleaved (see :mod:`autotune.study.confirm`). Each run gives one number that matters here: its
mean steady step time. The speedup of A over B is ``exp(mean log t_B − mean log t_A)`` (the ratio of the
geometric means of the runs' step times, which is the ratio of throughputs at the fixed global batch).

Why the interval is a t-interval over *runs*, not over steps: on a shared host the step times of one run
are correlated (the same neighbours load the machine for the whole run), so most of the noise is
between runs. Pooling every step as if independent gives an interval as narrow as the number of steps
allows and wrong by as much as a neighbour's load; a bootstrap over runs with two or three runs per side
has only a handful of distinct resamples and under-covers. So each run is one observation (its log mean
step time), and the interval is Student's t-interval on the difference of two means of log step time.

The run-to-run variance is pooled over every configuration of the re-measurement (winner, baseline,
runners-up), with ``runs − configurations`` degrees of freedom: it is the host's noise (neighbours,
caches, clocks) on similar runs of one job, and on the log scale it is relative, so it carries from one
configuration to another. With two runs each, a variance per configuration would have one degree of
freedom: Welch's interval would then take t ≈ 12.7 and confirm nothing but tenfold speedups. One floor
keeps runs that agree by chance from claiming more than they measured: the variance of one run's mean is
never taken below what its own steps imply (the runs' ``rel_ci95``), because the variance of a run mean is
the between-run variance plus the within-run one.

The refusal rule: a speedup whose interval includes 1.0 is "no measurable speedup", never a bare ratio.
The host rule: the host's noise must not decide the verdict. A compared run (winner or baseline) during
which other processes loaded the host is set aside and the interval is taken over the quiet runs; with
fewer than two quiet runs of either side, or an interval wider than :data:`NOISE_SPAN_MAX` (the runs of
one configuration differ so much that 2× cannot be told from 8×), the speedup is "not measurable on this
host", and no number is shown.
A runner-up whose interval against the winner includes 1.0 is named as equivalent. A compared
configuration measurably faster than the winner on re-measurement becomes the winner.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autotune.recommend import headroom_bytes, single_run_text
from autotune.records import (
    Confirmation,
    ConfirmRun,
    Hardware,
    Recommendation,
    SpeedupInterval,
    TrialResult,
    TrialStatus,
)
from autotune.trial.steady import t_quantile_975

__all__ = [
    "METHOD",
    "RunTime",
    "speedup_interval",
    "judge",
    "not_remeasured",
]

#: An interval whose high end is more than this many times its low end is set by the host's noise.
NOISE_SPAN_MAX = 4.0

METHOD = (
    "Student t-interval (95 %) on the difference of the mean log step time of the runs of each"
    " configuration; one run = one observation, run-to-run variance pooled over the configurations"
    " re-measured and never below what a run's own steps imply"
)


@dataclass(frozen=True)
class RunTime:
    """One run's mean steady step time and how sure the run itself is of it.

    Attributes:
        step_time_s: mean steady step time.
        rel_ci95: the run's own 95 % half-width of that mean, relative to it (0 when unknown).
        steady_steps: steps the mean is taken over.
    """

    step_time_s: float
    rel_ci95: float = 0.0
    steady_steps: int = 0

    @property
    def log_time(self) -> float:
        return math.log(self.step_time_s)

    @property
    def within_var(self) -> float:
        """Variance of ``log(step_time_s)`` from the run's own steps (delta method), 0 when unknown."""
        if self.steady_steps < 2 or not self.rel_ci95 > 0 or not math.isfinite(self.rel_ci95):
            return 0.0
        return (self.rel_ci95 / t_quantile_975(self.steady_steps - 1)) ** 2


def speedup_interval(
    candidate: Sequence[RunTime],
    reference: Sequence[RunTime],
    *,
    others: Sequence[Sequence[RunTime]] = (),
) -> SpeedupInterval | None:
    """How many times the reference's throughput the candidate's is, with a 95 % interval.

    Args:
        candidate: runs of the configuration in the numerator (e.g. the winner).
        reference: runs of the configuration in the denominator (e.g. the baseline).
        others: runs of the other configurations re-measured with them: they only add to the pooled
            estimate of the run-to-run variance.

    Returns:
        The ratio of throughputs (reference step time ÷ candidate step time, geometric means) and its
        interval, or None when either side has fewer than two runs (one run cannot show how much its
        configuration's runs differ).
    """
    if len(candidate) < 2 or len(reference) < 2:
        return None
    groups = [list(candidate), list(reference), *(list(g) for g in others if g)]
    for r in (run for g in groups for run in g):
        if not (r.step_time_s > 0 and math.isfinite(r.step_time_s)):
            raise ValueError(f"a step time must be a positive number, got {r.step_time_s!r}")
    means = [statistics.fmean(r.log_time for r in g) for g in groups]
    df = sum(len(g) for g in groups) - len(groups)
    ss = sum((r.log_time - m) ** 2 for g, m in zip(groups, means, strict=True) for r in g)
    floor = statistics.fmean(r.within_var for g in groups for r in g)
    var = max(ss / df, floor)
    n_c, n_r = len(candidate), len(reference)
    diff = means[1] - means[0]  # log(reference time / candidate time) = log speedup
    half = t_quantile_975(df) * math.sqrt(var * (1 / n_c + 1 / n_r))
    return SpeedupInterval(
        estimate=math.exp(diff),
        low=math.exp(diff - half),
        high=math.exp(diff + half),
        runs=(n_c, n_r),
        df=float(df),
    )


def _host_noise(
    speedup: SpeedupInterval, runs: Sequence[ConfirmRun], winner: int, base: int
) -> tuple[SpeedupInterval, str | None]:
    """The interval to judge the winner by, and why the host's noise makes it unmeasurable (or None).

    Loaded runs of the two compared configurations are set aside; what is left must still give an
    interval (two quiet runs a side) no wider than :data:`NOISE_SPAN_MAX`.
    """
    loaded = [r for r in runs if r.host_loaded and r.trial in (winner, base)]
    if loaded:
        quiet = _run_times([r for r in runs if not r.host_loaded])
        others = [t for n, t in quiet.items() if n not in (winner, base)]
        quiet_interval = speedup_interval(quiet.get(winner, []), quiet.get(base, []), others=others)
        if quiet_interval is None:
            compared = sum(1 for r in runs if r.trial in (winner, base))
            return speedup, (
                f"other processes loaded the host during {len(loaded)} of the {compared} compared runs,"
                " and fewer than two quiet runs of each side are left"
            )
        speedup = quiet_interval
    span = speedup.high / speedup.low
    if span > NOISE_SPAN_MAX:
        return speedup, (
            f"the re-measured runs of one configuration differ so much that the 95 % interval spans {span:.1f}×"
            f" (more than {NOISE_SPAN_MAX:g}×)"
        )
    return speedup, None


def _run_times(runs: Sequence[ConfirmRun]) -> dict[int, list[RunTime]]:
    """The usable runs (COMPLETE, with a steady step time) by the trial they repeat."""
    out: dict[int, list[RunTime]] = {}
    for run in runs:
        if run.status is TrialStatus.COMPLETE and run.step_time_s and run.step_time_s > 0:
            out.setdefault(run.trial, []).append(
                RunTime(run.step_time_s, run.rel_ci95 or 0.0, run.steady_steps)
            )
    return out


def judge(
    rec: Recommendation,
    confirmation: Confirmation,
    results: Mapping[int, TrialResult],
    hardware: Hardware | None,
) -> Recommendation:
    """The recommendation once the re-measurement is in: the winner, its interval and the verdict.

    Args:
        rec: what the search alone recommends (:func:`autotune.recommend.recommend`).
        confirmation: the re-measurement runs (intervals not yet filled in).
        results: the search's trials by number (for the throughput and headroom of a new winner).
        hardware: the study's hardware (headroom).

    Returns:
        ``rec`` with the winner re-decided, ``speedup`` and its interval from the re-measured runs,
        ``measurable``, ``equivalent``, ``verdict``, ``host_load`` and ``confirmation`` filled in.
    """
    times = _run_times(confirmation.runs)
    base = rec.baseline_trial
    winner = rec.trial

    def interval(a: int, b: int | None) -> SpeedupInterval | None:
        """``a`` ÷ ``b`` from their re-measured runs, the variance pooled with every other configuration's."""
        if b is None:
            return None
        others = [runs for t, runs in times.items() if t not in (a, b)]
        return speedup_interval(times.get(a, []), times.get(b, []), others=others)

    better = [(iv.estimate, t) for t in times if t != winner and (iv := interval(t, winner)) and iv.low > 1.0]
    overtaken = None
    if better:
        overtaken, winner = winner, max(better)[1]
    versus = {t: iv for t in times if t != winner and (iv := interval(t, winner)) is not None}
    speedup = interval(winner, base) if winner != base else None
    noise = None
    if speedup is not None and base is not None:
        speedup, noise = _host_noise(speedup, confirmation.runs, winner, base)
    equivalent = sorted(t for t, iv in versus.items() if t != base and iv.includes_one)
    loaded = [r for r in confirmation.runs if r.host_loaded]
    host_load = None
    if loaded:
        worst = max(r.other_busy_cores or 0.0 for r in loaded)
        host_load = (
            f"host loaded by other processes during {len(loaded)} of {len(confirmation.runs)} re-measurement"
            f" runs (up to {worst:.1f} cores busy outside the run): the interval includes that noise"
        )
    confirmation = confirmation.model_copy(update={"speedup": speedup, "versus_winner": versus})
    update: dict[str, object] = {
        "search_speedup": rec.speedup,
        "equivalent": equivalent,
        "host_load": host_load,
        "confirmation": confirmation,
    }
    if overtaken is not None:
        r = results[winner]
        # the old winner has two runs or more (it was compared to the new one), so it is in ``versus``
        gain = versus[overtaken]
        update |= {
            "trial": winner,
            "throughput": r.throughput or 0.0,
            "headroom_bytes": headroom_bytes(r, hardware),
            "why": f"re-measured faster than trial {overtaken}, the search's best"
            f" ({1 / gain.estimate:.2f}× its throughput)",
        }
    rounds = f"{confirmation.rounds} interleaved run(s) of each"
    set_aside = sum(1 for r in confirmation.runs if r.host_loaded and r.trial in (winner, base))
    if set_aside and speedup is not None and noise is None:
        rounds += f"; {set_aside} run(s) loaded by other processes set aside"
    if winner == base:
        update |= {"speedup": 1.0, "speedup_low": None, "speedup_high": None, "measurable": False}
        slower = versus.get(rec.trial)
        verdict = (
            f"the baseline (trial {base}) is the fastest configuration: trial {rec.trial}, the search's best"
        )
        verdict += (
            f", re-measured at {slower.text()} the baseline's throughput ({rounds})"
            if slower
            else ", re-measured slower"
        )
    elif noise is not None:
        update |= {"speedup_low": None, "speedup_high": None, "measurable": False, "host_noise": noise}
        verdict = (
            f"speedup over the baseline (trial {base}) not measurable on this host: {noise} ({rounds});"
            " run again on a quieter host or with more --confirm-runs"
        )
    elif speedup is None:
        update |= {"speedup_low": None, "speedup_high": None, "measurable": None}
        why_not = confirmation.note or "too few re-measurement runs completed"
        verdict = single_run_text(rec.speedup, base) + f" (not confirmed: {why_not})"
    else:
        update |= {
            "speedup": speedup.estimate,
            "speedup_low": speedup.low,
            "speedup_high": speedup.high,
            "measurable": speedup.low > 1.0,
        }
        if speedup.low > 1.0:
            verdict = f"speedup over the baseline (trial {base}): {speedup.text()} (95 % interval, {rounds})"
        else:
            verdict = f"no measurable speedup over the baseline (trial {base}): {speedup.text()} (95 % interval, {rounds})"
    if equivalent:
        names = ", ".join(f"trial {t} ({versus[t].text()} of the winner)" for t in equivalent)
        verdict += f"; equivalent to the winner: {names}"
    update["verdict"] = verdict
    return rec.model_copy(update=update)


def not_remeasured(rec: Recommendation, reason: str) -> Recommendation:
    """``rec`` with a verdict that says its speedup comes from single runs, and why it was not re-measured."""
    if rec.baseline_trial is not None and rec.trial == rec.baseline_trial:
        verdict = f"the baseline (trial {rec.baseline_trial}) is the fastest configuration tried"
    elif rec.speedup is None:
        verdict = single_run_text(None, rec.baseline_trial)  # nothing to re-measure against
    else:
        verdict = single_run_text(rec.speedup, rec.baseline_trial) + f" (not re-measured: {reason})"
    return rec.model_copy(update={"verdict": verdict, "search_speedup": rec.speedup})
