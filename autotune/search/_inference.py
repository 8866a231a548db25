"""What a failed trial teaches about configurations never run.

A configuration that ran out of GPU memory makes every configuration that needs at least as much memory
infeasible: same knobs, same values for every knob without a memory order, and for every knob with one
(``memory: increasing`` / ``decreasing`` in the space file) a value that needs at least as much —
with at least one knob strictly more. Only CUDA OOMs teach this: a vLLM "no cache blocks" failure goes
the other way (too *little* utilization), and host OOMs grow with offload, not against it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from autotune.records import TrialResult, TrialStatus
from autotune.space import SearchSpace, canonical_key

__all__ = ["oom_dominated", "needs_at_least"]


def needs_at_least(space: SearchSpace, candidate: Mapping[str, Any], failed: Mapping[str, Any]) -> bool:
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
            if canonical_key({"v": value}) != canonical_key({"v": other}):
                return False
            continue
        if rank_c < rank_f:
            return False
        if rank_c > rank_f:
            strictly_more = True
    return strictly_more


def oom_dominated(space: SearchSpace, candidate: Mapping[str, Any], history: Iterable[TrialResult]) -> TrialResult | None:
    """The OOM trial that proves ``candidate`` cannot fit, or None."""
    for result in history:
        if result.status is TrialStatus.OOM and needs_at_least(space, candidate, result.params):
            return result
    return None
