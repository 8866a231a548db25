"""Writing an export: never over a file of the user's; over autotune's own files, yes; secrets never."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from autotune.app.export import export_study
from autotune.errors import UsageError
from autotune.export import EXPORT_FORMATS, MARKER, Export, write_export
from tests.export.conftest import SECRETS


def test_single_file_export_is_written_to_the_path(fixture_study: Path, tmp_path: Path) -> None:
    export = export_study(fixture_study, "swift")
    written = write_export(export, tmp_path / "train.sh")
    assert written == [tmp_path / "train.sh"]
    assert (tmp_path / "train.sh").read_text() == export.files["command.sh"]
    assert os.stat(tmp_path / "train.sh").st_mode & stat.S_IXUSR


def test_single_file_export_into_an_existing_directory(fixture_study: Path, tmp_path: Path) -> None:
    written = write_export(export_study(fixture_study, "deepspeed"), tmp_path)
    assert written == [tmp_path / "ds_config.json"]
    assert not os.stat(written[0]).st_mode & stat.S_IXUSR


def test_multi_file_export_goes_into_a_directory(fixture_study: Path, tmp_path: Path) -> None:
    written = write_export(export_study(fixture_study, "verl"), tmp_path / "verl")
    assert sorted(p.name for p in written) == ["autotune_verl_reward.py", "command.sh"]


@pytest.mark.parametrize("fmt", ["swift", "deepspeed", "json"])
def test_a_file_of_the_users_is_never_overwritten(fixture_study: Path, tmp_path: Path, fmt: str) -> None:
    export = export_study(fixture_study, fmt)
    target = tmp_path / export.main
    target.write_text("my own training script\n")
    with pytest.raises(UsageError) as info:
        write_export(export, tmp_path)
    assert "exists and was not written by autotune export" in info.value.one_line()
    assert "--out" in info.value.one_line()
    assert target.read_text() == "my own training script\n"


def test_nothing_is_written_when_one_file_is_in_the_way(fixture_study: Path, tmp_path: Path) -> None:
    (tmp_path / "autotune_verl_reward.py").write_text("def compute_score(): ...\n")
    with pytest.raises(UsageError):
        write_export(export_study(fixture_study, "verl"), tmp_path)
    assert not (tmp_path / "command.sh").exists()


def test_autotunes_own_files_are_replaced(fixture_study: Path, tmp_path: Path) -> None:
    first = export_study(fixture_study, "swift")
    write_export(first, tmp_path / "train.sh")
    second = export_study(fixture_study, "swift", trial=6)
    write_export(second, tmp_path / "train.sh")
    assert (tmp_path / "train.sh").read_text() == second.files["command.sh"]


def test_every_file_of_every_format_carries_the_marker(fixture_study: Path) -> None:
    for fmt in ("swift", "verl", "deepspeed", "json", "command"):
        for name, text in export_study(fixture_study, fmt).files.items():
            assert MARKER in text[:4096], f"{fmt}/{name}"


def test_secrets_never_reach_an_export(fixture_study: Path) -> None:
    """The fixture's study.json passes --hub_token hf_... and its trial ran with HF_TOKEN and WANDB_API_KEY."""
    seen = 0
    for fmt in EXPORT_FORMATS:
        try:
            export = export_study(fixture_study, fmt)
        except UsageError:
            continue
        seen += 1
        for text in export.files.values():
            for secret in SECRETS:
                assert secret not in text, fmt
    assert seen == 5
    swift = export_study(fixture_study, "swift")
    assert any("--hub_token is a secret" in note for note in swift.notes)
    # the script reads it from the environment and says what to export
    assert '--hub_token "${HUB_TOKEN}"' in swift.files["command.sh"]
    assert "export HUB_TOKEN before running" in swift.files["command.sh"]


def test_a_secret_looking_value_is_read_from_the_environment_whatever_its_name(fixture_study: Path) -> None:
    from tests.export.conftest import edit_settings

    fixed = json.loads((fixture_study / "study.json").read_text())["fixed"]
    edit_settings(fixture_study, fixed={**fixed, "vllm_server_base_url": "http://user:pa55word@host:8000"})
    text = export_study(fixture_study, "swift").files["command.sh"]
    assert "pa55word" not in text
    assert '--vllm_server_base_url http://user:"${VLLM_SERVER_BASE_URL_PASSWORD}"@host:8000' in text


def test_a_name_the_user_declares_secret_is_never_exported(fixture_study: Path) -> None:
    from autotune.app.export import export_winner, load_study_winner
    from tests.export.conftest import edit_settings

    fixed = json.loads((fixture_study / "study.json").read_text())["fixed"]
    edit_settings(fixture_study, fixed={**fixed, "run_label": "s3cr3t-label"})
    winner = load_study_winner(fixture_study, secret_names=("run-label",))
    for fmt in ("swift", "json"):
        assert all("s3cr3t-label" not in text for text in export_winner(winner, fmt).files.values()), fmt


def test_write_error_is_one_line(tmp_path: Path) -> None:
    export = Export(format="json", files={"a.json": "{}"}, main="a.json", trial=0)
    (tmp_path / "file").write_text("x")
    with pytest.raises(UsageError, match="cannot write"):
        write_export(export, tmp_path / "file" / "sub" / "a.json")
