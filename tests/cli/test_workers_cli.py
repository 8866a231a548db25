"""Workers sharing one study, driven through the installed CLI with the command backend and real
processes: three workers on one storage finish the budget with no configuration run twice and no trial
lost; a worker killed with SIGKILL mid-trial is found by its heartbeat and its trial runs again while the
others' trials are untouched; trials run side by side on disjoint GPU sets (--gpus-per-trial); a study
name that holds another study is refused; report and export read the study from the storage on any
directory.

The shared storage is a real PostgreSQL server (``postgres_url``) when one can be started, else an
SQLite file."""

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

from tests.cli.conftest import autotune_exe, run_cli

JOB = """
import json, os, sys, time
trial_dir = os.environ["AUTOTUNE_TRIAL_DIR"]
record = {"cvd": os.environ.get("CUDA_VISIBLE_DEVICES"), "start": time.time(), "pid": os.getpid()}
with open(os.path.join(trial_dir, "started.json"), "w") as f:
    json.dump(record, f)
step_s = float(sys.argv[2])
# a barrier (``sys.argv[3]``): wait until that many trials have started anywhere in the test (at most
# 120 s), so workers that exist really run at the same time however loaded the host is
need = int(sys.argv[3]) if len(sys.argv) > 3 else 0
root = os.path.dirname(os.path.dirname(os.path.dirname(trial_dir)))  # the test's tmp_path
deadline = time.time() + 120
while need and time.time() < deadline:
    started = [p for d, _, files in os.walk(root) for p in files if p == "started.json"]
    if len(started) >= need:
        break
    time.sleep(0.1)
for step in range(1, 6):
    time.sleep(step_s)
    print(json.dumps({"step": step, "samples": 16, "t_mono_s": time.monotonic(), "loss": 1.0}), flush=True)
record["end"] = time.time()
with open(os.path.join(trial_dir, "ended.json"), "w") as f:
    json.dump(record, f)
"""


