"""What a failed trial teaches about configurations never run.

Only lessons that are sound are drawn; everything else is left to the surrogate's soft failure model.

- **GPU memory** (a CUDA OOM, or vLLM refusing to start because the trainer left less free memory than
  ``gpu_memory_utilization`` reserves): every configuration that needs at least as much memory fails
  too. "At least as much" means: the same active knobs, the same value for every knob without a memory
  order, and for every knob with one (``memory: increasing`` / ``decreasing`` in the space file) a
  value that needs at least as much — with at least one knob strictly more. The start-up check
  compares the trainer's held memory with the reserved budget, and both only grow along those orders.
- **vLLM KV cache** ("no memory for the cache blocks", "cannot hold one sequence of max_model_len"):
  the budget left after weights and the activation peak was too small, so the same configuration with
  a *lower* vLLM utilization fails too. Nothing else is concluded (the trainer's knobs do not move it
  in one direction for every framework).
- Host OOMs grow with offload (against the GPU order), hangs and unhealthy runs have no order: they
  teach nothing here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from autotune.records import TrialResult, TrialStatus
from autotune.space import SearchSpace, canonical_key

__all__ = [
    "Inference",
    "infer_infeasible",
    "is_kv_failure",
    "is_memory_failure",
    "needs_at_least",
    "needs_less_kv",
    "oom_dominated",
]

# The reasons autotune.trial.outcome gives (and vLLM's own text, for results classified elsewhere).
_STARTUP_FREE = re.compile(
    r"free (GPU|host) memory is below|Free memory on device|less than desired CPU memory utilization",
    re.IGNORECASE,
)
_KV_SHORT = re.compile(
    r"cache blocks|KV cache (cannot|is needed)|KV cache memory|stored in KV cache", re.IGNORECASE
)


def _texts(result: TrialResult) -> str:
    return f"{result.reason}\n{result.evidence or ''}"


def is_memory_failure(result: TrialResult) -> bool:
    """A CUDA OOM, or vLLM's start-up check finding less free memory than it reserves."""
    if result.status is TrialStatus.OOM:
        return True
    return result.status is TrialStatus.VLLM_INIT and bool(_STARTUP_FREE.search(_texts(result)))


def is_kv_failure(result: TrialResult) -> bool:
    """vLLM started but its budget left no (or too little) room for the KV cache."""
    return (
        result.status is TrialStatus.VLLM_INIT
        and not _STARTUP_FREE.search(_texts(result))
        and bool(_KV_SHORT.search(_texts(result)))
    )


def _same(a: object, b: object) -> bool:
    return canonical_key({"v": a}) == canonical_key({"v": b})


def needs_at_least(space: SearchSpace, candidate: Mapping[str, object], failed: Mapping[str, object]) -> bool:
    """True when ``candidate`` needs strictly more GPU memory than ``failed`` by the space's orders."""
    if set(candidate) != set(failed):
        return False
    strictly_more = False
    for name, value in candidate.items():
        other = failed[name]
        knob = space[name] if name in space else None
        rank_c = knob.memory_rank(value) if knob else None
        rank_f = knob.memory_rank(other) if knob else None
        if rank_c is None or rank_f is None:
            if not _same(value, other):
                return False
            continue
        if rank_c < rank_f:
            return False
        if rank_c > rank_f:
            strictly_more = True
    return strictly_more


def needs_less_kv(space: SearchSpace, candidate: Mapping[str, object], failed: Mapping[str, object]) -> bool:
    """True when ``candidate`` is ``failed`` with a strictly lower vLLM memory share (the knob the
    backend names for the ``vllm_util`` role) and nothing else changed."""
    budget = space.knob_for("vllm_util")
    if budget is None or set(candidate) != set(failed):
        return False
    lower = False
    for name, value in candidate.items():
        other = failed[name]
        if name == budget and isinstance(value, (int, float)) and isinstance(other, (int, float)):
            if value < other - 1e-12:  # higher or the same: ``lower`` stays False
                lower = True
        elif not _same(value, other):
            return False
    return lower


@dataclass(frozen=True)
class Inference:
    """Why a configuration is known to fail without running it.

    Attributes:
        trial: the failed trial that proves it.
        reason: one line for the report ("needs more GPU memory than trial 4, which ran out of memory").
    """

    trial: TrialResult
    reason: str


def _diff(candidate: Mapping[str, object], failed: Mapping[str, object]) -> str:
    return ", ".join(
        f"{k} {candidate[k]!r} vs {failed.get(k)!r}"
        for k in candidate
        if not _same(candidate[k], failed.get(k))
    )


def infer_infeasible(
    space: SearchSpace, candidate: Mapping[str, object], history: Iterable[TrialResult]
) -> Inference | None:
    """The failed trial that proves ``candidate`` cannot run, with the reason, or None."""
    for result in history:
        if is_memory_failure(result) and needs_at_least(space, candidate, result.params):
            what = (
                "ran out of memory"
                if result.status is TrialStatus.OOM
                else "left vLLM too little free memory to start"
            )
            return Inference(
                result,
                f"needs more GPU memory than trial {result.number}, which {what} ({_diff(candidate, result.params)})",
            )
        if is_kv_failure(result) and needs_less_kv(space, candidate, result.params):
            return Inference(
                result,
                f"leaves vLLM less KV cache than trial {result.number}, whose KV cache was already too small "
                f"({_diff(candidate, result.params)})",
            )
    return None


def oom_dominated(
    space: SearchSpace, candidate: Mapping[str, object], history: Iterable[TrialResult]
) -> TrialResult | None:
    """The memory failure (OOM or vLLM start-up) that proves ``candidate`` cannot fit, or None."""
    for result in history:
        if is_memory_failure(result) and needs_at_least(space, candidate, result.params):
            return result
    return None
