"""How far from the limit: a trial's measured step against its physical ceiling (``result.json``'s
``ceiling``, :mod:`autotune.estimate.ceiling`), as the report shows it.

For the recommendation: the step against its ceiling, one efficiency bar per phase the timeline split,
and the largest gap named in words. For every trial: the fraction of the limit (a column). A measured
time below its ceiling is a measurement or model error and is said so, never shown as a speed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from autotune.reports._load import StudyData

from autotune.errors import UsageError
from autotune.records import TrialCeiling, TrialResult, TrialStatus

__all__ = ["LimitBar", "LimitView", "fraction_text", "limit_section", "limit_view", "search_used_ceiling"]

#: what bounds each timeline phase, and what usually closes its gap (one place, read by the report).
PHASE_WORDS: dict[str, tuple[str, str]] = {
    "rollout": (
        "its bound (decode reads the weights and KV cache once per token; prefill is compute)",
        "more sequences decoded at once (a larger generation batch; with vLLM, more engines of a "
        "smaller tensor-parallel size) read the weights fewer times per generated token",
    ),
    "train": (
        "its compute bound (forward and backward FLOPs at the peak)",
        "larger micro-batches, less recomputation (gradient checkpointing) and less ZeRO-3 traffic "
        "raise the achieved FLOP/s",
    ),
    "weight_sync": (
        "its bandwidth bound (weights written into vLLM, gathered or sent over the link)",
        "fewer, larger transfers (no ZeRO-3 gather per batch) shorten the sync",
    ),
}

#: the train phase's advice when the study measured larger micro-batches slower than the recommendation
TRAIN_FIX_MEASURED_BATCH = (
    "larger micro-batches were measured slower in this study ({evidence}); less recomputation (gradient "
    "checkpointing) and less ZeRO-3 traffic raise the achieved FLOP/s"
)

#: what a strategy writes in a trial's ``choice`` when it bounded its prediction by the ceiling
CHOICE_CEILING_KEY = "ceiling_s"


@dataclass(frozen=True)
class LimitBar:
    """One phase's efficiency: its ceiling over its measured time."""

    phase: str
    ceiling_s: float
    measured_s: float
    fraction: float
    text: str
    width_pct: float  # the bar's filled share, 0..100


@dataclass(frozen=True)
class LimitView:
    """The report's "How far from the limit" section for one trial."""

    trial: int
    step_text: str
    basis: str
    work: str
    bars: tuple[LimitBar, ...]
    ceiling_rows: tuple[tuple[str, str], ...]  # (phase, seconds) of every ceiling phase
    gap: str
    error: str
    search: str
    no_split: bool


def _significant(fraction: float) -> str:
    """A fraction as percent with two significant digits (``18 %``, ``0.0042 %``)."""
    value = 100 * fraction
    return f"{value:.2g} %" if value < 10 else f"{value:.0f} %"


def fraction_text(ceiling: TrialCeiling | None) -> str:
    """The trials table's cell: the step's fraction of its limit, flagged when above 1."""
    if ceiling is None or ceiling.step_fraction is None:
        return ""
    text = _significant(ceiling.step_fraction)
    return f"{text} (faster than its ceiling: measurement or model error)" if ceiling.beats_ceiling else text


def _seconds(value_s: float) -> str:
    if value_s <= 0:
        return "0 s"
    if value_s >= 1:
        return f"{value_s:.3g} s"
    if value_s >= 1e-3:
        return f"{value_s * 1e3:.3g} ms"
    return f"{value_s * 1e6:.3g} µs"


def _bars(c: TrialCeiling) -> tuple[LimitBar, ...]:
    return tuple(
        LimitBar(
            phase=phase,
            ceiling_s=c.phase_ceiling_s[phase],
            measured_s=c.phase_measured_s[phase],
            fraction=fraction,
            text=f"{_significant(fraction)} ({_seconds(c.phase_ceiling_s[phase])} of "
            f"{_seconds(c.phase_measured_s[phase])})",
            width_pct=max(0.0, min(100.0, 100 * fraction)),
        )
        for phase, fraction in c.phase_fraction.items()
        if phase in c.phase_measured_s and phase in c.phase_ceiling_s
    )


