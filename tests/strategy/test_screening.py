"""The screening phase of ``auto``: the design generator, feasibility repair, and a wrong prior corrected."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from autotune.records import SteadyEstimate, TrialResult, TrialStatus
from autotune.space import SearchSpace, canonical_key, load_space
from autotune.strategy import AutoSettings, AutoStrategy, Collaborators, Pending
from autotune.strategy._screening import Screening, ScreeningSettings, balanced_design

SPACE = """
knobs:
  batch: {type: int, choices: [1, 2, 4, 8], default: 1, memory: increasing}
  tp: {type: int, choices: [1, 2, 4], default: 1, memory: decreasing}
  zero: {type: int, choices: [0, 2, 3], default: 0, memory: decreasing}
  offload: {type: bool, default: false, memory: decreasing}
  workers: {type: int, choices: [0, 2], default: 0}
"""
BASELINE = {"batch": 1, "tp": 1, "zero": 0, "offload": False, "workers": 0}


@pytest.fixture
def space(tmp_path: Path) -> SearchSpace:
    p = tmp_path / "s.yaml"
    p.write_text(SPACE)
    return load_space(p)


def prior(p: dict[str, Any]) -> float:
    """A prior that is wrong about ``tp``: it ranks tp=4 last by far (the truth has it fastest)."""
    tp_factor = {1: 1.0, 2: 0.8, 4: 0.4}[p["tp"]]
    return p["batch"] ** 0.4 * tp_factor * (0.9 if p["zero"] == 3 else 1.0) * (0.7 if p["offload"] else 1.0)


def truth(p: dict[str, Any]) -> tuple[TrialStatus, float | None]:
    """The world: tp=4 is 1.8x faster than tp=1; batch 8 without offload runs out of memory."""
    if p["batch"] == 8 and not p["offload"]:
        return TrialStatus.OOM, None
    tp_factor = {1: 1.0, 2: 1.3, 4: 1.8}[p["tp"]]
    return TrialStatus.COMPLETE, p["batch"] ** 0.4 * tp_factor * (0.9 if p["zero"] == 3 else 1.0)


def result(number: int, p: dict[str, Any], choice: dict[str, Any] | None = None) -> TrialResult:
    status, tp = truth(p)
    steady = None
    if tp is not None:
        steady = SteadyEstimate(
            step_time_s=1 / tp, rel_ci95=0.01, steady_steps=4, warmup_steps=1, throughput=tp
        )
    return TrialResult(
        number=number,
        params=p,
        status=status,
        reason=status.value.lower(),
        steps=5 if steady else 0,
        steady=steady,
        choice=choice,
        gpu_seconds=60.0,
        duration_s=60.0,
    )


def auto(space: SearchSpace, *, seed: int = 0, rank: Any = None, **settings: Any) -> AutoStrategy:
    """The auto strategy with an estimator (``rank``) and settings."""
    return AutoStrategy(space, Collaborators(rank=rank), seed=seed, settings=AutoSettings(**settings))


def left(history: list[TrialResult], trials: int) -> Pending:
    return Pending(visited=frozenset(canonical_key(r.params) for r in history), trials_left=trials)


def drive(strategy: AutoStrategy, budget: int) -> list[TrialResult]:
    """The baseline, then the strategy's proposals against :func:`truth` (the study loop without Optuna)."""
    history = [result(0, dict(BASELINE))]
    for number in range(1, budget):
        visited = {canonical_key(r.params) for r in history}
        proposal = strategy.explain(
            history, Pending(visited=frozenset(visited), trials_left=budget - len(history))
        )
        if proposal is None:
            break
        history.append(result(number, proposal.params, proposal.choice()))
    return history


@pytest.mark.parametrize(
    ("levels", "n_runs"), [((3, 3, 3, 3), 9), ((4, 7, 2, 3, 2), 14), ((2, 3), 5), ((4,), 3)]
)
def test_the_design_balances_every_knobs_levels(levels: tuple[int, ...], n_runs: int) -> None:
    design = balanced_design(levels, n_runs, seed=3)
    assert design.shape == (n_runs, len(levels))
    for j, n in enumerate(levels):
        counts = np.bincount(design[:, j], minlength=n)
        assert counts.max() - counts.min() <= 1 and counts.sum() == n_runs
        assert ((0 <= design[:, j]) & (design[:, j] < n)).all()


