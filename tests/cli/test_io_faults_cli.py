"""A disk or a storage that stops taking writes in the middle of a study, and links planted in a study
directory, with real trials through the installed CLI (command backend).

Each ends the study with one line naming the file and the cause (exit 74), keeps every finished trial,
leaves no trial RUNNING and no process behind, and the same command resumes once the cause is gone.
The full disk is a small tmpfs (root only; skipped elsewhere)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import pytest

from tests.cli.conftest import autotune_exe

FAULT = str(Path(__file__).resolve().parents[1] / "fixtures" / "faults" / "fault.py")
EX_IOERR = 74


def mount_tmpfs(where: Path, size: str) -> None:
    where.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        pytest.skip("a small tmpfs needs root")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True
    )
    if done.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")


@pytest.fixture
def mounts():
    made: list[Path] = []
    yield made
    for where in made:
        subprocess.run(["umount", "-l", str(where)], check=False)


def search(out: Path, space: Path, *extra: str, trials: int = 2, cmd: tuple[str, ...] = ()) -> list[str]:
    return [
        autotune_exe(), "search", "--backend", "command", "--space", str(space), "--out", str(out),
        "--search", "grid", "--trials", str(trials), "--confirm-runs", "0", "--startup-timeout", "60s",
        *extra, "--", sys.executable, FAULT, *cmd,
    ]  # fmt: skip


def run(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env)


def results(out: Path) -> dict[int, dict]:
    found = {}
    for path in (out / "trials").glob("*/result.json"):
        if path.parent.name.isdigit():
            found[int(path.parent.name)] = json.loads(path.read_text())
    return found


def optuna_states(storage: str, name: str) -> list[str]:
    return [t.state.name for t in optuna.load_study(study_name=name, storage=storage).trials]


def no_process_left(out: Path) -> None:
    for proc_json in (out / "trials").glob("*/proc.json"):
        pgid = json.loads(proc_json.read_text())["pgid"]
        left = []
        for p in psutil.process_iter():
            try:
                if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                    left.append(p.pid)
            except (ProcessLookupError, psutil.Error):
                continue
        assert left == [], (proc_json, left)


def one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    return lines[0]


def test_a_disk_that_fills_up_under_a_trial_log(tmp_path: Path, mounts: list[Path]) -> None:
    disk = tmp_path / "disk"
    mount_tmpfs(disk, "80m")  # above the doctor's 64 MiB floor, so the search starts and then fills it
    mounts.append(disk)
    space = tmp_path / "s.yaml"
    space.write_text("backend: command\nknobs:\n  mode: {type: str, choices: [ok, flood], default: ok}\n")
    out, storage = disk / "study", f"sqlite:///{tmp_path / 'optuna.db'}"
    args = search(
        out, space, "--storage", storage, cmd=("--mode", "{mode}", "--steps", "6", "--step-s", "0.05")
    )
    proc = run(args)
    assert proc.returncode == EX_IOERR, proc.stderr
    line = one_error_line(proc)
    assert f"cannot write {out}/trials/1/stdout.log: No space left on device (ENOSPC)" in line
    assert "run the same command again to resume" in line
    found = results(out)
    assert found[0]["status"] == "COMPLETE"  # the finished trial is kept
    assert all(r["status"] != "RUNNING" for r in found.values()), found
    assert "RUNNING" not in optuna_states(storage, "study")
    no_process_left(out)
    # once there is room again the same study resumes (one trial was the budget: it ends at once)
    subprocess.run(["mount", "-o", "remount,size=256m", str(disk)], check=True)
    again = run(args[: args.index("--trials") + 1] + ["1"] + args[args.index("--trials") + 2 :])
    assert again.returncode == 0, again.stderr
    assert results(out)[0]["status"] == "COMPLETE" and "best: trial 0" in again.stdout


def test_a_storage_that_fills_up_during_a_trial(tmp_path: Path, mounts: list[Path]) -> None:
    db_disk = tmp_path / "db"
    mount_tmpfs(db_disk, "1m")
    mounts.append(db_disk)
    space = tmp_path / "s.yaml"
    space.write_text(
        "backend: command\nknobs:\n  step_s: {type: float, choices: [0.02, 0.4], default: 0.02}\n"
    )
    out, storage = tmp_path / "study", f"sqlite:///{db_disk / 'optuna.db'}"
    args = search(
        out, space, "--storage", storage, cmd=("--mode", "ok", "--steps", "12", "--step-s", "{step_s}")
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    tuner = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while not (out / "trials" / "1" / "stdout.log").exists():  # trial 1 runs: fill the storage's disk
        assert time.monotonic() < deadline and tuner.poll() is None, "trial 1 never started"
        time.sleep(0.05)
    with open(db_disk / "filler", "wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 4096)
        except OSError:
            pass
    stdout, stderr = tuner.communicate(timeout=300)
    proc = subprocess.CompletedProcess(args, tuner.returncode, stdout, stderr)
    assert proc.returncode == EX_IOERR, stderr
    line = one_error_line(proc)
    assert f"cannot write the study storage {storage}: database or disk is full" in line
    found = results(out)
    assert found[0]["status"] == "COMPLETE"
    assert found[1]["status"] == "INTERRUPTED" and "storage could not be written" in found[1]["reason"]
    no_process_left(out)
    (db_disk / "filler").unlink()
    again = run(args)  # the storage kept trial 1 RUNNING (it could not be told): resuming settles it
    assert again.returncode == 0, again.stderr
    assert "RUNNING" not in optuna_states(storage, "study")
    assert results(out)[0]["status"] == "COMPLETE"


def test_links_planted_in_a_study_are_never_written_through(tmp_path: Path) -> None:
    space = tmp_path / "s.yaml"
    space.write_text("backend: command\nknobs:\n  bs: {type: int, choices: [1, 2, 3], default: 1}\n")
    out = tmp_path / "study"
    cmd = ("--mode", "ok", "--steps", "4", "--step-s", "0.02", "--bs", "{bs}")
    first = run(search(out, space, trials=1, cmd=cmd))
    assert first.returncode == 0, first.stderr
    victims = tmp_path / "victims"
    victims.mkdir()
    trial1 = out / "trials" / "1"
    trial1.mkdir()
    names = (
        "stdout.log",
        "stderr.log",
        "result.json",
        "launch.json",
        "command.sh",
        "metrics.jsonl",
        "proc.json",
    )
    for name in names:
        (victims / name).write_text("the user's file")
        (trial1 / name).symlink_to(victims / name)
    second = run(search(out, space, trials=2, cmd=cmd))
    assert second.returncode == 0, second.stderr
    assert all((victims / n).read_text() == "the user's file" for n in names)
    assert not any((trial1 / n).is_symlink() for n in names) and results(out)[1]["status"] == "COMPLETE"
    # a trial directory that is itself a link: refused, nothing written through it
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "trials" / "2").symlink_to(elsewhere, target_is_directory=True)
    third = run(search(out, space, trials=3, cmd=cmd))
    assert third.returncode == EX_IOERR, third.stderr
    assert "trials/2: a symbolic link where the study keeps its own directory" in one_error_line(third)
    assert list(elsewhere.iterdir()) == []
    assert {n: r["status"] for n, r in results(out).items()} == {0: "COMPLETE", 1: "COMPLETE"}


def read_only(path: Path, args: list[str]) -> list[str]:
    """``args`` run with ``path`` read-only: chmod 0444, or, for root (whom a mode does not stop), a
    read-only bind mount of the file onto itself in a mount namespace of that command alone."""
    if os.geteuid() != 0:
        path.chmod(0o444)
        return args
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", f"mount --bind '{path}' '{path}' && mount -o remount,bind,ro '{path}'"],
        capture_output=True,
        text=True,
    )
    if probe.returncode:
        pytest.skip(f"root, and no read-only bind mount here: {probe.stderr.strip()}")
    mount = f"mount --bind '{path}' '{path}' && mount -o remount,bind,ro '{path}' && exec \"$@\""
    return ["unshare", "-m", "sh", "-c", mount, "sh", *args]


def test_a_read_only_study_db_exits_74_naming_the_file_not_a_storage_flag(tmp_path: Path) -> None:
    """Issue 41, defect 9: a read-only ``study.db`` was "cannot open the study's own storage ... Restore
    study.db from a backup" with exit 2 (Optuna's "exception during the commit" hid SQLite's words)."""
    space = tmp_path / "s.yaml"
    space.write_text("backend: command\nknobs:\n  bs: {type: int, choices: [1, 2, 3], default: 1}\n")
    out = tmp_path / "study"
    cmd = ("--mode", "ok", "--steps", "3", "--step-s", "0.01")
    assert run(search(out, space, trials=1, cmd=cmd)).returncode == 0
    db = out / "study.db"
    proc = run(read_only(db, search(out, space, trials=2, cmd=cmd)))
    assert proc.returncode == EX_IOERR, proc.stderr
    line = one_error_line(proc)
    assert line.startswith(f"error: cannot write the study storage {db}: ") and "readonly database" in line
    assert "--storage" not in line and "backup" not in line
    assert "Make the file and its directory writable" in line and "run the same command again" in line
    assert set(results(out)) == {0}  # nothing launched
