"""The candidates the ``auto`` strategy scores: each configuration encoded once, with the estimator's
predictions, stacked in blocks for vectorised scoring, and the prior scales the estimator implies."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from autotune.records import TrialResult
from autotune.space import SearchSpace, canonical_key
from autotune.strategy._base import Collaborators
from autotune.strategy._candidates import sample_configs
from autotune.strategy._surrogate import PHASE_NAMES, ConfigEncoder

__all__ = ["Block", "Candidate", "CandidatePool", "PriorScale", "observed_phases"]


def observed_phases(result: TrialResult) -> np.ndarray | None:
    """Seconds per step of each phase (``PHASE_NAMES`` order) a trial measured, scaled to its steady
    step time; None without a steady estimate or a framework / marker phase split."""
    if result.steady is None or result.timeline_summary is None:
        return None
    phases = result.timeline_summary.phases
    if not phases.measured:
        return None
    values = [phases.time_s.get(p) for p in PHASE_NAMES]
    if any(v is None or not math.isfinite(float(v)) or float(v) < 0 for v in values):
        return None
    total = sum(float(v) for v in values if v is not None)
    if total <= 0:
        return None
    return np.array([float(v) for v in values if v is not None]) * (result.steady.step_time_s / total)


@dataclass(frozen=True)
class Candidate:
    """One configuration, encoded once."""

    params: dict[str, Any]
    key: str
    codes: tuple[int, ...]
    x: np.ndarray
    prior: float  # NaN when the estimator has no prediction
    valid: bool  # passes the framework's static rules
    phases: np.ndarray  # the estimator's seconds per phase (PHASE_NAMES order); NaN when unknown


@dataclass(frozen=True)
class Block:
    """Candidates with their features stacked for vectorised scoring."""

    cands: tuple[Candidate, ...]
    x: np.ndarray
    codes: np.ndarray
    prior: np.ndarray
    phases: np.ndarray

    @classmethod
    def of(cls, cands: Sequence[Candidate], n_slots: int) -> Block:
        n_features = len(cands[0].x) if cands else 1
        return cls(
            cands=tuple(cands),
            x=np.array([c.x for c in cands]).reshape(len(cands), n_features),
            codes=np.array([c.codes for c in cands], dtype=int).reshape(len(cands), n_slots),
            prior=np.array([c.prior for c in cands], dtype=float),
            phases=np.array([c.phases for c in cands], dtype=float).reshape(len(cands), len(PHASE_NAMES)),
        )

    def take(self, idx: np.ndarray) -> Block:
        return Block(
            tuple(self.cands[i] for i in idx), self.x[idx], self.codes[idx], self.prior[idx], self.phases[idx]
        )

    def select(self, mask: Sequence[bool]) -> Block:
        return self.take(np.flatnonzero(np.asarray(mask, dtype=bool)))

    def concat(self, other: Block) -> Block:
        if not other.cands:
            return self
        if not self.cands:
            return other
        return Block(
            self.cands + other.cands,
            np.vstack([self.x, other.x]),
            np.vstack([self.codes, other.codes]),
            np.concatenate([self.prior, other.prior]),
            np.vstack([self.phases, other.phases]),
        )


@dataclass(frozen=True)
class PriorScale:
    """How a knob's prior effect scale follows from the effect the estimator predicts for it: the
    estimator's error scales with what it predicts (``error``), within ``floor`` and ``cap`` (log)."""

    error: float
    floor: float
    cap: float

    def of(self, spread: float) -> float:
        return min(self.cap, max(self.floor, self.error * spread))


