"""The processes of a trial: its group, its descendants, and the ones that left both.

Every trial runs in its own session (its own process group). A process that leaves the group
(``setsid``, a double fork) is still found: the runner puts a marker in the trial's environment
(:data:`MARKER_ENV`, a value unique to the trial) and :func:`end_marked` ends every process of this
user whose environment carries it. A process that clears its environment before it execs is found by
the trial's cgroup, or by the process tree the runner recorded while the trial ran (pid and create
time; see :mod:`autotune.trial.confine`).

- :func:`terminate_group` ends a group and its known descendants (SIGTERM, grace, SIGKILL).
- :func:`end_marked` ends what carries a trial's marker, after the trial, whatever its end.
- :func:`end_trial` ends one trial after its watch: its group, stragglers, what carries its marker and
  what is left in its cgroup.
- :func:`reap_orphan` ends what a killed autotune left of a trial, when the study resumes; only when
  the autotune run that started it is provably dead.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from autotune.studydir import TrialDir
from autotune.trial.confine import Confinement, TrialCgroup

__all__ = [
    "MARKER_ENV",
    "TrialEnd",
    "alive_pids",
    "create_time_of",
    "descendants_of",
    "owner_alive",
    "end_marked",
    "end_trial",
    "marked_processes",
    "new_marker",
    "outside_group",
    "reap_orphan",
    "terminate_group",
]

# The environment variable that marks every process a trial starts (inherited by its descendants).
MARKER_ENV = "AUTOTUNE_TRIAL_MARKER"


def new_marker() -> str:
    """A value unique to one trial run (host, our pid, random), for :data:`MARKER_ENV`."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(8)}"


