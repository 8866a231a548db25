"""``auto-v4``: predictors weighed by their leave-one-out error, and the combination of the best levels.

A phase-additive world over four knobs of three levels: generation time depends on ``tp`` and
``util``, training time on ``batch`` and ``zero``, each level a factor on its own phase. The history
is a balanced screening design (an L9 orthogonal array, saturated for four three-level knobs) and
three more runs: every level of every knob measured three times or more, each time beside other
knobs' levels, and the combination of the four best levels never run.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from autotune.records import SteadyEstimate, TrialResult, TrialStatus
from autotune.space import SearchSpace, load_space
from autotune.strategy import Collaborators, Pending, build_strategy
from autotune.strategy._pool import Block, CandidatePool, PriorScale
from autotune.strategy._predictors import EstimatorPrior, Local, Observations, weigh

SPACE = """
knobs:
  batch: {type: int, choices: [2, 4, 8], default: 2}
  zero: {type: int, choices: [0, 2, 3], default: 0}
  tp: {type: int, choices: [1, 2, 4], default: 1}
  util: {type: float, choices: [0.3, 0.5, 0.7], default: 0.3}
"""
LEVELS = {"batch": (2, 4, 8), "zero": (0, 2, 3), "tp": (1, 2, 4), "util": (0.3, 0.5, 0.7)}
#: per knob, the cost factor of each level on its phase: the best level is the middle one of each
COST = {"batch": (1.3, 1.0, 1.25), "zero": (1.25, 1.0, 1.3), "tp": (1.35, 1.0, 1.2), "util": (1.3, 1.0, 1.2)}
BEST = {"batch": 4, "zero": 2, "tp": 2, "util": 0.5}
#: L9(3^4) with level 1 (the best) relabelled so that no row is (1, 1, 1, 1)
L9 = [
    (0, 0, 0, 0), (0, 1, 1, 2), (0, 2, 2, 1), (1, 0, 1, 1), (1, 1, 2, 0),
    (1, 2, 0, 2), (2, 0, 2, 2), (2, 1, 0, 1), (2, 2, 1, 0),
    (1, 1, 0, 2), (2, 0, 1, 1), (0, 2, 1, 1),
]  # fmt: skip
BATCH = 64


def _cost(name: str, params: dict[str, Any]) -> float:
    return COST[name][LEVELS[name].index(params[name])]


def phases(params: dict[str, Any]) -> dict[str, float]:
    return {
        "rollout": 6.0 * _cost("tp", params) * _cost("util", params),
        "train": 5.0 * _cost("batch", params) * _cost("zero", params),
        "weight_sync": 1.0,
        "other": 1.0,
    }


def run(number: int, params: dict[str, Any]) -> TrialResult:
    seconds = phases(params)
    step = sum(seconds.values())
    return TrialResult(
        number=number,
        params=params,
        status=TrialStatus.COMPLETE,
        reason="completed",
        steps=10,
        steady=SteadyEstimate(
            step_time_s=step, rel_ci95=0.01, steady_steps=8, warmup_steps=2, throughput=BATCH / step
        ),
        timeline_summary={
            "phases": {"source": "framework", "seconds": {p: 8 * s for p, s in seconds.items()}}
        },
        choice={"mode": "screen"},
    )


@pytest.fixture
def space(tmp_path: Path) -> SearchSpace:
    path = tmp_path / "space.yaml"
    path.write_text(SPACE)
    return load_space(path)


def _history() -> list[TrialResult]:
    rows = [{name: LEVELS[name][i] for name, i in zip(LEVELS, row, strict=True)} for row in L9]
    assert BEST not in rows  # the combination of the best levels was never run
    return [run(n, p) for n, p in enumerate(rows)]


def test_the_additive_model_earns_the_weight_on_a_phase_additive_world(space: SearchSpace) -> None:
    strategy = build_strategy("auto-v4", space, Collaborators(), seed=0)
    weighing = strategy.weighing(_history())  # type: ignore[attr-defined]
    assert set(weighing.loo_error) == {"phase-model", "additive", "estimator", "local"}
    assert weighing.loo_error["additive"] < min(
        v for k, v in weighing.loo_error.items() if k != "additive" and math.isfinite(v)
    )
    assert max(weighing.weights, key=weighing.weights.get) == "additive"


def test_auto_v4_proposes_the_combination_of_the_best_levels(space: SearchSpace) -> None:
    history = _history()
    strategy = build_strategy("auto-v4", space, Collaborators(), seed=0)
    proposal = strategy.propose(history, Pending.of(history, trials_left=3))
    assert proposal is not None and proposal.mode == "combine"
    assert proposal.params == BEST


def _weigh_with_rank(space: SearchSpace, rank: Any) -> Any:
    history = _history()
    pool = CandidatePool(space, Collaborators(rank=rank), lambda: [], PriorScale(0.3, 0.06, 0.25))
    obs = Observations(
        tuple(pool.cand(r.params) for r in history),
        np.array([math.log(r.throughput or 1.0) for r in history]),
        np.full((len(history), 4), np.nan),  # no phases: the additive model cannot fit
        tuple(r.number for r in history),
        0,
    )
    return pool, weigh([EstimatorPrior(), Local()], obs, fallback="estimator")


def test_weights_follow_the_leave_one_out_error(space: SearchSpace) -> None:
    # an estimator right up to a factor: its leave-one-out error is nil, it predicts the optimum exactly
    pool, w = _weigh_with_rank(space, lambda p: 2 * BATCH / sum(phases(dict(p)).values()))
    assert w.loo_error["estimator"] < 1e-9 and w.weights["estimator"] == max(w.weights.values())
    mean, _ = w.predict(Block.of([pool.cand(BEST)], len(pool.encoder().slots)))
    assert math.exp(mean[0]) == pytest.approx(BATCH / sum(phases(BEST).values()), rel=1e-6)
    # an estimator wrong in direction: the local model takes the weight
    _, w = _weigh_with_rank(space, lambda p: sum(phases(dict(p)).values()))
    assert w.loo_error["estimator"] > w.loo_error["local"] and w.weights["estimator"] < w.weights["local"]
