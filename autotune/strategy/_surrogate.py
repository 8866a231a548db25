"""The model behind ``--search auto``: predicted speed with its uncertainty, and the risk of failing.

Speed. ``log(throughput) = log(prior) + r(config)``, where ``prior`` is the estimator's predicted
throughput (a flat prior when there is none) and the residual ``r`` is Bayesian linear regression on
a one-hot encoding of every knob (an extra "absent" slot per conditional knob, so conditional spaces
need no imputation) plus an ordinal term for ordered numeric knobs. That is a Gaussian process with a
linear kernel on those features: closed form, exact for a dozen observations, and it needs no
start-up trials because the estimator already orders the space. The intercept learns the estimator's
overall bias from the first trial; the per-value terms learn where its shape is wrong.

Failure. Two parts combined as independent risks: the memory risk from the (calibrated) estimate of
peak memory over capacity, ``Φ(log(load / limit) / σ)``, and a sparse "culprit" model of the other
failures (hangs, vLLM start-up, unhealthy runs, crashes): each is caused by one knob value or a pair
of values that no successful trial shares (see :class:`FailureModel`). Sound lessons (OOM
monotonicity) are not modelled here: they are hard exclusions (see :mod:`autotune.strategy._inference`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune.space import SearchSpace

__all__ = [
    "ABSENT",
    "OFF_GRID",
    "ConfigEncoder",
    "SpeedModel",
    "FailureModel",
    "PHASE_NAMES",
    "PhaseSpeedModel",
    "expected_gain",
    "normal_cdf",
    "value_key",
]

ABSENT = -1
OFF_GRID = -2


def value_key(value: object) -> tuple[str, Any]:
    """A hashable key under which equal knob values meet (1 and 1.0 alike, True apart from 1)."""
    if isinstance(value, bool):
        return ("b", value)
    if isinstance(value, (int, float)):
        return ("n", round(float(value), 9))
    if value is None or isinstance(value, str):
        return ("o", value)
    return ("r", repr(value))


def normal_cdf(x: np.ndarray) -> np.ndarray:
    """Φ(x), vectorised (Abramowitz–Stegun 7.1.26 on erf, |error| < 1.5e-7)."""
    z = np.abs(x) / math.sqrt(2.0)
    t = 1.0 / (1.0 + 0.3275911 * z)
    poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))))
    erf = 1.0 - poly * np.exp(-z * z)
    return 0.5 * (1.0 + np.sign(x) * erf)


@dataclass(frozen=True)
class _Slot:
    name: str
    offset: int
    n_values: int
    index: Mapping[tuple[str, Any], int]  # value_key → position
    ordinal_col: int | None
    ordinal_of: tuple[float, ...]  # position → ordinal in [0, 1]
    low: float
    span: float
    log_scale: bool


class ConfigEncoder:
    """Turns configurations into feature vectors (and integer codes for distances).

    Args:
        space: the search space.
        onehot_sd: prior standard deviation (log scale) of one knob value's effect.
        ordinal_sd: prior standard deviation of the end-to-end trend of an ordered numeric knob.
        intercept_sd: prior standard deviation of the overall bias of the prior.
    """

    def __init__(
        self,
        space: SearchSpace,
        *,
        onehot_sd: float = 0.15,
        ordinal_sd: float = 0.3,
        intercept_sd: float = 1.0,
    ) -> None:
        slots: list[_Slot] = []
        sds: list[float] = [intercept_sd]
        col = 1
        for knob in space.knobs:
            values = knob.values()
            n = len(values)
            index = {value_key(v): i for i, v in enumerate(values)}
            numeric = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
            ordinal_col: int | None = None
            ordinal_of: tuple[float, ...] = ()
            low, span, log_scale = 0.0, 0.0, False
            if n > 2 and len(numeric) == n:
                lo, hi = min(numeric), max(numeric)
                log_scale = lo > 0 and hi / lo >= 4
                low = math.log(lo) if log_scale else float(lo)
                span = (math.log(hi) if log_scale else float(hi)) - low
                if span > 0:
                    ordinal_of = tuple(self._ordinal(float(v), low, span, log_scale) for v in values)
                    ordinal_col = col + n + 1
            slots.append(_Slot(knob.name, col, n, index, ordinal_col, ordinal_of, low, span, log_scale))
            sds.extend([onehot_sd] * (n + 1))  # values, then "absent"
            col += n + 1
            if ordinal_col is not None:
                sds.append(ordinal_sd)
                col += 1
        self.slots = tuple(slots)
        self.n_features = col
        self.prior_sd = np.asarray(sds, dtype=float)

    def scaled_prior_sd(self, scales: Mapping[str, float], *, ordinal_factor: float = 1.5) -> np.ndarray:
        """Prior standard deviations with each knob's effects scaled to ``scales[name]`` (others as built).

        One value's effect gets the knob's scale; the ordinal trend ``ordinal_factor`` times it.
        """
        sd = self.prior_sd.copy()
        for slot in self.slots:
            scale = scales.get(slot.name)
            if scale is None:
                continue
            sd[slot.offset : slot.offset + slot.n_values + 1] = scale
            if slot.ordinal_col is not None:
                sd[slot.ordinal_col] = ordinal_factor * scale
        return sd

    def knob_spreads(
        self, codes: np.ndarray, log_prior: np.ndarray, *, min_count: int = 3
    ) -> dict[str, float]:
        """How much each knob moves a prediction: the range of the mean of ``log_prior`` over its values.

        ``codes`` and ``log_prior`` describe a random sample of configurations (NaN priors ignored).
        """
        known = np.isfinite(log_prior)
        out: dict[str, float] = {}
        for j, slot in enumerate(self.slots):
            column, values = codes[known, j], log_prior[known]
            means = [
                float(values[column == c].mean())
                for c in np.unique(column)
                if int((column == c).sum()) >= min_count
            ]
            out[slot.name] = max(means) - min(means) if len(means) >= 2 else 0.0
        return out

    @staticmethod
    def _ordinal(value: float, low: float, span: float, log_scale: bool) -> float:
        x = math.log(value) if log_scale and value > 0 else value
        return min(1.0, max(0.0, (x - low) / span))

    def codes(self, params: Mapping[str, object]) -> tuple[int, ...]:
        """Position of each knob's value (``ABSENT`` when inactive, ``OFF_GRID`` when not a grid value)."""
        out = []
        for slot in self.slots:
            if slot.name not in params:
                out.append(ABSENT)
            else:
                out.append(slot.index.get(value_key(params[slot.name]), OFF_GRID))
        return tuple(out)

    def encode(self, params: Mapping[str, object], codes: Sequence[int] | None = None) -> np.ndarray:
        """The feature vector of one configuration (first column: the intercept)."""
        x = np.zeros(self.n_features)
        x[0] = 1.0
        for slot, code in zip(self.slots, codes if codes is not None else self.codes(params), strict=True):
            if code == ABSENT:
                x[slot.offset + slot.n_values] = 1.0
                continue
            if code >= 0:
                x[slot.offset + code] = 1.0
            if slot.ordinal_col is not None:
                if code >= 0:
                    x[slot.ordinal_col] = slot.ordinal_of[code]
                else:
                    value = params[slot.name]
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        x[slot.ordinal_col] = self._ordinal(float(value), slot.low, slot.span, slot.log_scale)
        return x

    def encode_many(self, configs: Sequence[Mapping[str, Any]]) -> np.ndarray:
        if not configs:
            return np.zeros((0, self.n_features))
        return np.vstack([self.encode(p) for p in configs])


