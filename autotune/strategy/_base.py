"""The contract every search strategy keeps: :class:`BaseStrategy`, and what crosses it.

A strategy decides which configuration the study runs next and when the search may stop; it never
runs anything. The study loop (:mod:`autotune.study.loop`) is its only caller and reaches it through
this contract alone, so strategies are added beside each other (``_registry.py``) and compared on the
same bench, never told apart by a name inside the loop.
"""

from __future__ import annotations

import abc
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import optuna

from autotune.records import TrialResult, TrialStatus
from autotune.space import SearchSpace, canonical_key
from autotune.strategy._candidates import count_configs, random_config

__all__ = [
    "BaseStrategy",
    "Collaborators",
    "EXHAUSTED",
    "Exhausted",
    "Pending",
    "Proposal",
    "StrategySettings",
    "launched",
    "usable_complete",
]

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


def usable_complete(result: TrialResult) -> bool:
    """The default test of a result that may be recommended: complete, with a throughput."""
    return result.status is TrialStatus.COMPLETE and bool(result.throughput)


@dataclass(frozen=True)
class Proposal:
    """A configuration a strategy wants run next, and why.

    Attributes:
        params: the configuration.
        mode: the kind of move, as the report's "chosen because" column shows it (``grid``,
            ``sweep``, ``explore``, ``refine``, ``probe``, ...).
    """

    params: dict[str, Any]
    mode: str

    def choice(self) -> dict[str, Any]:
        """Why this configuration was chosen, as stored with its trial (``TrialResult.choice``)."""
        return {"mode": self.mode}


@dataclass(frozen=True)
class Exhausted:
    """What :meth:`BaseStrategy.propose` returns when the strategy has nothing left to run: the study
    stops (``exhausted``) with ``detail`` as its reason."""

    detail: str


#: the reason of a strategy that has run every configuration of its space
EXHAUSTED = "every configuration of the space has been tried"


@dataclass(frozen=True)
class Pending:
    """What the study has in flight or spent when it asks, beside the finished history.

    Attributes:
        visited: canonical keys of every configuration tried (interrupted ones excepted) or running on
            any worker of the study: a strategy never proposes one of them.
        running: the configurations other workers of a shared study are running now (a subset of
            ``visited``; their results are not in the history yet).
        trials_left: launched trials the budget still allows (None: unknown, e.g. a time budget only).
    """

    visited: frozenset[str]
    running: frozenset[str] = frozenset()
    trials_left: int | None = None

    @classmethod
    def of(
        cls, history: Iterable[TrialResult], trials_left: int | None = None, running: Iterable[str] = ()
    ) -> Pending:
        """What a study with ``history`` (and ``running`` configurations elsewhere) has visited."""
        run = frozenset(running)
        tried = {canonical_key(r.params) for r in history if r.status is not TrialStatus.INTERRUPTED}
        return cls(visited=frozenset(tried) | run, running=run, trials_left=trials_left)


@dataclass(frozen=True)
class Collaborators:
    """What the study lends a strategy: the pre-checks and the estimator's predictions.

    Attributes:
        rank: the estimator's predicted throughput of a configuration, or None when unknown.
        phase_prior: the estimator's seconds per step of each phase (``rollout``, ``train``,
            ``weight_sync``, ``other``) for a configuration, or None.
        valid: the framework's static validity rules (the same answer for the whole study).
        feasible: the cheap pre-check a candidate must pass before it is proposed (validity rules, OOM
            inference, memory gate: it may change as the study learns).
        memory_load: predicted peak ÷ capacity (calibrated; above 1 when vLLM's checks fail), or None.
        usable: whether a result may be recommended (complete, enough headroom).
        ceiling_throughput: the most completions/s any run of a configuration could reach on these
            GPUs (the job's batch over the physical ceiling of its step: peak FLOP/s and bandwidth, not
            the estimator's speed model), or None when unknown: a bound a stop may rest on.
    """

    rank: Callable[[Mapping[str, Any]], float | None] | None = None
    phase_prior: Callable[[Mapping[str, Any]], Mapping[str, float] | None] | None = None
    valid: Callable[[Mapping[str, Any]], bool] = field(default=lambda _p: True)
    feasible: Callable[[Mapping[str, Any]], bool] = field(default=lambda _p: True)
    memory_load: Callable[[Mapping[str, Any]], float | None] | None = None
    usable: Callable[[TrialResult], bool] = usable_complete
    ceiling_throughput: Callable[[Mapping[str, Any]], float | None] | None = None


@dataclass(frozen=True)
class StrategySettings:
    """Settings every strategy has.

    Attributes:
        full_grid_limit: spaces up to this size are enumerated in full; larger ones are sampled.
    """

    full_grid_limit: int = 5_000


