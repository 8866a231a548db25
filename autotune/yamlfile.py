"""Reading a user's YAML file with one-line errors (a missing or unreadable file, invalid YAML)."""

from __future__ import annotations

from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from autotune.errors import UsageError


def read_yaml(
    source: Path | Traversable | str, *, what: str, flag: str, error: type[UsageError] = UsageError
) -> Any:
    """The parsed content of a YAML file (None for an empty one).

    Args:
        source: the file (a path, or a packaged resource).
        what: what the file is, for the message ("search-space", "--baseline").
        flag: the flag that named it, for the fix ("--space").
        error: the error class raised (a :class:`UsageError`).

    Raises:
        UsageError: (``error``) the file is missing or unreadable, or is not valid YAML (with the line).
    """
    import yaml

    try:
        path = Path(source) if isinstance(source, str) else source
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{what} file {source} does not exist", hint=f"Check the {flag} path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {what} file {source}: {exc}", hint=f"Check the {flag} path") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise error(f"{what} file {source} is not valid YAML{at}", hint="Fix the YAML syntax") from None