@pytest.fixture
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The storage URL the workers share: a fresh database on the real PostgreSQL server (CI starts
    one), else an SQLite file (several processes on one host; the --gpus-per-trial test below and the
    parallel bench's test run on SQLite anyway)."""
    try:
        return str(request.getfixturevalue("postgres_url"))
    except pytest.skip.Exception:
        return f"sqlite:///{tmp_path / 'shared.db'}"


def _setup(tmp_path: Path, values: str = "1, 2, 3, 4, 5, 6") -> tuple[Path, Path]:
    space = tmp_path / "space.yaml"
    space.write_text(f"backend: command\nknobs:\n  bs: {{type: int, choices: [{values}], default: 1}}\n")
    job = tmp_path / "job.py"
    job.write_text(JOB)
    return space, job


def _worker_args(
    space: Path,
    job: Path,
    out: Path,
    storage: str,
    name: str,
    *extra: str,
    trials: int = 6,
    step_s: float = 0.2,
    barrier: int = 0,
) -> list[str]:
    return [
        "search", "--backend", "command", "--space", str(space), "--out", str(out), "--trials", str(trials),
        "--confirm-runs", "0", "--startup-timeout", "180s", "--storage", storage, "--study-name", name, *extra,
        "--", sys.executable, str(job), "{bs}", str(step_s), str(barrier),
    ]  # fmt: skip


def _env(heartbeat_s: int | None = None) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if heartbeat_s is not None:  # short beats find a dead worker within seconds (a loaded host may
        env["AUTOTUNE_HEARTBEAT_S"] = str(heartbeat_s)  # lapse for longer than that: only where needed)
    return env


def _start(args: list[str], log: Path, heartbeat_s: int | None = None) -> subprocess.Popen:
    fh = log.open("w")
    return subprocess.Popen(
        [autotune_exe(), *args], stdout=fh, stderr=subprocess.STDOUT, env=_env(heartbeat_s)
    )


def _ran(study: optuna.Study) -> list[optuna.trial.FrozenTrial]:
    """The trials that ran a configuration (not those a worker gave up as another's duplicate)."""
    return [
        t
        for t in study.get_trials()
        if "duplicate_of" not in t.user_attrs and t.state is not optuna.trial.TrialState.WAITING
    ]


def _key(t: optuna.trial.FrozenTrial) -> str:
    return json.dumps(t.params, sort_keys=True)


def test_three_workers_finish_the_budget_with_no_configuration_twice(tmp_path: Path, storage: str) -> None:
    space, job = _setup(tmp_path)
    workers = [
        _start(
            _worker_args(space, job, tmp_path / f"out{i}", storage, "three", barrier=2),
            tmp_path / f"w{i}.log",
        )
        for i in range(3)
    ]
    for w in workers:
        assert w.wait(timeout=600) == 0, [p.read_text()[-2000:] for p in tmp_path.glob("w*.log")]
    study = optuna.load_study(study_name="three", storage=storage)
    states = [t.state for t in study.get_trials()]
    assert optuna.trial.TrialState.RUNNING not in states and optuna.trial.TrialState.WAITING not in states
    ran = _ran(study)
    complete = [t for t in ran if t.state is optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 6, [(t.number, t.state, t.params) for t in ran]
    keys = [_key(t) for t in ran]
    assert len(keys) == len(set(keys)), f"a configuration ran twice: {sorted(keys)}"
    names = {t.user_attrs["worker"]["name"] for t in ran}
    assert len(names) >= 2, names  # the budget was shared, not run by one worker alone
    hosts_pids = {(t.user_attrs["worker"]["host"], t.user_attrs["worker"]["pid"]) for t in ran}
    assert {pid for _, pid in hosts_pids} <= {w.pid for w in workers}
    # the workers ran at the same time: some trials of different workers overlap
    spans = []
    for t in ran:
        out = next(tmp_path.glob(f"out*/trials/{t.number}/ended.json"))
        rec = json.loads(out.read_text())
        spans.append((rec["start"], rec["end"], t.user_attrs["worker"]["pid"]))
    assert any(a[2] != b[2] and a[0] < b[1] and b[0] < a[1] for a in spans for b in spans)
    # any host reads the whole study from the storage: the report and the winner's export
    elsewhere = tmp_path / "elsewhere"
    rep = run_cli("report", "--storage", storage, "--study-name", "three", str(elsewhere))
    assert rep.returncode == 0, rep.stderr
    results = [json.loads(p.read_text()) for p in (elsewhere / "trials").glob("*/result.json")]
    assert sorted(r["number"] for r in results if r["status"] == "COMPLETE") == sorted(
        t.number for t in complete
    )
    md = (elsewhere / "report.md").read_text()
    assert all(f"| {t.number} " in md or f"trial {t.number}" in md for t in complete)
    exp = run_cli("export", "--storage", storage, "--study-name", "three", str(tmp_path / "elsewhere2"))
    assert exp.returncode == 0, exp.stderr
    settings = json.loads((elsewhere / "study.json").read_text())
    assert f"trial {settings['recommendation']['trial']}" in exp.stdout


def test_a_killed_worker_s_trial_is_recovered_by_heartbeat_and_runs_again(
    tmp_path: Path, storage: str
) -> None:
    space, job = _setup(tmp_path, "1, 2, 3, 4")
    out = tmp_path / "out"  # one shared --out: the survivor also ends the dead worker's job
    # a budget of 2: the survivor reaches it (its own trial and the dead one's, still RUNNING) before the
    # dead worker's trial goes stale, and must wait for it to, then run it (issue 30: no slot lost)
    args = _worker_args(space, job, out, storage, "kill", trials=2, step_s=0.8, barrier=2)
    victim = _start(args, tmp_path / "victim.log", heartbeat_s=4)
    survivor = None
    try:
        deadline = time.monotonic() + 300
        victim_trial = None
        while victim_trial is None:
            assert time.monotonic() < deadline and victim.poll() is None, (
                tmp_path / "victim.log"
            ).read_text()
            time.sleep(0.2)
            try:
                study = optuna.load_study(study_name="kill", storage=storage)
            except KeyError:
                continue
            for t in study.get_trials(states=(optuna.trial.TrialState.RUNNING,)):
                started = out / "trials" / str(t.number) / "started.json"
                if t.user_attrs.get("worker", {}).get("pid") == victim.pid and started.exists():
                    victim_trial = t
        survivor = _start(args, tmp_path / "survivor.log", heartbeat_s=4)
        while not any(  # the survivor runs a trial of its own when the victim dies
            t.user_attrs.get("worker", {}).get("pid") == survivor.pid
            for t in optuna.load_study(study_name="kill", storage=storage).get_trials(
                states=(optuna.trial.TrialState.RUNNING,)
            )
        ):
            assert time.monotonic() < deadline and survivor.poll() is None
            time.sleep(0.2)
        job_pid = json.loads((out / "trials" / str(victim_trial.number) / "started.json").read_text())["pid"]
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=30)
        assert survivor.wait(timeout=600) == 0, (tmp_path / "survivor.log").read_text()[-3000:]
    finally:
        for p in (victim, survivor):
            if p is not None and p.poll() is None:
                p.kill()
    study = optuna.load_study(study_name="kill", storage=storage)
    dead = study.trials[victim_trial.number]
    assert dead.state is optuna.trial.TrialState.FAIL
    on_disk = json.loads((out / "trials" / str(dead.number) / "result.json").read_text())
    assert on_disk["status"] == "INTERRUPTED" and "stopped beating" in on_disk["reason"], on_disk
    # its configuration ran again, to the end, by the survivor
    again = [
        t for t in _ran(study)
        if t.params == dead.params and t.number > dead.number and t.state is optuna.trial.TrialState.COMPLETE
    ]  # fmt: skip
    assert again and again[0].user_attrs.get("requeued_from") == dead.number
    assert again[0].user_attrs["worker"]["pid"] == survivor.pid
    # the survivor's trials were never touched: all COMPLETE, none marked interrupted
    mine = [t for t in _ran(study) if t.user_attrs["worker"]["pid"] == survivor.pid]
    assert mine and all(t.state is optuna.trial.TrialState.COMPLETE for t in mine)
    complete = [t for t in _ran(study) if t.state is optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 2 and len({_key(t) for t in complete}) == 2
    assert not psutil.pid_exists(job_pid) or psutil.Process(job_pid).status() == psutil.STATUS_ZOMBIE
    survivor_log = (tmp_path / "survivor.log").read_text()
    assert "stopped beating" in survivor_log
    # its own trial ended well within the grace (16 s): it waited for the dead one's instead of ending
    assert "waiting for trial(s)" in survivor_log, survivor_log


def test_parallel_trials_on_one_host_use_disjoint_gpus(tmp_path: Path) -> None:
    space, job = _setup(tmp_path, "1, 2, 3, 4")
    out = tmp_path / "out"
    args = [
        "search", "--backend", "command", "--space", str(space), "--out", str(out), "--trials", "4",
        "--confirm-runs", "0", "--startup-timeout", "60s", "--gpus", "2", "--gpu-type", "A10",
        "--gpus-per-trial", "1", "--", sys.executable, str(job), "{bs}", "0.4", "2",
    ]  # fmt: skip
    proc = subprocess.run([autotune_exe(), *args], capture_output=True, text=True, env=_env(), timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "2 trials at a time, on GPUs 0; 1" in proc.stdout
    runs = [json.loads(p.read_text()) for p in (out / "trials").glob("*/ended.json")]
    assert len(runs) == 4
    assert {r["cvd"] for r in runs} == {"0", "1"}  # each trial saw one GPU, and both GPUs were used
    overlapping = [
        (a, b) for a in runs for b in runs if a is not b and a["start"] < b["end"] and b["start"] < a["end"]
    ]
    assert overlapping, "no two trials ran at the same time"
    assert all(a["cvd"] != b["cvd"] for a, b in overlapping), "two trials at once shared a GPU"
    results = [json.loads(p.read_text()) for p in (out / "trials").glob("*/result.json")]
    assert sorted(r["status"] for r in results) == ["COMPLETE"] * 4
    settings = json.loads((out / "study.json").read_text())
    assert len(settings["hardware"]["gpus"]) == 1  # what one trial ran on: the winner is exported for it


def test_a_study_name_that_holds_another_study_is_refused(tmp_path: Path, storage: str) -> None:
    space, job = _setup(tmp_path, "1, 2")
    first = run_cli(*_worker_args(space, job, tmp_path / "a", storage, "taken", trials=1), env=_env())
    assert first.returncode == 0, first.stderr
    other = tmp_path / "other.yaml"
    other.write_text("backend: command\nknobs:\n  bs: {type: int, choices: [1, 2, 8], default: 1}\n")
    second = run_cli(*_worker_args(other, job, tmp_path / "b", storage, "taken", trials=1), env=_env())
    assert second.returncode == 2
    lines = [ln for ln in second.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in second.stderr, second.stderr
    assert "different definition" in lines[0] and "bs" in lines[0]
    assert not (tmp_path / "b" / "trials").exists() or not any((tmp_path / "b" / "trials").iterdir())
