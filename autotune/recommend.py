"""Choosing the winner: the fastest healthy trial that leaves memory headroom on every GPU; and the
sentences that say its speedup (the verdict's headline), which the study, its reports and exports show."""

from __future__ import annotations

from collections.abc import Sequence

from autotune.records import Hardware, Recommendation, TrialResult, TrialStatus

__all__ = [
    "Recommendation",
    "allocator_cache_bytes",
    "baseline_of",
    "headline",
    "headroom_bytes",
    "needed_bytes",
    "recommend",
    "required_headroom_bytes",
    "single_run_text",
    "speedup_text",
    "vllm_pool_bytes",
]


def allocator_cache_bytes(result: TrialResult) -> int:
    """Memory torch's caching allocator held free at its peak: reserved minus allocated (0 when unknown).

    NVML counts the allocator's reserve, and the reserve grows to whatever the GPU has when a phase
    churns through tensors (the first H200 run: Hugging Face ``generate`` of 512 sequences took NVML to
    143.6 of 150.8 GB, after which the trainer ran at 98 GB). Torch hands that cache back and retries
    before it raises an OOM, so it is room, not need. Only known where the framework reports both peaks
    (autotune's step records do from the trial's own process: ``memory_gib``, ``memory_allocated_gib``).
    """
    reserved, allocated = result.framework_peak_mem_bytes, result.framework_alloc_peak_bytes
    if reserved is None or allocated is None:
        return 0
    return max(0, reserved - allocated)


def needed_bytes(result: TrialResult) -> list[int | None]:
    """What the trial needed on each GPU: its NVML peak less the allocator's free cache (None: unmeasured)."""
    cache = allocator_cache_bytes(result)
    return [None if peak is None else max(0, peak - cache) for peak in result.peak_mem_bytes]


def headroom_bytes(result: TrialResult, hardware: Hardware | None) -> list[int | None]:
    """Memory left at the trial's peak need on each GPU (None where unmeasured): :func:`needed_bytes`."""
    if hardware is None or not hardware.gpus:
        return []
    need = needed_bytes(result)
    out: list[int | None] = []
    for i, gpu in enumerate(hardware.gpus):
        peak = need[i] if i < len(need) else None
        out.append(None if peak is None else gpu.memory_total_bytes - peak)
    return out


def vllm_pool_bytes(result: TrialResult) -> int:
    """Memory a colocated vLLM holds on each GPU in every phase of the step (0 without one).

    vLLM reserves ``gpu_memory_utilization`` × total up front, KV cache included, and the pool does not
    grow with a longer prompt. Awake throughout (sleep level 0) it is the whole budget; asleep between
    rollouts, what it keeps asleep. Read from the trial's estimate, whose ``vllm_reserved`` is exact.
    """
    phases = (result.estimate or {}).get("phases") or {}
    values = [comps.get("vllm_reserved") for comps in phases.values() if isinstance(comps, dict)]
    held = [int(x) for x in values if isinstance(x, int | float)]
    return max(0, min(held)) if held else 0


def required_headroom_bytes(result: TrialResult, total_bytes: int, frac: float) -> float:
    """The headroom a trial must leave on a GPU of ``total_bytes``: ``frac`` of the memory whose use can
    grow with a longer prompt, i.e. all of it but a colocated vLLM's fixed pool (:func:`vllm_pool_bytes`)."""
    return frac * max(0, total_bytes - vllm_pool_bytes(result))


def recommend(
    results: Sequence[TrialResult],
    hardware: Hardware | None,
    *,
    min_headroom_frac: float = 0.05,
) -> Recommendation | None:
    """The fastest COMPLETE trial with at least ``min_headroom_frac`` of memory left on every GPU.

    Unhealthy, failed, pruned and interrupted trials are never recommended. A trial whose measured
    peak leaves less headroom than asked is passed over (it would OOM on a longer prompt); the fraction
    applies to the memory that can grow, not to a colocated vLLM's fixed pool
    (:func:`required_headroom_bytes`). The speedup
    is the ratio of the two trials' single runs; the study re-measures it before it is reported
    (:func:`autotune.study.verdict.judge`).
    """
    baseline = baseline_of(results)
    base_tp = baseline.throughput if baseline and baseline.status is TrialStatus.COMPLETE else None
    ranked = sorted(
        (r for r in results if r.status is TrialStatus.COMPLETE and r.throughput),
        key=lambda r: r.throughput or 0.0,
        reverse=True,
    )
    skipped: list[tuple[int, str]] = []
    for r in ranked:
        room = headroom_bytes(r, hardware)
        tight = [
            (i, h)
            for i, h in enumerate(room)
            if h is not None
            and hardware is not None
            and h < required_headroom_bytes(r, hardware.gpus[i].memory_total_bytes, min_headroom_frac)
        ]
        if tight:
            i, h = tight[0]
            skipped.append((r.number, f"only {h / 2**30:.2f} GiB left on GPU {hardware.gpus[i].index}"))  # type: ignore[union-attr]
            continue
        tp = r.throughput or 0.0
        speedup = tp / base_tp if base_tp else None
        # the speedup is not in the sentence: the verdict gives it, with its interval once re-measured
        why = f"fastest healthy trial in the search: {tp:.3g} completions/s"
        return Recommendation(
            trial=r.number,
            throughput=tp,
            baseline_trial=baseline.number if baseline else None,
            baseline_throughput=base_tp,
            speedup=speedup,
            headroom_bytes=room,
            why=why,
            skipped=skipped,
        )
    return None


def baseline_of(results: Sequence[TrialResult]) -> TrialResult | None:
    """The study's baseline trial: the last run of it that was not interrupted (an interrupted
    baseline runs again), else the first."""
    runs = [r for r in results if r.is_baseline]
    said = [r for r in runs if r.status is not TrialStatus.INTERRUPTED]
    return said[-1] if said else (runs[0] if runs else None)


def single_run_text(speedup: float | None, base: int | None) -> str:
    """The speedup of one run of each side, as a sentence (no interval: nothing was re-measured)."""
    if speedup is None:
        return "no speedup can be given: the baseline did not complete"
    return f"{speedup:.2f}× the baseline (trial {base}) from one run of each"


def speedup_text(rec: Recommendation) -> str:
    """The speedup as a headline shows it, never bare: ``1.45× [1.21, 1.74]``, ``no measurable speedup``,
    ``1.80× (single runs)`` or ``—`` (no baseline)."""
    if rec.speedup is None:
        return "—"
    if rec.host_noise:
        return "not measurable on this host"
    if rec.baseline_trial is not None and rec.trial == rec.baseline_trial:
        return "the baseline is fastest"
    if rec.speedup_low is not None and rec.speedup_high is not None:
        interval = f"{rec.speedup:.2f}× [{rec.speedup_low:.2f}, {rec.speedup_high:.2f}]"
        return interval if rec.measurable else f"no measurable speedup: {interval}"
    return f"{rec.speedup:.2f}× (single runs, not re-measured)"


def headline(rec: Recommendation) -> str:
    """One sentence on the speedup: the stored verdict, or (a study written before verdicts) one built
    from the search's numbers."""
    if rec.verdict:
        return rec.verdict
    if rec.baseline_trial is not None and rec.trial == rec.baseline_trial:
        return f"the baseline (trial {rec.baseline_trial}) is the fastest configuration tried"
    return single_run_text(rec.speedup, rec.baseline_trial) + " (not re-measured)"
