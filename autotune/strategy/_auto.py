"""``auto``, the default strategy: which configuration to run next, and when to stop.

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
3. Stopping (see :meth:`AutoStrategy.converged`), after ``min_trials`` launched trials and once a
   trial is usable: expected improvement — the most promising untried configuration's expected gain
   over the best so far × its P(ok) is below ``stop_gain_frac`` — or no gain in the last
   ``patience`` trials that ran (failures do not count as "no gain").

Large spaces are not enumerated: the candidates are a random sample of the space plus, at every
decision, the one-knob neighbours of the most promising candidates and of the best trials. Everything
a decision uses is a function of the seed, the trial history and the memory gate's calibration, so a
resumed study continues the same search.

The auto strategy's proposal path is :meth:`AutoStrategy.propose` → :meth:`AutoStrategy._decide`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import optuna

from autotune.records import TrialResult, TrialStatus
from autotune.space import SearchSpace, canonical_key
from autotune.strategy._base import (
    BaseStrategy,
    Collaborators,
    Exhausted,
    Pending,
    Proposal,
    StrategySettings,
    launched,
)
from autotune.strategy._blame import blamed_knobs
from autotune.strategy._candidates import neighbours
from autotune.strategy._inference import infer_infeasible, is_memory_failure
from autotune.strategy._pool import Block, Candidate, CandidatePool, PriorScale, observed_phases
from autotune.strategy._proposal import ScoredProposal, move_from
from autotune.strategy._screen_phase import ScreeningPhase
from autotune.strategy._screening import Screening, ScreeningSettings
from autotune.strategy._surrogate import FailureModel, PhaseSpeedModel, SpeedModel, expected_gain
from autotune.strategy._tpe import tpe_sampler

__all__ = ["AutoSettings", "AutoStrategy", "ScoredProposal", "move_from"]


@dataclass
class _Analysis:
    proposal: ScoredProposal | None
    best: float | None


@dataclass(frozen=True)
class AutoSettings(StrategySettings):
    """The ``auto`` strategy's settings (the defaults are what the benches measured).

    Attributes:
        min_phase_trials: trials that measured their phases (the timeline's framework or marker split)
            before the speed model is the per-phase one
            (:class:`~autotune.strategy._surrogate.PhaseSpeedModel`), when the estimator splits its
            prediction by phase.
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
        n_startup_trials: random trials of Optuna's TPE, used only when ``auto`` has no proposal left.
        screening: how ``auto`` screens the high-impact knobs before it trusts the prior about them
            (:mod:`autotune.strategy._screening`); None: no screening (the v2 search).
    """

    min_phase_trials: int = 2
    stop_gain_frac: float = 0.01
    min_trials: int = 10
    patience: int = 10
    risk_aversion: float = 1.0
    failure_budget_frac: float = 0.1
    budget_aversion: float = 0.0
    headroom_limit: float = 0.95
    effect_error: float = 0.3
    effect_floor: float = 0.06
    effect_cap: float = 0.25
    warmup_trials: int = 3
    refine_share: tuple[float, float] = (0.5, 0.9)
    refine_radius: int = 2
    suspect_weight: float = 0.15
    max_probes: int = 6
    pool_size: int = 2_000
    shortlist_size: int = 64
    n_startup_trials: int = 4
    screening: ScreeningSettings | None = ScreeningSettings()  # noqa: RUF009 - frozen


class AutoStrategy(ScreeningPhase, BaseStrategy):
    """Constrained expected improvement over the estimator's prior, corrected by what trials measure
    (see the module's docstring). Settings: :class:`AutoSettings`."""

    Settings = AutoSettings
    settings: AutoSettings
    # with nothing to propose it leaves the draw to a sampler that knows nothing of the pre-screen
    requeue_after_refusals = 2

    def __init__(
        self,
        space: SearchSpace,
        collaborators: Collaborators | None = None,
        *,
        seed: int = 0,
        settings: StrategySettings | None = None,
    ) -> None:
        super().__init__(space, collaborators, seed=seed, settings=settings)
        s = self.settings
        self.pool = CandidatePool(
            space,
            self.collab,
            self._pool_configs,
            PriorScale(error=s.effect_error, floor=s.effect_floor, cap=s.effect_cap),
        )
        self._analysis_key: tuple[Any, ...] | None = None
        self._analysis: _Analysis | None = None
        self.screening: Screening | None = (
            Screening(space, s.screening, seed) if s.screening is not None else None
        )

    def scored(self, **fields: Any) -> ScoredProposal:
        """A proposal of this strategy's kind (the screening phase builds its own through this)."""
        return ScoredProposal(**fields)

    def _pool_configs(self) -> list[dict[str, Any]]:
        if self.size() <= self.settings.full_grid_limit:
            return list(self.grid())
        return CandidatePool.sampled(self.space, self.seed, self.settings.pool_size)

    # -- the contract ----------------------------------------------------------------------------
    def sampler(self, *, parallel: bool = False) -> optuna.samplers.BaseSampler:
        """Optuna's TPE (:func:`~autotune.strategy._tpe.tpe_sampler`), for when ``auto`` has no
        proposal left; failures reach it as infeasible through the trial constraints."""
        return tpe_sampler(self.seed, parallel=parallel, n_startup_trials=self.settings.n_startup_trials)

    def propose(self, history: Sequence[TrialResult], pending: Pending) -> Proposal | Exhausted | None:
        """The best-scoring candidate of the schedule's current move (see :meth:`explain`); None (the
        sampler chooses) when no candidate passes the pre-screen."""
        proposal = self._analyse(history, pending).proposal
        return replace(proposal, params=dict(proposal.params)) if proposal else None

    def explain(self, history: Sequence[TrialResult], pending: Pending) -> ScoredProposal | None:
        """The proposal ``auto`` would make now, with its predicted throughput, gain, risk, and the
        move from the incumbent (the best usable trial): ``mode`` is ``refine`` for a one- or two-knob
        change of it, ``explore`` for the best candidate of the whole space, ``probe`` for a move onto
        a suspect value."""
        return self._analyse(history, pending).proposal

    def failure_risk(self, history: Sequence[TrialResult], configs: Sequence[Mapping[str, Any]]) -> float:
        """The largest probability, among ``configs``, of failing for a reason the memory estimate does
        not cover, given ``history`` (the culprit model of :class:`~autotune.strategy._surrogate.FailureModel`)."""
        if not configs:
            return 0.0
        model = self._failure_model(launched(history))
        return float(
            model.predict(np.array([self.pool.encoder().codes(p) for p in configs], dtype=int)).max()
        )

    def _failure_model(
        self, runs: Sequence[TrialResult], success: Mapping[str, Any] | None = None
    ) -> FailureModel:
        """Failure evidence from every launched run (and, for a look-ahead, one more configuration
        supposed to succeed). Memory failures are the estimate's business when there is one (the gate
        calibrates on them); without one the culprit model learns them too."""
        enc = self.pool.encoder()
        if self.collab.memory_load is not None:
            runs = [r for r in runs if not is_memory_failure(r)]
        if success is not None:
            runs = [
                *runs,
                TrialResult.outline(-1, success, status=TrialStatus.COMPLETE, reason=""),
            ]
        codes = np.array([self.pool.cand(r.params).codes for r in runs], dtype=int).reshape(
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
        return FailureModel().fit(codes, failed, space_codes=self.pool.base().codes, blame=blame, kinds=kinds)

    # -- stopping --------------------------------------------------------------------------------
    def converged(self, history: Sequence[TrialResult], pending: Pending) -> str | None:
        """A one-line reason to stop before the budget, or None to go on (always None once the trial
        budget is spent: the study stops on it).

        Two rules, after ``min_trials`` launched trials and only once a trial is usable: the expected
        gain of the best untried candidate (expected improvement × P(ok)) is below ``stop_gain_frac``;
        or the last ``patience`` launched trials did not beat the best before them by more than
        ``stop_gain_frac``.
        """
        if pending.trials_left is not None and pending.trials_left <= 0:
            return None
        runs = launched(history)
        if len(runs) < self.settings.min_trials:
            return None
        best = self._best(history)
        if best is None:
            return None
        ceiling = self._ceiling_stop(best, pending)
        if ceiling is not None:
            return ceiling
        if not self._screened(runs):
            return None
        analysis = self._analyse(history, pending, explore_only=True)
        if analysis.proposal is None:
            return "no untried configuration passes the pre-screen"
        gain = analysis.proposal.expected_gain_frac
        if gain is not None and gain < self.settings.stop_gain_frac:
            return (
                f"further trials are unlikely to gain more than {self.settings.stop_gain_frac:.0%}: the most promising "
                f"untried configuration is expected to gain {gain:.1%} over the best{self._screen_note()}"
            )
        measured = [r for r in runs if r.throughput and not r.status.is_failure]
        if len(measured) > self.settings.patience:
            before = [
                r.throughput or 0.0 for r in measured[: -self.settings.patience] if self.collab.usable(r)
            ]
            recent = [
                r.throughput or 0.0 for r in measured[-self.settings.patience :] if self.collab.usable(r)
            ]
            if before and max(recent, default=0.0) <= max(before) * (1 + self.settings.stop_gain_frac):
                return (
                    f"the last {self.settings.patience} trials that ran did not beat the best by more than "
                    f"{self.settings.stop_gain_frac:.0%}; further trials are unlikely to gain more{self._screen_note()}"
                )
        return None

    def _ceiling_stop(self, best: float, pending: Pending) -> str | None:
        """A stop that rests on physics alone: no untried candidate's ceiling (the most any run of it
        could reach, :attr:`Collaborators.ceiling_throughput`) beats the best by ``stop_gain_frac``.
        None while one could, without ceilings, or when the pool is a sample of the space (a bound
        over a sample is not one over every configuration)."""
        bound = self.collab.ceiling_throughput
        if bound is None or self.size() > self.settings.full_grid_limit:
            return None
        untried = [c.params for c in self.pool.base().cands if c.key not in pending.visited]
        ceilings = [b for p in untried if (b := bound(p)) is not None]
        if not ceilings or len(ceilings) < len(untried):
            return None  # a candidate without a ceiling could be faster than any bound says
        top = max(ceilings)
        if top > best * (1 + self.settings.stop_gain_frac):
            return None
        return (
            f"no untried configuration can beat the best by more than {self.settings.stop_gain_frac:.0%}: "
            f"the physical ceiling of the fastest one is {top:.3g} completions/s against {best:.3g} measured"
        )

    # -- the model -------------------------------------------------------------------------------
    def _best(self, history: Sequence[TrialResult]) -> float | None:
        values = [r.throughput for r in history if self.collab.usable(r) and r.throughput]
        return max(values) if values else None

    def _aversion(self, runs: Sequence[TrialResult]) -> float:
        """How much more than usual to weigh the risk of failing, from the GPU time failures used so far:
        1 with no failed time, rising by ``budget_aversion`` per ``failure_budget_frac`` of the GPU time
        spent on failed trials (capped at three budgets)."""
        total_s = sum(r.gpu_seconds for r in runs)
        if self.settings.budget_aversion <= 0 or total_s <= 0:
            return 1.0
        failed_s = sum(r.gpu_seconds for r in runs if r.status.is_failure)
        over = min(3.0, failed_s / total_s / self.settings.failure_budget_frac)
        return 1.0 + self.settings.budget_aversion * over

    # -- deciding -------------------------------------------------------------------------------
    def _analyse(
        self, history: Sequence[TrialResult], pending: Pending, *, explore_only: bool = False
    ) -> _Analysis:
        """The decision for this history (cached: the study asks converged, then propose)."""
        key = (
            tuple((r.number, r.status.value, r.throughput) for r in sorted(history, key=lambda r: r.number)),
            len(pending.visited),
            pending.trials_left,
            explore_only,
        )
        if self._analysis is not None and self._analysis_key == key:
            return self._analysis
        analysis = self._decide(history, set(pending.visited), pending.trials_left, explore_only)
        self._analysis_key, self._analysis = key, analysis
        return analysis

    def _incumbent(self, history: Sequence[TrialResult]) -> TrialResult | None:
        """The best usable trial (highest throughput; the lower number on a tie)."""
        usable = [r for r in history if self.collab.usable(r) and r.throughput]
        return max(usable, key=lambda r: (r.throughput or 0.0, -r.number)) if usable else None

    def _wants_refine(self, runs: Sequence[TrialResult], budget_left: int | None) -> bool:
        """Whether the next trial is a refinement move, by the budget-aware schedule.

        After ``warmup_trials`` launched trials, refinement moves make up a share of the trials that
        grows from ``refine_share[0]`` to ``refine_share[1]`` with the share of the budget used (without
        a trial budget, over 20 trials). The count of refinement moves so far is read from the trials'
        recorded choices, so a resumed study keeps its schedule.
        """
        n = len(runs)
        if n < self.settings.warmup_trials:
            return False
        used = n / (n + budget_left) if budget_left is not None and n + budget_left > 0 else min(1.0, n / 20)
        lo, hi = self.settings.refine_share
        share = lo + (hi - lo) * used
        done = sum(1 for r in runs if (r.choice or {}).get("mode") == "refine")
        return done < share * (n - self.settings.warmup_trials + 1)

    def _around(self, params: Mapping[str, object], visited: set[str]) -> list[Candidate]:
        """Valid unvisited configurations within ``refine_radius`` knob changes of ``params``."""
        seen = {canonical_key(params)}
        frontier = [dict(params)]
        out: list[Candidate] = []
        for _ in range(self.settings.refine_radius):
            nxt: list[dict[str, Any]] = []
            for base in frontier:
                for nb in neighbours(self.space, base):
                    key = canonical_key(nb)
                    if key in seen:
                        continue
                    seen.add(key)
                    nxt.append(nb)
                    if key not in visited:
                        cand = self.pool.cand(nb, key)
                        if cand.valid:
                            out.append(cand)
            frontier = nxt
        return out

    def _fit_phase_model(self, runs: Sequence[TrialResult]) -> PhaseSpeedModel | None:
        """The per-phase speed model, once enough trials measured their phases (else None)."""
        if self.collab.phase_prior is None:
            return None
        xs, priors, observed = [], [], []
        for r in runs:
            obs = observed_phases(r)
            if obs is None:
                continue
            cand = self.pool.cand(r.params)
            if not np.isfinite(cand.phases).all() or math.isnan(cand.prior):
                continue
            xs.append(cand.x)
            priors.append(cand.phases)
            observed.append(obs)
        if len(xs) < self.settings.min_phase_trials:
            return None
        return PhaseSpeedModel(self.pool.phase_sds()).fit(np.array(xs), np.array(priors), np.array(observed))

    def _speed(self, runs: Sequence[TrialResult]) -> Callable[[Block], tuple[np.ndarray, np.ndarray]]:
        """The speed model fitted on ``runs``: a block → (mean, sd) of its log throughput. The
        estimator's prior corrected by every run that measured a throughput (unhealthy runs still
        measure speed), per phase once enough runs measured their phases."""
        speed_runs = [self.pool.cand(r.params) for r in runs if r.throughput]
        tps = [r.throughput or 1.0 for r in runs if r.throughput]
        known = [c.prior for c in speed_runs if not math.isnan(c.prior)]
        fallback = float(np.median(known)) if known else 1.0
        x_obs = np.array([c.x for c in speed_runs]).reshape(len(speed_runs), self.pool.encoder().n_features)
        y_obs = np.array(
            [
                math.log(tp) - math.log(fallback if math.isnan(c.prior) else c.prior)
                for c, tp in zip(speed_runs, tps, strict=True)
            ]
        )
        model = SpeedModel(self.pool.speed_prior_sd()).fit(x_obs, y_obs)
        phase_model = self._fit_phase_model(runs)

        def predict(block: Block) -> tuple[np.ndarray, np.ndarray]:
            mean, sd = model.predict(block.x)
            if phase_model is not None:
                has = np.isfinite(block.phases).all(axis=1) & np.isfinite(block.prior)
                if has.any():
                    ratio, ratio_sd = phase_model.predict(block.x[has], block.phases[has])
                    mean, sd = mean.copy(), sd.copy()
                    mean[has], sd[has] = -ratio, ratio_sd  # throughput ∝ 1 / step time
            return np.log(np.where(np.isnan(block.prior), fallback, block.prior)) + mean, sd

        return predict

    def _exploit(
        self,
        runs: Sequence[TrialResult],
        history: Sequence[TrialResult],
        visited: set[str],
        score: Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
        best: float | None,
    ) -> tuple[ScoredProposal, str] | None:
        """A move that overrides the schedule, screening included (none here: a subclass that trusts
        a model may exploit it)."""
        return None

    def _decide(
        self,
        history: Sequence[TrialResult],
        visited: set[str],
        budget_left: int | None = None,
        explore_only: bool = False,
    ) -> _Analysis:
        k = len(self.pool.encoder().slots)
        runs = launched(history)
        best = self._best(history)
        speed = self._speed(runs)
        failure = self._failure_model(runs)
        aversion = self._aversion(runs)

        def score(
            block: Block, load: np.ndarray, fm: FailureModel = failure
        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
            mean_log, sd = speed(block)
            p_other = fm.predict(block.codes)
            p_mem = (
                fm.memory_risk(load, self.settings.headroom_limit)
                if self.collab.memory_load is not None
                else 0.0
            )
            p_ok = (1.0 - p_mem) * (1.0 - p_other)
            gain = (
                expected_gain(mean_log, sd, best) if best is not None else np.exp(mean_log - mean_log.max())
            )
            choice = gain * (1.0 - p_mem) ** self.settings.risk_aversion * (1.0 - p_other) ** aversion
            return choice, gain * p_ok, mean_log, p_ok

        incumbent = self._incumbent(history)
        screen = (
            None
            if explore_only
            else self._exploit(runs, history, visited, score, best)
            or self._screen(runs, history, visited, budget_left, score, best)
        )

        def finish(proposal: ScoredProposal | None, mode: str) -> _Analysis:
            if proposal is None:
                return _Analysis(None, best)
            move = move_from(incumbent.params, proposal.params) if incumbent is not None else {}
            return _Analysis(
                replace(proposal, mode=mode, incumbent=incumbent.number if incumbent else None, move=move),
                best,
            )

        if screen is not None:
            return finish(*screen)
        chosen: tuple[ScoredProposal, str] | None = None
        # refinement: the best one- or two-knob change of the incumbent, when the schedule says so
        if not explore_only and incumbent is not None and self._wants_refine(runs, budget_left):
            proposal = self._best_of(
                Block.of(self._around(incumbent.params, visited), k), score, history, best
            )
            if proposal is not None:
                chosen = (proposal, "refine")

        base = self.pool.base()
        block = base.select([c.key not in visited for c in base.cands])
        # large spaces: add the one-knob neighbours of the most promising candidates and of the best runs
        if self.size() > self.settings.full_grid_limit and block.cands:
            seen = visited | {c.key for c in block.cands}
            anchors = [
                r.params for r in sorted(runs, key=lambda r: -(r.throughput or 0.0)) if self.collab.usable(r)
            ][:3]
            for _ in range(2):
                first, _, _, _ = score(block, self.pool.first_load(block.cands))
                top = [block.cands[i].params for i in np.argsort(-first, kind="stable")[:8]]
                extra: list[Candidate] = []
                for params in [*anchors, *top]:
                    for nb in neighbours(self.space, params):
                        nb_key = canonical_key(nb)
                        if nb_key not in seen:
                            seen.add(nb_key)
                            cand = self.pool.cand(nb, nb_key)
                            if cand.valid:
                                extra.append(cand)
                anchors = []
                if not extra:
                    break
                block = block.concat(Block.of(extra, k))
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

    def _probe(
        self,
        runs: Sequence[TrialResult],
        history: Sequence[TrialResult],
        incumbent: TrialResult,
        visited: set[str],
        block: Block,
        failure: FailureModel,
        score: Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
        current: float,
    ) -> ScoredProposal | None:
        """A one-knob move of the incumbent onto a suspect value, when testing it is worth more than
        ``current`` (the expected gain of the schedule's own move); None otherwise."""
        enc = self.pool.encoder()
        suspects = {
            (j, int(f[j]))
            for f, w_single, _ in failure.causes
            for j in np.flatnonzero(w_single >= self.settings.suspect_weight)
        }
        if not suspects:
            return None
        probes: list[Candidate] = []
        for nb in neighbours(self.space, incumbent.params):
            key = canonical_key(nb)
            if key in visited:
                continue
            cand = self.pool.cand(nb, key)
            if cand.valid and any(cand.codes[j] == code for j, code in suspects):
                probes.append(cand)
        if not probes:
            return None
        pblock = Block.of(probes, len(enc.slots))
        _, p_gain, p_mean, p_ok = score(pblock, self.pool.fresh_load(pblock.cands))
        load = self.pool.first_load(block.cands)
        now = float(score(block, load)[1].max())
        best_value, best_i = current, None
        for i in np.argsort(-p_ok, kind="stable")[: self.settings.max_probes]:
            params = probes[i].params
            if infer_infeasible(self.space, params, history) is not None or not self.collab.feasible(params):
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
        return ScoredProposal(
            params=dict(cand.params),
            predicted_throughput=float(math.exp(p_mean[best_i])),
            expected_gain_frac=best_value,
            failure_risk=float(1.0 - p_ok[best_i]),
            suspect=", ".join(names),
        )

    def _best_of(
        self,
        block: Block,
        score: Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
        history: Sequence[TrialResult],
        best: float | None,
    ) -> ScoredProposal | None:
        """The best-scoring candidate of ``block`` that passes the pre-check: ranked on the first
        memory loads, then picked shortlist by shortlist with fresh ones (:meth:`_pick`)."""
        if not block.cands:
            return None
        first, _, _, _ = score(block, self.pool.first_load(block.cands))
        order = np.argsort(-first, kind="stable")
        for start in range(0, len(order), self.settings.shortlist_size):
            proposal = self._pick(
                block.take(order[start : start + self.settings.shortlist_size]), score, history, best
            )
            if proposal is not None:
                return proposal
        return None

    def _pick(
        self,
        short: Block,
        score: Callable[[Block, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
        history: Sequence[TrialResult],
        best: float | None,
    ) -> ScoredProposal | None:
        """The best-scoring candidate of a shortlist (memory loads fresh) that passes the pre-check."""
        final, gain_ok, mean_log, p_ok = score(short, self.pool.fresh_load(short.cands))
        for i in np.argsort(-final, kind="stable"):
            cand = short.cands[i]
            if infer_infeasible(self.space, cand.params, history) is not None or not self.collab.feasible(
                cand.params
            ):
                continue
            return ScoredProposal(
                params=dict(cand.params),
                predicted_throughput=float(math.exp(mean_log[i])),
                expected_gain_frac=float(gain_ok[i]) if best is not None else None,
                failure_risk=float(1.0 - p_ok[i]),
            )
        return None
