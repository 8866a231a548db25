"""The speedup interval from re-measured runs and the rule that refuses to call noise a win, on
deterministic inputs (every expected number worked out by hand below)."""

from __future__ import annotations

import math

import pytest

from autotune.recommend import headline, speedup_text
from autotune.records import (
    Confirmation,
    ConfirmRun,
    GpuInfo,
    Hardware,
    HostInfo,
    Recommendation,
    SteadyEstimate,
    TrialResult,
    TrialStatus,
)
from autotune.study.verdict import RunTime, judge, not_remeasured, speedup_interval

T975_DF2 = 4.303  # Student t, two-sided 95 %, 2 degrees of freedom (any printed table)
T975_DF3 = 3.182


def test_the_estimate_is_the_ratio_of_geometric_means_and_the_interval_is_a_t_interval_over_runs() -> None:
    # winner runs 1.0 s and 1.1 s per step, baseline 2.0 s and 2.2 s: the same spread, half the time
    winner = [RunTime(1.0), RunTime(1.1)]
    baseline = [RunTime(2.0), RunTime(2.2)]
    iv = speedup_interval(winner, baseline)
    assert iv is not None
    assert iv.estimate == pytest.approx(2.0)
    # pooled variance of one run's log time: (2 * ln(1.1)^2 / 2) / (4 runs - 2 configurations) = ln(1.1)^2 / 2;
    # se of the difference of the two means (2 runs each) = sqrt(var * (1/2 + 1/2)) = ln(1.1) / sqrt(2)
    assert iv.df == 2
    half = T975_DF2 * math.log(1.1) / math.sqrt(2)
    assert iv.low == pytest.approx(2.0 * math.exp(-half), rel=1e-3)
    assert iv.high == pytest.approx(2.0 * math.exp(half), rel=1e-3)
    assert iv.low > 1.0 and not iv.includes_one
    assert iv.runs == (2, 2)
    # the other way round: the reciprocal
    back = speedup_interval(baseline, winner)
    assert back is not None
    assert back.estimate == pytest.approx(0.5) and back.high == pytest.approx(1 / iv.low, rel=1e-9)


def test_the_run_to_run_variance_is_pooled_over_every_configuration_re_measured() -> None:
    # the winner's two runs agree, the baseline's differ twofold: one host, one noise
    winner, baseline = [RunTime(0.5), RunTime(0.5)], [RunTime(1.0), RunTime(2.0)]
    iv = speedup_interval(winner, baseline)
    assert iv is not None and iv.df == 2
    log_ratio = (math.log(1.0) + math.log(2.0)) / 2 - math.log(0.5)
    var = (math.log(2.0) ** 2 / 2) / 2  # the baseline's sum of squares over 4 runs - 2 configurations
    half = T975_DF2 * math.sqrt(var)
    assert iv.estimate == pytest.approx(math.exp(log_ratio))
    assert (iv.low, iv.high) == pytest.approx(
        (math.exp(log_ratio - half), math.exp(log_ratio + half)), rel=1e-3
    )
    assert iv.includes_one  # a 2.8x point estimate that these runs cannot confirm
    # a runner-up's two runs, as steady as the winner's, add two runs and one degree of freedom
    pooled = speedup_interval(winner, baseline, others=[[RunTime(0.7), RunTime(0.7)]])
    assert pooled is not None and pooled.df == 3 and pooled.estimate == pytest.approx(iv.estimate)
    half3 = T975_DF3 * math.sqrt(math.log(2.0) ** 2 / 2 / 3)
    assert pooled.low == pytest.approx(math.exp(log_ratio - half3), rel=1e-3)


