"""Which trial is exported: the recommendation, or a COMPLETE trial named with --trial."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.app.export import export_study, load_study_winner
from autotune.errors import NothingToRecommend, UsageError
from tests.export.conftest import edit_result


def test_the_recommendation_is_exported_by_default(fixture_study: Path) -> None:
    winner = load_study_winner(fixture_study)
    assert winner.number == 3 and winner.recommended
    assert winner.why.startswith("fastest healthy trial")
    assert winner.launch is not None and winner.launch.argv[0] == "swift"


def test_another_complete_trial_can_be_chosen(fixture_study: Path) -> None:
    winner = load_study_winner(fixture_study, trial=6)
    assert winner.number == 6 and not winner.recommended and winner.why == "chosen with --trial 6"
    text = export_study(fixture_study, "swift", trial=6).files["command.sh"]
    assert "--per_device_train_batch_size 1" in text and "--gradient_accumulation_steps 8" in text
    assert "trial 6: chosen with --trial 6" in text


@pytest.mark.parametrize(
    ("number", "status"), [(2, "OOM"), (7, "HANG"), (8, "UNHEALTHY"), (9, "PRUNED"), (15, "INTERRUPTED")]
)
def test_a_trial_that_is_not_complete_is_refused_with_its_status(
    fixture_study: Path, number: int, status: str
) -> None:
    with pytest.raises(UsageError) as info:
        load_study_winner(fixture_study, trial=number)
    assert f"trial {number} is {status}" in info.value.one_line()
    assert "not COMPLETE" in info.value.one_line()


def test_a_missing_trial_is_refused_with_the_trials_on_disk(fixture_study: Path) -> None:
    with pytest.raises(UsageError, match=r"trial 99 is not in .*Pick one of the trials on disk: 0, 1, 2"):
        load_study_winner(fixture_study, trial=99)


def test_not_a_study_directory(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is not a study directory"):
        load_study_winner(tmp_path)
    with pytest.raises(UsageError, match="is not a directory"):
        load_study_winner(tmp_path / "missing")


def test_no_recommendation_says_why(fixture_study: Path) -> None:
    for path in (fixture_study / "trials").iterdir():
        data = json.loads((path / "result.json").read_text())
        if data["status"] == "COMPLETE":
            edit_result(fixture_study, int(path.name), status="OOM", steady=None)
    with pytest.raises(NothingToRecommend) as info:
        load_study_winner(fixture_study)
    assert info.value.exit_code == 3  # not a usage error: the study is fine, it found nothing
    message = info.value.one_line()
    assert "no recommendation: no healthy trial with memory headroom" in message
    assert "7 OOM" in message and "1 UNHEALTHY" in message
    assert "--trial N" in message


def test_the_verdict_and_interval_travel_with_the_export(fixture_study: Path) -> None:
    from autotune.recommend import recommend
    from autotune.records import Confirmation, ConfirmRun, TrialStatus
    from autotune.study.verdict import judge
    from autotune.studydir import StudyDir

    sd = StudyDir(fixture_study)
    results = sd.results()
    rec = recommend(results, sd.hardware())
    assert rec is not None
    runs = [
        ConfirmRun(
            trial=t, round=k, order=i, role="x", status=TrialStatus.COMPLETE, step_time_s=s, steady_steps=5
        )
        for i, (t, k, s) in enumerate([(0, 1, 28.0), (3, 1, 24.0), (3, 2, 33.0), (0, 2, 29.0)], 1)
    ]
    judged = judge(rec, Confirmation(rounds=2, runs=runs), {r.number: r for r in results}, sd.hardware())
    assert judged.measurable is False
    settings = sd.read_settings()
    sd.write_settings(settings.model_copy(update={"recommendation": judged.model_dump(mode="json")}))
    knobs = json.loads(export_study(fixture_study, "json").files["knobs.json"])
    assert knobs["speedup_over_baseline"] == pytest.approx(judged.speedup)
    assert (knobs["speedup_low"], knobs["speedup_high"]) == (judged.speedup_low, judged.speedup_high)
    assert knobs["speedup_measurable"] is False
    assert knobs["verdict"].startswith("no measurable speedup over the baseline (trial 0): ")
    script = export_study(fixture_study, "swift").files["command.sh"]
    assert "# Verdict: no measurable speedup over the baseline (trial 0): " in script
    # another trial exported with --trial: its own single-run ratio, no interval, no verdict
    other = json.loads(export_study(fixture_study, "json", trial=6).files["knobs.json"])
    assert other["speedup_low"] is None and other["verdict"] is None
