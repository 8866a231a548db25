"""Phase markers written from inside a training process. Standard library only.

A training script (the TRL trial worker, or any framework's code) brackets its work::

    from autotune.probes import phases

    with phases.phase("rollout", step=n):
        completions = generate(...)

Each ``begin``/``end`` appends one JSON line to the file named by ``AUTOTUNE_PHASES_FILE``::

    {"phase": "rollout", "event": "begin", "t_mono_s": 12.5, "t_wall_s": 1.7e9, "step": 3,
     "pid": 4242, "rank": 0}

Nothing happens when the variable is unset, and only rank 0 writes (env ``RANK`` unset, empty or
``"0"``). Each line is one ``write`` on a file opened in append mode and closed at once, so lines from
several processes never interleave, nothing is cached across ``fork``, and a marker costs a few tens of
microseconds. ``t_mono_s`` is ``time.monotonic()``: on Linux CLOCK_MONOTONIC is system-wide, so the
markers line up with the samplers' timeline and the step records written by other processes.

A marker that cannot be written (disk full, directory gone) never breaks training: it is dropped with
one ``RuntimeWarning``.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["PHASES", "EVENTS", "ENV_FILE", "mark", "phase", "read_phases"]

PHASES: tuple[str, ...] = ("rollout", "train", "weight_sync", "other")
EVENTS: tuple[str, ...] = ("begin", "end")
ENV_FILE = "AUTOTUNE_PHASES_FILE"


def _rank() -> int | None:
    """This process's rank when it may write (rank 0), else None."""
    raw = os.environ.get("RANK", "").strip()
    if raw in ("", "0"):
        return 0
    return None


def mark(phase: str, event: str, step: int | None = None) -> None:
    """Append one phase marker to ``$AUTOTUNE_PHASES_FILE`` (no-op when unset or not rank 0).

    Args:
        phase: one of ``rollout``, ``train``, ``weight_sync``, ``other``.
        event: ``begin`` or ``end``.
        step: the training step the phase belongs to, when known.

    Raises:
        ValueError: ``phase`` or ``event`` is not one of the names above (a bug in the caller).
    """
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; use one of {', '.join(PHASES)}")
    if event not in EVENTS:
        raise ValueError(f"unknown phase event {event!r}; use 'begin' or 'end'")
    path = os.environ.get(ENV_FILE)
    if not path:
        return
    rank = _rank()
    if rank is None:
        return
    record = {
        "phase": phase,
        "event": event,
        "t_mono_s": time.monotonic(),
        "t_wall_s": time.time(),
        "step": int(step) if step is not None else None,
        "pid": os.getpid(),
        "rank": rank,
    }
    line = json.dumps(record, separators=(",", ":")) + "\n"
    try:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(line)
    except OSError as exc:
        warnings.warn(
            f"phase marker not written to {path} ({exc}); the run's phase split will be inferred",
            RuntimeWarning,
            stacklevel=2,
        )


@contextmanager
def phase(name: str, step: int | None = None) -> Iterator[None]:
    """Bracket a block with ``begin``/``end`` markers of phase ``name``; ``end`` is written even when
    the block raises."""
    mark(name, "begin", step)
    try:
        yield
    finally:
        mark(name, "end", step)


def read_phases(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read the markers of a phases file, in file order.

    A missing file gives an empty list. Lines that are not complete marker objects (a partial last
    line of a killed run, stray text) are skipped.
    """
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return []
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if (
            not isinstance(record, dict)
            or record.get("phase") not in PHASES
            or record.get("event") not in EVENTS
            or not isinstance(record.get("t_mono_s"), (int, float))
        ):
            continue
        out.append(record)
    return out
