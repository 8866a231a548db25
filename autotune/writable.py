"""Proving a folder writable before anything is written to it: one rule for the study directory, the
caches and a tracker's logging folder (a floor below the study directory and the trackers, so both use it
without importing each other)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from autotune.errors import UsageError

__all__ = ["ensure_writable", "unwritable_reason"]


def ensure_writable(directory: Path, *, flag: str = "--out") -> None:
    """Create ``directory`` if needed and prove it is writable, or raise a one-line UsageError."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".autotune-write-test-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        raise UsageError(
            f"cannot write to {flag} {directory}: {reason}", hint=f"Choose a writable directory with {flag}"
        ) from None


def unwritable_reason(directory: Path) -> str | None:
    """Why ``directory`` could not be made or written by this user, naming the folder that stops it
    (``/data/runs: Permission denied``); None when it could. Nothing is left behind: a folder is made
    and removed in ``directory``, or in its nearest existing parent when it does not exist yet."""
    directory = directory.absolute()
    for place in (directory, *directory.parents):
        try:
            place.stat()
        except FileNotFoundError:
            continue
        except OSError as exc:  # a parent that cannot be searched: the folder below it cannot be reached
            return f"{place.parent}: {exc.strerror or type(exc).__name__}"
        if not place.is_dir():
            return f"{place}: not a directory"
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".autotune-write-test-", dir=place))
        except OSError as exc:
            return f"{place}: {exc.strerror or type(exc).__name__}"
        return None
    return None
