"""A study that cannot be corrupted and never leaves a process behind, driven through the installed CLI
with the command backend and real child processes: two runs on one study, SIGTERM/SIGHUP to the
tuner (once, then twice), a double-forked daemon left by a trial, and a resume with another study's
definition."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest

from tests.cli.conftest import autotune_exe

FAULT = str(Path(__file__).resolve().parents[1] / "fixtures" / "faults" / "fault.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _space(tmp_path: Path, values: str = "1, 2, 3") -> Path:
    space = tmp_path / f"s-{values.replace(', ', '-')}.yaml"
    space.write_text(f"backend: command\nknobs:\n  bs: {{type: int, choices: [{values}], default: 1}}\n")
    return space


def _args(out: Path, space: Path, *fault: str, trials: int = 3) -> list[str]:
    return [
        autotune_exe(), "search", "--backend", "command", "--space", str(space), "--out", str(out),
        "--search", "grid", "--trials", str(trials), "--startup-timeout", "60s", "--confirm-runs", "0",
        "--", sys.executable, FAULT, *fault,
    ]  # fmt: skip


def _results(out: Path) -> list[dict]:
    files = sorted((out / "trials").glob("*/result.json"), key=lambda p: p.parent.name)
    return [json.loads(p.read_text()) for p in files if p.parent.name.isdigit()]


def _wait_for(path: Path, tuner: subprocess.Popen, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert tuner.poll() is None, "the tuner ended before " + str(path)
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _group_alive(pgid: int) -> list[int]:
    out = []
    for p in psutil.process_iter():
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return out


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def test_a_second_run_on_a_live_study_is_refused_and_the_first_goes_on(tmp_path: Path) -> None:
    out = tmp_path / "study"
    # each trial sleeps 3 s before its first step: the second run arrives while trial 0 runs
    args = _args(
        out, _space(tmp_path), "--mode", "ok", "--steps", "4", "--step-s", "0.05", "--startup-s", "3"
    )
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    _wait_for(out / "trials" / "0" / "proc.json", first)
    second = subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=120)
    assert second.returncode == 2, second.stdout + second.stderr
    line = _one_line(second.stderr)
    assert f"pid {first.pid}" in line and "in use" in line, line
    stdout, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stdout + stderr
    results = _results(out)
    assert sorted(r["params"]["bs"] for r in results) == [1, 2, 3]
    assert all(r["status"] == "COMPLETE" for r in results), [(r["number"], r["reason"]) for r in results]
    assert sum(r["is_baseline"] for r in results) == 1
    # the lock is free again: a third run resumes the finished study at once (budget already used)
    third = subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=300)
    assert third.returncode == 0, third.stdout + third.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_stop_like_ctrl_c_and_the_trial_runs_again(tmp_path: Path, sig: int) -> None:
    out = tmp_path / "study"
    args = _args(
        out, _space(tmp_path, "1, 2"), "--mode", "ok", "--steps", "4", "--step-s", "0.05",
        "--startup-s", "{bs}", trials=2,
    )  # fmt: skip
    tuner = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    proc_json = out / "trials" / "1" / "proc.json"
    _wait_for(proc_json, tuner)
    pgid = json.loads(proc_json.read_text())["pgid"]
    tuner.send_signal(sig)
    stdout, stderr = tuner.communicate(timeout=120)
    assert tuner.returncode == 130, stdout + stderr
    assert "resume with:" in stdout, stdout
    assert _group_alive(pgid) == []
    by_number = {r["number"]: r for r in _results(out)}
    assert by_number[0]["status"] == "COMPLETE"
    assert by_number[1]["status"] == "INTERRUPTED", by_number[1]
    storage = optuna.storages.RDBStorage(f"sqlite:///{out / 'study.db'}")
    states = [t.state for t in optuna.load_study(study_name="study", storage=storage).get_trials()]
    assert optuna.trial.TrialState.RUNNING not in states
    # resume: the interrupted configuration runs again and did not use a slot of --trials 2
    again = subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    done = [r for r in _results(out) if r["status"] == "COMPLETE"]
    assert sorted(r["params"]["bs"] for r in done) == [1, 2]


def test_a_second_signal_forces_and_still_leaves_no_process(tmp_path: Path) -> None:
    out = tmp_path / "study"
    # the trial ignores SIGTERM and hangs after 2 steps, with a grandchild that ignores it too
    args = _args(
        out, _space(tmp_path, "1"), "--mode", "grandchild", "--fail-at", "2", "--step-s", "0.05",
        "--ignore-sigterm", "--pid-file", "{trial_dir}/grandchild.pid", trials=1,
    )  # fmt: skip
    tuner = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)
    pid_file = out / "trials" / "0" / "grandchild.pid"
    _wait_for(pid_file, tuner)
    pgid = json.loads((out / "trials" / "0" / "proc.json").read_text())["pgid"]
    grandchild = int(pid_file.read_text())
    tuner.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    tuner.send_signal(signal.SIGTERM)
    stdout, stderr = tuner.communicate(timeout=120)
    assert tuner.returncode == 130, stdout + stderr
    assert "Traceback" not in stderr, stderr
    assert _group_alive(pgid) == []
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
    (result,) = _results(out)
    assert result["status"] == "INTERRUPTED", result


@pytest.mark.parametrize("clear_env", [False, True], ids=["marked", "cleared-environment"])
def test_a_daemon_that_left_the_trial_is_found_and_ended(tmp_path: Path, clear_env: bool) -> None:
    """Double fork, setsid; with a cleared environment the trial's marker is gone too: the trial's cgroup
    (or, without one, the process tree recorded while the trial ran: it runs past a scan) finds it."""
    out = tmp_path / "study"
    step_s = "0.4" if clear_env else "0.05"
    args = _args(
        out, _space(tmp_path, "1"), "--mode", "daemon", "--steps", "4", "--step-s", step_s,
        "--pid-file", "{trial_dir}/daemon.pid", *(["--clear-env"] if clear_env else []), trials=1,
    )  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    daemon = int((out / "trials" / "0" / "daemon.pid").read_text())
    try:
        alive = psutil.Process(daemon).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        alive = False
    if alive:  # clean up before failing
        os.kill(daemon, signal.SIGKILL)
    assert not alive, "the double-forked daemon outlived its trial"
    (result,) = _results(out)
    assert result["status"] == "COMPLETE"
    assert any(
        str(daemon) in note and "left the trial's process group" in note for note in result["notes"]
    ), result["notes"]
    assert f"ended 1 process(es) that had left the trial's process group: {daemon}" in proc.stdout


def test_resuming_with_another_definition_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "study"
    fault = ("--mode", "ok", "--steps", "3", "--step-s", "0.02")
    first = subprocess.run(_args(out, _space(tmp_path, "1, 2"), *fault, trials=1), capture_output=True,
                           text=True, env=ENV, timeout=300)  # fmt: skip
    assert first.returncode == 0, first.stdout + first.stderr
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "study.lock"}
    other_space = subprocess.run(_args(out, _space(tmp_path, "1, 4"), *fault, trials=2), capture_output=True,
                                 text=True, env=ENV, timeout=120)  # fmt: skip
    assert other_space.returncode == 2
    line = _one_line(other_space.stderr)
    assert "different search space (knobs: bs)" in line and "new --out" in line, line
    other_command = subprocess.run(
        _args(out, _space(tmp_path, "1, 2"), *fault, "--seed", "7", trials=2),
        capture_output=True, text=True, env=ENV, timeout=120,
    )  # fmt: skip
    assert other_command.returncode == 2
    assert "different command" in _one_line(other_command.stderr)
    after = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != "study.lock"}
    assert after == before  # nothing of the study was touched
    # the same definition with a larger budget resumes
    more = subprocess.run(_args(out, _space(tmp_path, "1, 2"), *fault, trials=2), capture_output=True,
                          text=True, env=ENV, timeout=300)  # fmt: skip
    assert more.returncode == 0, more.stdout + more.stderr
    assert sorted(r["params"]["bs"] for r in _results(out)) == [1, 2]
