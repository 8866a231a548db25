"""Search strategy: which configuration to try next, what can be skipped, when to stop."""

from __future__ import annotations

from autotune.strategy._inference import Inference, infer_infeasible, oom_dominated
from autotune.strategy._strategy import SEARCH_KINDS, Proposal, SearchStrategy, launched, usable_complete
from autotune.strategy._sweep import DeepSpeedSweep

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
