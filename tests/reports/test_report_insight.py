"""Search insight: parameter importance through Optuna, the Pareto front, best-so-far."""

from __future__ import annotations

from pathlib import Path

import pytest
from autotune.reports._load import load_study
from autotune.reports.insight import best_so_far, param_importances, pareto_points

from autotune.records import SteadyEstimate, TrialResult, TrialStatus


def result(
    number: int,
    throughput: float | None,
    peak_gb: float | None = None,
    status: TrialStatus = TrialStatus.COMPLETE,
    gpu_s: float = 3600.0,
    **params,
) -> TrialResult:
    steady = (
        SteadyEstimate(
            step_time_s=32 / throughput, rel_ci95=0.02, steady_steps=4, warmup_steps=1, throughput=throughput
        )
        if throughput
        else None
    )
    return TrialResult(
        number=number,
        params=params,
        status=status,
        reason="",
        steady=steady,
        peak_mem_bytes=[int(peak_gb * 1e9)] if peak_gb is not None else [],
        gpu_seconds=gpu_s,
    )


def test_importance_finds_the_knob_that_drives_throughput() -> None:
    results = []
    n = 0
    for bs in (1, 2, 4, 8):
        for gc in (True, False):
            for workers in (0, 1):
                # Throughput grows with batch size; checkpointing costs a little; workers do nothing.
                results.append(
                    result(
                        n,
                        throughput=bs * (0.9 if gc else 1.0),
                        per_device_train_batch_size=bs,
                        gradient_checkpointing=gc,
                        dataloader_num_workers=workers,
                    )
                )
                n += 1
    imp = param_importances(results)
    assert list(imp.values)[0] == "per_device_train_batch_size"
    assert imp.values["per_device_train_batch_size"] > imp.values.get("dataloader_num_workers", 0.0)
    assert sum(imp.values.values()) == pytest.approx(1.0)
    assert "16 completed trials" in imp.note


def test_importance_needs_enough_completed_trials() -> None:
    results = [result(0, 1.0, bs=1), result(1, 2.0, bs=2), result(2, None, status=TrialStatus.OOM, bs=4)]
    imp = param_importances(results)
    assert imp.values == {} and "at least 3 completed trials (2 completed)" in imp.note


def test_importance_ignores_constant_and_conditional_knobs() -> None:
    results = [result(i, 1.0 + i, bs=i + 1, fixed="x", **({"extra": i} if i else {})) for i in range(4)]
    imp = param_importances(results)
    assert set(imp.values) == {"bs"}


def test_importance_without_variation() -> None:
    imp = param_importances([result(i, 1.0 + i, bs=1) for i in range(3)])
    assert imp.values == {} and "no knob took two values" in imp.note


def test_pareto_front() -> None:
    results = [
        result(0, 1.0, 10.0),  # front: smallest
        result(1, 0.8, 12.0),  # dominated by 0
        result(2, 2.0, 15.0),  # front
        result(3, 2.0, 16.0),  # dominated by 2 (same speed, more memory)
        result(4, None, 20.0, status=TrialStatus.OOM),  # not a completed point
    ]
    points = {p.trial: p for p in pareto_points(results)}
    assert set(points) == {0, 1, 2, 3}
    assert {n for n, p in points.items() if p.on_front} == {0, 2}


def test_best_so_far_against_trials_and_gpu_hours() -> None:
    results = [
        result(0, 1.0, gpu_s=1800),
        result(1, None, status=TrialStatus.OOM, gpu_s=900),
        result(2, 1.5, gpu_s=1800),
        result(3, 1.2, gpu_s=3600),
    ]
    pts = best_so_far(results)
    assert [p.best for p in pts] == [1.0, 1.0, 1.5, 1.5]
    assert [p.throughput for p in pts] == [1.0, None, 1.5, 1.2]
    assert [round(p.gpu_hours, 2) for p in pts] == [0.5, 0.75, 1.25, 2.25]


def test_unhealthy_trials_never_count_as_best() -> None:
    pts = best_so_far([result(0, 1.0), result(1, 5.0, status=TrialStatus.UNHEALTHY)])
    assert pts[-1].best == 1.0


def test_fixture_insight(fixture_study: Path) -> None:
    data = load_study(fixture_study)
    front = [p.trial for p in pareto_points(data.results) if p.on_front]
    assert front == [0, 4, 6, 3]  # the offload trial (1) is slower and larger than the baseline
    assert best_so_far(data.results)[-1].best == pytest.approx(1.7085)
    imp = param_importances(data.results)
    assert set(imp.values) <= {
        "per_device_train_batch_size",
        "dataloader_num_workers",
        "deepspeed",
        "vllm_gpu_memory_utilization",
    }
    assert "rough hint" in imp.note