def _larger_batch_slower(result: TrialResult, results: Sequence[TrialResult], knob: str | None) -> str | None:
    """``trial 4: bs=8`` when a completed trial with a larger micro-batch than ``result`` was slower."""
    mine = result.params.get(knob) if knob else None
    if knob is None or not isinstance(mine, int | float) or result.throughput is None:
        return None
    slower = [
        r
        for r in results
        if r.status is TrialStatus.COMPLETE
        and isinstance(r.params.get(knob), int | float)
        and r.params[knob] > mine
        and r.throughput is not None
        and r.throughput < result.throughput
    ]
    return ", ".join(f"trial {r.number}: {knob}={r.params[knob]}" for r in slower[:3]) or None


def _gap(c: TrialCeiling, bars: Sequence[LimitBar], measured_batch: str | None = None) -> str:
    """The largest gap in words: the phase losing the most seconds per step against its bound; advice
    the study's own measurements contradict (a larger micro-batch measured slower) is not given."""
    if not bars:
        return ""
    worst = max(bars, key=lambda b: b.measured_s - b.ceiling_s)
    bound, fix = PHASE_WORDS.get(worst.phase, ("its bound", ""))
    if worst.phase == "train" and measured_batch:
        fix = TRAIN_FIX_MEASURED_BATCH.format(evidence=measured_batch)
    lost = worst.measured_s - worst.ceiling_s
    text = (
        f"{worst.phase} runs at {_significant(worst.fraction)} of {bound}: {_seconds(lost)} per step "
        f"above it, the largest gap of the step"
    )
    return f"{text}; {fix}." if fix else f"{text}."


def search_used_ceiling(results: Sequence[TrialResult]) -> str:
    """Whether the search bounded its predictions by the ceiling, in words."""
    used = [r.number for r in results if r.choice and CHOICE_CEILING_KEY in r.choice]
    if not used:
        return "The search did not use the ceiling: it ranked configurations by measured speed only."
    return f"The search bounded its predicted speeds by the ceiling for {len(used)} trial(s)."


def limit_view(
    result: TrialResult, results: Sequence[TrialResult], micro_batch_knob: str | None = None
) -> LimitView | None:
    """The section for ``result`` (the recommendation), or None when it has no ceiling.

    ``micro_batch_knob``: the backend's knob for the per-device micro-batch, to hold the advice against
    what the study measured."""
    c = result.ceiling
    if c is None or c.step_measured_s is None or c.step_fraction is None:
        return None
    bars = _bars(c)
    errors = [
        f"{name} measured {_seconds(measured)} below its ceiling of {_seconds(bound)}"
        for name, measured, bound in [
            ("the step", c.step_measured_s, c.step_ceiling_s),
            *((b.phase, b.measured_s, b.ceiling_s) for b in bars),
        ]
        if measured < bound
    ]
    error = (
        "A measured time is below its physical ceiling, which no run can reach: a measurement or model "
        f"error ({'; '.join(errors)}). Check the step timing and the hardware basis."
        if errors
        else ""
    )
    return LimitView(
        trial=result.number,
        step_text=(
            f"{_seconds(c.step_measured_s)} per step against a ceiling of {_seconds(c.step_ceiling_s)}: "
            f"{_significant(c.step_fraction)} of the limit"
        ),
        basis=c.basis,
        work=c.work,
        bars=bars,
        ceiling_rows=tuple((phase, _seconds(s)) for phase, s in c.phase_ceiling_s.items()),
        gap=_gap(c, bars, _larger_batch_slower(result, results, micro_batch_knob)),
        error=error,
        search=search_used_ceiling(results),
        no_split=not bars,
    )


def limit_section(data: StudyData, winner: int | None) -> LimitView | None:
    """The section for the recommended trial of ``data``, or None (no recommendation, no ceiling)."""
    trial = data.trial(winner) if winner is not None else None
    if trial is None:
        return None
    return limit_view(trial.result, data.results, _micro_batch_knob(data))


def _micro_batch_knob(data: StudyData) -> str | None:
    """The study's backend's knob for the per-device micro-batch (its ``per_device_batch`` role)."""
    from autotune.backends import backend_class

    name = data.settings.backend
    try:
        return backend_class(name).knob_roles().get("per_device_batch") if name is not None else None
    except UsageError:
        return None
