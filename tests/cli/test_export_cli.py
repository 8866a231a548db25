"""`autotune export` through the installed console script."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.cli.conftest import run_cli

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "study"


@pytest.fixture
def study(tmp_path: Path) -> Path:
    dest = tmp_path / "study"
    shutil.copytree(FIXTURE, dest)
    return dest


def test_default_format_is_the_studys_backend_printed_to_stdout(study: Path) -> None:
    proc = run_cli("export", str(study))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("#!/usr/bin/env bash\n# Written by autotune export (--format swift)")
    assert "swift rlhf" in proc.stdout and "--deepspeed zero3" in proc.stdout
    assert "hf_FixtureSecretToken" not in proc.stdout + proc.stderr
    assert "note: --hub_token is a secret: scripts read it from $HUB_TOKEN" in proc.stderr
    assert '--hub_token "${HUB_TOKEN}"' in proc.stdout


def test_multi_file_format_names_the_other_files(study: Path) -> None:
    proc = run_cli("export", str(study), "--format", "verl")
    assert proc.returncode == 0, proc.stderr
    assert "verl.trainer.main_ppo" in proc.stdout
    assert "--out DIR would also write: autotune_verl_reward.py" in proc.stderr


def test_out_writes_every_file_and_prints_the_paths(study: Path, tmp_path: Path) -> None:
    out = tmp_path / "exported"
    proc = run_cli("export", str(study), "--format", "verl", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [str(out / "command.sh"), str(out / "autotune_verl_reward.py")]
    assert (out / "command.sh").read_text().startswith("#!/usr/bin/env bash")


def test_trial_option_exports_that_trial(study: Path) -> None:
    proc = run_cli("export", str(study), "--format", "json", "--trial", "6")
    assert proc.returncode == 0, proc.stderr
    assert '"trial": 6' in proc.stdout and '"recommended": false' in proc.stdout


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--format", "yaml"], "unknown export format 'yaml'"),
        (["--trial", "2"], "trial 2 is OOM"),
        (
            ["--format", "trl"],
            "fixed argument max_prompt_length=512 cannot be expressed in TRL's configuration",
        ),
    ],
)
def test_errors_are_one_line_with_exit_code_2(study: Path, args: list[str], expected: str) -> None:
    proc = run_cli("export", str(study), *args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0]


def test_not_a_study_directory(tmp_path: Path) -> None:
    proc = run_cli("export", str(tmp_path))
    assert proc.returncode == 2
    assert "is not a study directory (no study.json)" in proc.stderr and "Traceback" not in proc.stderr


def test_a_users_file_is_not_overwritten(study: Path, tmp_path: Path) -> None:
    mine = tmp_path / "train.sh"
    mine.write_text("#!/bin/sh\necho mine\n")
    proc = run_cli("export", str(study), "--out", str(mine))
    assert proc.returncode == 2 and "was not written by autotune export" in proc.stderr
    assert mine.read_text() == "#!/bin/sh\necho mine\n"
