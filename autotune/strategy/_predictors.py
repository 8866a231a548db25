"""Speed predictors behind one contract, weighed by how well each predicted this study's own trials.

A search tuned on one family of worlds fails on another: which model of speed deserves trust is a
fact of the study, not of the bench that tuned it. So ``auto-v4`` keeps several predictors of a
configuration's log throughput and weighs them by their leave-one-out error on the trials already run
(:func:`weigh`):

- :class:`PhaseModel` — ``auto``'s own model (the estimator's prior corrected per phase);
- :class:`AdditivePhases` — per phase, main effects of every knob's level fitted on the log of that
  phase's measured seconds across *all* runs that measured their phases (each trial's phases are
  observations in their own right: 12 trials are ~48), the step their sum. No prior: what a level is
  worth is judged across runs, never read off one run;
- :class:`EstimatorPrior` — the estimator's prediction with its overall bias removed;
- :class:`Local` — the incumbent's neighbourhood: measured runs weighed by their distance from the
  configuration (knobs set differently).

Each is a class with ``fit(observations) -> predict | None``; a new predictor is a new class.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from autotune.strategy._pool import Block, Candidate
from autotune.strategy._surrogate import PHASE_NAMES, SpeedModel

__all__ = [
    "AdditivePhases",
    "EstimatorPrior",
    "Local",
    "Observations",
    "PhaseModel",
    "Predict",
    "Predictor",
    "Weighing",
    "weigh",
]

#: a fitted predictor: block → (mean, sd) of each row's log throughput
Predict = Callable[[Block], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class Observations:
    """The runs a predictor learns from: every launched run that measured a throughput.

    Attributes:
        cands: each run's encoded configuration.
        log_tp: each run's log throughput.
        phases: each run's measured seconds per phase (``n × 4``, :data:`PHASE_NAMES` order; a row of
            NaN when the run measured no phase split).
        numbers: each run's trial number (a predictor that needs the runs themselves finds them by it).
        incumbent: the index of the best usable run, or None.
    """

    cands: tuple[Candidate, ...]
    log_tp: np.ndarray
    phases: np.ndarray
    numbers: tuple[int, ...]
    incumbent: int | None

    def __len__(self) -> int:
        return len(self.cands)

    def without(self, i: int) -> Observations:
        """The same runs less run ``i`` (for leave-one-out)."""
        keep = [j for j in range(len(self)) if j != i]
        inc = self.incumbent
        return Observations(
            tuple(self.cands[j] for j in keep),
            self.log_tp[keep],
            self.phases[keep],
            tuple(self.numbers[j] for j in keep),
            None if inc is None or inc == i else (inc - (inc > i)),
        )


class Predictor(abc.ABC):
    """One model of log throughput: fitted on observations, it predicts a block of candidates."""

    #: the name the trial's recorded choice and the weights use
    name: str = ""

    @abc.abstractmethod
    def fit(self, obs: Observations) -> Predict | None:
        """The fitted model, or None when these observations cannot support it."""


class PhaseModel(Predictor):
    """``auto``'s speed model (the estimator's prior corrected per phase by the runs), built by the
    strategy from the runs whose numbers the observations hold.

    Args:
        build: the runs' trial numbers → the fitted model.
    """

    name = "phase-model"

    def __init__(self, build: Callable[[Sequence[int]], Predict]) -> None:
        self.build = build

    def fit(self, obs: Observations) -> Predict | None:
        return self.build(obs.numbers)


class EstimatorPrior(Predictor):
    """The estimator's predicted throughput, shifted by its mean error on the runs (its shape trusted)."""

    name = "estimator"

    def fit(self, obs: Observations) -> Predict | None:
        prior = np.array([c.prior for c in obs.cands])
        known = np.isfinite(prior) & (prior > 0)
        if known.sum() < 2:
            return None
        resid = obs.log_tp[known] - np.log(prior[known])
        bias, spread = float(resid.mean()), float(max(resid.std(), 0.05))
        fallback = float(np.median(np.log(prior[known])))

        def predict(block: Block) -> tuple[np.ndarray, np.ndarray]:
            ok = np.isfinite(block.prior) & (block.prior > 0)
            mean = np.where(ok, np.log(np.where(ok, block.prior, 1.0)), fallback) + bias
            return mean, np.where(ok, spread, 3 * spread)

        return predict


class AdditivePhases(Predictor):
    """Per phase, Bayesian main effects of the knobs' levels on the log of the phase's seconds.

    ``log(t_p + ε) = a_p + Σ_knobs e_p(level)`` for each phase ``p`` (rollout, train, weight sync,
    other) on every run that measured its phases; the step time is the sum of the phases (their
    log-normals matched to one, Fenton–Wilkinson), the throughput ``c ÷ step`` with ``c`` (the batch)
    read off the runs. A knob that does not move a phase gets effects near zero in that phase's model,
    so each phase learns its own knobs.

    Args:
        prior_sd: per-feature prior standard deviations (intercept first).
        noise_sd: one phase measurement's noise around the model, log scale.
        floor_frac: ``ε`` as a share of the median measured step.
        min_runs: runs with phases before the model is fitted.
    """

    name = "additive"

    def __init__(
        self, prior_sd: np.ndarray, *, noise_sd: float = 0.06, floor_frac: float = 0.01, min_runs: int = 3
    ) -> None:
        self.prior_sd = prior_sd
        self.noise_sd = noise_sd
        self.floor_frac = floor_frac
        self.min_runs = min_runs

    def fit(self, obs: Observations) -> Predict | None:
        has = np.isfinite(obs.phases).all(axis=1)
        if has.sum() < self.min_runs:
            return None
        x = np.array([c.x for c, h in zip(obs.cands, has, strict=True) if h])
        seconds = obs.phases[has]
        step = seconds.sum(axis=1)
        eps = self.floor_frac * float(np.median(step))
        scale = float(np.median(obs.log_tp[has] + np.log(step)))  # log(batch): tp × step
        models = []
        for j in range(len(PHASE_NAMES)):
            y = np.log(seconds[:, j] + eps)
            centre = float(y.mean())
            models.append((SpeedModel(self.prior_sd, noise_sd=self.noise_sd).fit(x, y - centre), centre))

        def predict(block: Block) -> tuple[np.ndarray, np.ndarray]:
            median = np.zeros(len(block.x))  # the step of the phases' medians: no inflation by their spread
            total = np.zeros(len(block.x))
            var = np.zeros(len(block.x))
            for model, centre in models:
                mean, sd = model.predict(block.x)
                mu = centre + mean
                median += np.exp(mu) - eps
                total += np.exp(mu + 0.5 * sd**2) - eps
                var += (np.exp(sd**2) - 1.0) * np.exp(2 * mu + sd**2)
            sigma2 = np.log1p(var / np.maximum(total, 1e-9) ** 2)
            return scale - np.log(np.maximum(median, 1e-9)), np.sqrt(np.maximum(sigma2, 1e-12))

        return predict


