"""Where a trial's processes cannot escape to: a cgroup v2 of its own, or its first process as subreaper.

A process that double-forks, calls ``setsid`` and execs with an empty environment leaves the trial's
process group and its marker (:data:`autotune.trial.processes.MARKER_ENV`), and once its parent exits
it is no longer a descendant of the trial. Two kernel mechanisms keep it findable:

- **A cgroup v2 per trial** (:class:`TrialCgroup`), made under autotune's own cgroup where the host
  lets this user make one (root, or a delegated subtree; no other privilege is asked for). The trial's
  first process joins it before it execs (its first write, in the forked child), so everything it
  ever starts is in it, whatever it does to its session, group or environment: the kernel keeps the
  membership. After the trial, what is left in it is ended (SIGTERM, grace, ``cgroup.kill``) and the
  cgroup removed.
- **Elsewhere**, the trial's first process is made a *child subreaper* (``PR_SET_CHILD_SUBREAPER``,
  Linux, no privilege needed): a double-forked grandchild is re-parented to it rather than to init,
  so it stays in the process tree the runner walks every scan (pid and create time recorded, so a
  reused pid is never hit). The one gap left: a process that escapes within the last scan interval
  before the trial's first process itself exits.

:class:`Confinement` is what the runner holds: the cgroup when one could be made, else the subreaper.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import signal
import time
from collections.abc import Callable
from pathlib import Path

import psutil

__all__ = ["Confinement", "TrialCgroup", "cgroup_v2_home"]

_PR_SET_CHILD_SUBREAPER = 36
_CGROUP_PREFIX = "autotune-trial-"


def _own_cgroup_path() -> str | None:
    """This process's cgroup v2 path (the ``0::`` line of ``/proc/self/cgroup``), or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def _cgroup2_mount() -> tuple[Path, str] | None:
    """(mount point, root inside the hierarchy) of the cgroup2 file system, or None."""
    try:
        lines = Path("/proc/self/mountinfo").read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in lines:
        left, sep, right = line.partition(" - ")
        if sep and right.split(" ", 1)[0] == "cgroup2":
            fields = left.split(" ")
            if len(fields) >= 5:
                return Path(fields[4].replace("\\040", " ")), fields[3]
    return None


def cgroup_v2_home() -> Path | None:
    """The directory of this process's own cgroup v2, under which a trial's cgroup is made, or None."""
    own, mount = _own_cgroup_path(), _cgroup2_mount()
    if own is None or mount is None:
        return None
    mount_point, root = mount
    if root != "/" and (own == root or own.startswith(root.rstrip("/") + "/")):
        own = own[len(root.rstrip("/")) :] or "/"
    home = mount_point / own.lstrip("/")
    return home if (home / "cgroup.procs").exists() else None