def test_runs_that_agree_by_chance_keep_the_spread_their_own_steps_show() -> None:
    # two identical runs per side: no between-run spread, but each run's steps vary by ±10 % (95 %, 5 steps)
    runs = [RunTime(1.0, rel_ci95=0.10, steady_steps=5)] * 2
    iv = speedup_interval(runs, [RunTime(1.05, rel_ci95=0.10, steady_steps=5)] * 2)
    assert iv is not None
    within_sd = 0.10 / 2.776  # t(4) = 2.776: the run's own standard error of its log mean
    se = math.sqrt(2 * within_sd**2 / 2)
    assert iv.low == pytest.approx(1.05 * math.exp(-T975_DF2 * se), rel=1e-3)
    assert iv.includes_one
    # without the floor, identical runs would claim certainty: a zero-width interval
    exact = speedup_interval([RunTime(1.0)] * 2, [RunTime(1.05)] * 2)
    assert exact is not None and exact.low == pytest.approx(exact.high)


def test_one_run_per_side_gives_no_interval_and_bad_times_are_refused() -> None:
    assert speedup_interval([RunTime(1.0)], [RunTime(2.0), RunTime(2.1)]) is None
    assert speedup_interval([], []) is None
    with pytest.raises(ValueError, match="positive"):
        speedup_interval([RunTime(1.0), RunTime(0.0)], [RunTime(2.0), RunTime(2.1)])


# ------------------------------------------------------------------------------------ the refusal rule


def _result(number: int, step_s: float, *, baseline: bool = False) -> TrialResult:
    steady = SteadyEstimate(
        step_time_s=step_s, rel_ci95=0.02, steady_steps=6, warmup_steps=1, throughput=16 / step_s
    )
    return TrialResult(
        number=number,
        params={"bs": number},
        is_baseline=baseline,
        status=TrialStatus.COMPLETE,
        reason="completed",
        steps=7,
        steady=steady,
    )


def _rec(results: dict[int, TrialResult], winner: int) -> Recommendation:
    w, b = results[winner], results[0]
    return Recommendation(
        trial=winner,
        throughput=w.throughput or 0.0,
        baseline_trial=0,
        baseline_throughput=b.throughput,
        speedup=(w.throughput or 0.0) / (b.throughput or 1.0),
        headroom_bytes=[],
        why="fastest healthy trial in the search",
    )


def _runs(
    times: dict[int, list[float]], *, winner: int, loaded: set[tuple[int, int]] = frozenset()
) -> list[ConfirmRun]:
    out = []
    for trial, steps in times.items():
        role = "baseline" if trial == 0 else ("winner" if trial == winner else "runner_up")
        for k, t in enumerate(steps, 1):
            out.append(
                ConfirmRun(
                    trial=trial,
                    round=k,
                    order=len(out) + 1,
                    role=role,
                    status=TrialStatus.COMPLETE,
                    step_time_s=t,
                    rel_ci95=0.01,
                    steady_steps=6,
                    throughput=16 / t,
                    duration_s=10.0,
                    gpu_seconds=10.0,
                    other_busy_cores=1.4 if (trial, k) in loaded else 0.1,
                    host_loaded=(trial, k) in loaded,
                )
            )
    return out


def test_noise_is_not_called_a_win() -> None:
    # the search saw 2x (a lucky winner run); re-measured, both take about a second per step
    results = {0: _result(0, 2.0, baseline=True), 3: _result(3, 1.0)}
    rec = _rec(results, 3)
    conf = Confirmation(rounds=2, runs=_runs({0: [1.00, 1.20], 3: [1.05, 0.95]}, winner=3))
    judged = judge(rec, conf, results, None)
    assert judged.trial == 3
    assert judged.measurable is False
    assert judged.search_speedup == pytest.approx(2.0)
    assert judged.speedup_low is not None and judged.speedup_high is not None
    assert judged.speedup_low <= 1.0 <= judged.speedup_high
    assert judged.verdict is not None
    assert judged.verdict.startswith("no measurable speedup over the baseline (trial 0): ")
    assert f"{judged.speedup:.2f}× [{judged.speedup_low:.2f}, {judged.speedup_high:.2f}]" in judged.verdict
    assert speedup_text(judged).startswith("no measurable speedup: ")
    assert judged.confirmation is not None and judged.confirmation.speedup is not None


