"""The CPU cores a CPU-only trial is given, and pinning its processes to them.

On a CPU-only host a trial's speed depends on where the scheduler puts its threads. OpenMP threads that
wander onto cores a neighbour is using wait at every barrier for the slowest of them, so an unpinned
two-thread run can lose several times its speed to one busy neighbour and the ranking of configurations
becomes the neighbour's. A trial is therefore given its cores explicitly (``AUTOTUNE_CPU_CORES``, the
cores this autotune process may use): the runner pins the trial's first process to them before it
starts anything (its children inherit the mask), and each training rank pins itself to its own share
(:func:`rank_cores`), with one OpenMP thread per core of that share. What other processes still take
from those cores is measured (:mod:`autotune.trial.hostload`) and judged (:mod:`autotune.study.verdict`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

__all__ = ["CORES_ENV", "format_cores", "parse_cores", "pin", "rank_cores", "usable_cores"]

#: The environment variable that names a CPU-only trial's cores (``0,1``).
CORES_ENV = "AUTOTUNE_CPU_CORES"


def usable_cores() -> tuple[int, ...]:
    """The cores this process may run on (its affinity mask), in order."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity API on this platform
        return tuple(range(os.cpu_count() or 1))


def format_cores(cores: Sequence[int]) -> str:
    """``0,1,2``: the value of :data:`CORES_ENV`."""
    return ",".join(str(c) for c in cores)


def parse_cores(env: Mapping[str, str]) -> tuple[int, ...]:
    """The cores :data:`CORES_ENV` names in ``env``; empty when it is unset or not a list of core numbers."""
    text = env.get(CORES_ENV, "").strip()
    try:
        cores = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        return ()
    return cores if all(c >= 0 for c in cores) else ()


def rank_cores(cores: Sequence[int], rank: int, world: int) -> tuple[int, ...]:
    """Rank ``rank``'s share of ``cores`` among ``world`` ranks: contiguous, disjoint, as even as they
    divide; with fewer cores than ranks, ranks share cores round-robin (one core each)."""
    if not cores:
        return ()
    world = max(1, world)
    rank = rank % world
    if len(cores) < world:
        return (cores[rank % len(cores)],)
    per, extra = divmod(len(cores), world)
    start = rank * per + min(rank, extra)
    return tuple(cores[start : start + per + (1 if rank < extra else 0)])


def pin(pid: int, cores: Sequence[int]) -> str | None:
    """Pin process ``pid`` (0: this one) to ``cores``; returns why it could not be done, or None.

    Never raises: a host that refuses (a container without the capability, cores outside the cpuset)
    leaves the process where it was, and the caller records the note.
    """
    if not cores:
        return None
    try:
        os.sched_setaffinity(pid, set(cores))
    except (AttributeError, OSError, ValueError) as exc:
        return f"not pinned to cores {format_cores(cores)}: {exc}"
    return None
