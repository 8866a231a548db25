from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest

from autotune.space import load_space
from autotune.strategy._surrogate import (
    ABSENT,
    OFF_GRID,
    ConfigEncoder,
    FailureModel,
    SpeedModel,
    expected_gain,
    normal_cdf,
)

SPACE = """
knobs:
  batch: {type: int, choices: [1, 2, 4, 8], default: 1, memory: increasing}
  zero: {type: int, choices: [0, 2, 3], default: 0}
  offload: {type: bool, default: false, when: {zero: [2, 3]}}
  util: {type: float, low: 0.3, high: 0.9, step: 0.1, default: 0.3}
"""


@pytest.fixture
def space(tmp_path: Path):
    p = tmp_path / "s.yaml"
    p.write_text(SPACE)
    return load_space(p)


def test_normal_cdf_matches_erf() -> None:
    xs = np.linspace(-6, 6, 241)
    exact = np.array([0.5 * (1 + math.erf(x / math.sqrt(2))) for x in xs])
    assert np.max(np.abs(normal_cdf(xs) - exact)) < 2e-7


def test_encoder_marks_absent_off_grid_and_ordinal(space) -> None:
    enc = ConfigEncoder(space)
    p = {"batch": 4, "zero": 0, "util": 0.5}
    codes = enc.codes(p)
    assert codes == (2, 0, ABSENT, 2)
    x = enc.encode(p)
    assert x[0] == 1.0 and x.shape == (enc.n_features,)
    # one slot per value per knob (+ "absent"), every knob contributes exactly one 1 among them
    for slot, code in zip(enc.slots, codes, strict=True):
        block = x[slot.offset : slot.offset + slot.n_values + 1]
        assert block.sum() == 1.0
        assert block[slot.n_values if code == ABSENT else code] == 1.0
    # ordinal: batch on a log scale (4 of 1..8 is 2/3 of the way), util linear
    batch_slot = enc.slots[0]
    assert x[batch_slot.ordinal_col] == pytest.approx(2 / 3)
    # a value that is not a grid point keeps its ordinal but no one-hot
    q = {**p, "util": 0.55}
    assert enc.codes(q)[3] == OFF_GRID
    util_slot = enc.slots[3]
    xq = enc.encode(q)
    assert xq[util_slot.offset : util_slot.offset + util_slot.n_values + 1].sum() == 0.0
    assert xq[util_slot.ordinal_col] == pytest.approx(0.25 / 0.6)


def test_scaled_prior_follows_the_knob_scales(space) -> None:
    enc = ConfigEncoder(space)
    sd = enc.scaled_prior_sd({"batch": 0.2, "zero": 0.01})
    b, z = enc.slots[0], enc.slots[1]
    assert np.all(sd[b.offset : b.offset + b.n_values + 1] == 0.2) and sd[b.ordinal_col] == pytest.approx(0.3)
    assert np.all(sd[z.offset : z.offset + z.n_values + 1] == 0.01)
    assert sd[0] == enc.prior_sd[0]  # the intercept is left alone


def test_knob_spreads_find_the_knob_that_moves_predictions(space) -> None:
    enc = ConfigEncoder(space)
    rng = random.Random(0)
    configs = [
        space.active({"batch": rng.choice([1, 2, 4, 8]), "zero": rng.choice([0, 2, 3]), "util": 0.3})
        for _ in range(200)
    ]
    codes = np.array([enc.codes(p) for p in configs])
    log_prior = np.array([math.log(p["batch"]) for p in configs])  # only batch matters
    spreads = enc.knob_spreads(codes, log_prior)
    assert spreads["batch"] == pytest.approx(math.log(8))
    assert spreads["zero"] < 0.25 * spreads["batch"] and spreads["util"] == 0.0  # confounding only


def test_speed_model_learns_an_additive_effect(space) -> None:
    enc = ConfigEncoder(space, onehot_sd=0.3)
    rng = random.Random(1)
    configs = [
        space.active({"batch": rng.choice([1, 2, 4, 8]), "zero": rng.choice([0, 2, 3]), "util": 0.3})
        for _ in range(40)
    ]
    truth = {0: 0.0, 2: -0.2, 3: -0.5}  # log-throughput effect of the ZeRO stage

    def y(p: dict) -> float:
        return truth[p["zero"]] + rng.gauss(0, 0.01)

    x = enc.encode_many(configs)
    model = SpeedModel(enc.prior_sd, noise_sd=0.02).fit(x, np.array([y(p) for p in configs]))
    test = [space.active({"batch": 2, "zero": z, "util": 0.3}) for z in (0, 2, 3)]
    mean, sd = model.predict(enc.encode_many(test))
    assert mean[0] - mean[2] == pytest.approx(0.5, abs=0.05)
    assert mean[0] - mean[1] == pytest.approx(0.2, abs=0.05)
    # uncertainty: small where seen, large for a value never seen
    unseen = space.active({"batch": 2, "zero": 0, "util": 0.9})
    _, sd_unseen = model.predict(enc.encode_many([unseen]))
    assert sd_unseen[0] > 3 * sd.max()