def test_a_real_speedup_is_given_with_its_interval() -> None:
    results = {0: _result(0, 2.0, baseline=True), 3: _result(3, 1.0)}
    conf = Confirmation(rounds=2, runs=_runs({0: [2.0, 2.1], 3: [1.0, 1.02]}, winner=3))
    judged = judge(_rec(results, 3), conf, results, None)
    assert judged.measurable is True and judged.speedup_low is not None and judged.speedup_low > 1.0
    text = speedup_text(judged)
    assert text == f"{judged.speedup:.2f}× [{judged.speedup_low:.2f}, {judged.speedup_high:.2f}]"
    assert headline(judged).startswith("speedup over the baseline (trial 0): ")
    assert judged.host_load is None


def test_an_indistinguishable_runner_up_is_named_equivalent() -> None:
    results = {0: _result(0, 2.0, baseline=True), 3: _result(3, 1.0), 5: _result(5, 1.02)}
    conf = Confirmation(rounds=2, runs=_runs({0: [2.0, 2.1], 3: [1.0, 1.05], 5: [1.04, 0.99]}, winner=3))
    judged = judge(_rec(results, 3), conf, results, None)
    assert judged.trial == 3 and judged.equivalent == [5]
    assert judged.verdict is not None and "equivalent to the winner: trial 5 (" in judged.verdict
    assert judged.confirmation is not None and set(judged.confirmation.versus_winner) == {0, 5}


def test_a_runner_up_measurably_faster_on_re_measurement_becomes_the_winner() -> None:
    results = {0: _result(0, 2.0, baseline=True), 3: _result(3, 1.0), 5: _result(5, 1.02)}
    conf = Confirmation(rounds=2, runs=_runs({0: [2.0, 2.02], 3: [1.2, 1.21], 5: [0.9, 0.91]}, winner=3))
    judged = judge(_rec(results, 3), conf, results, None)
    assert judged.trial == 5
    assert judged.throughput == pytest.approx(16 / 1.02)  # the search's measurement of trial 5
    assert "re-measured faster than trial 3" in judged.why
    assert judged.measurable is True and judged.equivalent == []


def test_a_winner_measurably_slower_than_the_baseline_leaves_the_baseline() -> None:
    results = {0: _result(0, 2.0, baseline=True), 3: _result(3, 1.0)}
    conf = Confirmation(rounds=2, runs=_runs({0: [1.0, 1.01], 3: [1.3, 1.31]}, winner=3))
    judged = judge(_rec(results, 3), conf, results, None)
    assert judged.trial == 0 and judged.measurable is False and judged.speedup == 1.0
    assert judged.verdict is not None and judged.verdict.startswith("the baseline (trial 0) is the fastest")
    assert speedup_text(judged) == "the baseline is fastest"


def test_too_few_completed_runs_say_not_confirmed_and_a_loaded_host_is_named() -> None:
    results = {0: _result(0, 2.0, baseline=True), 3: _result(3, 1.0)}
    runs = _runs({0: [2.0], 3: [1.0, 1.1]}, winner=3, loaded={(3, 2)})
    conf = Confirmation(rounds=2, runs=runs, note="the time budget ran out")
    judged = judge(_rec(results, 3), conf, results, None)
    assert judged.measurable is None and judged.speedup_low is None
    assert (
        judged.verdict
        == "2.00× the baseline (trial 0) from one run of each (not confirmed: the time budget ran out)"
    )
    assert speedup_text(judged) == "2.00× (single runs, not re-measured)"
    assert judged.host_load is not None and "1 of 3 re-measurement runs" in judged.host_load
    assert "1.4 cores busy outside the run" in judged.host_load


