"""``auto-v4``: ``auto`` that chooses which speed model to trust by what the study has measured.

Everything of ``auto`` is kept — the screening design, the memory probe, the failure model, the OOM
inference, the refinement schedule, the stopping rules — but its speed model is a mixture of
predictors (:mod:`autotune.strategy._predictors`: ``auto``'s phase model, per-phase additive main
effects on the measured phase times, the estimator's prior, a local model around the incumbent),
weighed at every decision by each one's leave-one-out error on this study's runs, not by a fixed
schedule. When the additive model carries most of the weight and predicts the runs well, the search
proposes the combination of the levels it judges best (a ``combine`` run): the configuration its
main effects rank fastest, found by coordinate ascent from the incumbent and from the model's best
candidates, each level judged across all runs, never read off one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune.records import TrialResult
from autotune.space import canonical_key
from autotune.strategy._auto import AutoSettings, AutoStrategy
from autotune.strategy._candidates import neighbours
from autotune.strategy._inference import infer_infeasible
from autotune.strategy._pool import Block, Candidate, observed_phases
from autotune.strategy._predictors import (
    AdditivePhases,
    EstimatorPrior,
    Local,
    Observations,
    PhaseModel,
    Predict,
    Predictor,
    Weighing,
    weigh,
)
from autotune.strategy._proposal import ScoredProposal

__all__ = ["AutoV4Settings", "AutoV4Strategy"]

Score = Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class AutoV4Settings(AutoSettings):
    """``auto``'s settings, and how ``auto-v4`` weighs its predictors.

    Attributes:
        loo_min_runs: runs with a throughput before the predictors are weighed (before: ``auto``'s
            phase model alone).
        weight_power: a predictor's weight is its leave-one-out mean absolute error to twice this
            power, negated (2: an error half as large weighs 16 times as much).
        combine_weight: the additive model's weight from which a ``combine`` run may be proposed, when
            no other predictor weighs more ...
        combine_error: ... and its leave-one-out error (log throughput) is at most this ...
        max_combines: ... at most this many times in a study.
        additive_sd: prior standard deviation of one level's effect on a phase (log scale).
        climb_starts: the model's best candidates the coordinate ascent also starts from.
        optimism: the ascent ranks a configuration by the additive model's mean plus this many standard
            deviations (log throughput): a level measured in few runs is judged by what it may be worth,
            so its effect gets measured where it matters, beside the other knobs' best levels.
    """

    loo_min_runs: int = 4
    weight_power: float = 2.0
    combine_weight: float = 0.35
    combine_error: float = 0.3
    max_combines: int = 5
    additive_sd: float = 0.4
    climb_starts: int = 3
    optimism: float = 1.0


class AutoV4Strategy(AutoStrategy):
    """``auto`` with its speed model chosen by leave-one-out error, and ``combine`` runs (see the
    module's docstring). Settings: :class:`AutoV4Settings`."""

    Settings = AutoV4Settings
    settings: AutoV4Settings

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._weighing_cache: tuple[tuple[Any, ...], Weighing] | None = None

    # -- the speed model -------------------------------------------------------------------------
    def _predictors(self, runs: Sequence[TrialResult]) -> list[Predictor]:
        by_number = {r.number: r for r in runs}
        enc = self.pool.encoder()
        prior_sd = enc.scaled_prior_sd({s.name: self.settings.additive_sd for s in enc.slots})
        return [
            PhaseModel(lambda numbers: super(AutoV4Strategy, self)._speed([by_number[n] for n in numbers])),
            AdditivePhases(prior_sd),
            EstimatorPrior(),
            Local(),
        ]

    def _observations(self, runs: Sequence[TrialResult]) -> Observations:
        measured = [r for r in runs if r.throughput]
        usable = [i for i, r in enumerate(measured) if self.collab.usable(r)]
        incumbent = max(
            usable, key=lambda i: (measured[i].throughput or 0.0, -measured[i].number), default=None
        )
        phases = np.full((len(measured), 4), np.nan)
        for i, r in enumerate(measured):
            obs = observed_phases(r)
            if obs is not None:
                phases[i] = obs
        return Observations(
            tuple(self.pool.cand(r.params) for r in measured),
            np.array([math.log(r.throughput or 1.0) for r in measured]),
            phases,
            tuple(r.number for r in measured),
            incumbent,
        )

    def weighing(self, runs: Sequence[TrialResult]) -> Weighing:
        """The predictors fitted on ``runs`` and weighed by their leave-one-out error (cached per
        history: a decision asks several times)."""
        key = tuple((r.number, r.status.value, r.throughput) for r in runs)
        cached = self._weighing_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        result = weigh(
            self._predictors(runs),
            self._observations(runs),
            fallback=PhaseModel.name,
            min_runs=self.settings.loo_min_runs,
            power=self.settings.weight_power,
        )
        self._weighing_cache = (key, result)
        return result

    def _speed(self, runs: Sequence[TrialResult]) -> Predict:
        return self.weighing(runs).predict

    # -- combine runs ----------------------------------------------------------------------------
    def _exploit(
        self,
        runs: Sequence[TrialResult],
        history: Sequence[TrialResult],
        visited: set[str],
        score: Score,
        best: float | None,
    ) -> tuple[ScoredProposal, str] | None:
        """The combination of the levels the additive model judges best, when that model has earned
        the trust (its weight and its leave-one-out error) and predicts a gain over the best run."""
        s = self.settings
        w = self.weighing(runs)
        additive = w.fitted.get(AdditivePhases.name)
        if (
            additive is None
            or best is None
            or w.weights.get(AdditivePhases.name, 0.0) < max(s.combine_weight, *w.weights.values())
            or not w.loo_error.get(AdditivePhases.name, math.inf) <= s.combine_error
            or sum((r.choice or {}).get("mode") == "combine" for r in runs) >= s.max_combines
        ):
            return None
        incumbent = self._incumbent(history)
        starts = [incumbent.params] if incumbent is not None else []
        base = self.pool.base()
        if base.cands:
            value = self._exploit_value(additive, score)(base)
            starts += [base.cands[i].params for i in np.argsort(-value, kind="stable")[: s.climb_starts]]
        found: dict[str, tuple[float, Candidate]] = {}
        for start in starts:
            cand, val = self._climb(start, additive, score, history, visited)
            if cand is not None:
                found[cand.key] = (val, cand)
        if not found:
            return None
        _, cand = max(found.values(), key=lambda item: item[0])
        block = Block.of([cand], len(self.pool.encoder().slots))
        _, gain_ok, mean_log, p_ok = score(block, self.pool.fresh_load(block.cands))
        mean_add, _ = additive(block)
        if float(self._upper(additive, block)[0]) < best * (1 + s.stop_gain_frac):
            return None
        proposal = ScoredProposal(
            params=dict(cand.params),
            predicted_throughput=float(math.exp(mean_add[0])),
            expected_gain_frac=float(gain_ok[0]),
            failure_risk=float(1.0 - p_ok[0]),
        )
        return proposal, "combine"

    def _exploit_value(self, additive: Predict, score: Score) -> Callable[[Block], np.ndarray]:
        """Expected throughput by the additive model × P(ok), relative."""

        def value(block: Block) -> np.ndarray:
            _, _, _, p_ok = score(block, self.pool.first_load(block.cands))
            mean, sd = additive(block)
            upper = mean + self.settings.optimism * sd
            return np.exp(upper - upper.max()) * p_ok if len(upper) else upper

        return value

    def _climb(
        self,
        start: Mapping[str, object],
        additive: Predict,
        score: Score,
        history: Sequence[TrialResult],
        visited: set[str],
    ) -> tuple[Candidate | None, float]:
        """Coordinate ascent on the additive model × P(ok) from ``start``, through valid configurations
        that pass the pre-check: each step sets the one knob whose best level gains the most. Where it
        ends on a configuration already run, the best untried one-knob change of it."""
        k = len(self.pool.encoder().slots)
        current = self.pool.cand(dict(start))
        cur_block = Block.of([current], k)
        _, _, _, p_ok = score(cur_block, self.pool.fresh_load(cur_block.cands))
        cur_val = float(self._upper(additive, cur_block)[0] * p_ok[0])
        for _ in range(2 * k):
            cands, vals = self._steps(current, additive, score, history)
            if not cands:
                break
            i = int(np.argmax(vals))
            if vals[i] <= cur_val * 1.001:
                break
            current, cur_val = cands[i], float(vals[i])
        if current.key in visited or not (
            self.collab.valid(current.params) and self.collab.feasible(current.params)
        ):
            cands, vals = self._steps(current, additive, score, history)
            fresh = [i for i, c in enumerate(cands) if c.key not in visited]
            if not fresh:
                return None, 0.0
            i = max(fresh, key=lambda j: vals[j])
            return cands[i], float(vals[i])
        return current, cur_val

    def _steps(
        self, current: Candidate, additive: Predict, score: Score, history: Sequence[TrialResult]
    ) -> tuple[list[Candidate], np.ndarray]:
        """The one-knob changes of ``current`` that pass the pre-check, with their additive value."""
        cands = [
            c
            for nb in neighbours(self.space, current.params)
            if (c := self.pool.cand(nb, canonical_key(nb))).valid
            and infer_infeasible(self.space, nb, history) is None
            and self.collab.feasible(nb)
        ]
        if not cands:
            return [], np.zeros(0)
        block = Block.of(cands, len(self.pool.encoder().slots))
        _, _, _, p_ok = score(block, self.pool.fresh_load(block.cands))
        return cands, self._upper(additive, block) * p_ok

    def _upper(self, additive: Predict, block: Block) -> np.ndarray:
        """The additive model's optimistic throughput (mean + ``optimism`` sd, log scale)."""
        mean, sd = additive(block)
        return np.exp(mean + self.settings.optimism * sd)