class CandidatePool:
    """Every configuration the strategy has looked at, encoded once, and the base pool it scores.

    Args:
        space: the search space.
        collab: the estimator's predictions and the static rules.
        configs: the base pool's configurations (the whole grid of a small space, a sample of a large one).
        scale: the prior scale of a knob's effect, from the estimator's own spread.
    """

    def __init__(
        self,
        space: SearchSpace,
        collab: Collaborators,
        configs: Callable[[], list[dict[str, Any]]],
        scale: PriorScale,
    ) -> None:
        self.space = space
        self.collab = collab
        self._configs = configs
        self.scale = scale
        self._encoder: ConfigEncoder | None = None
        self._prior_sd: np.ndarray | None = None
        self._phase_sd: dict[str, np.ndarray] | None = None
        self._pool: Block | None = None
        self._cands: dict[str, Candidate] = {}
        self._load_cache: dict[str, float] = {}

    @staticmethod
    def sampled(space: SearchSpace, seed: int, n: int) -> list[dict[str, Any]]:
        """The random sample of a large space the pool starts from (a function of the seed)."""
        return sample_configs(space, random.Random(seed * 7919 + 17), n)

    def encoder(self) -> ConfigEncoder:
        if self._encoder is None:
            self._encoder = ConfigEncoder(self.space)
        return self._encoder

    def cand(self, params: Mapping[str, object], key: str | None = None) -> Candidate:
        """The encoded candidate of ``params`` (cached by its canonical key)."""
        key = key or canonical_key(params)
        cand = self._cands.get(key)
        if cand is None:
            enc = self.encoder()
            codes = enc.codes(params)
            prior = self.collab.rank(params) if self.collab.rank is not None else None
            cand = Candidate(
                params=dict(params),
                key=key,
                codes=codes,
                x=enc.encode(params, codes),
                prior=float(prior) if prior is not None and prior > 0 else math.nan,
                valid=bool(self.collab.valid(params)),
                phases=self._phase_vector(params),
            )
            self._cands[key] = cand
        return cand

    def block(self, cands: Sequence[Candidate]) -> Block:
        return Block.of(cands, len(self.encoder().slots))

    def base(self) -> Block:
        """The valid candidates of the base pool."""
        if self._pool is None:
            cands = [self.cand(p) for p in self._configs()]
            self._pool = self.block([c for c in cands if c.valid])
        return self._pool

    def speed_prior_sd(self) -> np.ndarray:
        """Prior scale of each knob's effect on the residual (see :class:`PriorScale`); the encoder's
        defaults when there is no estimator."""
        enc = self.encoder()
        if self._prior_sd is None:
            base = self.base()
            log_prior = np.log(base.prior) if len(base.prior) else np.zeros(0)
            if self.collab.rank is None or not np.isfinite(log_prior).any():
                self._prior_sd = enc.prior_sd
            else:
                spreads = enc.knob_spreads(base.codes, log_prior)
                self._prior_sd = enc.scaled_prior_sd({k: self.scale.of(v) for k, v in spreads.items()})
        return self._prior_sd

    def _phase_vector(self, params: Mapping[str, object]) -> np.ndarray:
        out = np.full(len(PHASE_NAMES), math.nan)
        if self.collab.phase_prior is None:
            return out
        phases = self.collab.phase_prior(params)
        if phases:
            values = [float(phases.get(p, 0.0) or 0.0) for p in PHASE_NAMES]
            if all(math.isfinite(v) and v >= 0 for v in values) and sum(values) > 0:
                out[:] = values
        return out

    def phase_sds(self) -> dict[str, np.ndarray]:
        """Per phase, each knob's prior scale from how much the estimator says it moves that phase."""
        if self._phase_sd is None:
            enc = self.encoder()
            base = self.base()
            known = np.isfinite(base.phases).all(axis=1)
            eps = 0.02 * np.nansum(base.phases, axis=1)
            out: dict[str, np.ndarray] = {}
            for j, name in enumerate(PHASE_NAMES):
                log_phase = np.where(
                    known, np.log(np.where(known, base.phases[:, j], 1.0) + eps + 1e-12), np.nan
                )
                spreads = enc.knob_spreads(base.codes, log_phase)
                out[name] = enc.scaled_prior_sd({k: self.scale.of(v) for k, v in spreads.items()})
            self._phase_sd = out
        return self._phase_sd

    def first_load(self, cands: Sequence[Candidate]) -> np.ndarray:
        """Predicted memory load, as first computed (the shortlist is re-checked fresh)."""
        memory_load = self.collab.memory_load
        if memory_load is None:
            return np.full(len(cands), math.nan)
        out = np.empty(len(cands))
        for i, c in enumerate(cands):
            if c.key not in self._load_cache:
                value = memory_load(c.params)
                self._load_cache[c.key] = math.nan if value is None else float(value)
            out[i] = self._load_cache[c.key]
        return out

    def fresh_load(self, cands: Sequence[Candidate]) -> np.ndarray:
        """Predicted memory load, asked again (the gate's calibration may have changed)."""
        memory_load = self.collab.memory_load
        if memory_load is None:
            return np.full(len(cands), math.nan)
        values = [memory_load(c.params) for c in cands]
        return np.array([math.nan if v is None else float(v) for v in values])