def test_without_re_measurement_the_speedup_is_never_bare() -> None:
    results = {0: _result(0, 2.0, baseline=True), 3: _result(3, 1.0)}
    rec = not_remeasured(_rec(results, 3), "re-measurement off (--confirm-runs 0)")
    assert (
        rec.verdict
        == "2.00× the baseline (trial 0) from one run of each (not re-measured: re-measurement off (--confirm-runs 0))"
    )
    assert speedup_text(rec) == "2.00× (single runs, not re-measured)"
    no_baseline = _rec(results, 3).model_copy(update={"speedup": None, "baseline_throughput": None})
    assert not_remeasured(no_baseline, "the baseline did not complete").verdict == (
        "no speedup can be given: the baseline did not complete"
    )
    assert speedup_text(no_baseline) == "—"


def test_a_recommendation_stored_before_verdicts_existed_still_loads() -> None:
    old = {
        "trial": 3,
        "throughput": 1.71,
        "baseline_trial": 0,
        "baseline_throughput": 1.12,
        "speedup": 1.52,
        "headroom_bytes": [2361393152],
        "why": "fastest healthy trial: 1.71 completions/s, 1.52x the baseline (trial 0)",
        "skipped": [],
    }
    rec = Recommendation.model_validate(old)
    assert rec.confirmation is None and rec.verdict is None and rec.measurable is None
    assert headline(rec) == "1.52× the baseline (trial 0) from one run of each (not re-measured)"
    assert speedup_text(rec) == "1.52× (single runs, not re-measured)"
    again = Recommendation.model_validate(rec.model_dump(mode="json"))
    assert again == rec


# ------------------------------------------------------- judge, value by value (each a bug it would let by)

GIB = 2**30
T975_DF4 = 2.776


def _run(trial: int, k: int, t: float | None, **kw: object) -> ConfirmRun:
    """One re-measurement run; ``kw`` overrides the status, the run's own spread, the host load."""
    fields: dict[str, object] = {
        "trial": trial,
        "round": k,
        "order": k,
        "role": "baseline" if trial == 0 else "winner",
        "status": TrialStatus.COMPLETE,
        "step_time_s": t,
        "rel_ci95": 0.0,
        "steady_steps": 6,
        "duration_s": 10.0,
        "gpu_seconds": 10.0,
    }
    return ConfirmRun.model_validate(fields | kw)


def _stale(rec: Recommendation) -> Recommendation:
    """``rec`` as a second judgement would see it: an interval and a verdict from an earlier one."""
    return rec.model_copy(update={"speedup_low": 1.5, "speedup_high": 2.5, "measurable": True})


def test_unequal_run_counts_pool_every_configuration_once() -> None:
    # step times in powers of two, so each log time is a multiple of ln 2 (L):
    #   winner 3: 1, 2 s      -> logs 0, L      mean L/2     sum of squares L²/2
    #   baseline 0: 4, 4, 8 s -> logs 2L,2L,3L  mean 7L/3   sum of squares (1/9+1/9+4/9) L² = 2L²/3
    #   runner-up 5: 2, 2 s   -> mean L, sum of squares 0 (slower than the winner: 2 s vs √2 s)
    # pooled: 7 runs - 3 configurations = 4 degrees of freedom, var = (1/2 + 2/3) L² / 4 = 7L²/24
    # speedup 2^(7/3 - 1/2) = 2^(11/6); half-width t(4) · sqrt(7L²/24 · (1/2 + 1/3)) = t(4) · L · sqrt(35/144)
    runs = [_run(3, 1, 1.0), _run(3, 2, 2.0), _run(0, 1, 4.0), _run(0, 2, 4.0), _run(0, 3, 8.0)]
    runs += [_run(5, 1, 2.0), _run(5, 2, 2.0)]
    results = {0: _result(0, 4.0, baseline=True), 3: _result(3, 1.0), 5: _result(5, 1.5)}
    judged = judge(_rec(results, 3), Confirmation(rounds=3, runs=runs), results, None)
    estimate = 2 ** (11 / 6)
    half = T975_DF4 * math.log(2) * math.sqrt(35 / 144)
    assert judged.confirmation is not None and judged.confirmation.speedup is not None
    interval = judged.confirmation.speedup
    assert judged.trial == 3 and interval.estimate == pytest.approx(estimate)
    assert interval.low == pytest.approx(estimate * math.exp(-half), rel=1e-3)
    assert interval.high == pytest.approx(estimate * math.exp(half), rel=1e-3)
    assert interval.df == 4 and interval.runs == (2, 3)
    assert judged.equivalent == [5]  # 1.41× slower, but with this much noise not measurably
    # the interval spans exp(2 · half) ≈ 6.7×, more than NOISE_SPAN_MAX: the host's noise decides it
    assert judged.measurable is False and judged.speedup_low is None and judged.speedup_high is None
    assert judged.host_noise == (
        "the re-measured runs of one configuration differ so much that the 95 % interval spans"
        f" {math.exp(2 * half):.1f}× (more than 4×)"
    )
    assert judged.verdict == (
        f"speedup over the baseline (trial 0) not measurable on this host: {judged.host_noise}"
        " (3 interleaved run(s) of each); run again on a quieter host or with more --confirm-runs;"
        f" equivalent to the winner: trial 5 ({judged.confirmation.versus_winner[5].text()} of the winner)"
    )
    assert speedup_text(judged) == "not measurable on this host"


