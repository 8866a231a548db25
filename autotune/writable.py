"""Proving a folder writable before anything is written to it: one rule for the study directory, the
caches and a tracker's logging folder (a floor below the study directory and the trackers, so both use it
without importing each other)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from autotune.errors import UsageError

__all__ = ["ensure_writable"]


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