class Local(Predictor):
    """Around the incumbent: the runs' residuals over the estimator, weighed by ``exp(-d / length)``
    with ``d`` the knobs a run sets differently from the configuration; uncertainty grows with the
    distance to the nearest run. Without an incumbent it has nothing to centre on.

    Args:
        length: the distance (knobs) over which a run's weight falls by e.
        radius: runs farther than this from the incumbent are not used.
        sd_per_knob: uncertainty added per knob from the nearest run.
    """

    name = "local"

    def __init__(self, *, length: float = 1.0, radius: int = 3, sd_per_knob: float = 0.08) -> None:
        self.length = length
        self.radius = radius
        self.sd_per_knob = sd_per_knob

    def fit(self, obs: Observations) -> Predict | None:
        if obs.incumbent is None:
            return None
        codes = np.array([c.codes for c in obs.cands])
        near = (codes != codes[obs.incumbent]).sum(axis=1) <= self.radius
        prior = np.array([c.prior for c in obs.cands])
        ok = np.isfinite(prior) & (prior > 0)
        resid = obs.log_tp - np.log(np.where(ok, prior, 1.0))
        resid = np.where(ok, resid, obs.log_tp - float(np.median(np.log(prior[ok])) if ok.any() else 0.0))
        runs_codes, runs_resid = codes[near], resid[near]

        def predict(block: Block) -> tuple[np.ndarray, np.ndarray]:
            d = (block.codes[:, None, :] != runs_codes[None, :, :]).sum(axis=2)
            w = np.exp(-d / self.length)
            mean_resid = (w * runs_resid).sum(axis=1) / w.sum(axis=1)
            known = np.isfinite(block.prior) & (block.prior > 0)
            base = np.log(np.where(known, block.prior, 1.0))
            return base + mean_resid, 0.03 + self.sd_per_knob * d.min(axis=1)

        return predict


@dataclass(frozen=True)
class Weighing:
    """The predictors' weights and leave-one-out errors on this study's runs.

    Attributes:
        weights: name → weight (summing to 1 over the predictors that fitted).
        loo_error: name → mean absolute leave-one-out error of log throughput (NaN: too few runs).
        predict: the weighted mixture (mean: weighted mean; variance: within plus between).
        fitted: name → each fitted predictor.
    """

    weights: Mapping[str, float]
    loo_error: Mapping[str, float]
    predict: Predict
    fitted: Mapping[str, Predict]


def _loo_error(predictor: Predictor, obs: Observations) -> float:
    """Mean absolute error of predicting each run's log throughput from the others (NaN when too few
    folds fit). Absolute, not squared: one run whose level no other run measured (a fold no model
    can predict) should not decide which model is trusted."""
    errors = []
    for i in range(len(obs)):
        fitted = predictor.fit(obs.without(i))
        if fitted is None:
            continue
        mean, _ = fitted(Block.of([obs.cands[i]], len(obs.cands[i].codes)))
        errors.append(float(mean[0]) - float(obs.log_tp[i]))
    if len(errors) < max(3, len(obs) // 2):
        return math.nan
    return float(np.mean(np.abs(errors)))


def weigh(
    predictors: Sequence[Predictor],
    obs: Observations,
    *,
    fallback: str,
    min_runs: int = 4,
    power: float = 2.0,
) -> Weighing:
    """Fit every predictor and weigh it by its leave-one-out error to the power ``-2 × power``; with fewer than
    ``min_runs`` runs (or no error known) the ``fallback`` predictor alone."""
    fitted = {p.name: f for p in predictors if (f := p.fit(obs)) is not None}
    error = {
        p.name: _loo_error(p, obs) if len(obs) >= min_runs and p.name in fitted else math.nan
        for p in predictors
    }
    scored = {name: error[name] for name in fitted if math.isfinite(error[name])}
    if not scored or fallback not in fitted:
        name = fallback if fallback in fitted else next(iter(fitted))
        weights = {name: 1.0}
    else:
        raw = {name: max(e, 1e-3) ** (-2 * power) for name, e in scored.items()}
        total = sum(raw.values())
        weights = {name: w / total for name, w in raw.items()}

    def predict(block: Block) -> tuple[np.ndarray, np.ndarray]:
        parts = [(w, *fitted[name](block)) for name, w in weights.items()]
        mean = sum(w * m for w, m, _ in parts)
        var = sum(w * (s**2 + (m - mean) ** 2) for w, m, s in parts)
        return np.asarray(mean), np.sqrt(np.maximum(np.asarray(var), 1e-12))

    return Weighing(weights, error, predict, fitted)