class SpeedModel:
    """Bayesian linear regression of the log residual of throughput against its prior.

    Args:
        prior_sd: per-feature prior standard deviations (:attr:`ConfigEncoder.prior_sd`).
        noise_sd: standard deviation of one measurement around the model, log scale (run-to-run noise
            plus interactions the linear model cannot express).
    """

    def __init__(self, prior_sd: np.ndarray, *, noise_sd: float = 0.06) -> None:
        self.prior_sd = prior_sd
        self.noise_sd = noise_sd
        self.mean = np.zeros(len(prior_sd))
        self.cov = np.diag(prior_sd**2)

    def fit(self, x: np.ndarray, y: np.ndarray) -> SpeedModel:
        """Condition on observations (rows of ``x``, residuals ``y``); returns self."""
        precision = np.diag(1.0 / self.prior_sd**2)
        if len(y):
            precision = precision + x.T @ x / self.noise_sd**2
        self.cov = np.linalg.inv(precision)
        self.mean = self.cov @ (x.T @ y / self.noise_sd**2) if len(y) else np.zeros(len(self.prior_sd))
        return self

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mean, standard deviation) of the residual of each row (the model's own uncertainty)."""
        mean = x @ self.mean
        var = ((x @ self.cov) * x).sum(axis=1)
        return mean, np.sqrt(np.maximum(var, 1e-12))


PHASE_NAMES: tuple[str, ...] = ("rollout", "train", "weight_sync", "other")


class PhaseSpeedModel:
    """Step time as the sum of its phases, each phase's log residual modelled on its own knobs.

    ``t_p(config) = (prior_p(config) + ε_p) × exp(r_p(config)) − ε_p`` for each phase ``p`` (rollout,
    train, weight sync, other), where ``prior_p`` is the estimator's time for that phase and ``r_p`` a
    Bayesian linear regression like :class:`SpeedModel`'s, with each knob's prior scale set by how much
    the estimator says the knob moves *that phase* (so a rollout measurement teaches little about the
    training knobs and the other way round). ``ε_p`` (a small share of the prior step) keeps phases the
    estimator calls zero learnable. The step's distribution is the sum of the phases' log-normals,
    matched to one log-normal (Fenton–Wilkinson), so the expected-improvement machinery is unchanged.

    Args:
        prior_sd: per phase, the per-feature prior standard deviations.
        noise_sd: one measurement's noise around the model, log scale, per phase.
        floor_frac: ``ε_p`` as a share of the prior step time.
    """

    def __init__(
        self, prior_sd: Mapping[str, np.ndarray], *, noise_sd: float = 0.08, floor_frac: float = 0.02
    ) -> None:
        self.models = {p: SpeedModel(prior_sd[p], noise_sd=noise_sd) for p in PHASE_NAMES}
        self.floor_frac = floor_frac

    def _eps(self, prior: np.ndarray) -> np.ndarray:
        return self.floor_frac * np.maximum(prior.sum(axis=1, keepdims=True), 1e-9)

    def fit(self, x: np.ndarray, prior: np.ndarray, observed: np.ndarray) -> PhaseSpeedModel:
        """Condition on rows of features ``x``, the estimator's phase seconds ``prior`` and the
        measured ones ``observed`` (both ``n × 4`` in :data:`PHASE_NAMES` order); returns self."""
        eps = self._eps(prior) if len(prior) else np.zeros((0, 1))
        for j, name in enumerate(PHASE_NAMES):
            y = np.log(np.maximum(observed[:, j], 0.0) + eps[:, 0]) - np.log(prior[:, j] + eps[:, 0])
            self.models[name].fit(x, y)
        return self

    def predict(self, x: np.ndarray, prior: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mean, sd) of ``log(step time ÷ prior step time)`` for each row."""
        eps = self._eps(prior)[:, 0]
        total_mean = np.zeros(len(x))
        total_var = np.zeros(len(x))
        for j, name in enumerate(PHASE_NAMES):
            mean, sd = self.models[name].predict(x)
            base = prior[:, j] + eps
            mu = np.log(base) + mean
            expect = np.exp(mu + 0.5 * sd**2)
            total_mean += expect - eps
            total_var += (np.exp(sd**2) - 1.0) * np.exp(2 * mu + sd**2)
        total_mean = np.maximum(total_mean, 1e-12)
        sigma2 = np.log1p(total_var / total_mean**2)
        mu_step = np.log(total_mean) - 0.5 * sigma2
        return mu_step - np.log(np.maximum(prior.sum(axis=1), 1e-12)), np.sqrt(np.maximum(sigma2, 1e-12))


class FailureModel:
    """Probability that a configuration fails, from the failures and successes seen so far.

    Failures that are not about memory (hangs, vLLM start-up, unhealthy runs, crashes) are in
    practice caused by one knob value (``vllm_tensor_parallel_size: 8``) or a pair of values (TP over
    every GPU *with* sleep mode; batch 1 *under* ZeRO-3), or they are flaky. So every failed trial is
    explained by a *culprit*: a single value or a pair of values of that trial that no successful trial
    contains (a success refutes every culprit it contains), or by chance (``flaky``). A culprit's
    weight grows with the failures it explains and shrinks with the share of the space it covers;
    ``single_share`` of the non-flaky mass goes to single values. A candidate
    fails through a failed trial with the probability mass of that trial's culprits it contains;
    failed trials combine as independent causes (noisy-OR), on top of ``base_rate``.

    This is sparse by construction — a configuration unlike every failure keeps the base rate, a
    configuration that shares the only unrefuted value of several failures is nearly certain to fail —
    where a Gaussian prior over per-value effects would have to choose between a high base rate and
    slow learning.

    Args:
        base_rate: failure rate of a configuration no failure points at.
        flaky: probability that a failure had no cause in the configuration.
        single_share: share of the remaining mass on single values (the rest on pairs).
        shared_cause: how much likelier a culprit is per additional failure it explains.
        off_phase: prior weight of a culprit that involves no knob of the failure's phase, relative to
            one that does (see :mod:`autotune.strategy._blame`): small, not zero, since evidence can
            mislead; when every explanation inside the phase is refuted, those outside keep the mass.
        memory_sd: log-scale uncertainty of the calibrated memory estimate (:meth:`memory_risk`).
    """

    def __init__(
        self,
        *,
        base_rate: float = 0.03,
        flaky: float = 0.1,
        single_share: float = 0.6,
        shared_cause: float = 4.0,
        off_phase: float = 0.05,
        memory_sd: float = 0.08,
    ) -> None:
        self.base_rate = base_rate
        self.shared_cause = shared_cause
        self.off_phase = off_phase
        self.flaky = flaky
        self.single_share = single_share
        self.memory_sd = memory_sd
        self._causes: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (values, single w, pair W)

    def fit(
        self,
        codes: np.ndarray,
        failed: np.ndarray,
        *,
        space_codes: np.ndarray | None = None,
        blame: Sequence[np.ndarray | None] | None = None,
        kinds: Sequence[str] | None = None,
    ) -> FailureModel:
        """Condition on observed configurations (rows of integer ``codes``) and whether each failed.

        Args:
            codes: observed configurations, one row each (:meth:`ConfigEncoder.codes`).
            failed: whether each failed.
            blame: per row, the knobs (a boolean mask over the columns) its failure's evidence points
                at, or None when the evidence does not narrow them.
            kinds: per row, what kind of failure it is (status and phase): a culprit is likelier for
                sharing it with more failures of the *same* kind only (a hang in the weight sync and
                a run that does not learn have different causes).
            space_codes: a random sample of the space; when given, a culprit's prior weight is the
                inverse of the share of the space it covers (a bug that broke half of all
                configurations would have been noticed: narrow causes are likelier).
        """
        self._causes = []
        ok, bad = codes[~failed], codes[failed]
        n_knobs = codes.shape[1] if codes.ndim == 2 else 0
        upper = np.triu(np.ones((n_knobs, n_knobs), dtype=bool), 1)
        masks = [m for m, is_bad in zip(blame, failed, strict=True) if is_bad] if blame is not None else []
        bad_kinds = np.array(
            [k for k, is_bad in zip(kinds, failed, strict=True) if is_bad]
            if kinds is not None
            else [""] * len(bad)
        )
        for i, f in enumerate(bad):
            shared = ok == f  # successes × knobs: where each success has this failure's value
            single = ~shared.any(axis=0)  # values no success has
            together = np.einsum("sk,sl->kl", shared.astype(np.int32), shared.astype(np.int32)) > 0
            pair = (
                upper & ~together & ~single[:, None] & ~single[None, :]
            )  # pairs no success has, not already single
            if not single.any() and not pair.any():
                continue  # every explanation refuted: a flaky failure teaches nothing
            w_single, w_pair = single.astype(float), pair.astype(float)
            mask = masks[i] if i < len(masks) else None
            if mask is not None:  # the evidence names the phase: culprits outside it are unlikely
                w_single *= np.where(mask, 1.0, self.off_phase)
                w_pair *= np.where(mask[:, None] | mask[None, :], 1.0, self.off_phase)
            # a value (pair) that every one of n failures shares explains them all at once; by chance
            # that is ~``shared_cause``^(n-1) times less likely
            in_failures = (bad[bad_kinds == bad_kinds[i]] == f).astype(float)
            w_single *= self.shared_cause ** (in_failures.sum(axis=0) - 1.0)
            w_pair *= self.shared_cause ** (in_failures.T @ in_failures - 1.0)
            if space_codes is not None and len(space_codes):
                match = (space_codes == f).astype(float)
                share_single = np.maximum(match.mean(axis=0), 1.0 / len(space_codes))
                share_pair = np.maximum(match.T @ match / len(space_codes), 1.0 / len(space_codes))
                w_single = w_single / share_single
                w_pair = w_pair / share_pair
            share = self.single_share if single.any() and pair.any() else (1.0 if single.any() else 0.0)
            w_single = (1.0 - self.flaky) * share * w_single / max(w_single.sum(), 1e-12)
            w_pair = (1.0 - self.flaky) * (1.0 - share) * w_pair / max(w_pair.sum(), 1e-12)
            self._causes.append((f, w_single, w_pair))
        return self

    @property
    def causes(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per explained failure: its codes, the blame on each single value, the blame on each pair."""
        return list(self._causes)

    def predict(self, codes: np.ndarray) -> np.ndarray:
        """P(failure) of each row of ``codes``."""
        survive = np.full(len(codes), 1.0 - self.base_rate)
        for f, w_single, w_pair in self._causes:
            match = (codes == f).astype(float)
            p = match @ w_single + ((match @ w_pair) * match).sum(axis=1)
            survive *= 1.0 - np.clip(p, 0.0, 1.0)
        return 1.0 - survive

    def memory_risk(self, load: np.ndarray, limit: float = 1.0) -> np.ndarray:
        """P(true peak ÷ capacity > ``limit``) given the estimated ``load`` (NaN: unknown → 0)."""
        out = np.zeros(len(load))
        known = np.isfinite(load) & (load > 0)
        out[known] = normal_cdf(np.log(load[known] / limit) / self.memory_sd)
        return out


def expected_gain(mean_log: np.ndarray, sd_log: np.ndarray, best: float) -> np.ndarray:
    """Expected improvement over ``best`` as a fraction of it, for lognormal throughputs.

    ``E[max(0, T − best)] / best`` with ``log T ~ N(mean_log, sd_log²)``.
    """
    if best <= 0:
        return np.exp(mean_log + 0.5 * sd_log**2)
    s = np.maximum(sd_log, 1e-9)
    d1 = (mean_log + s**2 - math.log(best)) / s
    d2 = d1 - s
    gain = np.exp(mean_log + 0.5 * s**2 - math.log(best)) * normal_cdf(d1) - normal_cdf(d2)
    return np.maximum(gain, 0.0)
