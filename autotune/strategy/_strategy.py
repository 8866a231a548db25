"""The search strategy on top of Optuna: which configuration to run next, and when to stop.

``auto`` (the default):

1. The study runs the baseline first (framework defaults or the user's own configuration).
2. Every next configuration maximises ``expected improvement × P(ok)`` (constrained expected
   improvement) over the untried configurations that pass the cheap pre-screen (validity rules, OOM
   inference, the memory estimate). P(ok) has two factors, the memory risk and the risk of failing
   otherwise (below). Optionally (``budget_aversion`` > 0; off by default, see that argument for
   the trade-off measured) the second factor is raised to a power that grows with the share of GPU
   time the study has already spent on failed trials, so a study that keeps hitting hangs or
   unhealthy runs turns to configurations unlike its failures. ``risk_aversion`` is the power of the
   memory factor (kept at 1: see its argument).
   - Speed: :class:`~autotune.strategy._surrogate.SpeedModel`, the estimator's predicted throughput
     corrected by what the trials measured (Bayesian linear regression of the log residual on
     one-hot knob features, a GP with a linear kernel; conditional knobs get an "absent" slot), with
     each knob's prior scale set by how much the estimator itself says the knob matters. The first
     proposals are therefore the estimator's predicted-fastest feasible candidates; later ones
     follow the measurements. With no estimator, the same model learns from a flat prior.
   - P(ok): the memory risk of the calibrated estimate (log-normal around predicted peak ÷ capacity,
     against the recommendation's headroom) times the chance of not failing otherwise, from the
     sparse "culprit" model of :class:`~autotune.strategy._surrogate.FailureModel`. Failed trials
     (OOM, vLLM start-up, hangs, unhealthy runs) count as *infeasible*, never as slow; sound lessons
     are hard exclusions (:mod:`autotune.strategy._inference`). The study also records failures as
     infeasible through Optuna's trial constraints, so Optuna's TPE — used only when the strategy has
     no proposal left — sees the same.
3. Stopping (see :meth:`SearchStrategy.converged`), after ``min_trials`` launched trials and once a
   trial is usable: expected improvement — the most promising untried configuration's expected gain
   over the best so far × its P(ok) is below ``stop_gain_frac`` — or no gain in the last
   ``patience`` trials that ran (failures do not count as "no gain").

Large spaces are not enumerated: the candidates are a random sample of the space plus, at every
decision, the one-knob neighbours of the most promising candidates and of the best trials. Everything
a decision uses is a function of the seed, the trial history and the memory gate's calibration, so a
resumed study continues the same search.

``random`` (Optuna's random sampler) and ``grid`` (every configuration in a stable order) exist for
comparison; ``tpe`` (Optuna's TPE with constraints, no estimator) is used by the search-efficiency
bench only.
"""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import optuna

from autotune.errors import UsageError
from autotune.records import TrialResult, TrialStatus
from autotune.space import SearchSpace, canonical_key
from autotune.strategy._blame import blamed_knobs
from autotune.strategy._candidates import count_configs, neighbours, random_config, sample_configs
from autotune.strategy._inference import infer_infeasible, is_memory_failure
from autotune.strategy._screening import Screening, ScreeningSettings, ScreenPlan
from autotune.strategy._surrogate import (
    PHASE_NAMES,
    ConfigEncoder,
    FailureModel,
    PhaseSpeedModel,
    SpeedModel,
    expected_gain,
)

__all__ = [
    "SEARCH_KINDS",
    "COMPARISON_KINDS",
    "Proposal",
    "SearchStrategy",
    "launched",
    "move_from",
    "observed_phases",
    "usable_complete",
]

SEARCH_KINDS = ("auto", "random", "grid")
COMPARISON_KINDS = ("tpe",)  # bench only
_GRID_ENUM_LIMIT = 200_000


def launched(history: Sequence[TrialResult]) -> list[TrialResult]:
    """Trials that really ran (not pruned before launch, not interrupted), by trial number."""
    out = [
        r
        for r in history
        if (r.status is not TrialStatus.PRUNED or r.steps > 0)
        and r.status not in (TrialStatus.INTERRUPTED, TrialStatus.RUNNING)
    ]
    return sorted(out, key=lambda r: r.number)


def observed_phases(result: TrialResult) -> np.ndarray | None:
    """Seconds per step of each phase (``PHASE_NAMES`` order) a trial measured, scaled to its steady
    step time; None without a steady estimate or a framework / marker phase split."""
    if result.steady is None or not result.timeline_summary:
        return None
    phases = result.timeline_summary.get("phases") or {}
    if phases.get("source") not in ("framework", "markers"):
        return None
    seconds = phases.get("seconds") or {}
    values = [seconds.get(p) for p in PHASE_NAMES]
    if any(v is None or not math.isfinite(float(v)) or float(v) < 0 for v in values):
        return None
    total = sum(float(v) for v in values if v is not None)
    if total <= 0:
        return None
    return np.array([float(v) for v in values if v is not None]) * (result.steady.step_time_s / total)


def usable_complete(result: TrialResult) -> bool:
    """The default test of a result that may be recommended: complete, with a throughput."""
    return result.status is TrialStatus.COMPLETE and bool(result.throughput)


