"""best/ at the end of a study: the recommended trial (read from study.json) in its own backend's format,
plus knobs.json."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from autotune.app.best import write_best
from autotune.app.export import export_study
from autotune.export import MARKER
from tests.export.conftest import FIXTURE, edit_settings, make_study


def test_swift_study_best_holds_the_swift_script_and_knobs(tmp_path: Path) -> None:
    study = tmp_path / "study"
    shutil.copytree(FIXTURE, study)
    (study / "best" / "stale.txt").write_text("from an earlier winner\n")
    best = write_best(study)
    assert best == study / "best"
    assert sorted(p.name for p in best.iterdir()) == ["command.sh", "knobs.json"]
    assert (best / "command.sh").read_text() == export_study(study, "swift").files["command.sh"]
    knobs = json.loads((best / "knobs.json").read_text())
    assert knobs["trial"] == 3 and knobs["params"]["deepspeed"] == "zero3" and MARKER in knobs["_comment"]
    assert (best / "command.sh").stat().st_mode & 0o100


def test_trl_study_best_holds_the_yaml_and_its_configs(tmp_path: Path) -> None:
    study = make_study(
        tmp_path / "trl",
        backend="trl",
        params={"per_device_train_batch_size": 4, "zero_stage": 2, "offload_optimizer": True},
        derived={"world_size": 4, "gradient_accumulation_steps": 4},
    )
    best = write_best(study)
    assert best is not None
    names = sorted(p.name for p in best.iterdir())
    assert names == ["accelerate.yaml", "command.sh", "ds_config.json", "grpo.yaml", "knobs.json"]


def test_a_winner_its_backend_cannot_express_leaves_a_readme(tmp_path: Path) -> None:
    study = make_study(
        tmp_path / "swift",
        backend="swift",
        params={"per_device_train_batch_size": 4, "deepspeed": "zero3"},
        derived={"world_size": 4, "gradient_accumulation_steps": 4},
        dataset=None,
    )
    edit_settings(study, backend="command")  # a command study whose winner has no launch.json
    best = write_best(study)
    assert best is not None
    assert "no command export for trial 1" in (best / "README.txt").read_text()
    assert (best / "knobs.json").exists()


def test_no_recommendation_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "study.json").write_text(json.dumps({"backend": "trl", "recommendation": None}))
    assert write_best(tmp_path) is None
    assert not (tmp_path / "best").exists()
