"""What every export shares: the :class:`Export` record, writing it safely, secrets, refusals, scripts.

Every file an export writes carries :data:`MARKER` near its top (a comment in scripts and YAML, a
``"_comment"`` key in JSON), so :func:`write_export` can tell a file autotune wrote before (replaced)
from a file of the user's (never overwritten).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.errors import UsageError

__all__ = [
    "EXPORT_FORMATS",
    "MARKER",
    "Export",
    "ShellWord",
    "drop_secrets",
    "flag_lines",
    "is_secret_name",
    "json_text",
    "looks_secret",
    "refuse",
    "shell_script",
    "write_export",
]

#: the formats ``autotune export --format`` accepts. ``command`` is the winning trial's own command
#: (the only runnable form of a study run with ``--backend command``).
EXPORT_FORMATS: tuple[str, ...] = ("swift", "trl", "verl", "deepspeed", "json", "command")

MARKER = "Written by autotune export"
_MARKER_WINDOW_BYTES = 4096
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

FORMAT_LABELS: dict[str, str] = {
    "swift": "ms-swift's command line",
    "trl": "TRL's configuration",
    "verl": "verl's configuration",
    "deepspeed": "a DeepSpeed config",
    "json": "JSON",
    "command": "the study's command",
}


@dataclass(frozen=True)
class Export:
    """An exported configuration: file name → content, and which file is the one to run or read.

    Attributes:
        format: one of :data:`EXPORT_FORMATS`.
        files: relative file name → text content.
        main: the name (a key of ``files``) to print or run.
        trial: the trial number the export describes.
        executable: names among ``files`` to mark executable when written.
        notes: what was left out and why (secret flags, for example), one sentence each.
    """

    format: str
    files: dict[str, str]
    main: str
    trial: int
    executable: frozenset[str] = frozenset()
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def others(self) -> list[str]:
        """The file names besides :attr:`main`."""
        return [name for name in self.files if name != self.main]


def refuse(what: str, fmt: str, instead: str | None) -> UsageError:
    """The one-line refusal for something a format cannot express.

    ``what`` names it (``"knob move_model_batches=8"``); ``instead`` is the format to use instead.
    """
    hint = f"use --format {instead}" if instead and instead != fmt else "export another trial with --trial N"
    return UsageError(f"{what} cannot be expressed in {FORMAT_LABELS.get(fmt, fmt)}; {hint}")


# ------------------------------------------------------------------------------------------ secrets

_SECRET_WORDS = (
    r"(?:TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|API[_-]?KEY|ACCESS[_-]?KEY|PRIVATE[_-]?KEY|CREDENTIALS?"
    r"|AUTH[_-]?KEY|COOKIE)(?![A-Za-z])"
)
_SECRET_NAME = re.compile(rf"{_SECRET_WORDS}|(?:^|_)KEY$", re.IGNORECASE)
_SECRET_VALUE = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}"
    r"|AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,})"
    r"|[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@"
)


def is_secret_name(name: str) -> bool:
    """True when a flag or variable name looks like it holds a secret (``hub_token``, ``WANDB_API_KEY``)."""
    return bool(_SECRET_NAME.search(name))


def looks_secret(value: Any) -> bool:
    """True when a value (or any item of a list value) looks like a credential (``hf_...``, ``user:pw@``)."""
    if isinstance(value, (list, tuple)):
        return any(looks_secret(v) for v in value)
    if isinstance(value, Mapping):
        return any(looks_secret(v) for v in value.values())
    return isinstance(value, str) and bool(_SECRET_VALUE.search(value))


def drop_secrets(args: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The arguments without secrets, and one note per argument left out."""
    kept: dict[str, Any] = {}
    notes: list[str] = []
    for name, value in args.items():
        if is_secret_name(name) or looks_secret(value):
            notes.append(
                f"--{name} left out: it holds a secret; set it in your environment or add it by hand"
            )
        else:
            kept[name] = value
    return kept, notes