def test_four_three_level_knobs_in_nine_runs_form_an_orthogonal_array() -> None:
    design = balanced_design((3, 3, 3, 3), 9, seed=0)
    for i, j in itertools.combinations(range(4), 2):
        pairs = {(int(a), int(b)) for a, b in design[:, [i, j]]}
        assert len(pairs) == 9  # every pair of levels of every two knobs meets exactly once


def test_the_design_is_a_function_of_its_seed() -> None:
    assert (balanced_design((3, 4, 2), 8, seed=5) == balanced_design((3, 4, 2), 8, seed=5)).all()
    assert not all(
        (balanced_design((3, 4, 2), 8, seed=5) == balanced_design((3, 4, 2), 8, seed=s)).all()
        for s in range(6, 9)
    )


def test_a_screening_run_repairs_an_infeasible_design_row(space: SearchSpace) -> None:
    """Candidates that fail the pre-screen are skipped; the run still covers a new level, with the other
    knobs set so that it passes."""
    screening = Screening(space, ScreeningSettings(), seed=1)
    pool = list(space.grid())
    plan = screening.plan(pool, {"tp": 0.5, "zero": 0.3, "offload": 0.2, "batch": 0.4, "workers": 0.0})
    assert set(plan.knobs) == {
        "tp",
        "zero",
        "offload",
        "batch",
    }  # workers: the estimator says it does not matter
    runs = [result(0, dict(BASELINE))]
    # the pre-screen rejects tp=4 unless the batch is 1 and ZeRO-3 is on
    ok = lambda p: p["tp"] != 4 or (p["batch"] == 1 and p["zero"] == 3)  # noqa: E731
    rejected: list[dict[str, Any]] = []

    def check(p: dict[str, Any]) -> bool:
        if not ok(p):
            rejected.append(p)
        return ok(p)

    seen_tp4 = False
    for number in range(1, 8):
        if screening.complete(plan, screening.state(plan, runs)):
            break
        cands = [p for p in pool if canonical_key(p) not in {canonical_key(r.params) for r in runs}]
        n = len(cands)
        pick = screening.next_run(plan, runs, cands, np.ones(n), np.zeros(n), check, 12 - len(runs))
        assert pick is not None and pick.mode == "screen"
        chosen = cands[pick.index]
        assert ok(chosen)
        # each run covers levels not measured yet (the most it can while passing the pre-screen)
        assert pick.covers and all(chosen[k] == v for k, v in pick.covers.items())
        seen_tp4 |= chosen["tp"] == 4
        runs.append(result(number, chosen, {"mode": "screen"}))
    assert rejected and seen_tp4  # the design asked for tp=4 elsewhere; the repair found where it passes
    assert screening.complete(plan, screening.state(plan, runs))  # every screened level measured healthy
    assert len(runs) <= 5  # baseline + at most one run per level of the knob with most levels


def test_a_value_the_prior_ranks_last_is_measured_healthy_in_the_first_half_of_the_budget(
    space: SearchSpace,
) -> None:
    """The optimum's tp=4 is the prior's last choice; screening measures it within 6 of 12 trials, and
    the search ends on it. Without screening the same search never measures it that early."""
    best_value = max(truth(p)[1] or 0.0 for p in space.grid())
    for seed in range(3):
        history = drive(auto(space, seed=seed, rank=prior), 12)
        first_half = history[:6]
        assert any(r.params["tp"] == 4 and r.status is TrialStatus.COMPLETE for r in first_half), seed
        assert [(r.choice or {}).get("mode") for r in history[1:3]] == ["screen", "screen"]
        best = max(r.throughput or 0.0 for r in history)
        assert best >= 0.97 * best_value, (seed, best, best_value)
    plain = drive(auto(space, seed=0, rank=prior, screening=None), 12)
    assert not any(r.params["tp"] == 4 and r.status is TrialStatus.COMPLETE for r in plain[:6])


