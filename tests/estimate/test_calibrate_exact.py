"""Exact values of the memory calibration, on hand-made observations and estimates.

``test_calibrate.py`` checks the behaviour on real estimates (approximately); these pin each number:
the ratio measured / modelled, the OOM floor and the fit ceiling (each 1.0001 past the capacity), the
median, the clamp to [0.25, 4], and what an estimate turns into when it is observed.

The hand-made estimate: 600 B of weights + 100 B of activations (modelled, 700 B) + 300 B reserved by
vLLM (exact) = a 1000 B peak on a 2000 B GPU.
"""

from __future__ import annotations

from typing import Any

import pytest

from autotune.estimate import Calibration, MemoryEstimate, Observation, prediction_error

NUDGE = 1.0001


def _estimate(**over: Any) -> MemoryEstimate:
    data: dict[str, Any] = {
        "components_bytes": {"weights": 600, "activations": 100, "vllm_reserved": 300},
        "peak_bytes": 1000,
        "capacity_bytes": 2000,
        **over,
    }
    return MemoryEstimate.from_dict(data)


def _obs(**over: Any) -> Observation:
    fields: dict[str, Any] = {
        "trial": 1,
        "predicted_peak_bytes": 1000,
        "modelled_bytes": 800,
        "exact_bytes": 200,
        "capacity_bytes": 2000,
        "measured_peak_bytes": 1400,
        "oom": False,
        **over,
    }
    return Observation(**fields)


def test_prediction_error_is_relative_to_the_measurement() -> None:
    assert prediction_error(150, 100) == 0.5
    assert prediction_error(75, 100) == -0.25
    assert prediction_error(100, 100) == 0.0
    assert prediction_error(3, 1) == 2.0  # one byte measured is a measurement
    assert prediction_error(5, 0) == 0.0 and prediction_error(5, -1) == 0.0  # nothing measured


def test_a_completed_trial_gives_a_ratio_and_a_ceiling() -> None:
    o = _obs()
    assert o.ratio == 1.5  # (1400 − 200 exact) / 800 modelled
    assert o.fit_ceiling == pytest.approx(2.25 / NUDGE, rel=1e-15)  # (2000 − 200) / 800, just under
    assert o.oom_floor is None
    assert o.rel_error == pytest.approx(-400 / 1400, rel=1e-15)  # (1000 − 1400) / 1400
    assert o.to_dict() == {
        "trial": 1,
        "predicted_peak_bytes": 1000,
        "modelled_bytes": 800,
        "exact_bytes": 200,
        "capacity_bytes": 2000,
        "measured_peak_bytes": 1400,
        "oom": False,
        "rel_error": -400 / 1400,
    }


def test_an_oom_gives_a_floor_only() -> None:
    o = _obs(measured_peak_bytes=None, oom=True)
    assert o.oom_floor == pytest.approx(2.25 * NUDGE, rel=1e-15)  # (2000 − 200) / 800, just past
    assert (o.ratio, o.fit_ceiling, o.rel_error) == (None, None, None)
    # an OOM with a peak read before it died is still an OOM: no ratio, no ceiling, no error
    late = _obs(measured_peak_bytes=1900, oom=True)
    assert (late.ratio, late.fit_ceiling, late.rel_error) == (None, None, None)
    assert late.oom_floor == pytest.approx(2.25 * NUDGE, rel=1e-15)


def test_a_trial_without_a_measurement_teaches_nothing() -> None:
    o = _obs(measured_peak_bytes=None)
    assert (o.ratio, o.fit_ceiling, o.oom_floor, o.rel_error) == (None, None, None, None)


def test_nothing_modelled_or_no_capacity_teaches_nothing() -> None:
    for o in (_obs(modelled_bytes=0), _obs(modelled_bytes=0, oom=True, measured_peak_bytes=None)):
        assert (o.ratio, o.fit_ceiling, o.oom_floor) == (None, None, None)
    no_gpu = _obs(capacity_bytes=0)
    assert no_gpu.ratio == 1.5 and no_gpu.fit_ceiling is None
    assert _obs(capacity_bytes=0, oom=True, measured_peak_bytes=None).oom_floor is None


