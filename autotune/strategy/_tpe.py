"""``tpe``: Optuna's TPE with constraints and no estimator (a peer on the search-efficiency bench)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import optuna

from autotune.records import TrialResult
from autotune.strategy._base import BaseStrategy, Exhausted, Pending, Proposal, StrategySettings

__all__ = ["TPESettings", "TPEStrategy", "tpe_sampler"]


@dataclass(frozen=True)
class TPESettings(StrategySettings):
    """Settings of Optuna's TPE sampler.

    Attributes:
        n_startup_trials: random trials before TPE models the history (Optuna's default is 10).
    """

    n_startup_trials: int = 4


def tpe_sampler(seed: int, *, parallel: bool, n_startup_trials: int) -> optuna.samplers.TPESampler:
    """Optuna's multivariate, grouped TPE. Failures reach it as infeasible through the trial
    constraints the study sets on tell (optuna 5 reads ``trial.constraints``; ``constraints_func`` is
    deprecated). ``parallel``: other workers' running trials count as if they had done badly (Optuna's
    constant liar), so concurrent draws spread out instead of piling on one region."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=seed,
            multivariate=True,
            group=True,
            n_startup_trials=n_startup_trials,
            constant_liar=parallel,
        )


class TPEStrategy(BaseStrategy):
    """Leaves every trial to Optuna's TPE (:func:`tpe_sampler`); never stops early."""

    Settings = TPESettings
    settings: TPESettings

    def propose(self, history: Sequence[TrialResult], pending: Pending) -> Proposal | Exhausted | None:
        """Always None: TPE draws."""
        return None

    def sampler(self, *, parallel: bool = False) -> optuna.samplers.BaseSampler:
        """Optuna's TPE (constant liar when ``parallel``)."""
        return tpe_sampler(self.seed, parallel=parallel, n_startup_trials=self.settings.n_startup_trials)
