"""Conformance suite run against every search strategy: the contract of
:class:`autotune.strategy.BaseStrategy`, checked on a simulated study (no Optuna, no processes).

A strategy is driven the way the study loop drives it (:mod:`autotune.study.loop`): the baseline runs
first; then, before every trial, ``converged`` and ``propose``; a :class:`~autotune.strategy.Proposal`
runs, ``None`` hands the trial to the sampler (here its stand-in, ``next_unvisited``, the loop's own
fallback), :class:`~autotune.strategy.Exhausted` ends the run; every result goes to ``after_trial``.
The simulated world has a static rule, a memory gate, out-of-memory failures the sound inference
learns from, hangs, and an estimator that is not the truth.

Checks, at every decision of the run (:data:`CHECKS`):

- never repeats: no proposal is a configuration already tried;
- never known-infeasible: no proposal breaks the static rule, is refused by the memory gate, or needs
  at least the memory of a configuration that ran out of it (:func:`autotune.strategy.infer_infeasible`);
  a strategy that covers the space (``covers_space``: the grid) must instead propose every one;
- pending-aware: with the proposal running on another worker (``Pending.running``), the strategy
  proposes something else, not visited either;
- resumes: a fresh strategy with the same seed and history (in any order) proposes the same
  configuration for the same reason, and ``explain`` changes nothing ``propose`` answers next.

A test module calls :func:`run_check` with a factory that builds the strategy under test.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.records import SteadyEstimate, TrialResult, TrialStatus
from autotune.space import SearchSpace, canonical_key, load_space
from autotune.strategy import (
    BaseStrategy,
    Collaborators,
    Exhausted,
    Pending,
    Proposal,
    infer_infeasible,
)

__all__ = ["CHECKS", "SPACE", "Factory", "World", "make_space", "run_check"]

SPACE = """
knobs:
  batch: {type: int, choices: [1, 2, 4, 8, 16], default: 1, memory: increasing}
  checkpointing: {type: bool, default: true, memory: decreasing}
  zero: {type: int, choices: [0, 2, 3], default: 0, memory: decreasing}
  offload: {type: bool, default: false, when: {zero: [2, 3]}, memory: decreasing}
  workers: {type: int, choices: [0, 2], default: 0}
"""
TRIALS = 14

#: builds the strategy under test: (space, collaborators, seed) → strategy
Factory = Callable[[SearchSpace, Collaborators, int], BaseStrategy]


def make_space(tmp_path: Path) -> SearchSpace:
    path = tmp_path / "conformance_space.yaml"
    path.write_text(SPACE)
    return load_space(path)


def _speed(p: Mapping[str, Any]) -> float:
    """The truth: bigger batches faster, checkpointing and offload cost, ZeRO-3 slower, workers help."""
    tp = p["batch"] ** 0.5 * (0.8 if p["checkpointing"] else 1.0) * (0.9 if p["zero"] == 3 else 1.0)
    return tp * (0.6 if p.get("offload") else 1.0) * (1.15 if p["workers"] == 2 else 1.0)


def valid(p: Mapping[str, Any]) -> bool:
    """The framework's static rule: a dataloader worker needs more than one sample per batch."""
    return not (p["workers"] == 2 and p["batch"] == 1)


def gate(p: Mapping[str, Any]) -> bool:
    """The memory gate: the largest batch without ZeRO or checkpointing is predicted not to fit."""
    return not (p["batch"] == 16 and p["zero"] == 0 and not p["checkpointing"])


@dataclass
class World:
    """A simulated study: the truth, the pre-checks the study lends, and the history so far."""

    space: SearchSpace
    history: list[TrialResult] = field(default_factory=list)

    def truth(self, p: Mapping[str, Any]) -> tuple[TrialStatus, float | None]:
        if p["batch"] >= 8 and not p["checkpointing"] and p["zero"] == 0:
            return TrialStatus.OOM, None
        if p["workers"] == 2 and p["zero"] == 3:
            return TrialStatus.HANG, None
        return TrialStatus.COMPLETE, _speed(p)

    def known_infeasible(self, p: Mapping[str, Any]) -> str | None:
        """Why the study would refuse ``p`` before launching it, or None."""
        if not valid(p):
            return "breaks the static rule"
        if not gate(p):
            return "refused by the memory gate"
        inferred = infer_infeasible(self.space, p, self.history)
        return f"inferred: {inferred.reason}" if inferred is not None else None

    def collaborators(self) -> Collaborators:
        """What the study lends a strategy; ``feasible`` reads the history as it grows."""
        return Collaborators(
            rank=lambda p: _speed(p) * (1.25 if p["zero"] == 3 else 1.0),  # an estimator that is off
            valid=valid,
            feasible=lambda p: self.known_infeasible(p) is None,
        )

    def record(self, p: Mapping[str, Any], strategy: BaseStrategy, choice: Mapping[str, Any]) -> None:
        status, tp = self.truth(p)
        steady = (
            SteadyEstimate(step_time_s=1 / tp, rel_ci95=0.01, steady_steps=4, warmup_steps=1, throughput=tp)
            if tp
            else None
        )
        result = TrialResult(
            number=len(self.history),
            params=dict(p),
            status=status,
            reason=status.value.lower(),
            steps=5 if steady else 0,
            steady=steady,
            gpu_seconds=60.0,
            is_baseline=not self.history,
            choice=dict(choice),
        )
        self.history.append(result)
        strategy.after_trial(result)