def test_loaded_runs_are_set_aside_and_the_quiet_runs_decide() -> None:
    # the baseline's second run was loaded (8 s instead of 2): set aside, the quiet runs give ~2×
    results = {0: _result(0, 2.0, baseline=True), 3: _result(3, 1.0)}
    runs = _runs({0: [2.0, 8.0, 2.1], 3: [1.0, 1.02, 0.98]}, winner=3, loaded={(0, 2)})
    judged = judge(_rec(results, 3), Confirmation(rounds=3, runs=runs), results, None)
    assert judged.confirmation is not None and judged.confirmation.speedup is not None
    assert judged.confirmation.speedup.runs == (3, 2)
    assert judged.measurable is True and judged.host_noise is None
    assert judged.speedup == pytest.approx(math.sqrt(2.0 * 2.1) / (1.0 * 1.02 * 0.98) ** (1 / 3))
    assert judged.verdict is not None and judged.verdict.endswith(
        "(95 % interval, 3 interleaved run(s) of each; 1 run(s) loaded by other processes set aside)"
    )


def test_a_loaded_host_with_too_few_quiet_runs_is_not_measurable_and_shows_no_number() -> None:
    # the search's 9× and a re-measured 4×: every winner run was loaded, so the host decided them
    results = {0: _result(0, 9.0, baseline=True), 3: _result(3, 1.0)}
    runs = _runs({0: [4.0, 4.2], 3: [1.0, 1.05]}, winner=3, loaded={(3, 1), (3, 2)})
    judged = judge(_rec(results, 3), Confirmation(rounds=2, runs=runs), results, None)
    assert judged.measurable is False and judged.speedup_low is None
    assert judged.host_noise == (
        "other processes loaded the host during 2 of the 4 compared runs, and fewer than two quiet runs"
        " of each side are left"
    )
    assert judged.verdict is not None and "×" not in judged.verdict
    assert "not measurable on this host" in judged.verdict
    assert speedup_text(judged) == "not measurable on this host"


def test_exact_ties_are_neither_a_win_nor_a_new_winner() -> None:
    # every run 1 s with no spread (and no own-steps spread: rel_ci95 unknown): the interval is [1, 1]
    runs = [_run(t, k, 1.0, rel_ci95=None) for t in (0, 3, 5) for k in (1, 2)]
    results = {0: _result(0, 2.0, baseline=True), 3: _result(3, 1.0), 5: _result(5, 1.02)}
    judged = judge(_rec(results, 3), Confirmation(rounds=2, runs=runs), results, None)
    assert judged.trial == 3 and judged.why == "fastest healthy trial in the search"  # not overtaken by a tie
    assert (judged.speedup, judged.speedup_low, judged.speedup_high) == (1.0, 1.0, 1.0)
    assert judged.measurable is False and judged.equivalent == [5]
    assert judged.verdict is not None
    assert judged.verdict.startswith("no measurable speedup over the baseline (trial 0): 1.00× [1.00, 1.00]")


