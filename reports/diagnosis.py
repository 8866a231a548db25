"""Rules that turn a study's evidence into advice, quoting the numbers that triggered them.

Each rule is a small function that returns a :class:`Finding` or None. Trial rules read one trial and
its :class:`~reports._signals.TrialSignals`; study rules compare trials. :func:`diagnose` runs them all.
Thresholds are module constants so a test (and a reader) can see exactly when a rule fires.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from autotune.reports._format import gib, knob_value, pct, seconds, share
from autotune.reports._load import StudyData, TrialData
from autotune.reports._safety import Sanitizer
from autotune.reports._signals import HOST_BUSY_PCT, IDLE_PCT, TrialSignals, signals

from autotune.backends import Backend, backend_class
from autotune.errors import AutotuneError, UsageError
from autotune.jobconfig import OFFLOAD_FIELDS, JobConfig
from autotune.records import TrialStatus
from autotune.trial.outcome import host_memory_note

__all__ = [
    "Severity",
    "Finding",
    "Context",
    "OffloadFit",
    "TRIAL_RULES",
    "STUDY_RULES",
    "diagnose",
    "make_context",
    "rule_rollout_idle",
    "rule_offload_bottleneck",
    "rule_host_cpu_stall",
    "rule_micro_batch_headroom",
    "rule_zero3_gather_peak",
    "rule_oom_boundary",
    "rule_hang_pattern",
    "rule_unhealthy_trials",
    "rule_host_memory",
    "rule_other_failures",
]

GIB = 2**30

# rollout_idle: GPUs idle a meaningful share of the steady time, mostly during rollout, with memory free.
ROLLOUT_MIN_IDLE_SHARE = 0.15
ROLLOUT_MIN_IDLE_FRACTION = 0.5  # rollout's part of all idle GPU time
ROLLOUT_MIN_HEADROOM_FRAC = 0.15
UTIL_SAFETY_FRAC = 0.05  # memory left free when suggesting a higher vLLM utilization
# offload_bottleneck: host<->GPU traffic during training while the GPUs wait.
OFFLOAD_MIN_PCIE_BYTES_S = 2e9
OFFLOAD_MIN_TRAIN_IDLE_SHARE = 0.25
# host_cpu_stall: GPU-idle time spent with the host CPU saturated.
HOST_MIN_IDLE_SHARE = 0.15
HOST_MIN_BUSY_SHARE = 0.5
HOST_MIN_IDLE_S = 5.0
# micro_batch_headroom
BATCH_MIN_HEADROOM_FRAC = 0.25
BATCH_MIN_HEADROOM_BYTES = 4 * GIB
# zero3_gather_peak
GATHER_MIN_EXCESS_BYTES = 1 * GIB
GATHER_TIGHT_FRAC = 0.10
# hang_pattern
HANG_BUSY_UTIL_PCT = 80.0
HANG_LOW_POWER_FRAC = 0.6

MEMORY_FAILURES = frozenset({TrialStatus.OOM, TrialStatus.VLLM_INIT})
FITTED = frozenset(
    {TrialStatus.COMPLETE, TrialStatus.UNHEALTHY, TrialStatus.TIMEOUT, TrialStatus.HANG, TrialStatus.PRUNED}
)


class Severity(str, Enum):
    """How much a finding matters to the user's next action."""

    CRITICAL = "critical"  # a configuration that must not be used, or a result that cannot be trusted
    WARNING = "warning"  # time or memory being wasted, with a change to try
    INFO = "info"  # what the search learned


_SEVERITY_ORDER = {Severity.CRITICAL: 0, Severity.WARNING: 1, Severity.INFO: 2}


@dataclass(frozen=True)
class Finding:
    """One piece of advice.

    Attributes:
        rule: the rule's name (stable; tests and the report key on it).
        severity: see :class:`Severity`.
        title: a few words.
        text: the advice with the numbers that justify it (plain text; the report escapes it).
        evidence: those numbers, machine-readable.
        trial: the trial it is about, or None for a finding about the whole study.
    """

    rule: str
    severity: Severity
    title: str
    text: str
    evidence: dict[str, Any] = field(default_factory=dict)
    trial: int | None = None


