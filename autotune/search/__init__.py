"""Search strategy: which configuration to try next, what can be skipped, when to stop."""

from __future__ import annotations

from autotune.search._inference import Inference, infer_infeasible, oom_dominated
from autotune.search._strategy import SEARCH_KINDS, Proposal, SearchStrategy, launched, usable_complete
from autotune.search._sweep import DeepSpeedSweep

__all__ = [
    "SEARCH_KINDS",
    "DeepSpeedSweep",
    "Inference",
    "Proposal",
    "SearchStrategy",
    "infer_infeasible",
    "launched",
    "oom_dominated",
    "usable_complete",
]