def test_the_study_does_not_stop_before_every_screened_level_was_measured(space: SearchSpace) -> None:
    history = [result(0, dict(BASELINE)), result(1, {**BASELINE, "batch": 2})]
    never_stop_early = auto(space, seed=0, rank=prior, min_trials=1, stop_gain_frac=10.0)
    assert (
        never_stop_early.converged(history, left(history, 10)) is None
    )  # tp=2, tp=4, zero, offload: not measured yet
    plain = auto(space, seed=0, rank=prior, min_trials=1, stop_gain_frac=10.0, screening=None)
    assert plain.converged(history, left(history, 10)) is not None
    # once every level was measured, the stop may come, and its reason says the prior was checked
    covered = [
        *history,
        *(
            result(n, {"batch": 1, "tp": tp, "zero": zero, "offload": off, "workers": 0})
            for n, (tp, zero, off) in enumerate([(2, 2, True), (4, 3, False), (4, 0, True)], start=2)
        ),
        result(5, {"batch": 4, "tp": 1, "zero": 0, "offload": False, "workers": 0}),
        result(6, {"batch": 8, "tp": 1, "zero": 0, "offload": True, "workers": 0}),
    ]
    reason = never_stop_early.converged(covered, left(covered, 10))
    assert reason is not None and "the prior was checked" in reason


def test_the_combination_sets_each_screened_knob_to_its_best_measured_level(space: SearchSpace) -> None:
    screening = Screening(space, ScreeningSettings(design_share=0.0, cover_share=0.0, combine=True), seed=0)
    plan = screening.plan(list(space.grid()), {"tp": 0.5, "zero": 0.3, "offload": 0.2, "batch": 0.4})
    runs = [
        result(0, dict(BASELINE)),
        result(1, {"batch": 4, "tp": 1, "zero": 3, "offload": True, "workers": 0}, {"mode": "screen"}),
        result(2, {"batch": 1, "tp": 4, "zero": 2, "offload": False, "workers": 0}, {"mode": "screen"}),
        result(3, {"batch": 2, "tp": 2, "zero": 0, "offload": True, "workers": 2}, {"mode": "screen"}),
    ]
    assert screening.best_levels(plan, runs)["tp"] == 4
    cands = [p for p in space.grid() if canonical_key(p) not in {canonical_key(r.params) for r in runs}]
    check: Callable[[dict[str, Any]], bool] = lambda p: True  # noqa: E731
    n = len(cands)
    pick = screening.next_run(plan, runs, cands, np.ones(n), np.zeros(n), check, 8)
    assert pick is not None and pick.mode == "combine"
    assert all(cands[pick.index][k] == v for k, v in screening.best_levels(plan, runs).items())


def test_the_design_spreads_the_other_discrete_knobs_too(space: SearchSpace) -> None:
    """A knob outside the screened set (``workers``: the estimator says it does not matter) is still
    measured at both its values during screening, so a prior wrong about it is corrected by the model;
    without ``balance_others`` the screening runs leave it at the prior's choice."""
    spreads = {"tp": 0.5, "zero": 0.3, "offload": 0.2, "batch": 0.4, "workers": 0.0}
    pool = list(space.grid())
    plan = Screening(space, ScreeningSettings(), seed=0).plan(pool, spreads)
    assert "workers" not in plan.knobs and plan.balanced == ("workers",)
    assert plan.balanced_levels == ((0, 2),)
    column = [row[len(plan.knobs)] for row in plan.design]
    assert sorted(set(column)) == [0, 1] and abs(column.count(0) - column.count(1)) <= 1
    for balance, expected in ((True, {0, 2}), (False, {0})):
        screening = Screening(space, ScreeningSettings(balance_others=balance), seed=0)
        plan = screening.plan(pool, spreads)
        runs = [result(0, dict(BASELINE))]
        for number in range(1, 5):
            cands = [p for p in pool if canonical_key(p) not in {canonical_key(r.params) for r in runs}]
            n = len(cands)
            # the model prefers workers=0 everywhere: only the design can ask for workers=2
            score = np.array([1.0 if p["workers"] == 0 else 0.0 for p in cands])
            pick = screening.next_run(plan, runs, cands, np.ones(n), score, lambda p: True, 12 - len(runs))
            assert pick is not None and pick.mode == "screen"
            runs.append(result(number, cands[pick.index], {"mode": "screen"}))
        assert {r.params["workers"] for r in runs[1:]} == expected, balance