@dataclass(frozen=True)
class Proposal:
    """The configuration ``auto`` would run next, and why.

    Attributes:
        params: the configuration.
        predicted_throughput: the model's median throughput for it (completions/s), when known.
        expected_gain_frac: expected improvement over the best usable trial × probability of success,
            as a fraction of the best; None while no trial is usable.
        failure_risk: the model's probability that it fails or cannot be recommended.
    """

    params: dict[str, Any]
    predicted_throughput: float | None
    expected_gain_frac: float | None
    failure_risk: float
    mode: str = "explore"
    incumbent: int | None = None
    move: dict[str, tuple[Any, Any]] = field(default_factory=dict)
    suspect: str | None = None
    covers: dict[str, Any] = field(default_factory=dict)

    def choice(self) -> dict[str, Any]:
        """Why this configuration was chosen, as stored with its trial (``TrialResult.choice``)."""
        return {
            "mode": self.mode,
            "predicted_throughput": self.predicted_throughput,
            "expected_gain_frac": self.expected_gain_frac,
            "failure_risk": round(self.failure_risk, 4),
            "incumbent": self.incumbent,
            "move": {k: [a, b] for k, (a, b) in self.move.items()},
            **({"suspect": self.suspect} if self.suspect else {}),
            **({"covers": self.covers} if self.covers else {}),
        }


