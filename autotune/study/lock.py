"""The study lock: one run at a time writes a study directory.

An OS file lock (``flock``) on ``<study>/study.lock`` is held for the whole run; the kernel releases it
when the holder dies, however it dies, so a lock left by a dead run is simply taken over. Beside the
lock the holder writes who it is (pid, host, start time) into the same file, which is what a
second run names when it refuses to start.

Kept on ``fcntl.flock`` rather than ``filelock``: the lock is held shared (the workers of one study)
or exclusive (a run) on the one file whose content names its holder; filelock's ``FileLock`` is
exclusive only.

``flock`` is per host on most network file systems: two runs on two hosts sharing a directory over NFS
are not kept apart by it. Several hosts share one study through a database (``--storage``), not a
directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from autotune.errors import UsageError
from autotune.studydir import StudyDir
from autotune.trial.processes import owner_alive

__all__ = ["StudyLock", "holder_alive"]

# Locks this process holds, by resolved path → how many ``with`` blocks hold it: a run that takes the
# lock in the application and again in the study loop holds it once (flock would refuse the second).
_HELD: dict[Path, int] = {}
_HELD_LOCK = threading.Lock()


def holder_alive(holder: dict[str, Any]) -> bool | None:
    """Whether the run a lock file names is alive: True/False on this host, None for another host."""
    return owner_alive(holder.get("pid"), holder.get("create_time"), holder.get("host"))


class StudyLock:
    """Lock on a study directory for the length of a ``with`` block.

    Args:
        study_dir: the study directory (created if missing).
        shared: a worker of a shared study (``--study-name``, ``--gpus-per-trial``):
            workers hold the lock together (the storage keeps them apart); a run that is no worker
            (exclusive) is refused while any worker holds it, and the other way round.
    """

    def __init__(self, study_dir: Path, *, shared: bool = False) -> None:
        self.shared = shared
        self.path = StudyDir(Path(study_dir)).lock_path
        self._fd: int | None = None
        self._key = self.path.parent.resolve() / self.path.name
        self.took_over: dict[str, Any] | None = None  # the dead holder whose lock this run took over

    def _read_holder(self, fd: int) -> dict[str, Any]:
        try:
            raw = os.pread(fd, 65536, 0)
            data = json.loads(raw.decode("utf-8")) if raw.strip() else {}
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def acquire(self) -> None:
        """Take the lock or raise a UsageError naming the run that holds it."""
        with _HELD_LOCK:
            if _HELD.get(self._key):
                _HELD[self._key] += 1
                self._fd = -1  # held by an outer block of this process (or another worker thread)
                return
            self._take()

    def _take(self) -> None:
        import psutil

        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # O_NOFOLLOW: a symlink planted at study.lock must not make us write elsewhere
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise UsageError(
                f"cannot lock the study at {self.path}: {exc.strerror or exc}",
                hint="Choose a writable --out that holds no link named study.lock",
            ) from None
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except OSError:
            holder = self._read_holder(fd)
            os.close(fd)
            raise UsageError(
                _busy_message(self.path.parent, holder, self.shared), hint=_busy_hint(holder, self.shared)
            ) from None
        if self.shared:  # workers do not name themselves here (the storage lists them); no run holds it
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            self._fd = fd
            _HELD[self._key] = 1
            return
        previous = self._read_holder(fd)
        if previous and holder_alive(previous) is not True:
            self.took_over = previous
        me = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "create_time": psutil.Process().create_time(),
            "started_wall_s": time.time(),
        }
        data = (json.dumps(me) + "\n").encode("utf-8")
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)
        self._fd = fd
        _HELD[self._key] = 1

    def release(self) -> None:
        """Give the lock up (the file stays; the next run overwrites who holds it)."""
        with _HELD_LOCK:
            if self._fd is None:
                return
            _HELD[self._key] = _HELD.get(self._key, 1) - 1
            if self._fd == -1:
                self._fd = None
                return
            _HELD.pop(self._key, None)
            self._give_up()

    def _give_up(self) -> None:
        assert self._fd is not None
        if not self.shared:
            try:
                os.ftruncate(self._fd, 0)
            except OSError:
                pass
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> StudyLock:
        self.acquire()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _busy_message(study: Path, holder: dict[str, Any], shared: bool = False) -> str:
    if not holder:
        who = "workers of a shared study (--study-name)" if not shared else "another autotune run"
        return f"the study in {study} is in use by {who}"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("started_wall_s") or 0)))
    return (
        f"the study in {study} is in use by autotune pid {holder.get('pid')} on {holder.get('host')} "
        f"since {since}"
    )


def _busy_hint(holder: dict[str, Any], shared: bool = False) -> str:
    if not holder:
        return "Wait for them to end, join them with the same --study-name and --storage, or choose another --out"
    pid = holder.get("pid")
    stop = f"stop it (kill {pid}) and run again to resume" if pid else "stop it and run again to resume"
    return f"Wait for that run to end or {stop}, or choose another --out for a separate study"
