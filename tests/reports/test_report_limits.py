"""The report's "How far from the limit" section and its per-trial column, from the ceilings in the
trials' results."""

from __future__ import annotations

import shutil
from pathlib import Path

from autotune.reports import render_study
from autotune.reports._load import load_study
from autotune.reports._render import pick_winner
from autotune.reports.frames import load_frames
from autotune.reports.limits import fraction_text, limit_view, search_used_ceiling

from autotune.records import TrialCeiling, TrialResult, TrialStatus
from autotune.studydir import StudyDir

CEILING = TrialCeiling(
    basis="catalog peaks of H100 (989 TFLOP/s, 3,350 GB/s)",
    basis_source="catalog",
    work="160 completion tokens per sample (measured); prompt tokens not counted",
    phase_ceiling_s={
        "rollout_prefill": 0.01,
        "rollout_decode": 0.9,
        "rollout": 0.9,
        "reference": 0.0,
        "train": 0.5,
        "weight_sync": 0.01,
        "offload": 0.0,
    },
    step_ceiling_s=1.41,
    step_measured_s=10.0,
    step_fraction=0.141,
    phase_measured_s={"rollout": 5.0, "train": 1.0, "weight_sync": 0.5},
    phase_fraction={"rollout": 0.18, "train": 0.5, "weight_sync": 0.02},
)


def _result(ceiling: TrialCeiling | None, number: int = 4, choice: dict | None = None) -> TrialResult:
    return TrialResult(
        number=number, params={}, status=TrialStatus.COMPLETE, reason="ok", ceiling=ceiling, choice=choice
    )


def test_the_section_names_the_largest_gap() -> None:
    view = limit_view(_result(CEILING), [_result(CEILING)])
    assert view is not None
    assert view.step_text == "10 s per step against a ceiling of 1.41 s: 14 % of the limit"
    assert [(b.phase, round(b.width_pct)) for b in view.bars] == [
        ("rollout", 18),
        ("train", 50),
        ("weight_sync", 2),
    ]
    # rollout loses 4.1 s against its bound, more than train (0.5 s) or the sync (0.49 s)
    assert view.gap.startswith("rollout runs at 18 % of its bound")
    assert "4.1 s per step above it" in view.gap
    assert not view.error and not view.no_split
    assert "did not use the ceiling" in view.search


def test_a_step_below_its_ceiling_is_called_an_error() -> None:
    fast = CEILING.model_copy(update={"step_measured_s": 1.0, "step_fraction": 1.41})
    assert fast.beats_ceiling
    view = limit_view(_result(fast), [])
    assert view is not None and "measurement or model error" in view.error
    assert "the step measured 1 s below its ceiling of 1.41 s" in view.error
    assert fraction_text(fast) == "141 % (faster than its ceiling: measurement or model error)"


def test_fraction_text_and_search_use() -> None:
    assert fraction_text(CEILING) == "14 %"
    assert fraction_text(CEILING.model_copy(update={"step_fraction": 4.2e-5})) == "0.0042 %"
    assert fraction_text(None) == ""
    used = [_result(CEILING, 1, {"ceiling_s": 1.4}), _result(CEILING, 2, {"mode": "explore"})]
    assert (
        search_used_ceiling(used) == "The search bounded its predicted speeds by the ceiling for 1 trial(s)."
    )
    assert limit_view(_result(None), []) is None


def test_the_report_shows_the_section_and_the_column(fixture_study: Path, tmp_path: Path) -> None:
    study = tmp_path / "study"
    shutil.copytree(fixture_study, study)
    winner = pick_winner(load_study(study))
    assert winner is not None
    sd = StudyDir(study)
    trial = load_study(study).trial(winner.trial)
    assert trial is not None
    sd.write_result(trial.result.model_copy(update={"ceiling": CEILING}))
    paths = render_study(study, out_dir=tmp_path / "out", png=False)
    md, html = paths.markdown.read_text(), paths.html.read_text()
    for text in (md, html):
        assert "How far from the limit" in text
        assert f"Trial {winner.trial}:" in text
        assert "rollout runs at 18 % of its bound" in text
        assert "of limit" in text and "14 %" in text
    assert "`████░░░░░░░░░░░░░░░░`" in md  # 18 %: 3.6 of 20 cells, rounded
    assert 'style="width:18.0%"' in html
    frame = load_frames(study).trials  # the same column in the notebook view
    assert frame.loc[winner.trial, "limit_fraction"] == 0.141
    assert frame["limit_fraction"].drop(index=winner.trial).isna().all()


def test_a_study_without_ceilings_has_no_section(rendered) -> None:  # noqa: ANN001
    assert "How far from the limit" not in rendered.markdown.read_text()


def test_no_larger_micro_batch_advice_beside_a_winner_that_beat_larger_ones() -> None:
    from autotune.records import SteadyEstimate

    train_worst = CEILING.model_copy(
        update={"phase_measured_s": {"rollout": 1.0, "train": 8.0, "weight_sync": 0.5}}
    )

    def trial(number: int, bs: int, throughput: float) -> TrialResult:
        steady = SteadyEstimate(
            step_time_s=16 / throughput, rel_ci95=0.02, steady_steps=4, warmup_steps=1, throughput=throughput
        )
        return TrialResult(
            number=number,
            params={"per_device_train_batch_size": bs},
            status=TrialStatus.COMPLETE,
            reason="ok",
            ceiling=train_worst,
            steady=steady,
        )

    winner, bigger = trial(3, 1, 4.0), trial(1, 8, 2.0)
    view = limit_view(winner, [winner, bigger], "per_device_train_batch_size")
    assert view is not None and view.gap.startswith("train runs at")
    assert "larger micro-batches, " not in view.gap
    assert (
        "larger micro-batches were measured slower in this study (trial 1: per_device_train_batch_size=8)"
        in view.gap
    )
    # without such a measurement the usual advice stands
    alone = limit_view(winner, [winner], "per_device_train_batch_size")
    assert alone is not None and "larger micro-batches, less recomputation" in alone.gap