def move_from(incumbent: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """The knobs ``params`` sets differently from ``incumbent``: name → (incumbent's value, new value)."""
    out: dict[str, tuple[Any, Any]] = {}
    for name in dict.fromkeys([*incumbent, *params]):
        a, b = incumbent.get(name), params.get(name)
        if canonical_key({"v": a}) != canonical_key({"v": b}):
            out[name] = (a, b)
    return out


@dataclass
class _Analysis:
    proposal: Proposal | None
    best: float | None


class SearchStrategy:
    """Decides what to try next. Collaborators are passed in; the strategy never runs anything.

    Args:
        space: the search space (already restricted to this machine).
        kind: "auto", "random", "grid" (or "tpe" in the bench).
        seed: seed of every random choice.
        rank: the estimator's predicted throughput of a configuration, or None when unknown.
        phase_prior: the estimator's seconds per step of each phase (``rollout``, ``train``,
            ``weight_sync``, ``other``) for a configuration, or None; with it, and once
            ``min_phase_trials`` trials measured their phases (the timeline's framework or marker
            split), the speed model is the per-phase one (:class:`~autotune.strategy._surrogate.PhaseSpeedModel`).
        valid: the framework's static validity rules (checked once per candidate).
        feasible: the cheap pre-check a candidate must pass before it is proposed (validity rules,
            OOM inference, memory gate — it may change as the study learns).
        memory_load: predicted peak ÷ capacity (calibrated; above 1 when vLLM's checks fail), or None.
        usable: whether a result may be recommended (complete, enough headroom).
        stop_gain_frac: stop once the next trial is expected to gain less than this fraction.
        min_trials: launched trials (baseline included) before ``auto`` may stop.
        patience: ``auto`` also stops when the last this-many trials that ran (failures excluded) did
            not beat the best before them by more than ``stop_gain_frac``.
        risk_aversion: exponent of the memory factor of P(ok) when choosing: 1 is constrained
            expected improvement (EI × P(feasible)); higher spends less GPU time on failures and
            explores less (tuning on the search-efficiency bench, seeds 0-9, with the power then on
            both factors: 2 cut the median failed share from 22 % to 15 % but the studies within 3 %
            of the optimum in 12 trials fell from 16 to 7 of 40). The memory risk is ``P(peak > headroom_limit)``: most of the risky
            configurations near the optimum complete, so a higher power mostly keeps the search off
            the optimum. Memory failures are rare anyway (the gate and the OOM inference see them).
        failure_budget_frac: the share of GPU time meant for failed trials at most (with
            ``budget_aversion`` only).
        budget_aversion: the exponent of the other factor of P(ok) (hangs, vLLM start-up, unhealthy
            runs) is ``1 + budget_aversion × min(3, failed share ÷ failure_budget_frac)``, with the
            failed share of the GPU time of the launched trials so far; 0 (the default) is plain
            constrained expected improvement. Measured on the search-efficiency bench (40 studies
            each): 1 cut the median failed share from 14.9 % to 9.6 % (seeds 0-9) and from 15.3 % to
            10.4 % (seeds 10-19), but the studies within 3 % of the optimum in 12 trials fell from 14
            to 11 and from 17 to 9 (median trials to 3 %: 22 → 25, 14 → 25.5); capping the power
            at 2 (seeds 10-19) still gave 11.8 % and 10 studies. The failure regions sit next to the
            optimum (the same knob values, another partner), so avoiding what failed also avoids
            what is fastest: off until the failure model tells a culprit pair from its neighbours.
        headroom_limit: peak ÷ capacity above which a configuration is not worth running (the
            recommendation wants headroom).
        effect_error: prior scale of a knob's effect on the estimator's error, relative to the effect
            the estimator itself predicts for that knob (a model is wrong in proportion to what it
            predicts) ...
        effect_floor: ... but at least this (effects the estimator does not model at all) ...
        effect_cap: ... and at most this (log scale).
        warmup_trials: launched trials (baseline included) before the schedule may refine.
        refine_share: the share of the trials after the warm-up spent refining the incumbent, at the
            start and at the end of the budget (linear in the share of the budget used): early trials
            mostly explore while the model is uncertain, the last ones mostly try one- and two-knob
            changes of the best healthy trial, where gains are likeliest.
        refine_radius: knobs a refinement move may change at once.
        suspect_weight: a knob value whose share of some failure's blame is at least this is a suspect;
            a one-knob move of the incumbent onto a suspect value is a *probe*, chosen over the
            schedule's move when its expected gain plus what its success would unlock (the best
            candidate's expected gain once the suspect is cleared, times the chance it succeeds) is
            larger: a one-step look-ahead on the culprit model, so one failure next to the optimum does
            not keep the search away from it for good.
        max_probes: probes evaluated per decision (each costs a refit of the culprit model).
        full_grid_limit: spaces up to this size are considered in full; larger ones are sampled.
        pool_size: random configurations considered in a large space.
        shortlist_size: candidates whose memory load is re-checked fresh per round of choosing.
        screening: how ``auto`` screens the high-impact knobs before it trusts the prior about them
            (:mod:`autotune.strategy._screening`); None: no screening (the v2 search).
    """

    def __init__(
        self,
        space: SearchSpace,
        kind: str = "auto",
        *,
        seed: int = 0,
        rank: Callable[[Mapping[str, Any]], float | None] | None = None,
        phase_prior: Callable[[Mapping[str, Any]], Mapping[str, float] | None] | None = None,
        min_phase_trials: int = 2,
        valid: Callable[[Mapping[str, Any]], bool] | None = None,
        feasible: Callable[[Mapping[str, Any]], bool] | None = None,
        memory_load: Callable[[Mapping[str, Any]], float | None] | None = None,
        usable: Callable[[TrialResult], bool] = usable_complete,
        stop_gain_frac: float = 0.01,
        min_trials: int = 10,
        patience: int = 10,
        risk_aversion: float = 1.0,
        failure_budget_frac: float = 0.1,
        budget_aversion: float = 0.0,
        headroom_limit: float = 0.95,
        effect_error: float = 0.3,
        effect_floor: float = 0.06,
        effect_cap: float = 0.25,
        warmup_trials: int = 3,
        refine_share: tuple[float, float] = (0.5, 0.9),
        refine_radius: int = 2,
        suspect_weight: float = 0.15,
        max_probes: int = 6,
        full_grid_limit: int = 5_000,
        pool_size: int = 2_000,
        shortlist_size: int = 64,
        screening: ScreeningSettings | None = ScreeningSettings(),  # noqa: B008 (frozen)
    ) -> None:
        if kind not in SEARCH_KINDS + COMPARISON_KINDS:
            raise UsageError(
                f"unknown search {kind!r}", hint=f"Use --search with one of: {', '.join(SEARCH_KINDS)}"
            )
        self.space = space
        self.kind = kind
        self.seed = seed
        self._rank = rank
        self._phase_prior = phase_prior
        self.min_phase_trials = min_phase_trials
        self._phase_sd: dict[str, np.ndarray] | None = None
        self._valid = valid or (lambda _p: True)
        self._feasible = feasible or (lambda _p: True)
        self._memory_load = memory_load
        self._usable = usable
        self.stop_gain_frac = stop_gain_frac
        self.min_trials = min_trials
        self.patience = patience
        self.risk_aversion = risk_aversion
        self.failure_budget_frac = failure_budget_frac
        self.budget_aversion = budget_aversion
        self.headroom_limit = headroom_limit
        self.effect_error = effect_error
        self.effect_floor = effect_floor
        self.effect_cap = effect_cap
        self.warmup_trials = warmup_trials
        self.refine_share = refine_share
        self.refine_radius = refine_radius
        self.suspect_weight = suspect_weight
        self.max_probes = max_probes
        self.full_grid_limit = full_grid_limit
        self.pool_size = pool_size
        self.shortlist_size = shortlist_size
        self._rng = random.Random(seed)
        self._grid: list[dict[str, Any]] | None = None
        self._size: int | None = None
        self._encoder: ConfigEncoder | None = None
        self._prior_sd: np.ndarray | None = None
        self._pool: _Block | None = None
        self._cands: dict[str, _Candidate] = {}
        self._load_cache: dict[str, float] = {}
        self._analysis_key: tuple[Any, ...] | None = None
        self._analysis: _Analysis | None = None
        self.screening: Screening | None = (
            Screening(space, screening, seed) if screening and kind == "auto" else None
        )

    # -- Optuna sampler -------------------------------------------------------------------------
    def sampler(self, *, parallel: bool = False) -> optuna.samplers.BaseSampler:
        """The Optuna sampler for this kind (grid and auto proposals are enqueued by the study).

        ``parallel``: other workers run trials of the same study at the same time; TPE then counts
        their running trials as if they had done badly (Optuna's constant liar), so concurrent draws
        spread out instead of piling on one region.
        """
        if self.kind in ("random", "grid"):
            return optuna.samplers.RandomSampler(seed=self.seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            # Failures reach TPE as infeasible through the trial constraints the study sets on tell
            # (optuna 5 reads ``trial.constraints``; ``constraints_func`` is deprecated).
            return optuna.samplers.TPESampler(
                seed=self.seed, multivariate=True, group=True, n_startup_trials=4, constant_liar=parallel
            )

    # -- the space -------------------------------------------------------------------------------
    def size(self) -> int:
        """Number of distinct configurations."""
        if self._size is None:
            self._size = count_configs(self.space)
        return self._size

    def grid(self) -> list[dict[str, Any]]:
        """Every configuration in a stable order (at most 200 000)."""
        if self._grid is None:
            grid: list[dict[str, Any]] = []
            for params in self.space.grid():
                grid.append(params)
                if len(grid) >= _GRID_ENUM_LIMIT:
                    break
            self._grid = grid
        return self._grid

    def next_unvisited(self, visited: set[str]) -> dict[str, Any] | None:
        """A configuration not run yet: the next grid point (grid), else a random one passing the
        pre-check (any unvisited one when none passes)."""
        if self.kind == "grid":
            return next((p for p in self.grid() if canonical_key(p) not in visited), None)
        if self.size() > self.full_grid_limit:
            fallback = None
            for _ in range(2_000):
                params = random_config(self.space, self._rng)
                if canonical_key(params) in visited:
                    continue
                if self._feasible(params):
                    return params
                fallback = fallback or params
            if fallback is not None:
                return fallback
        candidates = [p for p in self.grid() if canonical_key(p) not in visited]
        if not candidates:
            return None
        feasible = [p for p in candidates if self._feasible(p)]
        return self._rng.choice(feasible or candidates)

    # -- proposals -------------------------------------------------------------------------------
    def propose(
        self, history: Sequence[TrialResult], visited: set[str], budget_left: int | None = None
    ) -> dict[str, Any] | None:
        """The configuration to run next, or None to let the Optuna sampler choose.

        ``grid`` returns the next grid point (None once every point was visited); ``random`` and
        ``tpe`` always leave the choice to Optuna; ``auto`` returns the best-scoring candidate of the
        schedule's current move (see :meth:`explain`). ``budget_left``: launched trials the budget
        still allows (None: unknown, e.g. a time budget only).
        """
        if self.kind == "grid":
            return self.next_unvisited(visited)
        if self.kind != "auto":
            return None
        analysis = self._analyse(history, visited, budget_left)
        return dict(analysis.proposal.params) if analysis.proposal else None

    def explain(
        self, history: Sequence[TrialResult], visited: set[str], budget_left: int | None = None
    ) -> Proposal | None:
        """The proposal ``auto`` would make now, with its predicted throughput, gain, risk, and the
        move from the incumbent (the best usable trial): ``mode`` is ``refine`` for a one- or two-knob
        change of it, ``explore`` for the best candidate of the whole space."""
        if self.kind != "auto":
            return None
        return self._analyse(history, visited, budget_left).proposal

    def failure_risk(self, history: Sequence[TrialResult], configs: Sequence[Mapping[str, Any]]) -> float:
        """The largest probability, among ``configs``, of failing for a reason the memory estimate does
        not cover, given ``history`` (the culprit model of :class:`~autotune.strategy._surrogate.FailureModel`)."""
        if not configs:
            return 0.0
        model = self._failure_model(launched(history))
        return float(model.predict(np.array([self._encoder_().codes(p) for p in configs], dtype=int)).max())

    def _failure_model(
        self, runs: Sequence[TrialResult], success: Mapping[str, Any] | None = None
    ) -> FailureModel:
        """Failure evidence from every launched run (and, for a look-ahead, one more configuration
        supposed to succeed). Memory failures are the estimate's business when there is one (the gate
        calibrates on them); without one the culprit model learns them too."""
        enc = self._encoder_()
        if self._memory_load is not None:
            runs = [r for r in runs if not is_memory_failure(r)]
        if success is not None:
            runs = [
                *runs,
                TrialResult(number=-1, params=dict(success), status=TrialStatus.COMPLETE, reason=""),
            ]
        codes = np.array([self._cand(r.params).codes for r in runs], dtype=int).reshape(
            len(runs), len(enc.slots)
        )
        failed = np.array([r.status.is_failure for r in runs], dtype=bool)
        blame: list[np.ndarray | None] = []
        for r in runs:
            knobs = blamed_knobs(self.space, r)
            blame.append(
                None if knobs is None else np.array([s.name in knobs for s in enc.slots], dtype=bool)
            )
        kinds = [f"{r.status.value}:{r.failed_phase or ''}" for r in runs]
        return FailureModel().fit(
            codes, failed, space_codes=self._base_pool().codes, blame=blame, kinds=kinds
        )

    # -- stopping --------------------------------------------------------------------------------
    def converged(
        self, history: Sequence[TrialResult], launched_budget_left: int, visited: set[str] | None = None
    ) -> str | None:
        """A one-line reason to stop before the budget, or None to go on (``auto`` only).

        Two rules, after ``min_trials`` launched trials and only once a trial is usable: the expected
        gain of the best untried candidate (expected improvement × P(ok)) is below ``stop_gain_frac``;
        or the last ``patience`` launched trials did not beat the best before them by more than
        ``stop_gain_frac``.
        """
        if self.kind != "auto" or launched_budget_left <= 0:
            return None
        runs = launched(history)
        if len(runs) < self.min_trials:
            return None
        best = self._best(history)
        if best is None or not self._screened(runs):
            return None
        if visited is None:
            visited = {canonical_key(r.params) for r in history if r.status is not TrialStatus.INTERRUPTED}
        analysis = self._analyse(history, visited, launched_budget_left, explore_only=True)
        if analysis.proposal is None:
            return "no untried configuration passes the pre-screen"
        gain = analysis.proposal.expected_gain_frac
        if gain is not None and gain < self.stop_gain_frac:
            return (
                f"further trials are unlikely to gain more than {self.stop_gain_frac:.0%}: the most promising "
                f"untried configuration is expected to gain {gain:.1%} over the best{self._screen_note()}"
            )
        measured = [r for r in runs if r.throughput and not r.status.is_failure]
        if len(measured) > self.patience:
            before = [r.throughput or 0.0 for r in measured[: -self.patience] if self._usable(r)]
            recent = [r.throughput or 0.0 for r in measured[-self.patience :] if self._usable(r)]
            if before and max(recent, default=0.0) <= max(before) * (1 + self.stop_gain_frac):
                return (
                    f"the last {self.patience} trials that ran did not beat the best by more than "
                    f"{self.stop_gain_frac:.0%}; further trials are unlikely to gain more{self._screen_note()}"
                )
        return None

    # -- the model -------------------------------------------------------------------------------
    def _best(self, history: Sequence[TrialResult]) -> float | None:
        values = [r.throughput for r in history if self._usable(r) and r.throughput]
        return max(values) if values else None

    def _aversion(self, runs: Sequence[TrialResult]) -> float:
        """How much more than usual to weigh the risk of failing, from the GPU time failures used so far:
        1 with no failed time, rising by ``budget_aversion`` per ``failure_budget_frac`` of the GPU time
        spent on failed trials (capped at three budgets)."""
        total_s = sum(r.gpu_seconds for r in runs)
        if self.budget_aversion <= 0 or total_s <= 0:
            return 1.0
        failed_s = sum(r.gpu_seconds for r in runs if r.status.is_failure)
        over = min(3.0, failed_s / total_s / self.failure_budget_frac)
        return 1.0 + self.budget_aversion * over

    def _encoder_(self) -> ConfigEncoder:
        if self._encoder is None:
            self._encoder = ConfigEncoder(self.space)
        return self._encoder

    def _cand(self, params: Mapping[str, Any], key: str | None = None) -> _Candidate:
        key = key or canonical_key(params)
        cand = self._cands.get(key)
        if cand is None:
            enc = self._encoder_()
            codes = enc.codes(params)
            prior = self._rank(params) if self._rank is not None else None
            cand = _Candidate(
                params=dict(params),
                key=key,
                codes=codes,
                x=enc.encode(params, codes),
                prior=float(prior) if prior is not None and prior > 0 else math.nan,
                valid=bool(self._valid(params)),
                phases=self._phase_vector(params),
            )
            self._cands[key] = cand
        return cand

    def _base_pool(self) -> _Block:
        if self._pool is None:
            if self.size() <= self.full_grid_limit:
                configs = list(self.grid())
            else:
                configs = sample_configs(self.space, random.Random(self.seed * 7919 + 17), self.pool_size)
            cands = [self._cand(p) for p in configs]
            self._pool = _Block.of([c for c in cands if c.valid], len(self._encoder_().slots))
        return self._pool

    def _speed_prior_sd(self) -> np.ndarray:
        """Prior scale of each knob's effect on the residual (see ``effect_error``); the encoder's
        defaults when there is no estimator."""
        enc = self._encoder_()
        if self._prior_sd is None:
            base = self._base_pool()
            log_prior = np.log(base.prior) if len(base.prior) else np.zeros(0)
            if self._rank is None or not np.isfinite(log_prior).any():
                self._prior_sd = enc.prior_sd
            else:
                spreads = enc.knob_spreads(base.codes, log_prior)
                scales = {
                    k: min(self.effect_cap, max(self.effect_floor, self.effect_error * v))
                    for k, v in spreads.items()
                }
                self._prior_sd = enc.scaled_prior_sd(scales)
        return self._prior_sd

    def _phase_vector(self, params: Mapping[str, Any]) -> np.ndarray:
        out = np.full(len(PHASE_NAMES), math.nan)
        if self._phase_prior is None:
            return out
        phases = self._phase_prior(params)
        if phases:
            values = [float(phases.get(p, 0.0) or 0.0) for p in PHASE_NAMES]
            if all(math.isfinite(v) and v >= 0 for v in values) and sum(values) > 0:
                out[:] = values
        return out

    def _phase_sds(self) -> dict[str, np.ndarray]:
        """Per phase, each knob's prior scale from how much the estimator says it moves that phase."""
        if self._phase_sd is None:
            enc = self._encoder_()
            base = self._base_pool()
            known = np.isfinite(base.phases).all(axis=1)
            eps = 0.02 * np.nansum(base.phases, axis=1)
            out: dict[str, np.ndarray] = {}
            for j, name in enumerate(PHASE_NAMES):
                log_phase = np.where(
                    known, np.log(np.where(known, base.phases[:, j], 1.0) + eps + 1e-12), np.nan
                )
                spreads = enc.knob_spreads(base.codes, log_phase)
                scales = {
                    k: min(self.effect_cap, max(self.effect_floor, self.effect_error * v))
                    for k, v in spreads.items()
                }
                out[name] = enc.scaled_prior_sd(scales)
            self._phase_sd = out
        return self._phase_sd

    def _first_load(self, cands: Sequence[_Candidate]) -> np.ndarray:
        """Predicted memory load, as first computed (the shortlist is re-checked fresh)."""
        if self._memory_load is None:
            return np.full(len(cands), math.nan)
        out = np.empty(len(cands))
        for i, c in enumerate(cands):
            if c.key not in self._load_cache:
                value = self._memory_load(c.params)
                self._load_cache[c.key] = math.nan if value is None else float(value)
            out[i] = self._load_cache[c.key]
        return out

    def _fresh_load(self, cands: Sequence[_Candidate]) -> np.ndarray:
        if self._memory_load is None:
            return np.full(len(cands), math.nan)
        values = [self._memory_load(c.params) for c in cands]
        return np.array([math.nan if v is None else float(v) for v in values])

    def _analyse(
        self,
        history: Sequence[TrialResult],
        visited: set[str],
        budget_left: int | None = None,
        *,
        explore_only: bool = False,
    ) -> _Analysis:
        key = (
            tuple((r.number, r.status.value, r.throughput) for r in sorted(history, key=lambda r: r.number)),
            len(visited),
            budget_left,
            explore_only,
        )
        if self._analysis is not None and self._analysis_key == key:
            return self._analysis
        analysis = self._decide(history, visited, budget_left, explore_only)
        self._analysis_key, self._analysis = key, analysis
        return analysis

    def _incumbent(self, history: Sequence[TrialResult]) -> TrialResult | None:
        """The best usable trial (highest throughput; the lower number on a tie)."""
        usable = [r for r in history if self._usable(r) and r.throughput]
        return max(usable, key=lambda r: (r.throughput or 0.0, -r.number)) if usable else None

    def _wants_refine(self, runs: Sequence[TrialResult], budget_left: int | None) -> bool:
        """Whether the next trial is a refinement move, by the budget-aware schedule.

        After ``warmup_trials`` launched trials, refinement moves make up a share of the trials that
        grows from ``refine_share[0]`` to ``refine_share[1]`` with the share of the budget used (without
        a trial budget, over 20 trials). The count of refinement moves so far is read from the trials'
        recorded choices, so a resumed study keeps its schedule.
        """
        n = len(runs)
        if n < self.warmup_trials:
            return False
        used = n / (n + budget_left) if budget_left is not None and n + budget_left > 0 else min(1.0, n / 20)
        lo, hi = self.refine_share
        share = lo + (hi - lo) * used
        done = sum(1 for r in runs if (r.choice or {}).get("mode") == "refine")
        return done < share * (n - self.warmup_trials + 1)

    def _around(self, params: Mapping[str, Any], visited: set[str]) -> list[_Candidate]:
        """Valid unvisited configurations within ``refine_radius`` knob changes of ``params``."""
        seen = {canonical_key(params)}
        frontier = [dict(params)]
        out: list[_Candidate] = []
        for _ in range(self.refine_radius):
            nxt: list[dict[str, Any]] = []
            for base in frontier:
                for nb in neighbours(self.space, base):
                    key = canonical_key(nb)
                    if key in seen:
                        continue
                    seen.add(key)
                    nxt.append(nb)
                    if key not in visited:
                        cand = self._cand(nb, key)
                        if cand.valid:
                            out.append(cand)
            frontier = nxt
        return out

    def _fit_phase_model(self, runs: Sequence[TrialResult]) -> PhaseSpeedModel | None:
        """The per-phase speed model, once enough trials measured their phases (else None)."""
        if self._phase_prior is None:
            return None
        xs, priors, observed = [], [], []
        for r in runs:
            obs = observed_phases(r)
            if obs is None:
                continue
            cand = self._cand(r.params)
            if not np.isfinite(cand.phases).all() or math.isnan(cand.prior):
                continue
            xs.append(cand.x)
            priors.append(cand.phases)
            observed.append(obs)
        if len(xs) < self.min_phase_trials:
            return None
        return PhaseSpeedModel(self._phase_sds()).fit(np.array(xs), np.array(priors), np.array(observed))

    def _decide(
        self,
        history: Sequence[TrialResult],
        visited: set[str],
        budget_left: int | None = None,
        explore_only: bool = False,
    ) -> _Analysis:
        enc = self._encoder_()
        k = len(enc.slots)
        runs = launched(history)
        best = self._best(history)

        # speed model on every run that measured a throughput (unhealthy runs still measure speed)
        speed_runs = [self._cand(r.params) for r in runs if r.throughput]
        tps = [r.throughput or 1.0 for r in runs if r.throughput]
        known = [c.prior for c in speed_runs if not math.isnan(c.prior)]
        fallback = float(np.median(known)) if known else 1.0
        x_obs = np.array([c.x for c in speed_runs]).reshape(len(speed_runs), enc.n_features)
        y_obs = np.array(
            [
                math.log(tp) - math.log(fallback if math.isnan(c.prior) else c.prior)
                for c, tp in zip(speed_runs, tps, strict=True)
            ]
        )
        model = SpeedModel(self._speed_prior_sd()).fit(x_obs, y_obs)
        phase_model = self._fit_phase_model(runs)

        failure = self._failure_model(runs)
        aversion = self._aversion(runs)

        def score(
            block: _Block, load: np.ndarray, fm: FailureModel = failure
        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
            mean, sd = model.predict(block.x)
            if phase_model is not None:
                has = np.isfinite(block.phases).all(axis=1) & np.isfinite(block.prior)
                if has.any():
                    ratio, ratio_sd = phase_model.predict(block.x[has], block.phases[has])
                    mean, sd = mean.copy(), sd.copy()
                    mean[has], sd[has] = -ratio, ratio_sd  # throughput ∝ 1 / step time
            mean_log = np.log(np.where(np.isnan(block.prior), fallback, block.prior)) + mean
            p_other = fm.predict(block.codes)
            p_mem = fm.memory_risk(load, self.headroom_limit) if self._memory_load is not None else 0.0
            p_ok = (1.0 - p_mem) * (1.0 - p_other)
            gain = (
                expected_gain(mean_log, sd, best) if best is not None else np.exp(mean_log - mean_log.max())
            )
            choice = gain * (1.0 - p_mem) ** self.risk_aversion * (1.0 - p_other) ** aversion
            return choice, gain * p_ok, mean_log, p_ok

        incumbent = self._incumbent(history)
        screen = None if explore_only else self._screen(runs, history, visited, budget_left, score, best)

        def finish(proposal: Proposal | None, mode: str) -> _Analysis:
            if proposal is None:
                return _Analysis(None, best)
            move = move_from(incumbent.params, proposal.params) if incumbent is not None else {}
            return _Analysis(
                replace(proposal, mode=mode, incumbent=incumbent.number if incumbent else None, move=move),
                best,
            )

        if screen is not None:
            return finish(*screen)
        chosen: tuple[Proposal, str] | None = None
        # refinement: the best one- or two-knob change of the incumbent, when the schedule says so
        if not explore_only and incumbent is not None and self._wants_refine(runs, budget_left):
            proposal = self._best_of(
                _Block.of(self._around(incumbent.params, visited), k), score, history, best
            )
            if proposal is not None:
                chosen = (proposal, "refine")

        base = self._base_pool()
        block = base.select([c.key not in visited for c in base.cands])
        # large spaces: add the one-knob neighbours of the most promising candidates and of the best runs
        if self.size() > self.full_grid_limit and block.cands:
            seen = visited | {c.key for c in block.cands}
            anchors = [
                r.params for r in sorted(runs, key=lambda r: -(r.throughput or 0.0)) if self._usable(r)
            ][:3]
            for _ in range(2):
                first, _, _, _ = score(block, self._first_load(block.cands))
                top = [block.cands[i].params for i in np.argsort(-first, kind="stable")[:8]]
                extra: list[_Candidate] = []
                for params in [*anchors, *top]:
                    for nb in neighbours(self.space, params):
                        nb_key = canonical_key(nb)
                        if nb_key not in seen:
                            seen.add(nb_key)
                            cand = self._cand(nb, nb_key)
                            if cand.valid:
                                extra.append(cand)
                anchors = []
                if not extra:
                    break
                block = block.concat(_Block.of(extra, k))
        if chosen is None:
            proposal = self._best_of(block, score, history, best)
            if proposal is not None:
                chosen = (proposal, "explore")
        if chosen is None:
            return _Analysis(None, best)
        later_trials = budget_left is None or budget_left > 1
        # probes take a risk on purpose: not while the study is weighing failures up (budget_aversion)
        calm = aversion <= 1.0
        if (
            not explore_only
            and calm
            and incumbent is not None
            and best is not None
            and later_trials
            and block.cands
        ):
            current = chosen[0].expected_gain_frac or 0.0
            probe = self._probe(runs, history, incumbent, visited, block, failure, score, current)
            if probe is not None:
                return finish(probe, "probe")
        return finish(*chosen)

    def _screen_plan(self) -> ScreenPlan | None:
        """The screening plan over the valid pool (the estimator's knob spreads rank the knobs)."""
        if self.screening is None:
            return None
        base = self._base_pool()
        spreads = None
        if self._rank is not None and len(base.prior) and np.isfinite(base.prior).any():
            spreads = self._encoder_().knob_spreads(base.codes, np.log(base.prior))
        return self.screening.plan([c.params for c in base.cands], spreads)

    def _screened(self, runs: Sequence[TrialResult]) -> bool:
        """Whether every screened level was measured healthy (or given up): stopping needs it."""
        plan = self._screen_plan()
        return (
            plan is None
            or self.screening is None
            or self.screening.complete(plan, self.screening.state(plan, runs))
        )

    def _screen_note(self) -> str:
        """What a stop owes to the screening phase (empty without one)."""
        plan = self._screen_plan()
        if plan is None or not plan.knobs:
            return ""
        return f" (every level of {', '.join(plan.knobs)} was measured healthy or failed twice: the prior was checked)"

    def _screen(
        self,
        runs: Sequence[TrialResult],
        history: Sequence[TrialResult],
        visited: set[str],
        budget_left: int | None,
        score: Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
        best: float | None,
    ) -> tuple[Proposal, str] | None:
        """The screening design's next run, or the combination of the best screened levels, while the
        screening phase lasts (:class:`~autotune.strategy._screening.Screening`); None after it."""
        plan = self._screen_plan()
        if plan is None or self.screening is None:
            return None
        base = self._base_pool()
        block = base.select([c.key not in visited for c in base.cands])
        if not block.cands:
            return None
        choice, gain_ok, mean_log, p_ok = score(block, self._first_load(block.cands))

        def check(params: Mapping[str, Any]) -> bool:
            return infer_infeasible(self.space, params, history) is None and self._feasible(params)

        pick = self.screening.next_run(
            plan, runs, [c.params for c in block.cands], p_ok, choice, check, budget_left
        )
        if pick is None:
            return None
        i = pick.index
        proposal = Proposal(
            params=dict(block.cands[i].params),
            predicted_throughput=float(math.exp(mean_log[i])),
            expected_gain_frac=float(gain_ok[i]) if best is not None else None,
            failure_risk=float(1.0 - p_ok[i]),
            covers=pick.covers,
        )
        return proposal, pick.mode

    def _probe(
        self,
        runs: Sequence[TrialResult],
        history: Sequence[TrialResult],
        incumbent: TrialResult,
        visited: set[str],
        block: _Block,
        failure: FailureModel,
        score: Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
        current: float,
    ) -> Proposal | None:
        """A one-knob move of the incumbent onto a suspect value, when testing it is worth more than
        ``current`` (the expected gain of the schedule's own move); None otherwise."""
        enc = self._encoder_()
        suspects = {
            (j, int(f[j]))
            for f, w_single, _ in failure.causes
            for j in np.flatnonzero(w_single >= self.suspect_weight)
        }
        if not suspects:
            return None
        probes: list[_Candidate] = []
        for nb in neighbours(self.space, incumbent.params):
            key = canonical_key(nb)
            if key in visited:
                continue
            cand = self._cand(nb, key)
            if cand.valid and any(cand.codes[j] == code for j, code in suspects):
                probes.append(cand)
        if not probes:
            return None
        pblock = _Block.of(probes, len(enc.slots))
        _, p_gain, p_mean, p_ok = score(pblock, self._fresh_load(pblock.cands))
        load = self._first_load(block.cands)
        now = float(score(block, load)[1].max())
        best_value, best_i = current, None
        for i in np.argsort(-p_ok, kind="stable")[: self.max_probes]:
            params = probes[i].params
            if infer_infeasible(self.space, params, history) is not None or not self._feasible(params):
                continue
            after = float(score(block, load, self._failure_model(runs, success=params))[1].max())
            value = float(p_gain[i]) + float(p_ok[i]) * max(0.0, after - now)
            if value > best_value:
                best_value, best_i = value, int(i)
        if best_i is None:
            return None
        cand = probes[best_i]
        names = [
            f"{enc.slots[j].name}={cand.params.get(enc.slots[j].name)!r}"
            for j, code in sorted(suspects)
            if cand.codes[j] == code
        ]
        return Proposal(
            params=dict(cand.params),
            predicted_throughput=float(math.exp(p_mean[best_i])),
            expected_gain_frac=best_value,
            failure_risk=float(1.0 - p_ok[best_i]),
            suspect=", ".join(names),
        )

    def _best_of(
        self,
        block: _Block,
        score: Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
        history: Sequence[TrialResult],
        best: float | None,
    ) -> Proposal | None:
        """The best-scoring candidate of ``block`` that passes the pre-check: ranked on the first
        memory loads, then picked shortlist by shortlist with fresh ones (:meth:`_pick`)."""
        if not block.cands:
            return None
        first, _, _, _ = score(block, self._first_load(block.cands))
        order = np.argsort(-first, kind="stable")
        for start in range(0, len(order), self.shortlist_size):
            proposal = self._pick(
                block.take(order[start : start + self.shortlist_size]), score, history, best
            )
            if proposal is not None:
                return proposal
        return None

    def _pick(
        self,
        short: _Block,
        score: Callable[[_Block, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
        history: Sequence[TrialResult],
        best: float | None,
    ) -> Proposal | None:
        """The best-scoring candidate of a shortlist (memory loads fresh) that passes the pre-check."""
        final, gain_ok, mean_log, p_ok = score(short, self._fresh_load(short.cands))
        for i in np.argsort(-final, kind="stable"):
            cand = short.cands[i]
            if infer_infeasible(self.space, cand.params, history) is not None or not self._feasible(
                cand.params
            ):
                continue
            return Proposal(
                params=dict(cand.params),
                predicted_throughput=float(math.exp(mean_log[i])),
                expected_gain_frac=float(gain_ok[i]) if best is not None else None,
                failure_risk=float(1.0 - p_ok[i]),
            )
        return None


@dataclass(frozen=True)
class _Candidate:
    params: dict[str, Any]
    key: str
    codes: tuple[int, ...]
    x: np.ndarray
    prior: float  # NaN when the estimator has no prediction
    valid: bool  # passes the framework's static rules
    phases: np.ndarray  # the estimator's seconds per phase (PHASE_NAMES order); NaN when unknown


@dataclass(frozen=True)
class _Block:
    """Candidates with their features stacked for vectorised scoring."""

    cands: tuple[_Candidate, ...]
    x: np.ndarray
    codes: np.ndarray
    prior: np.ndarray
    phases: np.ndarray

    @classmethod
    def of(cls, cands: Sequence[_Candidate], n_slots: int) -> _Block:
        n_features = len(cands[0].x) if cands else 1
        return cls(
            cands=tuple(cands),
            x=np.array([c.x for c in cands]).reshape(len(cands), n_features),
            codes=np.array([c.codes for c in cands], dtype=int).reshape(len(cands), n_slots),
            prior=np.array([c.prior for c in cands], dtype=float),
            phases=np.array([c.phases for c in cands], dtype=float).reshape(len(cands), len(PHASE_NAMES)),
        )

    def take(self, idx: np.ndarray) -> _Block:
        return _Block(
            tuple(self.cands[i] for i in idx), self.x[idx], self.codes[idx], self.prior[idx], self.phases[idx]
        )

    def select(self, mask: Sequence[bool]) -> _Block:
        return self.take(np.flatnonzero(np.asarray(mask, dtype=bool)))

    def concat(self, other: _Block) -> _Block:
        if not other.cands:
            return self
        if not self.cands:
            return other
        return _Block(
            self.cands + other.cands,
            np.vstack([self.x, other.x]),
            np.vstack([self.codes, other.codes]),
            np.concatenate([self.prior, other.prior]),
            np.vstack([self.phases, other.phases]),
        )