# ------------------------------------------------------------------------------------------ text


def json_text(data: Any) -> str:
    """JSON as autotune writes it (2-space indent, newline at the end)."""
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


@dataclass(frozen=True)
class ShellWord:
    """A word written into a script as it is (not quoted): for ``"$HERE/file.py"`` and ``"$@"``."""

    text: str


def _word(item: str | ShellWord) -> str:
    return item.text if isinstance(item, ShellWord) else shlex.quote(item)


def flag_lines(argv: Sequence[str], lead: int = 1) -> list[list[str]]:
    """Group an argv into script lines: the first ``lead`` items, then one ``--flag value ...`` a line."""
    lines: list[list[str]] = [list(argv[:lead])]
    for item in argv[lead:]:
        if item.startswith("-") and not _is_number(item):
            lines.append([item])
        else:
            lines[-1].append(item)
    return lines


def shell_script(
    comments: Iterable[str],
    command: Sequence[Sequence[str | ShellWord]],
    *,
    env: Mapping[str, str] | None = None,
    setup: Iterable[str] = (),
) -> str:
    """A bash script that runs one command with ``env``, passing its own arguments (``"$@"``) on.

    Args:
        comments: header lines (without ``#``); the first should carry :data:`MARKER`.
        command: the command as lines of items; items are quoted unless they are :class:`ShellWord`.
        env: variables to export first (values quoted).
        setup: shell lines between the exports and the command (written by us, never built from values).
    """
    lines = ["#!/usr/bin/env bash"]
    lines += [f"# {c}".rstrip() for c in comments]
    lines.append("set -euo pipefail")
    for key, value in (env or {}).items():
        if not _ENV_NAME.match(key):
            raise UsageError(
                f"{key!r} is not an environment variable name", hint="Fix the trial's launch.json"
            )
        lines.append(f"export {key}={shlex.quote(value)}")
    lines += list(setup)
    rendered = [" ".join(_word(item) for item in line) for line in command if line]
    rendered.append('"$@"')
    lines.append(" \\\n  ".join(rendered))
    return "\n".join(lines) + "\n"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# ------------------------------------------------------------------------------------------ writing


def _written_by_autotune(path: Path) -> bool:
    try:
        with path.open("rb") as fh:
            head = fh.read(_MARKER_WINDOW_BYTES)
    except OSError:
        return False
    return MARKER.encode() in head


def _targets(export: Export, out: Path) -> dict[str, Path]:
    if len(export.files) == 1 and not out.is_dir():
        ((name, _),) = export.files.items()
        return {name: out}
    return {name: out / name for name in export.files}


def write_export(export: Export, out: Path, *, overwrite: bool = False) -> list[Path]:
    """Write the files of ``export`` to ``out`` and return their paths.

    A single-file export is written to ``out`` itself (or into it, when ``out`` is a directory); a
    multi-file export into the directory ``out`` (created). A file that exists and was not written by
    autotune (no :data:`MARKER` near its top) is never overwritten: nothing is written then.

    Args:
        export: what to write.
        out: a file (single-file exports) or a directory.
        overwrite: replace existing files whoever wrote them (for directories autotune owns, ``best/``).

    Raises:
        UsageError: a file of the user's is in the way, or ``out`` cannot be written.
    """
    out = Path(out)
    targets = _targets(export, out)
    for path in targets.values():
        if path.is_dir():
            raise UsageError(f"{path} is a directory", hint="Choose another --out")
        if path.exists() and not overwrite and not _written_by_autotune(path):
            raise UsageError(
                f"{path} exists and was not written by autotune export",
                hint="Choose another --out, or move that file away first",
            )
    written: list[Path] = []
    for name, path in targets.items():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as fh:
                    fh.write(export.files[name])
                os.chmod(tmp, 0o755 if name in export.executable else 0o644)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            reason = exc.strerror or exc.__class__.__name__
            raise UsageError(f"cannot write {path}: {reason}", hint="Choose a writable --out") from None
        written.append(path)
    return written
