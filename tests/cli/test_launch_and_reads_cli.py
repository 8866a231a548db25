"""Issue 30's last promises, through the CLI with the command backend and real processes: a trial whose
command cannot be launched is INVALID before anything records it RUNNING; ``report`` during a search
reads a consistent snapshot; unreadable files (as an unprivileged user) are one line, no traceback."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from autotune.cli.app import main
from autotune.records import TrialResult, TrialStatus
from autotune.studydir import StudyDir
from tests.cli.conftest import autotune_exe, run_cli

FAULT = str(Path(__file__).resolve().parents[1] / "fixtures" / "faults" / "fault.py")


def _search_args(out: Path, space: Path, *cmd: str, trials: int = 2) -> list[str]:
    return [
        "search", "--backend", "command", "--space", str(space), "--out", str(out), "--search", "grid",
        "--trials", str(trials), "--startup-timeout", "60s", "--confirm-runs", "0", "--", *cmd,
    ]  # fmt: skip


def _no_traceback(text: str) -> None:
    assert "Traceback" not in text, text


def test_a_trial_that_cannot_be_launched_is_invalid_and_never_running(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    """The executable is a knob (the baseline's exists, the other does not) and ``{x:c}`` renders 65 but
    not 2000000 (OverflowError): the three trials past the baseline are INVALID, written once, never
    RUNNING, nothing of them started; one line each."""
    space = tmp_path / "space.yaml"
    missing = tmp_path / "no-such-program"
    space.write_text(
        f"backend: command\nknobs:\n  exe: {{type: str, choices: [{sys.executable}, {missing}], "
        f"default: {sys.executable}}}\n  x: {{type: int, choices: [65, 2000000], default: 65}}\n"
    )
    written: list[tuple[int, TrialStatus]] = []
    real_write = StudyDir.write_result

    def recording(self: StudyDir, result: TrialResult) -> None:
        written.append((result.number, result.status))
        real_write(self, result)

    monkeypatch.setattr(StudyDir, "write_result", recording)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "study"
    cmd = ("{exe}", FAULT, "--mode", "ok", "--steps", "3", "--step-s", "0.01", "--x", "{x:c}")
    with pytest.raises(SystemExit) as done:
        main(_search_args(out, space, *cmd, trials=4))
    captured = capsys.readouterr()
    assert done.value.code in (0, None), captured.err
    _no_traceback(captured.out + captured.err)
    assert written[:2] == [(0, TrialStatus.RUNNING), (0, TrialStatus.COMPLETE)], written  # the baseline ran
    assert written[2:] == [(n, TrialStatus.INVALID) for n in (1, 2, 3)], written  # never RUNNING
    said = [ln for ln in captured.out.splitlines() if ln.startswith(("trial 1", "trial 2", "trial 3"))]
    assert len(said) == 3 and all(": INVALID — " in ln for ln in said), captured.out
    assert any("cannot be rendered: OverflowError" in ln for ln in said), said
    assert any(f"its executable '{missing}' is not an executable file" in ln for ln in said), said
    for number in (1, 2, 3):
        trial = out / "trials" / str(number)
        assert os.listdir(trial) == ["result.json"]  # nothing was started: no proc.json, no logs
        assert json.loads((trial / "result.json").read_text())["status"] == "INVALID"


def test_report_during_a_search_reads_a_consistent_snapshot(tmp_path: Path) -> None:
    """``report`` run again and again while a real search writes the study: every run exits 0 and writes a
    whole report.md (no damaged-file line for a step being appended)."""
    space = tmp_path / "space.yaml"
    space.write_text("backend: command\nknobs:\n  bs: {type: int, choices: [1, 2, 3, 4], default: 1}\n")
    out = tmp_path / "study"
    cmd = (sys.executable, FAULT, "--mode", "ok", "--steps", "25", "--step-s", "0.02")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    tuner = subprocess.Popen(
        [autotune_exe(), *_search_args(out, space, *cmd, trials=3), "--no-early-stop"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (out / "trials" / "0" / "result.json").exists():
        assert tuner.poll() is None and time.monotonic() < deadline, "the search never started trial 0"
        time.sleep(0.05)
    reports = []
    while tuner.poll() is None or not reports:
        target = tmp_path / f"report-{len(reports)}"
        reports.append((run_cli("report", str(out), "--no-png", "--out", str(target)), target))
    assert tuner.wait(timeout=120) == 0, tuner.stderr.read() if tuner.stderr else ""
    for proc, target in reports:
        assert proc.returncode == 0, proc.stderr
        _no_traceback(proc.stderr)
        text = (target / "report.md").read_text()
        assert text.startswith(f"# autotune report — {out.name}\n") and "\n## Summary\n" in text, text[:400]
        assert "\n## All trials\n" in text and "\n| 0 (" in text, text  # the baseline row at least
        assert "unreadable" not in text and "not a trial result" not in text, text
    assert len(reports) >= 2, "no report ran while the search did"


def test_a_line_being_appended_is_not_damage_while_its_trial_runs(tmp_path: Path) -> None:
    from autotune.reports import load_study

    study = StudyDir(tmp_path / "study")
    step = '{"step": 1, "t_mono_s": 1.0, "t_wall_s": 1.0, "duration_s": 0.5, "samples": 4, "values": {}}\n'
    for number, status in ((0, TrialStatus.RUNNING), (1, TrialStatus.COMPLETE)):
        study.write_result(TrialResult(number=number, params={"bs": number}, status=status, reason="r"))
        study.trial(number).metrics_jsonl.write_text(step + '{"step": 2, "t_mo')
    data = load_study(study.root)
    assert [len(t.steps) for t in data.trials] == [1, 1]
    assert [p for p in data.problems if "unreadable line" in p] == [
        "trials/1/metrics.jsonl: 1 unreadable line(s) skipped"
    ]


def _unprivileged() -> tuple[list[str], str] | str:
    """How to run a command as a user whom ``chmod 000`` denies (an argv prefix, and a Python both that
    user and we can run for the trial), or why there is no such user here.

    Root reads through any mode, so as root the command runs as ``nobody`` (uid 65534) via ``setpriv``.
    """
    if os.geteuid() != 0:
        return [], sys.executable
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return "running as root and setpriv is not installed: no unprivileged user to deny reads to"
    prefix = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]

    def runs(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=120)

    probe = runs(autotune_exe(), "--help")
    if probe.returncode != 0:
        return f"autotune cannot run as uid 65534 here: {(probe.stderr or probe.stdout).strip()[:200]}"
    pythons = [sys.executable, *(shutil.which(n, path="/usr/local/bin:/usr/bin:/bin") for n in ("python3",))]
    # started by that user's own process (not by setpriv's exec, which still holds root's capabilities)
    usable = next(
        (py for py in pythons if py and runs("/bin/sh", "-c", 'exec "$0" -c pass', py).returncode == 0), None
    )
    if usable is None:
        return "no Python that uid 65534 can run for the trial"
    return prefix, usable


def _digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.name.startswith(("study.db", "study.lock"))
    }


def test_unreadable_files_are_one_line_for_report_export_and_search(tmp_path: Path) -> None:
    """A trial directory or study.json this user may not read (mode 000, run as an unprivileged user):
    ``report``, ``export`` and ``search`` each print one line naming it (exit 2), no traceback, and the
    study is byte-identical afterwards."""
    found = _unprivileged()
    if isinstance(found, str):
        pytest.skip(found)
    prefix, python = found
    home = Path(
        tempfile.mkdtemp(prefix="autotune-denied-")
    )  # outside pytest's 0700 tmp: the user must reach it
    try:
        space = home / "space.yaml"
        space.write_text("backend: command\nknobs:\n  bs: {type: int, choices: [1, 2], default: 1}\n")
        study = home / "study"
        cmd = (python, FAULT, "--mode", "ok", "--steps", "3", "--step-s", "0.01")  # both users can run it
        assert run_cli(*_search_args(study, space, *cmd, trials=1)).returncode == 0
        home.chmod(0o755)
        if prefix:  # the study belongs to the user who reads it: only the mode denies
            for path in [home, *home.rglob("*")]:
                os.chown(path, 65534, 65534)
        before = _digests(study)
        env = {**os.environ, "HOME": str(home), "MPLCONFIGDIR": str(home / ".mpl"), "OMP_NUM_THREADS": "1"}
        commands = {
            "report": ["report", str(study), "--no-png"],
            "export": ["export", str(study), "--out", str(home / "exported")],
            "search": _search_args(study, space, *cmd, trials=2),  # resuming it for one more trial
        }
        for target in (study / "trials" / "0", study / "study.json"):
            mode = target.stat().st_mode
            target.chmod(0)
            try:
                running = {  # the three at once: each only reads (and fails)
                    name: subprocess.Popen(
                        [*prefix, autotune_exe(), *argv],
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                        env=env,
                    )  # fmt: skip
                    for name, argv in commands.items()
                }
                for name, tool in running.items():
                    out, err = tool.communicate(timeout=300)
                    proc = subprocess.CompletedProcess(tool.args, tool.returncode, out, err)
                    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
                    assert proc.returncode == 2, (name, target, proc.stdout, proc.stderr)
                    assert len(lines) == 1 and "Traceback" not in proc.stderr, (name, proc.stderr)
                    assert f"{target.relative_to(home)}: permission denied" in lines[0], (name, lines[0])
            finally:
                target.chmod(mode)
        assert _digests(study) == before
        assert not (home / "exported").exists()
    finally:
        shutil.rmtree(home, ignore_errors=True)
