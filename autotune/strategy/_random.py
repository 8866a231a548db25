"""``random``: Optuna's random sampler over the space, with the study's pre-screen (for comparison)."""

from __future__ import annotations

from collections.abc import Sequence

from autotune.records import TrialResult
from autotune.strategy._base import BaseStrategy, Exhausted, Pending, Proposal

__all__ = ["RandomStrategy"]


class RandomStrategy(BaseStrategy):
    """Leaves every trial to Optuna's :class:`~optuna.samplers.RandomSampler` (seeded); never stops
    early. The study's pre-screen still refuses what the rules, the OOM inference and the memory gate
    rule out."""

    def propose(self, history: Sequence[TrialResult], pending: Pending) -> Proposal | Exhausted | None:
        """Always None: the sampler draws."""
        return None