@dataclass(frozen=True)
class Decision:
    """What the strategy answered at one point of the run, with what it saw."""

    history: tuple[TrialResult, ...]
    pending: Pending
    answer: Proposal | Exhausted | None
    drawn: dict[str, Any] | None = None  # what the sampler's stand-in ran after a None


def simulate(make: Factory, space: SearchSpace, seed: int = 3) -> tuple[World, list[Decision]]:
    """Drive a strategy through a simulated study as the loop does; every decision it made."""
    world = World(space)
    strategy = make(space, world.collaborators(), seed)
    world.record(space.defaults(), strategy, {"mode": "baseline"})
    decisions: list[Decision] = []
    while len(world.history) < TRIALS:
        pending = Pending.of(world.history, trials_left=TRIALS - len(world.history))
        if strategy.converged(world.history, pending):
            break
        seen = tuple(world.history)
        answer = strategy.propose(world.history, pending)
        if isinstance(answer, Proposal):
            decisions.append(Decision(seen, pending, answer))
            world.record(answer.params, strategy, answer.choice())
            continue
        drawn = None if isinstance(answer, Exhausted) else strategy.next_unvisited(pending.visited)
        decisions.append(Decision(seen, pending, answer, drawn))
        if drawn is None:
            break
        world.record(drawn, strategy, strategy.unexplained_choice(queued=False))
    return world, decisions


def _proposals(decisions: list[Decision]) -> list[tuple[Decision, Proposal]]:
    return [(d, d.answer) for d in decisions if isinstance(d.answer, Proposal)]


def _chosen(decisions: list[Decision]) -> list[tuple[Decision, dict[str, Any]]]:
    """Every configuration the strategy chose: its proposals and its fallback's draws."""
    out = [(d, d.answer.params) for d, _ in _proposals(decisions) if isinstance(d.answer, Proposal)]
    return out + [(d, d.drawn) for d in decisions if d.drawn is not None]


def check_never_repeats(make: Factory, space: SearchSpace) -> None:
    world, decisions = simulate(make, space)
    for d, params in _chosen(decisions):
        assert canonical_key(params) not in d.pending.visited, f"chose {params}, already tried"
    keys = [canonical_key(r.params) for r in world.history]
    assert len(keys) == len(set(keys)), "a configuration ran twice"
    assert len(world.history) > 1, "the run never got past the baseline"


def check_never_known_infeasible(make: Factory, space: SearchSpace) -> None:
    """(A strategy that covers the space proposes every configuration, refused or not: the study prunes
    and records them. Its draws are checked like every other strategy's.)"""
    world, decisions = simulate(make, space)
    covers = make(space, world.collaborators(), 3).covers_space
    for d, params in _chosen(decisions):
        if covers and d.drawn is None:
            continue
        why = World(space, list(d.history)).known_infeasible(params)
        assert why is None, f"chose {params} after {len(d.history)} trials: {why}"
    assert _chosen(decisions), "the strategy chose nothing: the check would be empty"
    if covers:
        ran = {canonical_key(r.params) for r in world.history}
        grid = [canonical_key(p) for p in space.grid()]
        assert [k for k in grid if k in ran] == grid[: len([k for k in grid if k in ran])], (
            "a strategy that covers the space skipped a configuration"
        )


def check_respects_pending(make: Factory, space: SearchSpace) -> None:
    _, decisions = simulate(make, space)
    for d, params in _chosen(decisions):
        elsewhere = Pending.of(d.history, d.pending.trials_left, running={canonical_key(params)})
        fresh = make(space, World(space, list(d.history)).collaborators(), 3)
        again = fresh.propose(list(d.history), elsewhere)
        if not isinstance(again, Proposal | Exhausted):
            again = None if d.drawn is None else _drawn(fresh.next_unvisited(elsewhere.visited))
        if isinstance(again, Proposal):
            assert canonical_key(again.params) not in elsewhere.visited, (
                f"chose {again.params}, which another worker is running or that was tried"
            )


def _drawn(params: dict[str, Any] | None) -> Proposal | None:
    return Proposal(params, mode="sampler") if params is not None else None


def check_resumes(make: Factory, space: SearchSpace) -> None:
    _, decisions = simulate(make, space)
    for d in decisions:
        history = list(d.history)
        fresh = make(space, World(space, history).collaborators(), 3)
        fresh.explain(history, d.pending)  # explaining first changes nothing
        again = fresh.propose(list(reversed(history)), d.pending)
        assert _same(again, d.answer), f"after {len(history)} trials: {again} instead of {d.answer}"


def _same(a: Proposal | Exhausted | None, b: Proposal | Exhausted | None) -> bool:
    if isinstance(a, Proposal) and isinstance(b, Proposal):
        return canonical_key(a.params) == canonical_key(b.params) and a.choice() == b.choice()
    return a == b


CHECKS: dict[str, Callable[[Factory, SearchSpace], None]] = {
    "never_repeats": check_never_repeats,
    "never_known_infeasible": check_never_known_infeasible,
    "respects_pending": check_respects_pending,
    "resumes": check_resumes,
}


def run_check(name: str, make: Factory, space: SearchSpace) -> None:
    """Run one check of :data:`CHECKS` against the strategy ``make`` builds."""
    CHECKS[name](make, space)
