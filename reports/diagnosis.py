"""Rules that turn a study's evidence into advice, quoting the numbers that triggered them.

Each rule is a small function that returns a :class:`Finding` or None. Trial rules read one trial and
its :class:`~reports._signals.TrialSignals`; study rules compare trials (:mod:`autotune.reports._study_rules`).
:func:`diagnose` runs them all. Thresholds are module constants (:mod:`autotune.reports._findings`) so a
test (and a reader) can see exactly when a rule fires.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from autotune.reports._findings import (
    BATCH_MIN_HEADROOM_BYTES,
    BATCH_MIN_HEADROOM_FRAC,
    FITTED,
    GATHER_MIN_EXCESS_BYTES,
    GATHER_TIGHT_FRAC,
    HOST_MIN_BUSY_SHARE,
    HOST_MIN_IDLE_S,
    HOST_MIN_IDLE_SHARE,
    MEMORY_FAILURES,
    OFFLOAD_MIN_PCIE_BYTES_S,
    OFFLOAD_MIN_TRAIN_IDLE_SHARE,
    ROLLOUT_MIN_HEADROOM_FRAC,
    ROLLOUT_MIN_IDLE_FRACTION,
    ROLLOUT_MIN_IDLE_SHARE,
    SEVERITY_ORDER,
    UTIL_SAFETY_FRAC,
    Context,
    Finding,
    OffloadEstimator,
    OffloadFit,
    Severity,
    gpu_at,
    is_zero3,
    num,
    performance_trial,
    round_down,
    same_memory_knobs,
    trials_text,
    uses_vllm,
)
from autotune.reports._format import gib, knob_value, pct, seconds, share
from autotune.reports._load import StudyData, TrialData
from autotune.reports._safety import Sanitizer
from autotune.reports._signals import HOST_BUSY_PCT, TrialSignals, signals
from autotune.reports._study_rules import (
    STUDY_RULES,
    rule_hang_pattern,
    rule_host_memory,
    rule_oom_boundary,
    rule_other_failures,
    rule_unhealthy_trials,
)

from autotune.errors import AutotuneError
from autotune.records import TrialStatus

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

# ------------------------------------------------------------------------------------ trial rules


def rule_rollout_idle(ctx: Context, trial: TrialData, sig: TrialSignals) -> Finding | None:
    """Idle GPU time dominated by rollout while memory is free → give vLLM more memory (or more TP)."""
    if not performance_trial(ctx, trial) or not uses_vllm(ctx, trial):
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
        f"of it), while {gib(head)} of {gib(cap)} stayed free on {gpu_at(ctx, pos)}."
    )
    advice = []
    if util_knob is not None and num(util_knob[1]) is not None:
        name, current = util_knob[0], float(util_knob[1])
        suggested = round_down(min(0.95, current + head / cap - UTIL_SAFETY_FRAC), 0.05)
        ceiling = _util_ceiling(ctx, trial, name)
        if ceiling is not None and suggested >= ceiling[0]:
            suggested = round_down(ceiling[0] - 0.05, 0.05)
        if suggested > current + 1e-9:
            advice.append(
                f"raise {name} from {current:g} to about {suggested:.2f} (more KV cache, more sequences in flight)"
            )
            evidence["suggested_utilization"] = round(suggested, 2)
            if ceiling is not None:
                advice[-1] += (
                    f"; {ceiling[0]:g} already failed at this batch size in {trials_text(ceiling[1])}"
                )
    tp = ctx.knob(trial, "vllm_tp")
    n_gpus = len(sig.capacity_bytes)
    if tp is not None and num(tp[1]) is not None and n_gpus and int(tp[1]) < n_gpus:
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
        value = num(other.params.get(util_name))
        if value is not None:
            failed.setdefault(value, []).append(other.number)
    if not failed:
        return None
    lowest = min(failed)
    return lowest, failed[lowest]


def rule_offload_bottleneck(ctx: Context, trial: TrialData, sig: TrialSignals) -> Finding | None:
    """PCIe traffic with idle GPUs during training under offload → offload is the bottleneck."""
    if not performance_trial(ctx, trial):
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
        and same_memory_knobs(ctx, t.params, off_params)
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
        text += f" Without offload it ran out of memory ({trials_text(t.number for t in oomed)})."
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
    if not performance_trial(ctx, trial):
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
    if workers is not None and num(workers[1]) is not None:
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
    if not performance_trial(ctx, trial):
        return None
    room = sig.min_headroom()
    if room is None:
        return None
    pos, head, cap = room
    if head < BATCH_MIN_HEADROOM_FRAC * cap or head < BATCH_MIN_HEADROOM_BYTES:
        return None
    batch = ctx.knob(trial, "per_device_batch")
    peak = sig.peak_bytes[pos]
    text = f"The measured peak was {gib(peak)} of {gib(cap)} on {gpu_at(ctx, pos)}: {gib(head)} ({share(head / cap)}) stayed free on every GPU."
    evidence: dict[str, Any] = {"min_headroom_bytes": head, "capacity_bytes": cap, "peak_bytes": peak}
    if batch is not None and num(batch[1]) is not None:
        name, current = batch[0], int(batch[1])
        larger = [
            t
            for t in ctx.data.trials
            if num(t.params.get(name)) is not None
            and int(t.params[name]) > current
            and same_memory_knobs(ctx, t.params, trial.params, ignore=(name,))
        ]
        if any(t.status in MEMORY_FAILURES for t in larger):
            return None  # the larger batch was tried with the same settings and did not fit
        if any(t.status is TrialStatus.COMPLETE for t in larger):
            return None  # already measured; the table shows it
        target = current * 2
        text += f" Try: {name} {target} (from {current}); activations and logits grow with it, model states do not."
        values = ctx.space_values(name)
        nums = [int(v) for v in values or [] if num(v) is not None]
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
    if not is_zero3(ctx, trial) or sig.sync_peak_bytes is None or sig.rest_peak_bytes is None:
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
    current = int(mmb[1]) if mmb is not None and num(mmb[1]) is not None else None
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
        return (SEVERITY_ORDER[f.severity], rank, f.trial if f.trial is not None else -1)

    return sorted(findings, key=key)