def test_a_stop_on_the_physical_ceiling_needs_neither_the_prior_nor_screening(space: SearchSpace) -> None:
    """When no untried configuration's ceiling beats the best measured by the stop's gain, the study may
    stop at once (screening unfinished: the bound is physics, not the prior); a ceiling above that,
    or one unknown for some candidate, lets the search go on."""
    history = [result(0, dict(BASELINE)), result(1, {**BASELINE, "batch": 2})]
    best = max(r.throughput or 0.0 for r in history)

    def strategy(ceiling: Any) -> AutoStrategy:
        collab = Collaborators(rank=prior, ceiling_throughput=ceiling)
        return AutoStrategy(space, collab, seed=0, settings=AutoSettings(min_trials=1))

    reason = strategy(lambda p: best * 1.01).converged(history, left(history, 10))
    assert reason is not None and "physical ceiling" in reason
    assert strategy(lambda p: best * 1.5).converged(history, left(history, 10)) is None
    unknown = lambda p: None if p["tp"] == 4 else best  # noqa: E731
    assert strategy(unknown).converged(history, left(history, 10)) is None


def test_a_level_the_memory_gate_refuses_everywhere_gets_one_memory_probe(space: SearchSpace) -> None:
    """tp=4 never passes the pre-screen (the gate predicts it does not fit); once the design is done and
    the other levels are measured, screening tests the gate with the tp=4 candidate the model prefers
    first in its order among those predicted within ``memory_probe_load``, marked as a memory probe;
    none beyond that load, and after one probe no other."""
    screening = Screening(space, ScreeningSettings(design_share=0.0), seed=0)
    pool = list(space.grid())
    plan = screening.plan(pool, {"tp": 0.5, "zero": 0.3, "offload": 0.2, "batch": 0.4, "workers": 0.0})
    runs = [result(0, dict(BASELINE))]
    for number, p in enumerate(
        [
            {"batch": 2, "tp": 2, "zero": 2, "offload": True, "workers": 0},
            {"batch": 4, "tp": 1, "zero": 3, "offload": False, "workers": 2},
            {"batch": 8, "tp": 2, "zero": 3, "offload": True, "workers": 0},
        ],
        start=1,
    ):
        runs.append(result(number, p, {"mode": "screen"}))
    assert screening.state(plan, runs).uncovered(plan) == [("tp", canonical_key({"v": 4}))]
    cands = [p for p in pool if canonical_key(p) not in {canonical_key(r.params) for r in runs}]
    n = len(cands)
    check = lambda p: p["tp"] != 4  # noqa: E731 - the gate refuses every tp=4 candidate
    load = lambda p: 1.2 if p["batch"] == 1 else 1.6  # noqa: E731 - only batch 1 is within a probe's reach
    score = np.zeros(n)
    pick = screening.next_run(plan, runs, cands, np.ones(n), score, check, 8, load)
    assert pick is not None and pick.memory_probe and pick.covers == {"tp": 4}
    assert cands[pick.index]["batch"] == 1  # the one tp=4 candidate within a probe's reach
    assert screening.next_run(plan, runs, cands, np.ones(n), score, check, 8, lambda p: 1.6) is None
    probed = [*runs, result(4, cands[pick.index], {"mode": "screen", "memory_probe": True})]
    probed[-1] = probed[-1].model_copy(update={"status": TrialStatus.OOM, "steady": None})
    rest = [p for p in cands if p is not cands[pick.index]]
    m = len(rest)
    assert screening.next_run(plan, probed, rest, np.ones(m), np.zeros(m), check, 7, load) is None