def test_the_runs_own_spread_is_carried_from_the_confirm_records() -> None:
    # identical runs on each side (no between-run spread), each run's steps ±10 % (95 %, 5 steps):
    # the floor t(4)=2.776 → within sd 0.10/2.776; se of the difference sqrt(2·sd²/2) = sd; df 2
    runs = [_run(3, k, 1.0, rel_ci95=0.10, steady_steps=5) for k in (1, 2)]
    runs += [_run(0, k, 1.05, rel_ci95=0.10, steady_steps=5) for k in (1, 2)]
    results = {0: _result(0, 2.0, baseline=True), 3: _result(3, 1.0)}
    judged = judge(_rec(results, 3), Confirmation(rounds=2, runs=runs), results, None)
    sd = 0.10 / 2.776
    assert judged.speedup == pytest.approx(1.05)
    assert judged.speedup_low == pytest.approx(1.05 * math.exp(-T975_DF2 * sd), rel=1e-3)
    assert judged.speedup_high == pytest.approx(1.05 * math.exp(T975_DF2 * sd), rel=1e-3)


def test_failed_runs_and_runs_without_a_time_are_left_out() -> None:
    # the first test's numbers (winner 1.0/1.1 s, baseline 2.0/2.2 s) plus a CRASHed run with a time and a
    # COMPLETE run that never reached steady state: neither may count
    runs = [_run(3, 1, 1.0), _run(3, 2, 1.1), _run(3, 3, 5.0, status=TrialStatus.CRASH)]
    runs += [_run(0, 1, 2.0), _run(0, 2, 2.2), _run(0, 3, None)]
    results = {0: _result(0, 2.0, baseline=True), 3: _result(3, 1.0)}
    judged = judge(_rec(results, 3), Confirmation(rounds=3, runs=runs), results, None)
    assert judged.confirmation is not None and judged.confirmation.speedup is not None
    assert judged.confirmation.speedup.runs == (2, 2) and judged.speedup == pytest.approx(2.0)
    half = T975_DF2 * math.log(1.1) / math.sqrt(2)
    assert judged.speedup_low == pytest.approx(2.0 * math.exp(-half), rel=1e-3)


def test_a_side_whose_runs_all_failed_gives_no_interval_and_says_why() -> None:
    results = {0: _result(0, 2.0, baseline=True), 3: _result(3, 1.0)}
    failed = TrialStatus.CRASH
    for dead in (0, 3):  # the baseline's runs failed, then the winner's
        runs = [
            _run(t, k, 1.0, status=failed if t == dead else TrialStatus.COMPLETE)
            for t in (0, 3)
            for k in (1, 2)
        ]
        judged = judge(_stale(_rec(results, 3)), Confirmation(rounds=2, runs=runs), results, None)
        assert judged.trial == 3 and judged.speedup == pytest.approx(2.0)  # the search's single runs
        assert (judged.speedup_low, judged.speedup_high, judged.measurable) == (None, None, None)
        assert judged.verdict == (
            "2.00× the baseline (trial 0) from one run of each"
            " (not confirmed: too few re-measurement runs completed)"
        )


def test_a_new_winner_takes_its_own_search_numbers_and_says_by_how_much() -> None:
    results = {0: _result(0, 2.0, baseline=True), 3: _result(3, 1.0), 5: _result(5, 1.02)}
    results[5] = results[5].model_copy(update={"peak_mem_bytes": [60 * GIB]})
    runs = _runs({0: [2.0, 2.02], 3: [1.2, 1.21], 5: [0.9, 0.91]}, winner=3)
    hardware = Hardware(
        gpus=(GpuInfo(index=0, name="H100", memory_total_bytes=80 * GIB),),
        host=HostInfo(
            hostname="h", cpu_cores_logical=8, cpu_cores_physical=4, ram_total_bytes=GIB, platform="linux"
        ),
    )
    judged = judge(_rec(results, 3), Confirmation(rounds=2, runs=runs), results, hardware)
    assert judged.trial == 5 and judged.headroom_bytes == [20 * GIB]  # 80 GiB - its 60 GiB peak
    # trial 3 against 5: geometric means sqrt(1.2·1.21) = 1.20499 s and sqrt(0.9·0.91) = 0.90499 s → 1.33×
    assert judged.why == "re-measured faster than trial 3, the search's best (1.33× its throughput)"
    # what every verdict fills in is kept beside the new winner's numbers
    assert judged.search_speedup == pytest.approx(2.0) and judged.confirmation is not None
    assert judged.confirmation.speedup is not None and judged.confirmation.speedup.runs == (2, 2)