def create_time_of(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


def _is_live(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def _group_members(pgid: int) -> list[psutil.Process]:
    """Live processes whose process group is ``pgid`` (zombies excluded)."""
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and _is_live(proc):
                members.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def _known_live(known: Mapping[int, float | None] | Iterable[int]) -> list[psutil.Process]:
    """Known pids that are still alive and still the same process (create time matches when given)."""
    pairs = known.items() if isinstance(known, Mapping) else ((p, None) for p in known)
    live = []
    for pid, ctime in pairs:
        try:
            proc = psutil.Process(pid)
            if ctime is not None and abs(proc.create_time() - ctime) > 0.01:
                continue  # pid reused by an unrelated process
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
        if _is_live(proc):
            live.append(proc)
    return live


def _targets(pgid: int, known: Mapping[int, float | None] | Iterable[int]) -> dict[int, psutil.Process]:
    own_group = pgid == os.getpgid(0)  # never our own group, whatever a caller passes
    out = {p.pid: p for p in _group_members(pgid)} if pgid > 0 and not own_group else {}
    for p in _known_live(known):
        out.setdefault(p.pid, p)
    out.pop(os.getpid(), None)  # never ourselves, whatever a caller passes
    return out


def _send(procs: Iterable[psutil.Process], pgid: int, sig: int) -> None:
    if pgid > 0 and pgid != os.getpgid(0):
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for proc in procs:
        try:
            proc.send_signal(sig)
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            pass


def _wait_gone(procs: Sequence[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until every process is gone or a zombie, without reaping anyone (our caller does)."""
    deadline = time.monotonic() + timeout_s
    alive = [p for p in procs if _is_live(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.02)
        alive = [p for p in alive if _is_live(p)]
    return alive


def terminate_group(
    pgid: int, known_pids: Mapping[int, float | None] | Iterable[int] = (), grace_s: float = 5.0
) -> list[int]:
    """End a trial's process group and its known descendants; return the pids that needed SIGKILL.

    SIGTERM to the group (and to each known descendant that left it, e.g. with ``setsid``), wait up
    to ``grace_s``, SIGKILL whatever is left, then check again until no process of the group or of
    ``known_pids`` is alive (a process forked during the kill is caught by the re-check). Idempotent:
    a second call finds nothing and returns ``[]``. Zombies count as gone; reaping our own child is the
    caller's job (``Popen.wait``).

    Args:
        pgid: the trial's process group id (its leader's pid).
        known_pids: descendants seen during the run; a mapping pid → create time skips pids that were
            reused by unrelated processes since.
        grace_s: seconds between SIGTERM and SIGKILL.
    """
    targets = _targets(pgid, known_pids)
    if not targets:
        return []
    _send(targets.values(), pgid, signal.SIGTERM)
    left = _wait_gone(list(targets.values()), grace_s)
    killed: list[int] = []
    for _ in range(10):
        if not left:
            left = list(_targets(pgid, known_pids).values())
            if not left:
                break
        killed.extend([p.pid for p in left if p.pid not in killed])
        _send(left, pgid, signal.SIGKILL)
        left = _wait_gone(left, 2.0)
    return killed


def outside_group(pgid: int, known: Mapping[int, float | None]) -> list[int]:
    """The known descendants still alive (same pid, same start time) whose process group is not ``pgid``:
    they left the trial's group (``setsid``, a double fork) and were seen by a scan of its tree."""
    out = []
    for proc in _known_live(known):
        try:
            if os.getpgid(proc.pid) != pgid:
                out.append(proc.pid)
        except (ProcessLookupError, PermissionError):
            continue
    return sorted(out)


def alive_pids(pids: Iterable[int]) -> list[int]:
    """The pids that are still alive (not zombies). For GPU hygiene: are the trial's processes gone?"""
    out = []
    for pid in pids:
        try:
            if _is_live(psutil.Process(pid)):
                out.append(pid)
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return out


def descendants_of(pid: int) -> dict[int, float]:
    try:
        children = psutil.Process(pid).children(recursive=True)
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return {}
    out: dict[int, float] = {}
    for child in children:
        try:
            out[child.pid] = child.create_time()
        except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
            continue
    return out


def owner_alive(pid: object, create_time: object, host: object) -> bool | None:
    """Whether a process named by pid, start time and host still runs.

    True or False on this host (the same pid with the same start time), None for another host
    (nothing here can tell). Without a recorded start time a live pid counts as alive.
    """
    if host not in (None, socket.gethostname()):
        return None
    try:
        started = psutil.Process(int(pid)).create_time()  # type: ignore[call-overload]
    except (TypeError, ValueError, psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True
    if create_time is None:
        return True
    try:
        return abs(float(create_time) - started) < 0.01  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return True


def marked_processes(marker: str) -> list[psutil.Process]:
    """Live processes of this user whose environment carries ``MARKER_ENV=marker`` (never ourselves)."""
    if not marker:
        return []
    me = os.getpid()
    uid = os.getuid()
    found = []
    for proc in psutil.process_iter():
        if proc.pid == me:
            continue
        try:
            if proc.uids().real != uid or proc.environ().get(MARKER_ENV) != marker:
                continue
        except (psutil.Error, OSError):
            continue  # gone, a kernel thread, or another user's
        if _is_live(proc):
            found.append(proc)
    return found


def end_marked(marker: str, grace_s: float = 5.0) -> tuple[list[int], list[int]]:
    """End every process carrying a trial's marker: (pids ended, pids that survived SIGKILL).

    Run after a trial whatever its end; a process found here had left the trial's group (``setsid``,
    a double fork) and was not among the descendants seen.
    """
    found = marked_processes(marker)
    if not found:
        return [], []
    ended = sorted(p.pid for p in found)
    _send(found, -1, signal.SIGTERM)
    left = _wait_gone(found, grace_s)
    for _ in range(3):
        fresh = {p.pid: p for p in [*left, *marked_processes(marker)]}
        if not fresh:
            break
        ended = sorted({*ended, *fresh})
        _send(fresh.values(), -1, signal.SIGKILL)
        left = _wait_gone(list(fresh.values()), 2.0)
    return ended, sorted(p.pid for p in left)


@dataclass(frozen=True)
class TrialEnd:
    """What ending a trial's processes took (:func:`end_trial`).

    Attributes:
        killed_pids: the pids that needed SIGKILL, then those ended after leaving the trial's group.
        notes: one line each for what the lead may want to know (a process that did not exit after
            SIGKILL, processes that had left the group, survivors).
    """

    killed_pids: list[int]
    notes: list[str]


def end_trial(
    proc: subprocess.Popen[bytes],
    known: dict[int, float | None],
    *,
    marker: str,
    confinement: Confinement | None,
    grace_s: float,
) -> TrialEnd:
    """Stop a trial if it still runs, reap it, end stragglers; safe when the process already ended.

    Touches only the trial's own group and the descendants seen (:func:`terminate_group`), then what
    carries its ``marker`` (:func:`end_marked`) and what is left in its cgroup (``confinement``).
    Afterwards the process is reaped (``proc.returncode`` is set), unless the kernel could not deliver
    SIGKILL: a note says so.

    Args:
        proc: the trial's process, leader of its own group (``pgid == pid``).
        known: the trial's pid and every descendant seen → create time; descendants still running
            are added to it.
        marker: the trial's :data:`MARKER_ENV` value.
        confinement: the trial's cgroup (or subreaper), when it has one.
        grace_s: seconds between SIGTERM and SIGKILL.
    """
    pid = pgid = proc.pid
    notes: list[str] = []
    killed: list[int] = []
    if proc.poll() is None:
        known.update({p: t for p, t in descendants_of(pid).items() if p not in known})
    left = outside_group(pgid, known)  # seen by a scan, but no longer in the trial's group
    if proc.poll() is None:
        killed = terminate_group(pgid, known, grace_s)
    try:
        proc.wait(timeout=grace_s + 5)
    except subprocess.TimeoutExpired:  # only if the kernel cannot deliver SIGKILL
        notes.append(f"trial process {pid} did not exit after SIGKILL")
    # Stragglers left in the group after the main process ended, and escaped descendants.
    killed += [p for p in terminate_group(pgid, known, grace_s) if p not in killed]
    # Processes that left the group unseen (setsid, double fork) still carry the trial's marker, and
    # stay in the trial's cgroup whatever they did to their environment.
    escaped, survivors = end_marked(marker, grace_s)
    escaped += [p for p in left if p not in escaped and p not in alive_pids(left)]
    if confinement is not None:
        jailed, stuck = confinement.end(grace_s)
        escaped += [p for p in jailed if p not in escaped and p not in killed]
        survivors += [p for p in stuck if p not in survivors]
    if escaped:
        notes.append(
            f"ended {len(escaped)} process(es) that had left the trial's process group: "
            + ", ".join(map(str, escaped))
        )
    if survivors:
        notes.append("processes of this trial survived SIGKILL: " + ", ".join(map(str, survivors)))
    return TrialEnd(killed_pids=killed + [p for p in escaped if p not in killed], notes=notes)


def reap_orphan(trial_dir: Path, *, grace_s: float = 5.0) -> str | None:
    """End a trial's process group left running after autotune was killed; describe it in one line.

    Reads ``<trial_dir>/proc.json``. Nothing is touched unless the autotune run that started the trial
    is provably dead (its pid and start time on this host; a trial started on another host is left
    alone and named). The group is ours when its leader is alive with the recorded pid and create
    time, or when the leader is gone and the group's members started after it (Linux does not hand
    out a pid that is still some group's id). Descendants recorded by pid + create time, and every
    process carrying the trial's marker, are ended too. Returns None when there is nothing of ours
    left (or no proc.json).
    """
    path = TrialDir(Path(trial_dir)).proc_json
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
        pid, pgid = int(info["pid"]), int(info["pgid"])
        ctime = info.get("create_time")
    except (OSError, ValueError, KeyError, TypeError):
        return None
    runner = owner_alive(info.get("runner_pid"), info.get("runner_create_time"), info.get("host"))
    if runner is None:
        return f"trial {Path(trial_dir).name} ran on host {info.get('host')}: its processes there were not touched"
    if runner and info.get("runner_pid") != os.getpid():
        return None  # its autotune still runs: not an orphan
    marked = marked_processes(str(info.get("marker") or ""))
    known: dict[int, float | None] = {int(k): v for k, v in (info.get("descendants") or {}).items()}
    leader_ctime = create_time_of(pid)
    leader_ours = leader_ctime is not None and ctime is not None and abs(leader_ctime - ctime) < 0.01
    leader_reused = leader_ctime is not None and not leader_ours and pid == pgid
    if leader_ours:
        known[pid] = ctime
    group_pgid = -1 if leader_reused else pgid
    if group_pgid > 0 and not leader_ours and ctime is not None:
        started = [create_time_of(p.pid) for p in _group_members(group_pgid)]
        if any(t is not None and t < ctime - 0.01 for t in started):
            group_pgid = -1  # a member older than our trial: the group is not ours
    for proc in marked:
        try:
            known.setdefault(proc.pid, proc.create_time())
        except psutil.Error:
            continue
    cgroup = TrialCgroup.existing(info.get("cgroup"))
    if cgroup is not None:  # whatever is still in the trial's cgroup is the trial's, environment or not
        for member, member_ctime in cgroup.members().items():
            known.setdefault(member, member_ctime)
    targets = _targets(group_pgid, known)
    if not targets:
        if cgroup is not None:
            cgroup.remove()
        return None
    pids = sorted(targets)
    killed = terminate_group(group_pgid, known, grace_s)
    if cgroup is not None:
        cgroup.end(grace_s)
    started_at = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("started_wall_s") or 0))
    forced = f", {len(killed)} needed SIGKILL" if killed else ""
    return (
        f"ended orphaned trial processes of {Path(trial_dir).name} (group {pgid}, started {started_at}): "
        f"{len(pids)} process{'es' if len(pids) != 1 else ''} {', '.join(map(str, pids))}{forced}"
    )