def test_ratios_and_ceilings_never_go_negative() -> None:
    # a peak below the exact part: ratio max(0, 100 − 200) / 800 = 0
    assert _obs(measured_peak_bytes=100).ratio == 0.0
    # the exact part alone overflows: no factor lets it fit, ceiling max(0, 2000 − 2500) / 800 = 0
    assert _obs(exact_bytes=2500).fit_ceiling == 0.0


def test_the_factor_is_the_median_ratio() -> None:
    assert Calibration().factor == 1.0
    big = {"capacity_bytes": 10**6}  # ceilings far above
    # ratios 1.0, 1.25, 3.0 (measured 1000, 1200, 2600 over 800 modelled + 200 exact): median 1.25
    cal = Calibration([_obs(measured_peak_bytes=m, **big) for m in (1000, 1200, 2600)])
    assert cal.factor == 1.25
    # an even count: the mean of the middle two, (1.0 + 1.25) / 2
    assert Calibration([_obs(measured_peak_bytes=m, **big) for m in (1000, 1200)]).factor == 1.125


def test_ooms_raise_the_factor_to_the_highest_floor() -> None:
    # a ratio of 1.0, OOMs at capacities 1400 and 2000: floors 1.5 · 1.0001 and 2.25 · 1.0001
    ran = _obs(measured_peak_bytes=1000, capacity_bytes=10**6)
    ooms = [_obs(capacity_bytes=c, measured_peak_bytes=None, oom=True) for c in (1400, 2000)]
    assert Calibration([ran, *ooms]).factor == pytest.approx(2.25 * NUDGE, rel=1e-15)
    # OOMs alone: the floor over the default 1.0
    assert Calibration(ooms[:1]).factor == pytest.approx(1.5 * NUDGE, rel=1e-15)
    # a floor below the median changes nothing
    low = _obs(capacity_bytes=600, measured_peak_bytes=None, oom=True)  # floor 0.5 · 1.0001
    assert Calibration([ran, low]).factor == 1.0


def test_trials_that_ran_cap_the_factor_at_the_lowest_ceiling() -> None:
    # ratio 3.0 (measured 2600); trials that ran on 1800 B and 2200 B GPUs: ceilings 2.0 and 2.5 / 1.0001
    high = _obs(measured_peak_bytes=2600, capacity_bytes=10**6)
    ran = [_obs(measured_peak_bytes=1000, capacity_bytes=c) for c in (2200, 1800)]
    # median of 3.0, 1.0, 1.0 is 1.0: under both ceilings
    assert Calibration([high, *ran]).factor == 1.0
    # an OOM floor of 2.75 · 1.0001 (capacity 2400) above the ceilings: the ceiling wins
    oom = _obs(capacity_bytes=2400, measured_peak_bytes=None, oom=True)
    assert Calibration([*ran, oom]).factor == pytest.approx(2.0 / NUDGE, rel=1e-15)


def test_the_factor_stays_between_a_quarter_and_four() -> None:
    huge = {"capacity_bytes": 10**9}
    assert Calibration([_obs(measured_peak_bytes=200 + 8000, **huge)]).factor == 4.0  # ratio 10
    assert Calibration([_obs(measured_peak_bytes=200 + 80, **huge)]).factor == 0.25  # ratio 0.1
    assert Calibration([_obs(measured_peak_bytes=200 + 3000, **huge)]).factor == 3.75  # inside


