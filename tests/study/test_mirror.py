from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from autotune.errors import UsageError
from autotune.records import TrialResult, TrialStatus
from autotune.study.mirror import pull


def _study(url: str, name: str, settings: dict | None) -> optuna.Study:
    study = optuna.create_study(storage=url, study_name=name, direction="maximize")
    if settings is not None:
        study.set_user_attr("settings", settings)
    return study


def test_a_study_name_the_storage_does_not_hold_is_refused_naming_those_it_does(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    _study(url, "alpha", {"name": "alpha"})
    with pytest.raises(UsageError, match="no study named 'beta'") as err:
        pull(url, "beta", tmp_path / "out")
    assert "alpha" in str(err.value.hint)
    _study(url, "foreign", None)  # an Optuna study no autotune worker wrote
    with pytest.raises(UsageError, match="not written by autotune search"):
        pull(url, "foreign", tmp_path / "out")


def test_results_come_from_the_storage_and_files_on_disk_are_kept(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    study = _study(url, "s", {"name": "s", "finished_wall_s": 10.0})
    done = study.ask({"bs": optuna.distributions.IntDistribution(1, 4)})
    result = TrialResult(
        number=done.number, params=done.params, status=TrialStatus.COMPLETE, reason="ok", throughput=5.0
    )
    done.set_user_attr("result", result.model_dump_json())
    done.set_user_attr("launch", '{"argv": ["python", "job.py"]}')
    study.tell(done, 5.0)
    lost = study.ask({"bs": optuna.distributions.IntDistribution(1, 4)})  # its worker died unrecorded
    study.tell(lost, state=optuna.trial.TrialState.FAIL)
    running = study.ask({"bs": optuna.distributions.IntDistribution(1, 4)})
    out = tmp_path / "out"
    kept = out / "trials" / str(running.number) / "result.json"
    kept.parent.mkdir(parents=True)
    kept.write_text(
        TrialResult(
            number=running.number, params=running.params, status=TrialStatus.COMPLETE, reason="mine"
        ).model_dump_json()
    )
    pulled = pull(url, "s", out)
    assert sorted(pulled.trials_written) == [done.number, lost.number]
    on_disk = {int(p.parent.name): json.loads(p.read_text()) for p in (out / "trials").glob("*/result.json")}
    assert on_disk[done.number]["status"] == "COMPLETE" and on_disk[done.number]["throughput"] == 5.0
    assert on_disk[lost.number]["status"] == "INTERRUPTED"
    assert on_disk[running.number]["reason"] == "mine"  # what the directory had is not overwritten
    assert (out / "trials" / str(done.number) / "launch.json").exists()
    assert json.loads((out / "study.json").read_text())["finished_wall_s"] == 10.0