@dataclass(frozen=True)
class OffloadFit:
    """What the memory estimate says about a trial's knobs with offload turned off."""

    fits: bool
    peak_bytes: int
    capacity_bytes: int


OffloadEstimator = Callable[[StudyData, TrialData, dict[str, Any]], "OffloadFit | str"]


@dataclass
class Context:
    """What the rules share: the study, every trial's signals, the winner, and optional collaborators.

    Attributes:
        estimator: predicts memory for changed knobs; returns an :class:`OffloadFit` or a sentence
            saying why no estimate can be given.
    """

    data: StudyData
    signals: dict[int, TrialSignals]
    winner: int | None = None
    estimator: OffloadEstimator | None = None
    clean: Callable[[str], str] = str

    def fixed(self) -> dict[str, Any]:
        return dict(self.data.settings.fixed)

    def backend(self) -> type[Backend] | None:
        """The class of the study's backend (None for a profiled run or a backend unknown here)."""
        name = self.data.settings.backend
        if name is None:
            return None
        try:
            return backend_class(name)
        except UsageError:
            return None

    def knob_name(self, role: str) -> str | None:
        """The study's backend's knob for ``role`` (a JobConfig field), or None."""
        backend = self.backend()
        return backend.knob_roles().get(role) if backend is not None else None

    def knob(self, trial: TrialData, role: str) -> tuple[str, Any] | None:
        """The knob (or fixed argument) that plays ``role`` for this trial — a JobConfig field, named by
        the study's backend — with its value, when the trial or the fixed arguments set it."""
        name = self.knob_name(role)
        if name is None:
            return None
        fixed = self.fixed()
        if name in trial.params:
            return name, trial.params[name]
        if name in fixed:
            return name, fixed[name]
        return None

    def config(self, params: Mapping[str, Any]) -> JobConfig | None:
        """What ``params`` (over the study's fixed arguments) mean to the study's backend, if it can say."""
        backend = self.backend()
        if backend is None:
            return None
        job = {**self.data.settings.job_sizes, **self.fixed()}
        n_gpus = len(self.data.hardware.gpus) if self.data.hardware is not None else 0
        try:
            return backend.describe(params, {}, job, n_gpus)
        except (AutotuneError, TypeError, ValueError):
            return None

    def offload_knobs(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The knobs (or fixed arguments) that keep model or optimizer state in host memory."""
        config = self.config(params)
        if config is None:
            return {}
        out: dict[str, Any] = {}
        for role in OFFLOAD_FIELDS:
            if getattr(config, role) and role in config.origin:
                name, value = config.origin[role]
                out[name] = value
        return out

    def without_offload(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` with every offload knob turned off, in the backend's own words."""
        backend = self.backend()
        return backend.without_offload(params) if backend is not None else dict(params)

    def memory_knobs(self) -> set[str] | None:
        """Knobs the search space marks as affecting memory (None when the space does not say)."""
        if not isinstance(self.data.settings.space, list):
            return None
        names = {k["name"] for k in self.data.settings.knobs if k.get("memory") and "name" in k}
        return names or None

    def space_values(self, name: str) -> list[Any] | None:
        if not isinstance(self.data.settings.space, list):
            return None
        for k in self.data.settings.knobs:
            if k.get("name") == name and isinstance(k.get("values"), list):
                return k["values"]
        return None


# ----------------------------------------------------------------------------------------- helpers


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def _uses_vllm(ctx: Context, trial: TrialData) -> bool:
    hit = ctx.knob(trial, "use_vllm")
    if hit is not None:
        return bool(hit[1])
    return ctx.knob(trial, "vllm_util") is not None


def _is_zero3(ctx: Context, trial: TrialData) -> bool:
    config = ctx.config(trial.params)
    return config is not None and config.deepspeed and config.zero_stage == 3


def _same_memory_knobs(
    ctx: Context, a: Mapping[str, Any], b: Mapping[str, Any], ignore: Iterable[str] = ()
) -> bool:
    relevant = ctx.memory_knobs()
    names = (set(a) | set(b)) - set(ignore)
    if relevant is not None:
        names &= relevant
    return all(a.get(n) == b.get(n) for n in names)


def _performance_trial(ctx: Context, trial: TrialData) -> bool:
    """Rules about speed read trials that ran at steady state (or the single profiled run)."""
    if ctx.data.kind == "profile":
        return len(trial.steps) >= 2
    return trial.status is TrialStatus.COMPLETE


def _trials_text(numbers: Iterable[int]) -> str:
    nums = sorted(set(numbers))
    if not nums:
        return "no trial"
    return ("trial " if len(nums) == 1 else "trials ") + ", ".join(str(n) for n in nums)


def _round_down(value: float, step: float) -> float:
    return math.floor(value / step + 1e-9) * step


def _gpu_at(ctx: Context, position: int) -> str:
    return ctx.data.gpu_label(position)


# ------------------------------------------------------------------------------------ trial rules


def rule_rollout_idle(ctx: Context, trial: TrialData, sig: TrialSignals) -> Finding | None:
    """Idle GPU time dominated by rollout while memory is free → give vLLM more memory (or more TP)."""
    if not _performance_trial(ctx, trial) or not _uses_vllm(ctx, trial):
        return None
    idle_by_phase = sig.idle_seconds_by_phase()
    total_idle = sum(idle_by_phase.values())
    rollout_idle = idle_by_phase.get("rollout", 0.0)
    room = sig.min_headroom()
    if sig.window_s is None or total_idle <= 0 or room is None:
        return None
    idle_share = total_idle / sig.window_s
    rollout_fraction = rollout_idle / total_idle
    pos, head, cap = room
    if (
        idle_share < ROLLOUT_MIN_IDLE_SHARE
        or rollout_fraction < ROLLOUT_MIN_IDLE_FRACTION
        or head < ROLLOUT_MIN_HEADROOM_FRAC * cap
    ):
        return None
    util_knob = ctx.knob(trial, "vllm_util")
    evidence: dict[str, Any] = {
        "idle_share": round(idle_share, 4),
        "rollout_idle_fraction": round(rollout_fraction, 4),
        "rollout_idle_share": sig.idle_share_by_phase.get("rollout"),
        "rollout_seconds": round(sig.phase_seconds.get("rollout", 0.0), 2),
        "min_headroom_bytes": head,
        "capacity_bytes": cap,
    }
    rollout_share = sig.phase_seconds.get("rollout", 0.0) / sig.window_s
    text = (
        f"GPUs sat idle {share(idle_share)} of the steady time, and {share(rollout_fraction)} of that idle time fell "
        f"in rollout (rollout is {share(rollout_share)} of each step; GPUs idle {share(sig.idle_share_by_phase.get('rollout'))} "
        f"of it), while {gib(head)} of {gib(cap)} stayed free on {_gpu_at(ctx, pos)}."
    )
    advice = []
    if util_knob is not None and _num(util_knob[1]) is not None:
        name, current = util_knob[0], float(util_knob[1])
        suggested = _round_down(min(0.95, current + head / cap - UTIL_SAFETY_FRAC), 0.05)
        ceiling = _util_ceiling(ctx, trial, name)
        if ceiling is not None and suggested >= ceiling[0]:
            suggested = _round_down(ceiling[0] - 0.05, 0.05)
        if suggested > current + 1e-9:
            advice.append(
                f"raise {name} from {current:g} to about {suggested:.2f} (more KV cache, more sequences in flight)"
            )
            evidence["suggested_utilization"] = round(suggested, 2)
            if ceiling is not None:
                advice[-1] += (
                    f"; {ceiling[0]:g} already failed at this batch size in {_trials_text(ceiling[1])}"
                )
    tp = ctx.knob(trial, "vllm_tp")
    n_gpus = len(sig.capacity_bytes)
    if tp is not None and _num(tp[1]) is not None and n_gpus and int(tp[1]) < n_gpus:
        advice.append(
            f"or raise {tp[0]} from {int(tp[1])} to {min(n_gpus, int(tp[1]) * 2)} (weights split over more GPUs leave more room for KV cache)"
        )
    if not advice:
        advice.append(
            "give vLLM more of the free memory (a higher gpu_memory_utilization) or a larger tensor-parallel size"
        )
    return Finding(
        "rollout_idle",
        Severity.WARNING,
        "Rollout leaves the GPUs idle with memory to spare",
        text + " Try: " + "; ".join(advice) + ".",
        evidence,
        trial.number,
    )


def _util_ceiling(ctx: Context, trial: TrialData, util_name: str) -> tuple[float, list[int]] | None:
    """The lowest utilization that ran out of memory at this trial's micro-batch, and which trials."""
    batch = ctx.knob(trial, "per_device_batch")
    failed: dict[float, list[int]] = {}
    for other in ctx.data.trials:
        if other.status not in MEMORY_FAILURES:
            continue
        if batch is not None and other.params.get(batch[0], batch[1]) != batch[1]:
            continue
        value = _num(other.params.get(util_name))
        if value is not None:
            failed.setdefault(value, []).append(other.number)
    if not failed:
        return None
    lowest = min(failed)
    return lowest, failed[lowest]


def rule_offload_bottleneck(ctx: Context, trial: TrialData, sig: TrialSignals) -> Finding | None:
    """PCIe traffic with idle GPUs during training under offload → offload is the bottleneck."""
    if not _performance_trial(ctx, trial):
        return None
    offload = ctx.offload_knobs(trial.params)
    if not offload:
        return None
    pcie = sig.pcie_bytes_s_by_phase.get("train")
    idle = sig.idle_share_by_phase.get("train")
    if pcie is None or idle is None or pcie < OFFLOAD_MIN_PCIE_BYTES_S or idle < OFFLOAD_MIN_TRAIN_IDLE_SHARE:
        return None
    train_s = sig.phase_seconds.get("train", 0.0)
    train_share = train_s / sig.window_s if sig.window_s else None
    knobs = ", ".join(f"{k}={knob_value(v)}" for k, v in offload.items())
    text = (
        f"With {knobs}, training moved {pcie / 1e9:.1f} GB/s per GPU over PCIe while the GPUs sat idle "
        f"{share(idle)} of the training phase (training is {share(train_share)} of each step): offload is the bottleneck."
    )
    evidence: dict[str, Any] = {
        "pcie_bytes_s_train": round(pcie),
        "train_idle_share": round(idle, 4),
        "offload": offload,
    }
    off_params = ctx.without_offload(trial.params)
    fits: bool | None = None
    measured = [
        t
        for t in ctx.data.trials
        if t.number != trial.number
        and not ctx.offload_knobs(t.params)
        and _same_memory_knobs(ctx, t.params, off_params)
    ]
    ran = [t for t in measured if t.status in FITTED and t.steps]
    oomed = [t for t in measured if t.status in MEMORY_FAILURES]
    if ran:
        best = max(ran, key=lambda t: t.result.throughput or 0.0)
        sig_best = ctx.signals.get(best.number)
        peak = max((p for p in (sig_best.peak_bytes if sig_best else []) if p is not None), default=None)
        text += f" Without offload it fits: trial {best.number} ran the same memory settings"
        text += f" with a peak of {gib(peak)}" if peak is not None else ""
        if best.result.throughput and trial.result.throughput:
            text += f" at {best.result.throughput:.3g} vs {trial.result.throughput:.3g} completions/s"
        text += "."
        evidence["measured_without_offload"] = best.number
        fits = True
    elif oomed:
        text += f" Without offload it ran out of memory ({_trials_text(t.number for t in oomed)})."
        evidence["measured_without_offload_oom"] = [t.number for t in oomed]
        fits = False
    else:
        estimate = (
            ctx.estimator(ctx.data, trial, off_params)
            if ctx.estimator
            else "the memory estimate is unavailable"
        )
        if isinstance(estimate, OffloadFit):
            verdict = "fits" if estimate.fits else "does not fit"
            text += (
                f" The memory estimate says turning offload off {verdict}: predicted peak {gib(estimate.peak_bytes)} "
                f"of {gib(estimate.capacity_bytes)} per GPU."
            )
            evidence["estimate_without_offload"] = {"fits": estimate.fits, "peak_bytes": estimate.peak_bytes}
            fits = estimate.fits
        else:
            text += f" Whether it fits without offload is unknown: {estimate}."
            evidence["estimate_without_offload"] = None
    off = ", ".join(f"{k}={knob_value(v)}" for k, v in ctx.without_offload(offload).items())
    if fits is False:
        text += f" Try: free memory first (a lower vLLM utilization or micro-batch), then {off}."
    elif fits is None:
        text += f" Try: {off}, if it fits."
    else:
        text += f" Try: {off}."
    return Finding(
        "offload_bottleneck",
        Severity.WARNING,
        "Offload traffic stalls the GPUs",
        text,
        evidence,
        trial.number,
    )


def rule_host_cpu_stall(ctx: Context, trial: TrialData, sig: TrialSignals) -> Finding | None:
    """Host CPU saturated while the GPUs wait → more dataloader workers (or lighter host work)."""
    if not _performance_trial(ctx, trial):
        return None
    if sig.host_busy_idle_share is None or sig.gpu_idle_s is None or sig.window_s is None:
        return None
    idle_share = sig.gpu_idle_s / sig.window_s
    if (
        idle_share < HOST_MIN_IDLE_SHARE
        or sig.gpu_idle_s < HOST_MIN_IDLE_S
        or sig.host_busy_idle_share < HOST_MIN_BUSY_SHARE
    ):
        return None
    workers = ctx.knob(trial, "dataloader_num_workers")
    text = (
        f"All GPUs were idle {share(idle_share)} of the steady time ({seconds(sig.gpu_idle_s)}), and during "
        f"{share(sig.host_busy_idle_share)} of that idle time the host CPU was at or above {HOST_BUSY_PCT:.0f} % "
        f"(mean {pct(sig.host_cpu_idle_mean_pct)}): the GPUs wait for the host (data loading, tokenization, reward functions)."
    )
    if workers is not None and _num(workers[1]) is not None:
        current = int(workers[1])
        target = max(2, current * 2)
        text += f" Try: raise {workers[0]} from {current} to {target}"
    else:
        text += " Try: 2 or more data-loading workers"
    text += ", and move heavy reward computation off the training process."
    evidence = {
        "gpu_idle_s": sig.gpu_idle_s,
        "idle_share": round(idle_share, 4),
        "host_busy_idle_share": round(sig.host_busy_idle_share, 4),
        "host_cpu_idle_mean_pct": sig.host_cpu_idle_mean_pct,
    }
    if workers is not None:
        evidence[workers[0]] = workers[1]
    return Finding(
        "host_cpu_stall", Severity.WARNING, "GPUs wait for a saturated host CPU", text, evidence, trial.number
    )


def rule_micro_batch_headroom(ctx: Context, trial: TrialData, sig: TrialSignals) -> Finding | None:
    """Large memory headroom in a completed trial → a larger micro-batch."""
    if not _performance_trial(ctx, trial):
        return None
    room = sig.min_headroom()
    if room is None:
        return None
    pos, head, cap = room
    if head < BATCH_MIN_HEADROOM_FRAC * cap or head < BATCH_MIN_HEADROOM_BYTES:
        return None
    batch = ctx.knob(trial, "per_device_batch")
    peak = sig.peak_bytes[pos]
    text = f"The measured peak was {gib(peak)} of {gib(cap)} on {_gpu_at(ctx, pos)}: {gib(head)} ({share(head / cap)}) stayed free on every GPU."
    evidence: dict[str, Any] = {"min_headroom_bytes": head, "capacity_bytes": cap, "peak_bytes": peak}
    if batch is not None and _num(batch[1]) is not None:
        name, current = batch[0], int(batch[1])
        larger = [
            t
            for t in ctx.data.trials
            if _num(t.params.get(name)) is not None
            and int(t.params[name]) > current
            and _same_memory_knobs(ctx, t.params, trial.params, ignore=(name,))
        ]
        if any(t.status in MEMORY_FAILURES for t in larger):
            return None  # the larger batch was tried with the same settings and did not fit
        if any(t.status is TrialStatus.COMPLETE for t in larger):
            return None  # already measured; the table shows it
        target = current * 2
        text += f" Try: {name} {target} (from {current}); activations and logits grow with it, model states do not."
        values = ctx.space_values(name)
        nums = [int(v) for v in values or [] if _num(v) is not None]
        if nums and current >= max(nums):
            text += f" {current} is already the largest value in the search space: widen it."
        evidence[name] = current
        evidence["suggested"] = target
    else:
        text += " Try a larger per-device micro-batch."
    return Finding(
        "micro_batch_headroom",
        Severity.INFO,
        "Memory to spare for a larger micro-batch",
        text,
        evidence,
        trial.number,
    )


def rule_zero3_gather_peak(ctx: Context, trial: TrialData, sig: TrialSignals) -> Finding | None:
    """ZeRO-3's full-weight gather at the weight sync sets the peak (or OOMs) → ``move_model_batches``."""
    if not _is_zero3(ctx, trial) or sig.sync_peak_bytes is None or sig.rest_peak_bytes is None:
        return None
    excess = sig.sync_peak_bytes - sig.rest_peak_bytes
    if excess < GATHER_MIN_EXCESS_BYTES:
        return None
    cap = max((c for c in sig.capacity_bytes if c is not None), default=None)
    oom_in_sync = trial.status in MEMORY_FAILURES and sig.open_phase == "weight_sync"
    tight = cap is not None and cap - sig.sync_peak_bytes < GATHER_TIGHT_FRAC * cap
    if not (oom_in_sync or tight):
        return None
    mmb = ctx.knob(trial, "move_model_batches")
    current = int(mmb[1]) if mmb is not None and _num(mmb[1]) is not None else None
    suggested = 8 if current is None else current * 2
    where = (
        "it ran out of memory inside the weight sync"
        if oom_in_sync
        else f"only {gib((cap or 0) - sig.sync_peak_bytes)} stayed free"
    )
    text = (
        f"Memory peaked at the weight sync: {gib(sig.sync_peak_bytes)} there against {gib(sig.rest_peak_bytes)} in rollout "
        f"and training ({gib(excess)} more), and {where}. Under ZeRO-3 the sync gathers the full weights at once. "
        f"Try: {ctx.knob_name('move_model_batches') or 'gathering the sync in batches of'} {suggested}"
        + (f" (from {current})" if current is not None else " (it was not set)")
        + " to gather them in parts; the sync gets slower, the peak smaller."
    )
    evidence = {
        "sync_peak_bytes": sig.sync_peak_bytes,
        "rest_peak_bytes": sig.rest_peak_bytes,
        "excess_bytes": excess,
        "oom_in_sync": oom_in_sync,
        "move_model_batches": current,
        "suggested": suggested,
    }
    severity = Severity.WARNING
    return Finding(
        "zero3_gather_peak",
        severity,
        "ZeRO-3 gather at the weight sync sets the peak",
        text,
        evidence,
        trial.number,
    )


TrialRule = Callable[[Context, TrialData, TrialSignals], "Finding | None"]
TRIAL_RULES: tuple[TrialRule, ...] = (
    rule_rollout_idle,
    rule_offload_bottleneck,
    rule_host_cpu_stall,
    rule_micro_batch_headroom,
    rule_zero3_gather_peak,
)


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
        if t.status in MEMORY_FAILURES and _num(t.params.get(knob)) is not None
    ]
    fits = [
        (float(t.params[knob]), t.number)
        for t in trials
        if t.status in FITTED and t.steps and _num(t.params.get(knob)) is not None
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
    names = sorted({k for t in trials for k, v in t.params.items() if _num(v) is not None})
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


def _hashable(value: Any) -> Any:
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
            line += f" ({_trials_text(b.fail_trials)}; {b.fit_max:g} fits: {_trials_text(b.fit_trials)})"
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


# --------------------------------------------------------------------------------------- running


def estimate_without_offload(data: StudyData, trial: TrialData, params: dict[str, Any]) -> OffloadFit | str:
    """Ask ``autotune.estimate`` (when installed) whether ``params`` fit; a sentence when it cannot say."""
    try:
        from autotune.backends import job_shape
        from autotune.estimate import estimate_memory, find_gpu, find_model
    except ImportError:
        return "the memory estimate is unavailable"
    model = None
    for name in (data.settings.model.name, data.settings.model.path_or_id):
        if name is not None and model is None:
            model = find_model(name)
    if model is None:
        return "the model is not in the estimator's catalog"
    if data.hardware is None or not data.hardware.gpus:
        return "the GPUs are unknown"
    gpu = find_gpu(data.hardware.gpus[0].name)
    if gpu is None:
        return f"the GPU type {data.hardware.gpus[0].name} is not in the estimator's catalog"
    fixed = {**data.settings.job_sizes, **data.settings.fixed}
    try:
        shape = job_shape(
            data.settings.backend or "trl",
            params,
            trial.result.derived,
            fixed,
            model,
            len(data.hardware.gpus),
        )
        est = estimate_memory(shape, gpu)
        capacity = min(g.memory_total_bytes for g in data.hardware.gpus)
        peak = int(est.peak_bytes)
        return OffloadFit(
            fits=bool(est.fits(0.0)) and peak <= capacity, peak_bytes=peak, capacity_bytes=capacity
        )
    except (AutotuneError, ArithmeticError, AttributeError, KeyError, TypeError, ValueError) as exc:
        return f"the memory estimate failed ({exc.__class__.__name__})"


def make_context(
    data: StudyData,
    *,
    winner: int | None = None,
    estimator: OffloadEstimator | None = estimate_without_offload,
) -> Context:
    """Compute every trial's signals once and bundle what the rules need."""
    sigs = {t.number: signals(data, t) for t in data.trials}
    sanitizer = Sanitizer.for_study(data.roots, data.env_maps, secret_names=data.secret_names)
    return Context(data=data, signals=sigs, winner=winner, estimator=estimator, clean=sanitizer.clean)


def diagnose(ctx: Context) -> list[Finding]:
    """Run every rule; findings sorted by severity, then the winner and the baseline first."""
    findings: list[Finding] = []
    for trial in ctx.data.trials:
        sig = ctx.signals.get(trial.number)
        if sig is None:
            continue
        for trial_rule in TRIAL_RULES:
            found = trial_rule(ctx, trial, sig)
            if found is not None:
                findings.append(found)
    for study_rule in STUDY_RULES:
        if ctx.data.kind == "profile" and study_rule is rule_oom_boundary:
            continue  # one run has no boundary to find
        found = study_rule(ctx)
        if found is not None:
            findings.append(found)
    baseline = ctx.data.baseline
    first = [n for n in (ctx.winner, baseline.number if baseline else None) if n is not None]

    def key(f: Finding) -> tuple[int, int, int]:
        rank = first.index(f.trial) if f.trial in first else len(first)
        return (_SEVERITY_ORDER[f.severity], rank, f.trial if f.trial is not None else -1)

    return sorted(findings, key=key)
