"""``study.json`` as :class:`StudySettings`: old files read through the one reader and write back the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.errors import UsageError
from autotune.studydir import StudyDir
from autotune.studysettings import StudySettings

ROOT = Path(__file__).resolve().parent
#: the committed studies: the generated fixture (an older version's study.json, no uid, identity or
#: recommendation) and the recorded TRL study (a newer one)
STUDIES = [ROOT / "fixtures" / "study", ROOT / "fixtures" / "recorded_trl_study" / "study"]


@pytest.mark.parametrize("study", STUDIES, ids=lambda p: p.parent.name if p.name == "study" else p.name)
def test_an_old_study_json_reads_and_writes_back_the_same(study: Path, tmp_path: Path) -> None:
    raw_text = (study / "study.json").read_text()
    raw = json.loads(raw_text)
    settings = StudyDir(study).read_settings()
    assert settings.to_json() == raw
    assert json.dumps(settings.to_json()) == json.dumps(raw)  # key order too
    copy = StudyDir(tmp_path)
    copy.write_settings(settings)
    assert json.loads(copy.study_json.read_text()) == raw
    assert copy.read_settings() == settings


def test_typed_attributes_of_the_generated_fixture() -> None:
    s = StudyDir(STUDIES[0]).read_settings()
    assert (s.backend, s.global_batch, s.num_generations) == ("swift", 32, 8)
    assert (s.budget.trials, s.budget.time_s) == (16, None)
    assert s.model.loaded == "Qwen/Qwen2-7B" and s.model.facts["hidden"] == 3584 and s.model.local is False
    assert s.model.ref().path_or_id == "Qwen/Qwen2-7B" and not s.stored_recommendation
    assert s.outcome is not None and s.identity == {} and s.secret_args == []


def test_missing_unknown_and_damaged_entries_are_tolerated_and_kept() -> None:
    raw = {"name": "n", "global_batch": "many", "budget": 5, "added_later": {"x": 1}, "model": {"name": "m"}}
    s = StudySettings.from_json(raw)
    assert s.name == "n" and s.global_batch is None and s.budget.trials is None  # damaged reads as missing
    assert s.model.loaded == "m" and s.model_extra == {"added_later": {"x": 1}}
    assert s.to_json() == raw  # nothing lost, nothing added, the damaged entries as they were
    assert list(s.to_json()) == list(raw)


def test_a_stored_null_recommendation_is_not_a_missing_one() -> None:
    assert StudySettings.from_json({"recommendation": None}).stored_recommendation
    assert not StudySettings.from_json({}).stored_recommendation


def test_a_study_json_that_is_not_an_object_is_one_line(tmp_path: Path) -> None:
    sd = StudyDir(tmp_path)
    sd.study_json.write_text("[1, 2]")
    with pytest.raises(UsageError, match="does not hold a JSON object") as err:
        sd.read_settings()
    assert "\n" not in err.value.one_line()
