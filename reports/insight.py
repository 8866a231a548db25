"""What the search learned: which knobs mattered, the speed/memory trade-off, and how fast it converged."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autotune.records import TrialResult, TrialStatus

__all__ = ["Importance", "param_importances", "ParetoPoint", "pareto_points", "ProgressPoint", "best_so_far"]


@dataclass(frozen=True)
class Importance:
    """Parameter importance for throughput (Optuna's evaluator over the completed trials).

    Attributes:
        values: knob → share of throughput variance it explains (sums to 1), largest first; empty
            when it cannot be computed.
        note: why it is empty, or how many trials it rests on.
    """

    values: dict[str, float]
    note: str
    method: str = "PED-ANOVA"
    #: optuna-dashboard's fANOVA over the same trials, shown beside ``values`` when the two methods order
    #: the knobs differently (empty when they agree, or when scikit-learn, which fANOVA needs, is missing)
    fanova: dict[str, float] = field(default_factory=dict)


def _num(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _choice(value: object) -> None | bool | int | float | str:
    return value if value is None or isinstance(value, bool | int | float | str) else repr(value)


def _completed(results: Sequence[TrialResult]) -> list[TrialResult]:
    return [r for r in results if r.status is TrialStatus.COMPLETE and r.throughput]


def param_importances(results: Sequence[TrialResult]) -> Importance:
    """Build an in-memory Optuna study from the completed trials and ask for parameter importances.

    Only knobs set in every completed trial and taking at least two values count. Numeric knobs are
    float ranges, the rest categorical.
    """
    import optuna
    from optuna.distributions import BaseDistribution, CategoricalDistribution, FloatDistribution
    from optuna.importance import get_param_importances

    done = _completed(results)
    if len(done) < 3:
        return Importance({}, f"needs at least 3 completed trials ({len(done)} completed)")
    names = set(done[0].params)
    for r in done[1:]:
        names &= set(r.params)
    dists: dict[str, BaseDistribution] = {}
    for name in sorted(names):
        knob_values = [r.params[name] for r in done]
        nums = [_num(v) for v in knob_values]
        if all(v is not None for v in nums):
            low, high = min(nums), max(nums)  # type: ignore[type-var]
            if high > low:  # type: ignore[operator]
                dists[name] = FloatDistribution(float(low), float(high))  # type: ignore[arg-type]
            continue
        choices = sorted({_choice(v) for v in knob_values}, key=repr)
        if len(choices) > 1:
            dists[name] = CategoricalDistribution(choices)
    if not dists:
        return Importance({}, "no knob took two values among the completed trials")
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        study = optuna.create_study(direction="maximize")
        for r in done:
            params = {
                n: (float(r.params[n]) if isinstance(d, FloatDistribution) else _choice(r.params[n]))
                for n, d in dists.items()
            }
            study.add_trial(
                optuna.trial.create_trial(
                    params=params, distributions=dists, value=float(r.throughput or 0.0)
                )
            )
        ordered = _ordered(get_param_importances(study, evaluator=_evaluator(len(done))))
        fanova, fanova_says = _fanova(study) if _evaluator(len(done)) is not None else ({}, "")
    except (ValueError, RuntimeError, ZeroDivisionError) as exc:
        return Importance({}, f"Optuna could not compute importances ({exc.__class__.__name__}: {exc})")
    finally:
        optuna.logging.set_verbosity(verbosity)
    method = "PED-ANOVA" if _evaluator(len(done)) is not None else "fANOVA"
    note = f"Optuna's {method} importance over {len(done)} completed trials"
    if method == "PED-ANOVA":
        note += (
            " (how much each knob separates the fastest trials from the rest; optuna-dashboard shows"
            " fANOVA, the share of throughput variance over all trials"
        )
        agree = bool(fanova) and list(fanova) == list(ordered)
        note += (
            f"{fanova_says})"
            if not fanova
            else ", which orders the knobs the same here)"
            if agree
            else ", which orders the knobs differently here: both are shown)"
        )
        fanova = {} if agree else fanova
    if len(done) < 10:
        note += "; with fewer than 10, read it as a rough hint"
    return Importance(ordered, note, method, fanova)


def _ordered(values: Mapping[str, float]) -> dict[str, float]:
    return dict(sorted(((k, float(v)) for k, v in values.items()), key=lambda kv: -kv[1]))


def _fanova(study: Any) -> tuple[dict[str, float], str]:
    """optuna-dashboard's method over the same study, and what to say when it cannot be computed.

    Optuna's fANOVA fits a random forest from scikit-learn, an optional package here (PED-ANOVA needs
    none); seeded, so the same trials always give the same values.
    """
    from optuna.importance import FanovaImportanceEvaluator, get_param_importances

    try:
        import sklearn  # noqa: F401  (fANOVA's own import is lazy: fail here with a clear note)
    except ImportError:
        return {}, "; install scikit-learn to see it beside this one"
    return _ordered(get_param_importances(study, evaluator=FanovaImportanceEvaluator(seed=0))), ""


def _evaluator(n_trials: int) -> Any:
    """PED-ANOVA (no scikit-learn needed) looking at the faster part of the trials; None = Optuna's default."""
    try:
        from optuna.importance import PedAnovaImportanceEvaluator
    except ImportError:  # older Optuna: its default evaluator
        return None
    # The default target quantile (0.1) selects no trial from a short study: use at least two trials.
    return PedAnovaImportanceEvaluator(target_quantile=max(0.1, min(0.5, 2.0 / n_trials)))


@dataclass(frozen=True)
class ParetoPoint:
    """One completed trial on the throughput / peak-memory plane."""

    trial: int
    throughput: float
    peak_bytes: int
    on_front: bool


def pareto_points(results: Sequence[TrialResult]) -> list[ParetoPoint]:
    """Completed trials with a measured peak; ``on_front`` when no other is both faster and smaller."""
    pts = []
    for r in _completed(results):
        peaks = [p for p in r.peak_mem_bytes if p is not None]
        peak = max(peaks) if peaks else (r.host_peak_rss_bytes if not r.peak_mem_bytes else None)
        if peak is None:
            continue
        pts.append((r.number, float(r.throughput or 0.0), int(peak)))
    out = []
    for n, tp, peak in pts:
        dominated = any(
            (tp2 >= tp and pk2 <= peak) and (tp2 > tp or pk2 < peak) for n2, tp2, pk2 in pts if n2 != n
        )
        out.append(ParetoPoint(n, tp, peak, not dominated))
    return sorted(out, key=lambda p: (p.peak_bytes, -p.throughput))


@dataclass(frozen=True)
class ProgressPoint:
    """The search after each trial: its throughput (None unless completed), the best so far, GPU time spent."""

    trial: int
    status: str
    throughput: float | None
    best: float | None
    gpu_hours: float


def best_so_far(results: Sequence[TrialResult]) -> list[ProgressPoint]:
    """Best completed throughput against trial number and cumulative GPU-hours."""
    out = []
    best: float | None = None
    hours = 0.0
    for r in sorted(results, key=lambda r: r.number):
        hours += (r.gpu_seconds or 0.0) / 3600.0
        tp = r.throughput if r.status is TrialStatus.COMPLETE else None
        if tp is not None and (best is None or tp > best):
            best = tp
        out.append(ProgressPoint(r.number, r.status.value, tp, best, hours))
    return out
