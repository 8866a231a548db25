"""Whether a study is still being written, and how far it is: ``running: 5 of 12 trials``.

A study whose ``study.json`` holds no outcome is either running or was stopped before it ended. The
lock file tells them apart: the run writing a study names itself in ``study.lock`` (pid, its start time,
host) for as long as it runs (:mod:`autotune.study.lock`). A holder alive on this host, or one on another
host (which cannot be checked from here), is a running study; a dead holder or none is one that stopped.
"""

from __future__ import annotations

import json
from typing import Any

from autotune.reports._load import StudyData

from autotune.records import TrialStatus
from autotune.study.lock import holder_alive
from autotune.studydir import StudyDir

__all__ = ["running_text"]

_LOCK_READ_MAX_BYTES = 65536


def _holder(data: StudyData) -> dict[str, Any]:
    path = StudyDir(data.root).lock_path
    try:
        with path.open("rb") as fh:
            raw = fh.read(_LOCK_READ_MAX_BYTES)
        holder = json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def running_text(data: StudyData) -> str | None:
    """``running: 5 of 12 trials`` for a study a live run is still writing; None for any other."""
    if data.kind != "study" or data.settings.outcome is not None:
        return None
    holder = _holder(data)
    if not holder.get("pid") or holder_alive(holder) is False:
        return None
    done = sum(1 for t in data.trials if t.result.status is not TrialStatus.RUNNING)
    total = data.settings.budget.trials
    of = f" of {total}" if total is not None and total > 0 else ""
    return f"running: {done}{of} trials"