class TrialCgroup:
    """One trial's cgroup v2: made empty, joined by the trial's first process, ended and removed after.

    Args:
        path: the cgroup's directory (its name starts with ``autotune-trial-``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def make(cls, home: Path | None = None) -> tuple[TrialCgroup | None, str | None]:
        """A fresh cgroup under ``home`` (default: our own), or None and why not (one line)."""
        home = cgroup_v2_home() if home is None else home
        if home is None:
            return None, "no cgroup v2 here"
        path = home / f"{_CGROUP_PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        try:
            path.mkdir()
        except OSError as exc:
            return None, f"cannot make a cgroup under {home}: {exc.strerror or exc}"
        return cls(path), None

    @classmethod
    def existing(cls, path: object) -> TrialCgroup | None:
        """The trial cgroup named in a ``proc.json``, when it still exists (and is one of ours)."""
        if not isinstance(path, str) or not Path(path).name.startswith(_CGROUP_PREFIX):
            return None
        found = Path(path)
        return cls(found) if (found / "cgroup.procs").is_file() else None

    def pids(self) -> list[int]:
        """Every process in the cgroup and the cgroups the trial made under it (exited ones are not)."""
        out: list[int] = []
        for folder, _, _ in os.walk(self.path):
            try:
                text = Path(folder, "cgroup.procs").read_text(encoding="ascii")
            except OSError:
                continue
            out.extend(int(p) for p in text.split() if p.isdigit())
        return out

    def members(self) -> dict[int, float]:
        """The cgroup's processes by pid → create time (for the reused-pid check of a later kill)."""
        out: dict[int, float] = {}
        for pid in self.pids():
            try:
                out[pid] = psutil.Process(pid).create_time()
            except psutil.Error:
                continue
        return out

    def end(self, grace_s: float) -> tuple[list[int], list[int]]:
        """End what is left in the cgroup and remove it: (pids ended, pids still there after SIGKILL).

        SIGTERM to every member, up to ``grace_s`` for them to exit, then ``cgroup.kill`` (SIGKILL to
        the whole subtree at once, by the kernel: nothing forked meanwhile slips out), else SIGKILL to
        each member. Idempotent: a second call finds nothing.
        """
        ended: set[int] = set()
        procs = self._processes()
        if procs:
            ended.update(p.pid for p in procs)
            for proc in procs:
                _signal(proc, signal.SIGTERM)
            self._wait_empty(grace_s)
        for _ in range(3):
            left = self._processes()
            if not left:
                break
            ended.update(p.pid for p in left)
            if not self._write("cgroup.kill", "1"):
                for proc in left:
                    _signal(proc, signal.SIGKILL)
            self._wait_empty(2.0)
        survivors = sorted(self.pids())
        if not survivors:
            self.remove()
        return sorted(ended), survivors

    def remove(self) -> None:
        """Remove the (empty) cgroup, the ones the trial made under it first; quiet when it cannot."""
        for folder, _, _ in sorted(os.walk(self.path), key=lambda w: -len(w[0])):
            try:
                os.rmdir(folder)
            except OSError:
                pass

    def join_fd(self) -> int | None:
        """An open descriptor of ``cgroup.procs``: writing ``0`` to it moves the writer in."""
        try:
            return os.open(self.path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
        except OSError:
            return None

    def _processes(self) -> list[psutil.Process]:
        procs = []
        for pid in self.pids():
            if pid == os.getpid():
                continue  # never ourselves, whatever moved us in
            try:
                procs.append(psutil.Process(pid))
            except psutil.Error:
                continue
        return procs

    def _wait_empty(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.pids() and time.monotonic() < deadline:
            time.sleep(0.02)

    def _write(self, name: str, value: str) -> bool:
        try:
            (self.path / name).write_text(value, encoding="ascii")
        except OSError:
            return False
        return True


def _signal(proc: psutil.Process, sig: int) -> None:
    try:
        proc.send_signal(sig)  # psutil checks the pid is still this process (create time) first
    except psutil.Error:
        pass


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, bound before any fork (a forked child must not load libraries), or None."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None


class Confinement:
    """What keeps one trial's processes findable: its cgroup where one can be made, else the subreaper.

    The runner calls :meth:`open` before the launch, passes :meth:`child_setup` as the child's
    ``preexec_fn``, calls :meth:`launched` with the child's pid right after, and :meth:`end` after the
    trial (and :meth:`close` when the launch failed).

    Attributes:
        cgroup: the trial's cgroup, or None.
        note: why there is no cgroup (one line), or None.
    """

    def __init__(self, cgroup: TrialCgroup | None, note: str | None) -> None:
        self.cgroup = cgroup
        self.note = note
        self._fd = cgroup.join_fd() if cgroup is not None else None
        if cgroup is not None and self._fd is None:
            cgroup.remove()
            self.cgroup, self.note = None, f"cannot open {cgroup.path / 'cgroup.procs'} for writing"
        self._prctl = _prctl() if self.cgroup is None else None

    @classmethod
    def open(cls) -> Confinement:
        """A cgroup for the next trial when the host allows one, else the subreaper fallback."""
        cgroup, note = TrialCgroup.make()
        return cls(cgroup, note)

    def child_setup(self) -> None:
        """Runs in the forked child before it execs: join the cgroup, else become a subreaper.

        Only system calls on what was prepared before the fork (no import, no allocation of note).
        """
        if self._fd is not None:
            try:
                os.write(self._fd, b"0")
            except OSError:
                pass  # launched() sees the child outside the cgroup and says so
        elif self._prctl is not None:
            self._prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)

    def launched(self, pid: int) -> None:
        """After the launch: close the descriptor; a child that could not join leaves no cgroup behind."""
        self._close_fd()
        if self.cgroup is not None and not self.cgroup.pids() and _running(pid):  # it did not join
            path = self.cgroup.path
            self.cgroup.remove()
            self.cgroup, self.note = None, f"the trial could not join cgroup {path}"

    def end(self, grace_s: float) -> tuple[list[int], list[int]]:
        """End what is left in the trial's cgroup: (pids ended, pids that survived SIGKILL)."""
        if self.cgroup is None:
            return [], []
        return self.cgroup.end(grace_s)

    def close(self) -> None:
        """The launch failed: drop the descriptor and the empty cgroup."""
        self._close_fd()
        if self.cgroup is not None:
            self.cgroup.remove()

    @property
    def cgroup_path(self) -> str | None:
        """The cgroup's directory as text (recorded in ``proc.json``), or None."""
        return None if self.cgroup is None else str(self.cgroup.path)

    def _close_fd(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None
