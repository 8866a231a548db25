"""A trial's escapee that clears its environment (double fork, setsid, exec with ``env={}``) is ended
after the trial: by the trial's cgroup v2 where the host allows one, else by the process tree the
runner recorded (the trial's first process is the subreaper of its tree). Real processes only."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import psutil
import pytest

from autotune.backends.command import CommandParser
from autotune.records import LaunchPlan
from autotune.trial import confine
from autotune.trial.confine import Confinement, TrialCgroup
from autotune.trial.runner import EarlyStopConfig, WatchdogConfig, run_trial

FAULT = Path(__file__).parents[1] / "fixtures" / "faults" / "fault.py"
FAST = WatchdogConfig(startup_timeout_s=30, hang_k=3, hang_floor_s=5, grace_s=0.3, poll_interval_s=0.05)


def _run_daemon(trial_dir: Path, step_s: float) -> tuple[int, dict]:
    """A trial whose daemon double-forks, calls setsid and execs with an empty environment."""
    trial_dir.mkdir(parents=True)
    metrics, pid_file = trial_dir / "m.jsonl", trial_dir / "daemon.pid"
    plan = LaunchPlan(
        argv=(sys.executable, str(FAULT), "--mode", "daemon", "--clear-env", "--steps", "4", "--step-s",
              str(step_s), "--pid-file", str(pid_file)),
        env={"AUTOTUNE_METRICS_FILE": str(metrics), "AUTOTUNE_GLOBAL_BATCH": "16"},
        cwd=str(trial_dir),
        metrics_paths=(str(metrics),),
    )  # fmt: skip
    rec = run_trial(
        plan, CommandParser(metrics), trial_dir, global_batch=16, watchdog=FAST,
        early_stop=EarlyStopConfig(enabled=False),
    )  # fmt: skip
    assert rec.exit_code == 0, rec
    daemon = int(pid_file.read_text())
    assert "AUTOTUNE_TRIAL_MARKER" not in _environ(daemon)  # the marker cannot find it
    return daemon, json.loads((trial_dir / "proc.json").read_text())


def _environ(pid: int) -> dict[str, str]:
    try:
        return psutil.Process(pid).environ()
    except psutil.Error:
        return {}


def _gone(pid: int) -> bool:
    try:
        gone = psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
    if not gone:
        os.kill(pid, signal.SIGKILL)  # clean up before the test fails
    return gone


def test_the_trial_cgroup_ends_an_escapee_that_cleared_its_environment(tmp_path: Path) -> None:
    probe, why = TrialCgroup.make()
    if probe is None:
        pytest.skip(f"this host gives no cgroup v2 to this user: {why}")
    probe.remove()
    bystander = psutil.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        daemon, proc_json = _run_daemon(tmp_path / "t", step_s=0.02)
        assert _gone(daemon), "the escapee outlived its trial"
        assert proc_json["cgroup"] and not Path(proc_json["cgroup"]).exists()  # removed after the trial
        assert bystander.is_running() and bystander.status() != psutil.STATUS_ZOMBIE  # not the trial's
    finally:
        bystander.kill()
        bystander.wait()


def test_without_a_cgroup_the_recorded_tree_ends_the_escapee(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(TrialCgroup, "make", classmethod(lambda cls, home=None: (None, "not in this test")))
    if confine._prctl() is None:
        pytest.skip("no prctl on this system (not Linux): no subreaper")
    daemon, proc_json = _run_daemon(tmp_path / "t", step_s=0.4)  # the trial runs past a tree scan
    assert proc_json["cgroup"] is None and proc_json["cgroup_note"] == "not in this test"
    assert str(daemon) in proc_json["descendants"]  # recorded with its create time while the trial ran
    assert _gone(daemon), "the escapee outlived its trial"


def test_a_failed_launch_leaves_no_cgroup_behind(tmp_path: Path) -> None:
    made = Confinement.open()
    path = made.cgroup_path
    made.close()
    assert path is None or not Path(path).exists()


def test_a_recorded_descendant_outside_the_group_is_named_and_a_reused_pid_is_not() -> None:
    from autotune.trial.processes import outside_group, terminate_group

    other = psutil.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        started = other.create_time()
        assert outside_group(os.getpgid(0), {other.pid: started}) == [other.pid]
        assert outside_group(other.pid, {other.pid: started}) == []  # in that group: not outside it
        reused = {other.pid: started - 100.0}  # the same pid, another process's start time
        assert outside_group(os.getpgid(0), reused) == []
        assert terminate_group(-1, reused, grace_s=0.1) == [] and other.is_running()
    finally:
        other.kill()
        other.wait()
