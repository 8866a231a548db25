"""Issue 30's last promises, through the CLI with the command backend and real processes: a trial whose
command cannot be launched is INVALID before anything records it RUNNING; ``report`` during a search
reads a consistent snapshot; unreadable files (as an unprivileged user) are one line, no traceback."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from autotune.cli.app import main
from autotune.records import TrialResult, TrialStatus
from autotune.studydir import StudyDir
from tests.cli.conftest import run_cli

FAULT = str(Path(__file__).resolve().parents[1] / "fixtures" / "faults" / "fault.py")


def _search_args(out: Path, space: Path, *cmd: str, trials: int = 2) -> list[str]:
    return [
        "search", "--backend", "command", "--space", str(space), "--out", str(out), "--search", "grid",
        "--trials", str(trials), "--startup-timeout", "60s", "--confirm-runs", "0", "--", *cmd,
    ]  # fmt: skip


def _no_traceback(text: str) -> None:
    assert "Traceback" not in text, text


def test_a_command_that_cannot_be_rendered_is_invalid_and_never_running(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """``{x:c}`` renders 65 but not 2000000 (OverflowError): trial 1 is INVALID, written once, never RUNNING."""
    space = tmp_path / "space.yaml"
    space.write_text("backend: command\nknobs:\n  x: {type: int, choices: [65, 2000000], default: 65}\n")
    written: list[tuple[int, TrialStatus]] = []
    real_write = StudyDir.write_result

    def recording(self: StudyDir, result: TrialResult) -> None:
        written.append((result.number, result.status))
        real_write(self, result)

    monkeypatch.setattr(StudyDir, "write_result", recording)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "study"
    cmd = (sys.executable, FAULT, "--mode", "ok", "--steps", "3", "--step-s", "0.01", "--x", "{x:c}")
    with pytest.raises(SystemExit) as done:
        main(_search_args(out, space, *cmd))
    captured = capsys.readouterr()
    assert done.value.code in (0, None), captured.err
    _no_traceback(captured.out + captured.err)
    assert (0, TrialStatus.RUNNING) in written  # the baseline launched: its placeholder was written
    assert [s for n, s in written if n == 1] == [TrialStatus.INVALID], written
    said = [ln for ln in captured.out.splitlines() if ln.startswith("trial 1")]
    assert len(said) == 1 and "INVALID" in said[0] and "cannot be rendered: OverflowError" in said[0], said
    assert json.loads((out / "trials" / "1" / "result.json").read_text())["status"] == "INVALID"


def test_a_missing_executable_is_invalid_before_launch(tmp_path: Path) -> None:
    """The executable is a knob: the baseline's exists, trial 1's does not (installed CLI, real trials)."""
    space = tmp_path / "space.yaml"
    missing = tmp_path / "no-such-program"
    space.write_text(
        f"backend: command\nknobs:\n  exe: {{type: str, choices: [{sys.executable}, {missing}], "
        f"default: {sys.executable}}}\n"
    )
    out = tmp_path / "study"
    proc = run_cli(
        *_search_args(out, space, "{exe}", FAULT, "--mode", "ok", "--steps", "3", "--step-s", "0.01")
    )
    assert proc.returncode == 0, proc.stderr
    _no_traceback(proc.stdout + proc.stderr)
    said = [ln for ln in proc.stdout.splitlines() if ln.startswith("trial 1")]
    assert len(said) == 1 and "INVALID" in said[0] and "is not an executable file" in said[0], proc.stdout
    trial = out / "trials" / "1"
    assert json.loads((trial / "result.json").read_text())["status"] == "INVALID"
    assert not (trial / "proc.json").exists()  # nothing was started
    assert os.listdir(trial) == ["result.json"]
