"""`autotune export` through the installed console script."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
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


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_running_the_command_export_never_touches_the_study(tmp_path: Path) -> None:
    """The export writes its own metrics and phases beside itself: every file of the study is
    byte-identical after the exported script ran (it appended to the winner's metrics.jsonl before)."""
    fault = Path(__file__).resolve().parents[1] / "fixtures" / "faults" / "fault.py"
    space = tmp_path / "space.yaml"
    space.write_text("backend: command\nknobs:\n  bs: {type: int, choices: [1, 2], default: 1}\n")
    out = tmp_path / "runs" / "demo"
    study = run_cli(
        "search", "--backend", "command", "--space", str(space), "--out", str(out), "--search", "grid",
        "--trials", "1", "--confirm-runs", "0", "--",
        sys.executable, str(fault), "--mode", "ok", "--steps", "3", "--step-s", "0.05", "--to-file", "--bs", "{bs}",
    )  # fmt: skip
    assert study.returncode == 0, study.stderr
    exported = tmp_path / "exported"
    proc = run_cli("export", str(out), "--format", "command", "-o", str(exported))
    assert proc.returncode == 0, proc.stderr
    before = _files(out)
    script = exported if exported.is_file() else exported / "command.sh"
    ran = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert _files(out) == before
    # what the run wrote is beside the script, under the trial's own file name
    launch = json.loads((out / "trials" / "0" / "launch.json").read_text())
    metrics = script.parent / Path(launch["metrics_paths"][0]).name
    assert metrics.read_text().count('"step"') == 3


def test_the_command_export_of_a_trl_trial_copies_its_inputs_relative_to_itself(tmp_path: Path) -> None:
    """A TRL trial's command reads trial_config.json from its trial directory: the export copies it (and
    the prompts it names) with every trial path made relative, and runs in its own directory."""
    recorded = Path(__file__).resolve().parents[1] / "fixtures" / "recorded_trl_study" / "study"
    study = tmp_path / "study"
    shutil.copytree(recorded, study)
    for path in study.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".sh"):
            path.write_text(path.read_text().replace("@STUDY@", str(study)))
    exported = tmp_path / "exported"
    proc = run_cli("export", str(study), "--format", "command", "--trial", "0", "-o", str(exported))
    assert proc.returncode == 0, proc.stderr
    copied = sorted(p.name for p in exported.iterdir())
    assert "trial_config.json" in copied and "prompts.jsonl" in copied
    assert not {"metrics.jsonl", "result.json", "stdout.log"} & set(copied)
    config = (exported / "trial_config.json").read_text()
    assert str(study) not in config and '"./metrics.jsonl"' in config
    script = (exported / "command.sh").read_text()
    assert 'cd "$HERE"' in script and '"$HERE/trial_config.json"' in script and str(study) not in script
    # exporting again replaces the copies it wrote before (they carry no marker of their own)
    again = run_cli("export", str(study), "--format", "command", "--trial", "0", "-o", str(exported))
    assert again.returncode == 0, again.stderr
    # a copy the user changed since is theirs: never replaced
    import os
    import time

    edited = exported / "prompts.jsonl"
    edited.write_text("my own prompts\n")
    later = time.time() + 5
    os.utime(edited, (later, later))
    refused = run_cli("export", str(study), "--format", "command", "--trial", "0", "-o", str(exported))
    assert (
        refused.returncode == 2 and "prompts.jsonl exists and was not written by autotune" in refused.stderr
    )
    assert edited.read_text() == "my own prompts\n"
