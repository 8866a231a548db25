"""The search strategy on top of Optuna.

``auto``: the baseline first, then the candidates an estimator predicts fastest (when one is given),
then TPE (multivariate, grouped for conditional knobs) that treats failures as infeasible through
Optuna's constraints. ``random`` and ``grid`` exist for comparison.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna

from autotune.errors import UsageError
from autotune.records import TrialResult, TrialStatus
from autotune.space import SearchSpace, canonical_key

__all__ = ["SEARCH_KINDS", "SearchStrategy"]

SEARCH_KINDS = ("auto", "random", "grid")
_GRID_ENUM_LIMIT = 200_000


class SearchStrategy:
    """Decides what to try next. Collaborators are passed in; the strategy never runs anything.

    Args:
        space: the search space (already restricted to this machine).
        kind: "auto", "random" or "grid".
        seed: seed of every random choice.
        rank: predicted throughput of a configuration (higher first), or None when unknown.
        feasible: a cheap pre-check (validity rules, memory estimate) used when picking candidates.
        n_seeds: how many predicted-fastest candidates ``auto`` runs before the model-based sampler.
        stop_gain_frac: ``auto`` stops when the last ``patience`` trials did not improve the best by
            more than this fraction.
        patience: see ``stop_gain_frac``.
    """

    def __init__(
        self,
        space: SearchSpace,
        kind: str = "auto",
        *,
        seed: int = 0,
        rank: Callable[[Mapping[str, Any]], float | None] | None = None,
        feasible: Callable[[Mapping[str, Any]], bool] | None = None,
        n_seeds: int = 3,
        stop_gain_frac: float = 0.02,
        patience: int = 6,
    ) -> None:
        if kind not in SEARCH_KINDS:
            raise UsageError(f"unknown search {kind!r}", hint=f"Use --search with one of: {', '.join(SEARCH_KINDS)}")
        self.space = space
        self.kind = kind
        self.seed = seed
        self._rank = rank
        self._feasible = feasible or (lambda _p: True)
        self.n_seeds = n_seeds
        self.stop_gain_frac = stop_gain_frac
        self.patience = patience
        self._rng = random.Random(seed)
        self._grid: list[dict[str, Any]] | None = None

    # -- Optuna sampler -------------------------------------------------------------------------
    def sampler(self) -> optuna.samplers.BaseSampler:
        """The Optuna sampler for this kind (grid is driven by :meth:`next_unvisited`)."""
        if self.kind == "random":
            return optuna.samplers.RandomSampler(seed=self.seed)
        if self.kind == "grid":
            return optuna.samplers.RandomSampler(seed=self.seed)  # never consulted: every grid trial is enqueued
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # Failures reach TPE as infeasible through trial constraints (set by the study on tell).
            return optuna.samplers.TPESampler(seed=self.seed, multivariate=True, group=True, n_startup_trials=4)

    # -- candidates ------------------------------------------------------------------------------
    def grid(self) -> list[dict[str, Any]]:
        if self._grid is None:
            grid: list[dict[str, Any]] = []
            for params in self.space.grid():
                grid.append(params)
                if len(grid) >= _GRID_ENUM_LIMIT:
                    break
            self._grid = grid
        return self._grid

    def seeds(self, visited: set[str]) -> list[dict[str, Any]]:
        """Candidates to run right after the baseline: the predicted fastest feasible ones."""
        if self.kind != "auto" or self._rank is None:
            return []
        scored = []
        for params in self.grid():
            if canonical_key(params) in visited or not self._feasible(params):
                continue
            score = self._rank(params)
            if score is not None:
                scored.append((score, params))
        scored.sort(key=lambda sp: sp[0], reverse=True)
        return [p for _, p in scored[: self.n_seeds]]

    def next_unvisited(self, visited: set[str]) -> dict[str, Any] | None:
        """A configuration not run yet: the next grid point (grid) or a random feasible one."""
        candidates = [p for p in self.grid() if canonical_key(p) not in visited]
        if not candidates:
            return None
        if self.kind == "grid":
            return candidates[0]
        feasible = [p for p in candidates if self._feasible(p)]
        pool = feasible or candidates
        if self._rank is not None and self.kind == "auto":
            scored = [(self._rank(p), p) for p in pool]
            known = [sp for sp in scored if sp[0] is not None]
            if known:
                return max(known, key=lambda sp: sp[0])[1]  # type: ignore[arg-type, return-value]
        return self._rng.choice(pool)

    # -- stopping --------------------------------------------------------------------------------
    def converged(self, history: Sequence[TrialResult], launched_budget_left: int) -> str | None:
        """A one-line reason to stop before the budget, or None to go on."""
        if self.kind != "auto":
            return None
        launched = [r for r in history if r.status is not TrialStatus.PRUNED or r.steps > 0]
        launched = [r for r in launched if r.status is not TrialStatus.INTERRUPTED]
        if len(launched) < self.patience + 2 or launched_budget_left <= 0:
            return None
        launched.sort(key=lambda r: r.number)
        best_before = max(
            (r.throughput or 0.0 for r in launched[: -self.patience] if r.status is TrialStatus.COMPLETE),
            default=0.0,
        )
        best_recent = max(
            (r.throughput or 0.0 for r in launched[-self.patience :] if r.status is TrialStatus.COMPLETE),
            default=0.0,
        )
        if best_before > 0 and best_recent <= best_before * (1 + self.stop_gain_frac):
            return (
                f"the last {self.patience} trials did not beat the best by more than "
                f"{self.stop_gain_frac:.0%}; further trials are unlikely to gain more"
            )
        return None
