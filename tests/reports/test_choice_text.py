"""The report says, for every trial, why the search chose it."""

from __future__ import annotations

from pathlib import Path

from autotune.reports import render_study
from autotune.reports._rows import choice_text


def test_a_refinement_names_the_incumbent_the_move_the_prediction_and_the_risk() -> None:
    text = choice_text(
        {
            "mode": "refine",
            "predicted_throughput": 1.234,
            "expected_gain_frac": 0.052,
            "failure_risk": 0.08,
            "incumbent": 4,
            "move": {"per_device_train_batch_size": [4, 8], "offload_optimizer": [True, False]},
        }
    )
    assert text == (
        "refine best trial 4: per_device_train_batch_size 4→8, offload_optimizer true→false; "
        "predicted 1.23/s; expected gain +5.2%; failure risk 8%"
    )


def test_exploration_baseline_and_sampler_choices() -> None:
    explore = choice_text(
        {"mode": "explore", "incumbent": 2, "move": {"a": [1, 2], "b": [1, 3]}, "failure_risk": 0.3}
    )
    assert explore == "explore: 2 knobs away from best trial 2; failure risk 30%"
    assert choice_text({"mode": "explore", "incumbent": None, "move": {}}).startswith("explore: the model's")
    assert choice_text({"mode": "baseline"}).startswith("the baseline")
    assert choice_text({"mode": "sampler"}) == "chosen by Optuna's sampler"
    assert choice_text(None) == ""


def test_screening_and_combination_runs_name_the_levels_they_measure() -> None:
    screen = choice_text(
        {"mode": "screen", "incumbent": 0, "move": {"tp": [1, 4]}, "covers": {"tp": 4}, "failure_risk": 0.1}
    )
    assert screen == "screen the high-impact knobs: measure tp 4; failure risk 10%"
    combine = choice_text({"mode": "combine", "covers": {"tp": 4, "sleep_level": 0}})
    assert combine == "combine the best screened levels: tp 4, sleep_level 0"


def test_the_markdown_report_has_a_chosen_because_column(fixture_study: Path, tmp_path: Path) -> None:
    paths = render_study(fixture_study, out_dir=tmp_path / "report", png=False)
    md = Path(paths.markdown).read_text()
    assert "| chosen because |" in md
    assert "refine best trial 0:" in md


def test_a_probe_names_the_suspect_it_tests() -> None:
    text = choice_text(
        {
            "mode": "probe",
            "incumbent": 3,
            "move": {"deepspeed": ["zero3_offload", "zero3"]},
            "suspect": "deepspeed='zero3'",
            "failure_risk": 0.6,
        }
    )
    assert text.startswith(
        "test a suspect of earlier failures (deepspeed='zero3') on best trial 3: deepspeed zero3_offload→zero3"
    )
    assert text.endswith("failure risk 60%")
