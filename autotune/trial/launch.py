"""Start a trial's process: the plan as launched, the environment it gets, and the child itself in a new
session (its own process group, ``pgid == pid``), with a start failure translated once into a
:class:`~autotune.errors.LaunchError`.

The trial runner (:meth:`autotune.trial.runner.TrialRun.launch`) calls :func:`start_process` once per
trial, then writes :func:`proc_info` as ``proc.json``; pinning and the watch stay there.
"""

from __future__ import annotations

import os
import socket
import subprocess
from typing import Any

from autotune.affinity import parse_cores
from autotune.errors import LaunchError
from autotune.records import LaunchPlan
from autotune.trial.confine import Confinement
from autotune.trial.processes import MARKER_ENV, create_time_of

__all__ = ["child_env", "effective_plan", "proc_info", "start_process"]


def effective_plan(plan: LaunchPlan) -> LaunchPlan:
    """The plan as launched: Python children unbuffered so step lines arrive live."""
    if "PYTHONUNBUFFERED" in plan.env or "PYTHONUNBUFFERED" in os.environ:
        return plan
    return plan.model_copy(update={"env": {**plan.env, "PYTHONUNBUFFERED": "1"}})


def child_env(plan: LaunchPlan, marker: str) -> dict[str, str]:
    """The trial's environment: ours, without the plan's ``unset_env``, with the plan's on top and the
    trial's marker."""
    env = dict(os.environ)
    for key in plan.unset_env:
        env.pop(key, None)
    env.update(plan.env)
    env[MARKER_ENV] = marker  # every process of the trial inherits it (see autotune.trial.processes)
    return env


def start_process(plan: LaunchPlan, *, marker: str, confinement: Confinement) -> subprocess.Popen[bytes]:
    """Start ``plan`` in a new session, stdout and stderr piped unbuffered, confined by ``confinement``.

    Raises:
        LaunchError: the command cannot be started (not found, not executable, too long, a NUL byte).
    """
    try:
        return subprocess.Popen(
            list(plan.argv),
            cwd=plan.cwd,
            env=child_env(plan, marker),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            bufsize=0,
            preexec_fn=confinement.child_setup,
        )
    except (OSError, ValueError, subprocess.SubprocessError) as exc:  # not found, E2BIG, a NUL byte
        cause = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        size = sum(len(a) + 1 for a in plan.argv)
        raise LaunchError(
            f"cannot start {plan.argv[0][:200]!r} in {plan.cwd}: {cause}"
            + (f" ({len(plan.argv)} arguments, {size} bytes)" if isinstance(exc, OSError) else ""),
            hint="Check the command (its first word must be an executable on PATH or a path, "
            "its arguments short enough for the system)",
        ) from None


def proc_info(
    plan: LaunchPlan,
    pid: int,
    *,
    started_wall_s: float,
    create_time: float | None,
    marker: str,
    confinement: Confinement,
    affinity_note: str | None,
) -> dict[str, Any]:
    """What ``proc.json`` says of a started trial (what :func:`~autotune.trial.processes.reap_orphan`
    reads): its process and group, the autotune run that owns it, its marker, cgroup and cores."""
    return {
        "pid": pid,
        "pgid": pid,  # start_new_session: the child leads its session and group
        "create_time": create_time,
        "started_wall_s": started_wall_s,
        "runner_pid": os.getpid(),
        "runner_create_time": create_time_of(os.getpid()),
        "host": socket.gethostname(),
        "marker": marker,
        "cgroup": confinement.cgroup_path,
        "cgroup_note": confinement.note,  # why not, when the trial has none
        "cpu_cores": list(parse_cores(plan.env)),
        "affinity_note": affinity_note,
        "argv0": plan.argv[0],
        "ended": False,
    }
