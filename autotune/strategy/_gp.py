"""``gp``: Optuna's GPSampler with constraints and no estimator (a peer on the search-efficiency bench).

GPSampler models the history with a Gaussian process and needs scipy (the ``bench`` extra). It has no
conditional search spaces: on a space with conditional knobs it samples those independently. It models
only COMPLETE trials: a trial the study stops early as clearly slower (PRUNED) or that fails teaches it
nothing, and until ``n_startup_trials`` trials complete it draws with its start-up sampler, Optuna's
random sampler with the same seed as ``random``'s (so the same draws).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import optuna

from autotune.records import TrialResult
from autotune.strategy._base import BaseStrategy, Exhausted, Pending, Proposal, StrategySettings

__all__ = ["GPSettings", "GPStrategy"]


@dataclass(frozen=True)
class GPSettings(StrategySettings):
    """Settings of Optuna's GPSampler.

    Attributes:
        n_startup_trials: random trials before the process models the history (Optuna's default is 10).
    """

    n_startup_trials: int = 4


class GPStrategy(BaseStrategy):
    """Leaves every trial to Optuna's GPSampler; never stops early. (The trial constraints the study
    sets on tell never reach it: GPSampler reads them only from COMPLETE trials, which are all
    feasible.)"""

    Settings = GPSettings
    settings: GPSettings

    def propose(self, history: Sequence[TrialResult], pending: Pending) -> Proposal | Exhausted | None:
        """Always None: the GP draws."""
        return None

    def sampler(self, *, parallel: bool = False) -> optuna.samplers.BaseSampler:
        """Optuna's GPSampler (constraints read from the trials, as TPE reads them)."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.GPSampler(
                seed=self.seed,
                n_startup_trials=self.settings.n_startup_trials,
                warn_independent_sampling=False,
            )
