"""Issue 41, defect 9: a forced stop (a second Ctrl-C) still prints the line that resumes the study."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.cli.conftest import autotune_exe

# a trial that says it started, then waits: the first SIGINT asks it to end, the second forces
TRIAL = (
    "import os, signal, time\n"
    "signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "open(os.environ['AUTOTUNE_TRIAL_DIR'] + '/../../started', 'w').close()\n"
    "time.sleep(120)\n"
)


def _start(
    space: Path, out: Path, options: list[str], command: list[str], *, new_session: bool = False
) -> subprocess.Popen[str]:
    """``autotune search`` on the command backend over ``space`` into ``out`` (no re-measurement),
    running ``command`` as each trial, its output piped."""
    argv = [
        autotune_exe(), "search", "--backend", "command", "--space", str(space), "--out", str(out),
        "--confirm-runs", "0", *options, "--", *command,
    ]  # fmt: skip
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        start_new_session=new_session,
    )


def test_a_second_ctrl_c_still_prints_resume_with(tmp_path: Path) -> None:
    space = tmp_path / "s.yaml"
    space.write_text("backend: command\nknobs:\n  mode: {type: str, choices: [a, b], default: a}\n")
    out = tmp_path / "study"
    proc = _start(space, out, ["--trials", "2"], [sys.executable, "-c", TRIAL], new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "started").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (out / "started").exists(), proc.communicate(timeout=30)
        proc.send_signal(signal.SIGINT)
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    assert "resume with: autotune search" in stdout + stderr
    assert "Traceback" not in stdout + stderr


FAULT = str(Path(__file__).resolve().parents[1] / "fixtures" / "faults" / "fault.py")


def test_a_tuner_paused_mid_trial_notes_it_on_the_trial(tmp_path: Path) -> None:
    """autotune stopped 8 s mid-trial (SIGSTOP) measured a 53/s script at 10/s without a word."""
    space = tmp_path / "s.yaml"
    space.write_text("backend: command\nknobs:\n  mode: {type: str, choices: [ok], default: ok}\n")
    out = tmp_path / "study"
    proc = _start(
        space,
        out,
        ["--trials", "1", "--no-early-stop", "--max-steps", "400"],
        [sys.executable, FAULT, "--mode", "ok", "--steps", "120", "--step-s", "0.1"],
    )
    try:
        metrics = out / "trials" / "0" / "metrics.jsonl"
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if metrics.exists() and metrics.stat().st_size > 0:
                break
            time.sleep(0.2)
        proc.send_signal(signal.SIGSTOP)
        time.sleep(8)
        proc.send_signal(signal.SIGCONT)
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()
            proc.wait()
    result = json.loads((out / "trials" / "0" / "result.json").read_text())
    assert any("autotune itself was paused" in note for note in result["notes"]), (result["notes"], stderr)
