"""The per-phase speed model predicts combinations never run from phases measured apart."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from autotune.probes.summary import TimelineSummary

from autotune.records import SteadyEstimate, TrialResult, TrialStatus
from autotune.space import load_space
from autotune.strategy import observed_phases
from autotune.strategy._surrogate import ConfigEncoder, PhaseSpeedModel, SpeedModel

SPACE = """
knobs:
  fast_rollout: {type: bool, default: false}
  fast_train: {type: bool, default: false}
"""


def truth(p: dict) -> np.ndarray:
    """Seconds per step by phase: each knob halves its own phase only."""
    rollout = 2.0 * (0.5 if p["fast_rollout"] else 1.0)
    train = 1.0 * (0.5 if p["fast_train"] else 1.0)
    return np.array([rollout, train, 0.0, 0.1])


def test_phases_add_up_where_a_whole_step_model_multiplies(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(SPACE)
    enc = ConfigEncoder(load_space(path), onehot_sd=1.0, intercept_sd=1.0)
    seen = [
        {"fast_rollout": False, "fast_train": False},
        {"fast_rollout": True, "fast_train": False},
        {"fast_rollout": False, "fast_train": True},
    ]
    untried = {"fast_rollout": True, "fast_train": True}
    x = np.vstack([enc.encode(p) for p in seen])
    prior = np.tile([1.0, 1.0, 0.0, 0.1], (len(seen), 1))  # an estimator that knows neither knob
    observed = np.vstack([truth(p) for p in seen])
    phase = PhaseSpeedModel(
        dict.fromkeys(("rollout", "train", "weight_sync", "other"), enc.prior_sd), noise_sd=0.02
    )
    phase.fit(x, prior, observed)
    ratio, sd = phase.predict(enc.encode(untried)[None, :], np.array([[1.0, 1.0, 0.0, 0.1]]))
    predicted_phase = 2.1 * float(np.exp(ratio[0]))
    # the whole-step model on the same trials: log step residuals, additive in log space
    step = SpeedModel(enc.prior_sd, noise_sd=0.02).fit(x, np.log(observed.sum(axis=1) / 2.1))
    predicted_step = 2.1 * float(np.exp(step.predict(enc.encode(untried)[None, :])[0][0]))
    true_step = float(truth(untried).sum())  # 1.6 s
    assert abs(predicted_phase - true_step) < 0.05 * true_step
    assert abs(predicted_phase - true_step) < 0.5 * abs(predicted_step - true_step)
    assert 0 < sd[0] < 0.5


def test_observed_phases_are_scaled_to_the_steady_step_and_need_a_real_split() -> None:
    steady = SteadyEstimate(step_time_s=2.0, rel_ci95=0.01, steady_steps=4, warmup_steps=1, throughput=8.0)
    summary = {
        "window": {"steps": 4},
        "phases": {
            "source": "framework",
            "seconds": {"rollout": 6.0, "train": 1.0, "weight_sync": 0.5, "other": 0.5},
        },
    }
    r = TrialResult(
        number=1, params={}, status=TrialStatus.COMPLETE, reason="ok", steady=steady, timeline_summary=summary
    )
    got = observed_phases(r)
    assert got is not None
    assert got.sum() == pytest.approx(2.0) and got[0] == pytest.approx(1.5)
    inferred = {**summary, "phases": {**summary["phases"], "source": "inferred"}}
    assert (
        observed_phases(r.model_copy(update={"timeline_summary": TimelineSummary.from_json(inferred)}))
        is None
    )
    assert observed_phases(r.model_copy(update={"steady": None})) is None