def test_observe_records_the_raw_estimate() -> None:
    cal = Calibration()
    cal.observe(_estimate(), 1400.9, 1, trial=5)  # type: ignore[arg-type]
    cal.observe(_estimate(), None, False)
    assert cal.observations == [
        # modelled 1000 − 300 = 700; the peak read as an int, the OOM flag as a bool
        Observation(5, 1000, 700, 300, 2000, 1400, True),
        Observation(None, 1000, 700, 300, 2000, None, False),
    ]
    assert type(cal.observations[0].oom) is bool


def test_observe_undoes_an_applied_factor() -> None:
    # the same estimate with a factor 2 applied: 1200 + 200 modelled, 300 exact (kept)
    doubled = _estimate(
        components_bytes={"weights": 1200, "activations": 200, "vllm_reserved": 300},
        peak_bytes=1700,
        calibration_factor=2.0,
    )
    cal = Calibration()
    cal.observe(doubled, 1400, False)
    assert cal.observations == [Observation(None, 1000, 700, 300, 2000, 1400, False)]


def test_observe_without_vllm_counts_everything_as_modelled() -> None:
    cal = Calibration()
    cal.observe(_estimate(components_bytes={"weights": 900, "activations": 100}), 1100, False)
    assert cal.observations == [Observation(None, 1000, 1000, 0, 2000, 1100, False)]


def test_observe_records_any_gpu_with_memory() -> None:
    cal = Calibration()
    cal.observe(_estimate(capacity_bytes=1), None, True)  # a one-byte GPU still has a capacity
    assert cal.observations == [Observation(None, 1000, 700, 300, 1, None, True)]


def test_observe_ignores_estimates_with_nothing_to_judge() -> None:
    cal = Calibration()
    cal.observe(_estimate(on_gpu=False), 1400, False)
    cal.observe(_estimate(capacity_bytes=0), 1400, False)
    assert cal.observations == []


def test_adjust_scales_the_modelled_part() -> None:
    # one ratio of (1350 − 300) / 700 = 1.5, under the ceiling (2000 − 300) / 700 / 1.0001
    cal = Calibration()
    cal.observe(_estimate(), 1350, False)
    assert cal.factor == 1.5
    adjusted = cal.adjust(_estimate())
    # 600 · 1.5 = 900, 100 · 1.5 = 150, 300 kept: 1350
    assert adjusted.components_bytes == {"weights": 900, "activations": 150, "vllm_reserved": 300}
    assert (adjusted.peak_bytes, adjusted.calibration_factor) == (1350, 1.5)
    cpu = _estimate(on_gpu=False)
    assert cal.adjust(cpu) is cpu


def test_the_report_and_the_round_trip() -> None:
    cal = Calibration([_obs(), _obs(trial=2, measured_peak_bytes=None, oom=True)])
    rows = [_obs().to_dict(), _obs(trial=2, measured_peak_bytes=None, oom=True).to_dict()]
    assert cal.errors() == rows
    # ratio 1.5; floor 2.25 · 1.0001 above it; the ceiling 2.25 / 1.0001 below that: the ceiling
    assert cal.to_dict() == {"factor": pytest.approx(2.25 / NUDGE, rel=1e-15), "observations": rows}
    assert Calibration.from_dict(cal.to_dict()).observations == cal.observations


def test_from_dict_reads_numbers_as_numbers_and_defaults_the_optional_keys() -> None:
    data = {
        "observations": [
            {"predicted_peak_bytes": "1000", "modelled_bytes": 800.0, "capacity_bytes": "2000"},
            {
                "trial": 7,
                "predicted_peak_bytes": 1000,
                "modelled_bytes": 800,
                "exact_bytes": "200",
                "capacity_bytes": 2000,
                "measured_peak_bytes": "1400",
                "oom": 1,
            },
        ]
    }
    assert Calibration.from_dict(data).observations == [
        Observation(None, 1000, 800, 0, 2000, None, False),
        Observation(7, 1000, 800, 200, 2000, 1400, True),
    ]
    assert Calibration.from_dict({}).observations == [] and Calibration.from_dict(None).observations == []
