from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.errors import UsageError
from autotune.study.lock import StudyLock, holder_alive

HOLD = """
import sys, time
from autotune.study.lock import StudyLock
with StudyLock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_lock_held_by_another_process_is_refused_with_its_holder(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(UsageError) as err, StudyLock(tmp_path):
            pass
        assert f"pid {holder.pid} on {socket.gethostname()}" in str(err.value)
        assert f"kill {holder.pid}" in str(err.value)
    finally:
        holder.kill()
        holder.wait()
    # the kernel released the dead holder's lock; its record names it as taken over
    with StudyLock(tmp_path) as lock:
        assert lock.took_over is not None and lock.took_over["pid"] == holder.pid
        recorded = json.loads((tmp_path / "study.lock").read_text())
        assert recorded["pid"] == os.getpid() and holder_alive(recorded) is True
    assert (tmp_path / "study.lock").read_text() == ""  # a clean release names nobody


def test_the_same_process_may_nest_the_lock(tmp_path: Path) -> None:
    with StudyLock(tmp_path), StudyLock(tmp_path):
        pass
    with StudyLock(tmp_path) as again:
        assert again.took_over is None


def test_a_symlink_at_the_lock_is_not_followed(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.txt"
    target.write_text("precious")
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "study.lock").symlink_to(target)
    with pytest.raises(UsageError, match="cannot lock"), StudyLock(tmp_path / "study"):
        pass
    assert target.read_text() == "precious"


def test_holder_on_another_host_is_unknown_and_a_dead_pid_is_dead() -> None:
    assert holder_alive({"pid": os.getpid(), "host": "some-other-host"}) is None
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert holder_alive({"pid": dead.pid, "host": socket.gethostname(), "create_time": 1.0}) is False


HOLD_SHARED = """
import sys, time
from autotune.study.lock import StudyLock
with StudyLock(sys.argv[1], shared=True):
    print("held", flush=True)
    time.sleep(60)
"""


def test_workers_share_the_lock_and_a_lone_run_is_kept_out(tmp_path: Path) -> None:
    worker = subprocess.Popen(
        [sys.executable, "-c", HOLD_SHARED, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "held"
        with StudyLock(tmp_path, shared=True):  # a second worker joins
            pass
        with pytest.raises(UsageError) as err, StudyLock(tmp_path):  # a run that is no worker does not
            pass
        assert "workers of a shared study" in str(err.value)
        assert "--study-name" in str(err.value.hint)
    finally:
        worker.kill()
        worker.wait()
    # and while a lone run holds it, a worker is refused, naming that run
    with StudyLock(tmp_path):
        lone = subprocess.run(
            [sys.executable, "-c", HOLD_SHARED, str(tmp_path)], capture_output=True, text=True
        )
        assert lone.returncode != 0 and f"pid {os.getpid()}" in lone.stderr
