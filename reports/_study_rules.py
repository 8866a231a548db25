"""The study rules of the diagnosis: each compares the study's trials (an OOM boundary on a knob, a hang
pattern, unhealthy trials, host memory, other failures) and returns a :class:`Finding` or None.
:func:`autotune.reports.diagnosis.diagnose` runs them after the trial rules."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from autotune.reports._findings import (
    FITTED,
    HANG_BUSY_UTIL_PCT,
    HANG_LOW_POWER_FRAC,
    MEMORY_FAILURES,
    Context,
    Finding,
    Severity,
    num,
    trials_text,
)
from autotune.reports._format import gib, knob_value, pct, seconds, share
from autotune.reports._load import TrialData
from autotune.reports._signals import IDLE_PCT

from autotune.records import TrialStatus
from autotune.trial.outcome import host_memory_note

# ------------------------------------------------------------------------------------ study rules


@dataclass(frozen=True)
class _Boundary:
    knob: str
    fail_min: float
    fit_max: float | None
    fail_trials: tuple[int, ...]
    fit_trials: tuple[int, ...]
    given: tuple[str, Any] | None = None


def _boundary(knob: str, trials: Sequence[TrialData], given: tuple[str, Any] | None) -> _Boundary | None:
    fails = [
        (float(t.params[knob]), t.number)
        for t in trials
        if t.status in MEMORY_FAILURES and num(t.params.get(knob)) is not None
    ]
    fits = [
        (float(t.params[knob]), t.number)
        for t in trials
        if t.status in FITTED and t.steps and num(t.params.get(knob)) is not None
    ]
    if not fails or not fits:
        return None
    fail_min = min(v for v, _ in fails)
    fit_max = max(v for v, _ in fits)
    if fit_max >= fail_min:
        return None
    return _Boundary(
        knob,
        fail_min,
        fit_max,
        tuple(n for _, n in fails),
        tuple(n for v, n in fits if v == fit_max),
        given,
    )


def _find_boundaries(trials: Sequence[TrialData]) -> list[_Boundary]:
    """Numeric knobs whose value separates the memory failures from the trials that fit.

    First a single knob over all trials; otherwise one knob within groups that share another knob's
    value. The pairs that explain the most failures win (all of them when several tie: "utilization
    ≥ 0.7 fails at batch 4" and "batch ≥ 4 fails at utilization 0.7" are both worth reading).
    """
    failures = [t for t in trials if t.status in MEMORY_FAILURES]
    names = sorted({k for t in trials for k, v in t.params.items() if num(v) is not None})
    singles = [
        b
        for knob in names
        if (b := _boundary(knob, trials, None)) is not None and len(b.fail_trials) == len(failures)
    ]
    if singles:
        return singles
    best: list[_Boundary] = []
    best_cover = 0
    for knob in names:
        for other in sorted({k for t in trials for k in t.params} - {knob}):
            groups: dict[Any, list[TrialData]] = {}
            for t in trials:
                if other in t.params:
                    groups.setdefault(_hashable(t.params[other]), []).append(t)
            found = [
                b for value, g in groups.items() if (b := _boundary(knob, g, (other, value))) is not None
            ]
            cover = len({n for b in found for n in b.fail_trials})
            if cover > best_cover:
                best, best_cover = found, cover
            elif cover == best_cover and cover:
                best += found
    return best


def _hashable(value: object) -> Any:
    return value if isinstance(value, str | int | float | bool | type(None)) else repr(value)


def rule_oom_boundary(ctx: Context) -> Finding | None:
    """Where memory ran out: the knob value at which trials start to OOM (or vLLM refuses to start)."""
    failures = [t for t in ctx.data.trials if t.status in MEMORY_FAILURES]
    if not failures:
        return None
    boundaries = _find_boundaries(ctx.data.trials)
    listing = "; ".join(
        f"trial {t.number} ({t.status.value}"
        + (
            f", {gib(max(p for p in ctx.signals[t.number].peak_bytes if p is not None))} peak"
            if t.number in ctx.signals and any(p is not None for p in ctx.signals[t.number].peak_bytes)
            else ""
        )
        + f"): {_short_knobs(ctx, t)}"
        for t in failures
    )
    if boundaries:
        parts = []
        for b in sorted(boundaries, key=lambda b: (b.fail_min, str(b.given))):
            line = f"{b.knob} ≥ {b.fail_min:g} fails for memory"
            if b.given is not None:
                line += f" at {b.given[0]} {knob_value(b.given[1])}"
            line += f" ({trials_text(b.fail_trials)}; {b.fit_max:g} fits: {trials_text(b.fit_trials)})"
            parts.append(line)
        text = "Memory boundary found: " + "; ".join(parts) + ". "
    else:
        text = f"{len(failures)} trial(s) ran out of memory and no single knob separates them from the trials that fit. "
    text += f"Failures: {listing}."
    evidence = {
        "failures": [t.number for t in failures],
        "boundaries": [
            {
                "knob": b.knob,
                "fails_from": b.fail_min,
                "fits_up_to": b.fit_max,
                "given": list(b.given) if b.given else None,
                "trials": list(b.fail_trials),
            }
            for b in boundaries
        ],
    }
    return Finding("oom_boundary", Severity.INFO, "Out-of-memory boundary", text, evidence)


def _short_knobs(ctx: Context, trial: TrialData) -> str:
    """The trial's knobs that differ from the baseline (all of them when there is no baseline)."""
    base = ctx.data.baseline
    keys = [k for k in trial.params if base is None or base.params.get(k) != trial.params[k]]
    if not keys:
        return "the baseline's knobs"
    return ", ".join(f"{k}={knob_value(trial.params[k])}" for k in keys)


def _distinctive_knobs(ctx: Context, bad: Sequence[TrialData]) -> list[tuple[str, Any]]:
    """Knob values every trial in ``bad`` shares and no healthy completed trial has."""
    good = [t for t in ctx.data.trials if t.status is TrialStatus.COMPLETE]
    if not bad or not good:
        return []
    shared = [
        (k, v) for k, v in bad[0].params.items() if all(t.params.get(k, object()) == v for t in bad[1:])
    ]
    return [(k, v) for k, v in shared if all(t.params.get(k, object()) != v for t in good)]


def rule_hang_pattern(ctx: Context) -> Finding | None:
    """Hung trials: where they stopped, what the GPUs did meanwhile, and what they have in common."""
    hangs = [t for t in ctx.data.trials if t.status is TrialStatus.HANG]
    if not hangs:
        return None
    lines = []
    patterns = []
    for t in hangs:
        sig = ctx.signals.get(t.number)
        line = f"trial {t.number} made {len(t.steps)} step(s)"
        if sig is not None and sig.silence_s is not None:
            line += f", then nothing for {seconds(sig.silence_s)}"
        if sig is not None and sig.open_phase:
            line += f" inside {sig.open_phase}"
        if sig is not None and sig.silence_util_pct is not None:
            line += f"; GPUs at {pct(sig.silence_util_pct)} utilization"
            if sig.silence_power_frac is not None:
                line += f" and {share(sig.silence_power_frac)} of their power limit"
            if (
                sig.silence_util_pct >= HANG_BUSY_UTIL_PCT
                and (sig.silence_power_frac or 0.0) < HANG_LOW_POWER_FRAC
            ):
                patterns.append(
                    "busy at low power: ranks spin in a collective (NCCL) waiting for a peer that never arrives"
                )
            elif sig.silence_util_pct < IDLE_PCT:
                patterns.append(
                    "idle: the processes wait on the host (a deadlock, a dead worker or I/O), not on the GPU"
                )
        lines.append(line)
    distinct = _distinctive_knobs(ctx, hangs)
    text = "Hung: " + "; ".join(lines) + "."
    if patterns:
        text += " Pattern: " + "; ".join(sorted(set(patterns))) + "."
    if distinct:
        text += (
            " Only the hung trials have "
            + ", ".join(f"{k}={knob_value(v)}" for k, v in distinct)
            + ": avoid it."
        )
    text += " To see where it waits, rerun the trial's command.sh with NCCL_DEBUG=INFO and py-spy dump on each rank."
    evidence = {
        "trials": [t.number for t in hangs],
        "distinctive": {k: v for k, v in distinct},
        "open_phases": {t.number: ctx.signals[t.number].open_phase for t in hangs if t.number in ctx.signals},
    }
    return Finding("hang_pattern", Severity.CRITICAL, "Trials hang", text, evidence)


def rule_unhealthy_trials(ctx: Context) -> Finding | None:
    """Trials that ran but do not learn, with the health gate's reasons and what they share."""
    bad = [t for t in ctx.data.trials if t.status is TrialStatus.UNHEALTHY]
    if not bad:
        return None
    lines = []
    for t in bad:
        why = ctx.clean("; ".join(t.result.health) or t.result.reason)
        lines.append(f"trial {t.number} ({_short_knobs(ctx, t)}): {why}")
    distinct = _distinctive_knobs(ctx, bad)
    text = "Ran fast but does not train: " + " | ".join(lines) + "."
    if distinct:
        text += " Only unhealthy trials have " + ", ".join(f"{k}={knob_value(v)}" for k, v in distinct) + "."
    text += " These are never recommended, however fast."
    evidence = {
        "trials": [t.number for t in bad],
        "distinctive": {k: v for k, v in distinct},
        "health": {t.number: list(t.result.health) for t in bad},
    }
    return Finding("unhealthy_trials", Severity.CRITICAL, "Trials that do not learn", text, evidence)


def rule_host_memory(ctx: Context) -> Finding | None:
    """Trials killed for host RAM, with the host memory numbers and the knobs that live in host RAM.

    A trial whose own host samples show plenty of memory available throughout
    (:func:`~autotune.trial.outcome.host_memory_note`) is not said to be killed for host memory: the
    finding quotes its figures and the other causes of a SIGKILL instead.
    """
    killed = [t for t in ctx.data.trials if t.status is TrialStatus.HOST_OOM]
    if not killed:
        return None
    total = ctx.data.hardware.host.ram_total_bytes if ctx.data.hardware is not None else None
    short: list[str] = []
    ample: list[str] = []
    to_spare: list[int] = []
    for t in killed:
        sig = ctx.signals.get(t.number)
        line = f"trial {t.number}"
        host_knobs = ctx.offload_knobs(t.params)
        config = ctx.config(t.params)
        if config is not None and config.sleep_level == 1 and "sleep_level" in config.origin:
            name, value = config.origin["sleep_level"]
            host_knobs[name] = value
        if host_knobs:
            line += " (" + ", ".join(f"{k}={knob_value(v)}" for k, v in host_knobs.items()) + ")"
        low = sig.host_min_available_bytes if sig is not None else None
        note = host_memory_note(low, total)
        if note is not None:
            ample.append(f"{line}: {note}")
            to_spare.append(t.number)
            continue
        if sig is not None and low is not None:
            line += f": host memory available fell to {gib(low, 2)}"
            if sig.host_peak_rss_bytes is not None:
                line += f", the trial held {gib(sig.host_peak_rss_bytes)}"
        short.append(line)
    parts = []
    if short:
        parts.append(
            "Killed by the kernel for host memory: "
            + "; ".join(short)
            + ". Offloaded states and sleep level 1 keep "
            "weights in host RAM on every rank. Try less offload, sleep_level 0, or a host with more RAM."
        )
    if ample:
        parts.append("Killed by a SIGKILL autotune did not send, " + "; ".join(ample) + ".")
    return Finding(
        "host_memory",
        Severity.WARNING,
        "Host ran out of memory" if short else "Killed by SIGKILL with host memory to spare",
        " ".join(parts),
        {"trials": [t.number for t in killed], "memory_to_spare": to_spare},
    )


def rule_other_failures(ctx: Context) -> Finding | None:
    """Crashes, rejected arguments and timeouts, each with its evidence line."""
    kinds = (TrialStatus.CRASH, TrialStatus.INVALID, TrialStatus.TIMEOUT)
    bad = [t for t in ctx.data.trials if t.status in kinds]
    if not bad:
        return None
    lines = []
    for t in bad:
        line = f"trial {t.number} {t.status.value}: {ctx.clean(t.result.reason)}"
        if t.result.evidence:
            line += f" — {ctx.clean(t.result.evidence.strip()[:300])}"
        lines.append(line)
    return Finding(
        "other_failures",
        Severity.INFO,
        "Other failed trials",
        "; ".join(lines) + ".",
        {"trials": {t.number: t.status.value for t in bad}},
    )


StudyRule = Callable[[Context], "Finding | None"]
STUDY_RULES: tuple[StudyRule, ...] = (
    rule_hang_pattern,
    rule_unhealthy_trials,
    rule_oom_boundary,
    rule_host_memory,
    rule_other_failures,
)
