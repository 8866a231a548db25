"""The study directory on disk: paths, ``study.json``, and the trials' ``result.json`` files.

Writes are atomic (write to a temporary file, then ``os.replace``) so a study killed at any moment
never leaves a half-written record behind.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from autotune.errors import UsageError
from autotune.records import TrialResult

__all__ = ["StudyDir", "write_json_atomic", "ensure_writable"]


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to ``path`` atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, sort_keys=False, default=str)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


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


class StudyDir:
    """Paths and records of one study directory (``runs/<study>``)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def study_json(self) -> Path:
        return self.root / "study.json"

    @property
    def db_path(self) -> Path:
        return self.root / "study.db"

    @property
    def trials_dir(self) -> Path:
        return self.root / "trials"

    @property
    def best_dir(self) -> Path:
        return self.root / "best"

    @property
    def cache_dir(self) -> Path:
        return self.root / "cache"

    def trial_dir(self, number: int) -> Path:
        return self.trials_dir / str(number)

    def exists(self) -> bool:
        return self.study_json.exists()

    def read_settings(self) -> dict[str, Any]:
        try:
            return json.loads(self.study_json.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UsageError(
                f"{self.root} is not a study directory (no study.json)",
                hint="Point at a directory written by autotune search",
            ) from None
        except json.JSONDecodeError as exc:
            raise UsageError(
                f"{self.study_json} is not valid JSON ({exc.msg})",
                hint="Restore it or start a new study with another --out",
            ) from None

    def write_settings(self, data: dict[str, Any]) -> None:
        write_json_atomic(self.study_json, data)

    def write_result(self, result: TrialResult) -> None:
        write_json_atomic(self.trial_dir(result.number) / "result.json", result.model_dump(mode="json"))

    def read_result(self, number: int) -> TrialResult | None:
        path = self.trial_dir(number) / "result.json"
        if not path.exists():
            return None
        return TrialResult.model_validate_json(path.read_text(encoding="utf-8"))

    def results(self) -> list[TrialResult]:
        """Every trial result on disk, by trial number."""
        out = []
        if not self.trials_dir.exists():
            return out
        for child in self.trials_dir.iterdir():
            if child.is_dir() and child.name.isdigit():
                result = self.read_result(int(child.name))
                if result is not None:
                    out.append(result)
        return sorted(out, key=lambda r: r.number)
