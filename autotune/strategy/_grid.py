"""``grid``: every configuration of the space in a stable order (for comparison)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autotune.records import TrialResult
from autotune.space import canonical_key
from autotune.strategy._base import EXHAUSTED, BaseStrategy, Exhausted, Pending, Proposal

__all__ = ["GridStrategy"]


class GridStrategy(BaseStrategy):
    """Runs the space's configurations in :meth:`~autotune.space.SearchSpace.grid` order, skipping the
    visited ones, those the pre-check refuses included (the study prunes and records them); the study
    ends (exhausted) after the last."""

    covers_space = True

    def propose(self, history: Sequence[TrialResult], pending: Pending) -> Proposal | Exhausted | None:
        """The next grid point not visited, or :class:`Exhausted`."""
        params = self.next_unvisited(pending.visited)
        return Exhausted(EXHAUSTED) if params is None else Proposal(params, mode="grid")

    def next_unvisited(self, visited: set[str] | frozenset[str]) -> dict[str, Any] | None:
        """The next grid point not visited (None once every point was)."""
        return next((p for p in self.grid() if canonical_key(p) not in visited), None)

    def unexplained_choice(self, queued: bool) -> dict[str, Any]:
        """Every trial of a grid is a grid point."""
        return {"mode": "grid"}