def _svg_text(svg: str) -> list[str]:
    import re

    return [t.strip() for t in re.findall(r"<text[^>]*>([^<]*)</text>", svg) if t.strip()]


def test_the_progress_chart_counts_whole_trials_and_names_the_device_hours() -> None:
    from autotune.reports import charts
    from autotune.reports.insight import ProgressPoint

    points = [ProgressPoint(n, "COMPLETE", 2.0 + n, 2.0 + n, 0.001 * (n + 1)) for n in range(4)]
    texts = _svg_text(charts.inline_svg(lambda p: charts.progress_chart(points, p, hours_label="CPU-hours")))
    assert "CPU-hours" in texts and "GPU-hours" not in texts
    trial_ticks = [t for t in texts if t.replace(".", "", 1).isdigit()]
    assert "0.5" not in trial_ticks and "1.5" not in trial_ticks  # no fractional trial numbers


def test_a_failed_study_charts_no_negative_throughput() -> None:
    from autotune.reports import charts
    from autotune.reports.insight import ProgressPoint

    failed = [ProgressPoint(n, "OOM", None, None, 0.01 * (n + 1)) for n in range(3)]
    rows = [{"throughput": None, "status": "OOM", "ci_abs": None, "number": n} for n in range(3)]
    for draw in (
        lambda p: charts.progress_chart(failed, p),
        lambda p: charts.throughput_chart(rows, p),
    ):
        texts = _svg_text(charts.inline_svg(draw))
        assert not any(t.startswith(("−", "-")) and t[1:2].isdigit() for t in texts), texts


def test_importance_names_its_method() -> None:
    rows = [(1.0, 1, True), (2.0, 2, True), (3.0, 4, False), (2.5, 4, True), (1.5, 1, False)]
    imp = param_importances([result(n, tp, bs=bs, ckpt=ck) for n, (tp, bs, ck) in enumerate(rows)])
    assert imp.method == "PED-ANOVA" and "PED-ANOVA" in imp.note and "fANOVA" in imp.note


#: 12 trials where the fastest few all ran one dataloader worker: PED-ANOVA (what separates the fastest
#: from the rest) ranks workers second, fANOVA (variance over all trials, optuna-dashboard's) ranks
#: gradient checkpointing second
_DISAGREE = [
    (3.22, 1, True, 0), (2.21, 2, False, 1), (3.78, 1, True, 1), (2.54, 4, False, 2),
    (3.43, 1, True, 1), (3.78, 4, False, 1), (3.46, 2, True, 0), (1.27, 2, False, 0),
    (5.59, 4, True, 1), (3.96, 4, False, 1), (7.43, 8, True, 1), (6.56, 8, True, 1),
]  # fmt: skip


def _disagreeing() -> list[TrialResult]:
    return [result(n, tp, bs=bs, ckpt=ck, workers=w) for n, (tp, bs, ck, w) in enumerate(_DISAGREE)]


def test_where_fanova_orders_the_knobs_differently_both_are_given() -> None:
    pytest.importorskip("sklearn")
    imp = param_importances(_disagreeing())
    assert list(imp.values) == ["bs", "workers", "ckpt"]
    assert list(imp.fanova) == ["bs", "ckpt", "workers"]
    assert sum(imp.fanova.values()) == pytest.approx(1.0)
    assert "orders the knobs differently here: both are shown" in imp.note
    # the same trials, the same numbers (the forest is seeded)
    assert param_importances(_disagreeing()).fanova == imp.fanova


def test_where_the_methods_agree_only_one_is_given() -> None:
    pytest.importorskip("sklearn")
    rows = [(1.0, 1, True), (2.0, 2, True), (3.0, 4, False), (2.5, 4, True), (1.5, 1, False)]
    imp = param_importances([result(n, tp, bs=bs, ckpt=ck) for n, (tp, bs, ck) in enumerate(rows)])
    assert imp.fanova == {} and "orders the knobs the same here" in imp.note


def test_without_scikit_learn_the_note_says_how_to_see_fanova(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "sklearn", None)  # `import sklearn` raises ImportError
    imp = param_importances(_disagreeing())
    assert imp.fanova == {} and list(imp.values) == ["bs", "workers", "ckpt"]
    assert "install scikit-learn to see it beside this one" in imp.note