def test_the_baseline_as_winner_names_how_slow_the_search_best_was() -> None:
    results = {0: _result(0, 2.0, baseline=True), 3: _result(3, 1.0)}
    conf = Confirmation(rounds=2, runs=_runs({0: [1.0, 1.01], 3: [1.3, 1.31]}, winner=3))
    judged = judge(_stale(_rec(results, 3)), conf, results, None)
    assert judged.confirmation is not None and judged.confirmation.speedup is None  # no baseline vs itself
    slower = judged.confirmation.versus_winner[3]
    assert slower.estimate == pytest.approx(math.sqrt(1.0 * 1.01) / math.sqrt(1.3 * 1.31))
    assert (judged.speedup_low, judged.speedup_high) == (None, None)
    assert judged.verdict == (
        "the baseline (trial 0) is the fastest configuration: trial 3, the search's best, re-measured at"
        f" {slower.text()} the baseline's throughput (2 interleaved run(s) of each)"
    )


def test_every_equivalent_runner_up_is_listed_after_the_verdict() -> None:
    results = {
        0: _result(0, 2.0, baseline=True),
        3: _result(3, 1.0),
        5: _result(5, 1.02),
        7: _result(7, 1.03),
    }
    times = {0: [2.0, 2.1], 3: [1.0, 1.05], 5: [1.04, 0.99], 7: [1.03, 1.01]}
    judged = judge(_rec(results, 3), Confirmation(rounds=2, runs=_runs(times, winner=3)), results, None)
    assert judged.confirmation is not None and judged.confirmation.speedup is not None
    versus = judged.confirmation.versus_winner
    assert judged.trial == 3 and judged.equivalent == [5, 7]
    assert judged.verdict == (
        f"speedup over the baseline (trial 0): {judged.confirmation.speedup.text()} (95 % interval,"
        f" 2 interleaved run(s) of each); equivalent to the winner: trial 5 ({versus[5].text()} of the"
        f" winner), trial 7 ({versus[7].text()} of the winner)"
    )


def test_a_loaded_run_without_a_core_count_reports_none_busy() -> None:
    runs = [_run(t, k, 1.0 + 0.1 * k + t) for t in (0, 3) for k in (1, 2)]
    runs[0] = runs[0].model_copy(update={"host_loaded": True, "other_busy_cores": None})
    results = {0: _result(0, 2.0, baseline=True), 3: _result(3, 1.0)}
    judged = judge(_rec(results, 3), Confirmation(rounds=2, runs=runs), results, None)
    assert judged.host_load is not None and "(up to 0.0 cores busy outside the run)" in judged.host_load


def test_not_re_measured_keeps_the_search_speedup_and_names_a_baseline_winner() -> None:
    results = {0: _result(0, 2.0, baseline=True), 3: _result(3, 1.0)}
    rec = not_remeasured(_rec(results, 3), "the study was stopped")
    assert rec.search_speedup == pytest.approx(2.0)
    base = not_remeasured(_rec(results, 0), "the baseline is the winner")
    assert base.verdict == "the baseline (trial 0) is the fastest configuration tried"
    # a study written before verdicts whose best was its baseline
    old = _rec(results, 0)
    assert (
        old.verdict is None and headline(old) == "the baseline (trial 0) is the fastest configuration tried"
    )
