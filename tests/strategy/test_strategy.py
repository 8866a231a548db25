"""The search strategy driven directly: proposals, what failures teach it, stopping, determinism.

Tests of the exploitation phase's own rules (the first choice by the prior, what a failure teaches it,
patience, aversion, probes) build the strategy without its screening phase (``screening=None``); the
screening phase has tests of its own (``test_screening.py``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import pytest

from autotune.errors import UsageError
from autotune.records import SteadyEstimate, TrialResult, TrialStatus
from autotune.space import SearchSpace, canonical_key, load_space
from autotune.strategy import (
    AutoSettings,
    AutoStrategy,
    BaseStrategy,
    Collaborators,
    Exhausted,
    GridStrategy,
    Pending,
    Proposal,
    RandomStrategy,
    TPEStrategy,
    build_strategy,
    launched,
)

SPACE = """
knobs:
  batch: {type: int, choices: [1, 2, 4, 8, 16], default: 1, memory: increasing}
  checkpointing: {type: bool, default: true, memory: decreasing}
  zero: {type: int, choices: [0, 2, 3], default: 0, memory: decreasing}
  offload: {type: bool, default: false, when: {zero: [2, 3]}, memory: decreasing}
  workers: {type: int, choices: [0, 2], default: 0}
"""


@pytest.fixture
def space(tmp_path: Path) -> SearchSpace:
    p = tmp_path / "s.yaml"
    p.write_text(SPACE)
    return load_space(p)


def predicted(p: dict[str, Any]) -> float:
    """The estimator: bigger batches faster, checkpointing and offload cost, ZeRO-3 slightly slower."""
    tp = p["batch"] ** 0.5 * (0.8 if p["checkpointing"] else 1.0) * (0.97 if p["zero"] == 3 else 1.0)
    return tp * (0.6 if p.get("offload") else 1.0)


def result(
    number: int, p: dict[str, Any], status: TrialStatus, throughput: float | None = None
) -> TrialResult:
    steady = None
    if throughput is not None:
        steady = SteadyEstimate(
            step_time_s=1 / throughput, rel_ci95=0.01, steady_steps=4, warmup_steps=1, throughput=throughput
        )
    return TrialResult(
        number=number,
        params=p,
        status=status,
        reason=status.value.lower(),
        steps=5 if steady else 0,
        steady=steady,
    )


def auto(
    space: SearchSpace,
    *,
    seed: int = 0,
    rank: Callable[[dict[str, Any]], float] | None = None,
    feasible: Callable[[dict[str, Any]], bool] | None = None,
    **settings: Any,
) -> AutoStrategy:
    """The auto strategy with an estimator (``rank``), a pre-check and settings."""
    collab = Collaborators(rank=rank, **({"feasible": feasible} if feasible is not None else {}))
    return AutoStrategy(space, collab, seed=seed, settings=AutoSettings(**settings))


def at(visited: set[str], trials_left: int | None = None) -> Pending:
    return Pending(visited=frozenset(visited), trials_left=trials_left)


def drive(
    strategy: BaseStrategy, truth: Callable[[dict[str, Any]], tuple[TrialStatus, float | None]], n: int
) -> list[TrialResult]:
    """Run ``n`` proposals against a truth function (the study loop without Optuna)."""
    history: list[TrialResult] = []
    for number in range(n):
        visited = {canonical_key(r.params) for r in history}
        proposal = strategy.propose(history, at(visited))
        if not isinstance(proposal, Proposal):
            break
        status, tp = truth(proposal.params)
        history.append(result(number, proposal.params, status, tp))
    return history


def test_first_proposal_is_the_predicted_fastest_feasible(space: SearchSpace) -> None:
    infeasible = {canonical_key(p) for p in space.grid() if p["batch"] == 16 and not p["checkpointing"]}
    s = auto(
        space, seed=1, rank=predicted, feasible=lambda p: canonical_key(p) not in infeasible, screening=None
    )
    proposal = s.propose([], at(set()))
    assert isinstance(proposal, Proposal)
    first = proposal.params
    assert canonical_key(first) not in infeasible
    best = max((p for p in space.grid() if canonical_key(p) not in infeasible), key=predicted)
    assert predicted(first) == pytest.approx(predicted(best))


def test_never_proposes_a_visited_or_infeasible_configuration(space: SearchSpace) -> None:
    feasible = lambda p: p["batch"] <= 8  # noqa: E731
    s = auto(space, seed=2, rank=predicted, feasible=feasible, stop_gain_frac=0.0)
    history = drive(s, lambda p: (TrialStatus.COMPLETE, predicted(p) * (1.1 if p["workers"] else 1.0)), 25)
    keys = [canonical_key(r.params) for r in history]
    assert len(keys) == len(set(keys)) == 25
    assert all(feasible(r.params) for r in history)


def test_a_value_that_always_fails_is_learned_and_the_best_working_one_found(space: SearchSpace) -> None:
    # the estimator likes workers=2 (30 % faster, it says); in truth every configuration with it hangs
    rank = lambda p: predicted(p) * (1.3 if p["workers"] == 2 else 1.0)  # noqa: E731

    def truth(p: dict[str, Any]) -> tuple[TrialStatus, float | None]:
        return (TrialStatus.HANG, None) if p["workers"] == 2 else (TrialStatus.COMPLETE, predicted(p))

    s = auto(space, seed=3, rank=rank, stop_gain_frac=0.0, screening=None)
    history = drive(s, truth, 12)
    assert history[0].params["workers"] == 2  # the prior's favourite is tried first ...
    hangs = [r for r in history if r.status is TrialStatus.HANG]
    assert len(hangs) <= 5  # ... failures count as infeasible, not as slow, and the value is learned
    best_working = max(predicted(p) for p in space.grid() if p["workers"] == 0)
    assert max(r.throughput or 0.0 for r in history) == pytest.approx(best_working)
    # the model knows: an untried configuration with workers=2 is now predicted to fail
    proposal = s.explain(history, at({canonical_key(r.params) for r in history}))
    assert proposal is not None
    untried = [
        p
        for p in space.grid()
        if p["workers"] == 2 and canonical_key(p) not in {canonical_key(r.params) for r in history}
    ]
    assert s.failure_risk(history, untried) > 0.6


def test_failures_are_infeasible_not_slow(space: SearchSpace) -> None:
    """A failure says nothing about speed: the speed model only learns from measured throughput."""

    def truth(p: dict[str, Any]) -> tuple[TrialStatus, float | None]:
        if p["batch"] == 16:
            return TrialStatus.OOM, None
        return TrialStatus.COMPLETE, predicted(p)

    s = auto(space, seed=4, rank=predicted, stop_gain_frac=0.0)
    history = drive(s, truth, 6)
    # OOMs did not drag the predicted throughput of their neighbours below what was measured
    proposal = s.explain(history, at({canonical_key(r.params) for r in history}))
    assert proposal is not None and proposal.predicted_throughput is not None
    completed = [r for r in history if r.status is TrialStatus.COMPLETE]
    assert completed and proposal.predicted_throughput > 0.5 * max(r.throughput or 0 for r in completed)


def test_stopping_waits_for_enough_trials_then_says_why(space: SearchSpace) -> None:
    s = auto(space, seed=5, rank=predicted, min_trials=6, patience=4)
    history = drive(s, lambda p: (TrialStatus.COMPLETE, predicted(p)), 5)
    assert s.converged(history, Pending.of(history, 10)) is None  # fewer than min_trials
    # a truth exactly as predicted: the model soon expects too little from untried configurations
    reasons = []
    for n in range(6, 30):
        history = drive(
            auto(space, seed=5, rank=predicted, min_trials=6, patience=4),
            lambda p: (TrialStatus.COMPLETE, predicted(p)),
            n,
        )
        reason = auto(space, seed=5, rank=predicted, min_trials=6, patience=4).converged(
            history, Pending.of(history, 30 - n)
        )
        if reason:
            reasons.append((n, reason))
            break
    assert reasons, "never converged on a surface that matches the estimator"
    assert "unlikely to gain more" in reasons[0][1]
    assert (
        auto(space, seed=5, rank=predicted, min_trials=6).converged(history, Pending.of(history, 0)) is None
    )  # no budget left


def test_patience_counts_only_trials_that_ran(space: SearchSpace) -> None:
    s = auto(space, seed=6, rank=predicted, min_trials=2, patience=3, stop_gain_frac=0.0, screening=None)
    grid = list(space.grid())
    history = [result(0, grid[0], TrialStatus.COMPLETE, 1.0)]
    history += [result(i, grid[i], TrialStatus.HANG) for i in range(1, 6)]
    assert s.converged(history, Pending.of(history, 10)) is None  # five failures in a row are not "no gain"
    history += [result(i, grid[i], TrialStatus.COMPLETE, 0.9) for i in range(6, 9)]
    reason = s.converged(history, Pending.of(history, 10))
    assert reason is not None and "last 3 trials that ran" in reason


def test_same_history_same_proposal(space: SearchSpace) -> None:
    history = drive(
        auto(space, seed=7, rank=predicted), lambda p: (TrialStatus.COMPLETE, predicted(p) * 0.9), 5
    )
    visited = {canonical_key(r.params) for r in history}
    a = auto(space, seed=7, rank=predicted).propose(history, at(visited))
    b = auto(space, seed=7, rank=predicted).propose(list(reversed(history)), at(visited))
    assert isinstance(a, Proposal) and isinstance(b, Proposal)
    assert canonical_key(a.params) == canonical_key(b.params)


def test_large_spaces_are_sampled_not_enumerated(space: SearchSpace) -> None:
    s = auto(space, seed=8, rank=predicted, full_grid_limit=5, pool_size=8, stop_gain_frac=0.0)
    assert s.size() == len(list(space.grid())) > 5
    history = drive(s, lambda p: (TrialStatus.COMPLETE, predicted(p)), 12)
    keys = {canonical_key(p) for p in space.grid()}
    assert len(history) == 12 and all(canonical_key(r.params) in keys for r in history)
    assert len({canonical_key(r.params) for r in history}) == 12
    # neighbours of the best runs are explored: the sampled pool alone has only 8 configurations
    best = max(history, key=lambda r: r.throughput or 0)
    assert predicted(best.params) >= 0.9 * max(predicted(p) for p in space.grid())


def test_grid_walks_the_space_in_order_and_ends(space: SearchSpace) -> None:
    s = GridStrategy(space)
    grid = list(space.grid())
    visited: set[str] = set()
    seen = []
    while isinstance(p := s.propose([], at(visited)), Proposal):
        seen.append(p.params)
        visited.add(canonical_key(p.params))
    assert seen == grid
    assert isinstance(p, Exhausted) and "every configuration" in p.detail


def test_random_and_tpe_leave_the_choice_to_optuna(space: SearchSpace) -> None:
    assert RandomStrategy(space).propose([], at(set())) is None
    assert isinstance(RandomStrategy(space).sampler(), optuna.samplers.RandomSampler)
    assert TPEStrategy(space).propose([], at(set())) is None
    assert isinstance(TPEStrategy(space).sampler(), optuna.samplers.TPESampler)
    assert RandomStrategy(space).converged([], at(set(), 5)) is None


def test_unknown_kind_is_a_usage_error(space: SearchSpace) -> None:
    with pytest.raises(UsageError, match="unknown search"):
        build_strategy("bayes", space)


def test_launched_ignores_pruned_and_interrupted(space: SearchSpace) -> None:
    grid = list(space.grid())
    history = [
        result(2, grid[2], TrialStatus.COMPLETE, 1.0),
        result(0, grid[0], TrialStatus.PRUNED),
        TrialResult(number=1, params=grid[1], status=TrialStatus.PRUNED, reason="slower", steps=3),
        result(3, grid[3], TrialStatus.INTERRUPTED),
    ]
    assert [r.number for r in launched(history)] == [1, 2]


def test_failed_gpu_time_makes_the_choice_more_risk_averse(space: SearchSpace) -> None:
    # the baseline ran; a hang shares "no checkpointing" with the fastest untried candidates
    baseline = {"batch": 1, "checkpointing": True, "zero": 0, "workers": 0}
    hung = {"batch": 16, "checkpointing": False, "zero": 0, "workers": 2}

    def proposal(hang_gpu_s: float, budget_aversion: float) -> Any:
        history = [
            result(0, baseline, TrialStatus.COMPLETE, 1.0).model_copy(update={"gpu_seconds": 100.0}),
            result(1, hung, TrialStatus.HANG).model_copy(update={"gpu_seconds": hang_gpu_s}),
        ]
        s = auto(space, seed=0, rank=predicted, budget_aversion=budget_aversion, screening=None)
        return s.explain(history, at({canonical_key(r.params) for r in history}))

    plain = proposal(100.0, 0.0)  # constrained expected improvement: the faster, riskier candidate
    averse = proposal(100.0, 1.0)  # half the GPU time went to a failure: weigh the risk more
    assert plain is not None and averse is not None
    assert averse.failure_risk < plain.failure_risk
    assert averse.expected_gain_frac is not None and plain.expected_gain_frac is not None
    assert averse.expected_gain_frac < plain.expected_gain_frac
    # no GPU time on failures (e.g. unmeasured): the budget changes nothing
    assert proposal(0.0, 1.0).params == plain.params


def test_a_suspect_next_to_a_large_predicted_gain_is_tested_on_the_best_trial(space: SearchSpace) -> None:
    """Two hangs share two values no success has: ``workers 2`` (30 % faster, the estimator says) and
    ``no checkpointing`` (the real cause). Plain constrained expected improvement stays away from both;
    the look-ahead tests ``workers 2`` on the best trial, since clearing it opens the fastest part of
    the space."""
    rank = lambda p: predicted(p) * (1.3 if p["workers"] == 2 else 1.0)  # noqa: E731
    history = [
        result(0, {"batch": 4, "checkpointing": True, "zero": 0, "workers": 0}, TrialStatus.COMPLETE, 1.0),
        result(1, {"batch": 8, "checkpointing": False, "zero": 0, "workers": 2}, TrialStatus.HANG),
        result(
            2,
            {"batch": 16, "checkpointing": False, "zero": 2, "offload": False, "workers": 2},
            TrialStatus.HANG,
        ),
        result(3, {"batch": 8, "checkpointing": True, "zero": 0, "workers": 0}, TrialStatus.COMPLETE, 1.41),
        result(4, {"batch": 16, "checkpointing": True, "zero": 0, "workers": 0}, TrialStatus.COMPLETE, 2.0),
    ]
    visited = {canonical_key(r.params) for r in history}
    plain = auto(space, seed=0, rank=rank, max_probes=0, screening=None).explain(history, at(visited, 20))
    looked = auto(space, seed=0, rank=rank, screening=None).explain(history, at(visited, 20))
    assert plain is not None and looked is not None
    assert plain.mode != "probe" and plain.params.get("workers") != 2
    assert looked.mode == "probe" and looked.incumbent == 4
    assert looked.params == {"batch": 16, "checkpointing": True, "zero": 0, "workers": 2}
    assert looked.suspect == "workers=2"
    # with no trial left after it, knowing more is worth nothing
    last = auto(space, seed=0, rank=rank, screening=None).explain(history, at(visited, 1))
    assert last is not None and last.mode != "probe"