class BaseStrategy(abc.ABC):
    """Decides what the study tries next and when it may stop. Collaborators are passed in; a strategy
    never runs anything.

    Lifecycle (who calls what, when):

    1. The study builds the strategy once per run of the loop (a resumed study builds a new one) and
       opens its Optuna study with :meth:`sampler`. The baseline, and configurations an interrupted
       run left unfinished, are queued by the study itself before the strategy is asked anything.
    2. Before each trial, with nothing queued and the baseline done, the study calls
       :meth:`converged`; unless it returns a reason, :meth:`propose`. A :class:`Proposal` is queued
       and runs next (its :meth:`Proposal.choice` is stored with the trial); ``None`` leaves the
       trial to :meth:`sampler`; :class:`Exhausted` ends the study.
    3. After each trial the study records (this worker's, another worker's taken in from the
       storage, and at resume every stored one), it calls :meth:`after_trial`.
    4. When the sampler keeps drawing configurations already tried, the study calls
       :meth:`next_unvisited` for one that was not.

    What must hold:

    - **Determinism and resume.** Every decision is a function of the seed, the history and the
      collaborators' answers: the same history and seed give the same next proposal, in a fresh
      strategy (a resumed study) as in the one that saw the trials arrive. State kept between calls
      is a cache of that, never a fact the history lacks (``after_trial`` may warm a cache only).
    - **Never twice, never known-infeasible.** :meth:`propose` never returns a configuration in
      ``pending.visited`` (which holds other workers' running trials: pending-aware) nor one the
      ``feasible`` pre-check refuses when a feasible one is left; a strategy that sets
      :attr:`covers_space` (the grid) proposes the refused ones too, so that the study records each
      refusal (a PRUNED trial, never launched).
    - **Threads.** One strategy serves one worker; workers of one process each build their own (their
      seeds differ), so a strategy needs no lock. Other workers' trials reach it only through the
      history and ``pending``.
    - **Side effects.** :meth:`explain` and :meth:`converged` change nothing :meth:`propose` returns.

    Args:
        space: the search space (already restricted to this machine).
        collaborators: the pre-checks and predictions the study lends (:class:`Collaborators`).
        seed: seed of every random choice.
        settings: the strategy's own frozen settings (its ``Settings`` class; the defaults when None).
    """

    #: the frozen dataclass of this strategy's settings
    Settings: type[StrategySettings] = StrategySettings
    #: proposes every configuration of the space, those the pre-check refuses included (the study
    #: prunes them before launch and records why)
    covers_space: ClassVar[bool] = False
    #: configurations in a row refused before launch after which the study queues one that passes the
    #: pre-check, and :attr:`~autotune.study.config.StudyConfig.max_refused_in_a_row` of which stop it: for
    #: a strategy that leaves Optuna's sampler drawing when it has nothing to propose, each draw after a
    #: whole decision (``auto``). None: refusals are the strategy's own business (a sampler that learns
    #: from them, a grid that records each one).
    requeue_after_refusals: ClassVar[int | None] = None

    def __init__(
        self,
        space: SearchSpace,
        collaborators: Collaborators | None = None,
        *,
        seed: int = 0,
        settings: StrategySettings | None = None,
    ) -> None:
        self.space = space
        self.seed = seed
        self.collab = collaborators or Collaborators()
        self.settings = settings if settings is not None else self.Settings()
        self._rng = random.Random(seed)
        self._grid: list[dict[str, Any]] | None = None
        self._size: int | None = None

    # -- the contract --------------------------------------------------------------------------
    @abc.abstractmethod
    def propose(self, history: Sequence[TrialResult], pending: Pending) -> Proposal | Exhausted | None:
        """The configuration to run next (with why), None to let :meth:`sampler` choose, or
        :class:`Exhausted` when nothing is left."""

    def explain(self, history: Sequence[TrialResult], pending: Pending) -> Proposal | None:
        """The proposal :meth:`propose` would make now, with its reasons (None when the sampler would
        choose); changes nothing."""
        proposal = self.propose(history, pending)
        return proposal if isinstance(proposal, Proposal) else None

    def converged(self, history: Sequence[TrialResult], pending: Pending) -> str | None:
        """A one-line reason to stop before the budget, or None to go on (the default: never early)."""
        return None

    def after_trial(self, result: TrialResult) -> None:  # noqa: B027 - a hook: most strategies need none
        """A trial's result was recorded (see the lifecycle); the default does nothing."""

    def sampler(self, *, parallel: bool = False) -> optuna.samplers.BaseSampler:
        """The Optuna sampler of the trials this strategy leaves to Optuna (the default: random).

        ``parallel``: other workers run trials of the same study at the same time.
        """
        return optuna.samplers.RandomSampler(seed=self.seed)

    def unexplained_choice(self, queued: bool) -> dict[str, Any]:
        """Why a trial ran that this strategy did not propose: re-run after an interruption or queued
        after duplicates (``queued``), else drawn by the sampler."""
        return {"mode": "requeued" if queued else "sampler"}

    # -- the space -----------------------------------------------------------------------------
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

    def next_unvisited(self, visited: set[str] | frozenset[str]) -> dict[str, Any] | None:
        """A configuration not run yet: a random one passing the pre-check (any unvisited one when none
        passes), None when every configuration was visited."""
        feasible_ = self.collab.feasible
        if self.size() > self.settings.full_grid_limit:
            fallback = None
            for _ in range(2_000):
                params = random_config(self.space, self._rng)
                if canonical_key(params) in visited:
                    continue
                if feasible_(params):
                    return params
                fallback = fallback or params
            if fallback is not None:
                return fallback
        candidates = [p for p in self.grid() if canonical_key(p) not in visited]
        if not candidates:
            return None
        feasible = [p for p in candidates if feasible_(p)]
        return self._rng.choice(feasible or candidates)