def test_expected_gain_is_right_and_monotone() -> None:
    rng = np.random.default_rng(0)
    for mean, sd, best in [(0.0, 0.2, 1.0), (0.1, 0.05, 1.0), (-0.3, 0.3, 1.0), (1.0, 0.1, 2.0)]:
        draws = np.exp(rng.normal(mean, sd, 400_000))
        mc = np.maximum(draws - best, 0).mean() / best
        assert expected_gain(np.array([mean]), np.array([sd]), best)[0] == pytest.approx(
            mc, rel=0.03, abs=1e-4
        )
    gains = expected_gain(np.array([-0.2, 0.0, 0.2]), np.array([0.1, 0.1, 0.1]), 1.0)
    assert np.all(np.diff(gains) > 0) and np.all(gains >= 0)
    # with no incumbent: ordering by the predicted median throughput
    assert np.all(np.diff(expected_gain(np.array([0.0, 1.0]), np.array([0.1, 0.1]), 0.0)) > 0)


def test_failure_model_finds_the_culprit_pair() -> None:
    # knobs: tp, sleep, batch. Hangs when tp == 2 and sleep == 1 (a pair).
    codes = np.array([[2, 1, 0], [2, 1, 1], [1, 1, 0], [2, 0, 1], [1, 0, 0]])
    failed = np.array([1, 1, 0, 0, 0], dtype=bool)
    fm = FailureModel().fit(codes, failed)
    p = fm.predict(np.array([[2, 1, 2], [2, 0, 2], [1, 1, 2], [0, 0, 0]]))
    assert p[0] > 0.6  # contains the unrefuted pair
    assert np.allclose(p[1:], fm.base_rate)  # tp 2 alone and sleep 1 alone were refuted by successes


def test_a_cause_shared_by_several_failures_takes_the_blame() -> None:
    # three failures share knob 0 = 1; each also has other values no success has seen
    codes = np.array([[1, 0, 5], [1, 1, 6], [1, 2, 7], [0, 3, 8]])
    failed = np.array([1, 1, 1, 0], dtype=bool)
    fm = FailureModel().fit(codes, failed)
    shared, other = fm.predict(np.array([[1, 3, 8], [0, 0, 5]]))
    assert shared > 0.8 and other < 0.3


def test_failure_model_base_rate_without_evidence_and_flaky_failures() -> None:
    fm = FailureModel().fit(np.zeros((0, 3), dtype=int), np.zeros(0, dtype=bool))
    assert np.allclose(fm.predict(np.array([[0, 0, 0], [1, 2, 3]])), fm.base_rate)
    # a failure whose every value and pair also occurs in successes is flaky: it teaches nothing
    codes = np.array([[0, 0], [0, 1], [1, 0], [0, 0]])
    fm = FailureModel().fit(codes, np.array([0, 0, 0, 1], dtype=bool))
    assert np.allclose(fm.predict(np.array([[0, 0], [1, 1]])), fm.base_rate)


def test_failure_model_prefers_narrow_culprits() -> None:
    # one failure, no successes: a value shared by half the space is a less likely cause than a rare one
    space_codes = np.array([[0, v] for v in range(8)] * 4 + [[1, v] for v in range(8)] * 4)
    fm = FailureModel().fit(np.array([[0, 3]]), np.array([True]), space_codes=space_codes)
    p_common, p_rare = fm.predict(np.array([[0, 5], [1, 3]]))
    assert p_rare > p_common > fm.base_rate


def test_memory_risk_is_a_calibrated_tail() -> None:
    fm = FailureModel(memory_sd=0.1)
    risk = fm.memory_risk(np.array([0.5, 0.95, 1.0, 1.3, np.nan]), limit=1.0)
    assert risk[0] < 1e-6 and risk[2] == pytest.approx(0.5) and risk[3] > 0.99 and risk[4] == 0.0
    assert risk[1] == pytest.approx(float(normal_cdf(np.array([math.log(0.95) / 0.1]))[0]))
