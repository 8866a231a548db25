"""What every export shares: the :class:`Export` record, writing it safely, secrets, refusals, scripts.

Every file an export writes carries :data:`MARKER` near its top (a comment in scripts and YAML, a
``"_comment"`` key in JSON), so :func:`write_export` can tell a file autotune wrote before (replaced)
from a file of the user's (never overwritten).
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autotune.errors import UsageError
from autotune.plaintext import comment_line, shell_name
from autotune.secrets import MASK, SecretRule, env_name
from autotune.studydir import regular_file

__all__ = [
    "EXPORT_FORMATS",
    "MANIFEST",
    "MARKER",
    "Export",
    "ShellWord",
    "flag_lines",
    "json_text",
    "mask_secrets",
    "refuse",
    "secret_comment",
    "shell_script",
    "write_export",
]

#: the formats ``autotune export --format`` accepts. ``command`` is the winning trial's own command
#: (the only runnable form of a study run with ``--backend command``).
EXPORT_FORMATS: tuple[str, ...] = ("swift", "trl", "verl", "deepspeed", "json", "command")

MARKER = "Written by autotune export"
#: a line of a script autotune wrote that lists the files it copied beside it (they carry no marker of
#: their own: a trial's JSON config, its prompts); rewriting the export may replace them
MANIFEST = "Copied beside this script from the trial: "
_MARKER_WINDOW_BYTES = 4096

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


def mask_secrets(
    args: Mapping[str, object], rule: SecretRule | None = None
) -> tuple[dict[str, Any], list[str]]:
    """The arguments with secret values masked (:data:`~autotune.secrets.MASK`), and one note per secret.

    Scripts read a masked argument from an environment variable (:func:`shell_script`); JSON and YAML
    show the mask.
    """
    rule = rule or SecretRule()
    masked = rule.redact_mapping(args)
    notes = [
        f"--{name} is a secret: scripts read it from ${env_name(str(name))}, other files show {MASK}"
        for name, value in args.items()
        if masked[name] != value or MASK in str(masked[name])
    ]
    return masked, notes


# ------------------------------------------------------------------------------------------ text


def json_text(data: object) -> str:
    """JSON as autotune writes it (2-space indent, newline at the end)."""
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


@dataclass(frozen=True)
class ShellWord:
    """A word written into a script as it is (not quoted): for ``"$HERE/file.py"`` and ``"$@"``."""

    text: str


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
    secrets: SecretRule | None = None,
) -> str:
    """A bash script that runs one command with ``env``, passing its own arguments (``"$@"``) on.

    Secrets (:mod:`autotune.secrets`) are never written: a secret argument is read from an environment
    variable (``--hf_token "${HF_TOKEN}"``), a secret variable of ``env`` is left for the user to export,
    and a comment names what to export.

    Args:
        comments: header lines (without ``#``); the first should carry :data:`MARKER`. Each is written
            on one line through :func:`~autotune.plaintext.comment_line` (a newline in a study's name
            never ends the comment).
        command: the command as lines of items; items are quoted unless they are :class:`ShellWord`.
        env: variables to export first (values quoted).
        setup: shell lines between the exports and the command (written by us, never built from values).
        secrets: the rule (default: the built-in one).
    """
    rule = secrets or SecretRule()
    body: list[str] = []
    needed: list[str] = []
    for key, value in (env or {}).items():
        shell_name(key)
        if rule.is_secret_name(key) or rule.looks_secret(value) or MASK in value:
            needed.append(key)  # the user exports it; its value is never written
            continue
        body.append(f"export {key}={shlex.quote(value)}")
    body += list(setup)
    rendered = []
    for line in command:
        if not line:
            continue
        plain = [item for item in line if not isinstance(item, ShellWord)]
        words, used = rule.script_words(plain) if plain else ([], [])
        needed += [u for u in used if u not in needed]
        it = iter(words)
        rendered.append(" ".join(item.text if isinstance(item, ShellWord) else next(it) for item in line))
    rendered.append('"$@"')
    body.append(" \\\n  ".join(rendered))
    lines = ["#!/usr/bin/env bash"]
    lines += [f"# {comment_line(c)}".rstrip() for c in comments]
    lines += secret_comment(needed)
    lines.append("set -euo pipefail")
    return "\n".join(lines + body) + "\n"


def secret_comment(names: Sequence[str]) -> list[str]:
    """The script comment that names the variables the user must export (none: no comment)."""
    if not names:
        return []
    listed = " ".join(comment_line(n) for n in names)
    return [f"# Secrets are not written here: export {listed} before running (autotune never stores them)."]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# ------------------------------------------------------------------------------------------ writing


def _written_by_autotune(path: Path) -> bool:
    if not regular_file(path):  # a FIFO would block the read, a link is never ours
        return False
    try:
        with path.open("rb") as fh:
            head = fh.read(_MARKER_WINDOW_BYTES)
    except OSError:
        return False
    return MARKER.encode() in head


def _copied_before(main: Path | None) -> frozenset[str]:
    """The files an earlier export listed as copied beside its main file (:data:`MANIFEST`) and that
    nobody changed since: a copy newer than the main file (written last) is the user's now."""
    if main is None or not _written_by_autotune(main):
        return frozenset()
    try:
        written_s = main.stat().st_mtime
    except OSError:
        return frozenset()
    return frozenset(n for n in _manifest(main) if _mtime(main.parent / n) <= written_s)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return float("inf")  # gone or unreadable: nothing of ours to replace


def _manifest(main: Path) -> frozenset[str]:
    if not regular_file(main):
        return frozenset()
    try:
        with main.open("r", encoding="utf-8", errors="replace") as fh:
            head = fh.read(_MARKER_WINDOW_BYTES)
    except OSError:
        return frozenset()
    for line in head.splitlines():
        if line.startswith("# " + MANIFEST):
            return frozenset(line[len("# " + MANIFEST) :].split())
    return frozenset()


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
    listed = _copied_before(targets.get(export.main))
    for name, path in targets.items():
        if path.is_dir():
            raise UsageError(f"{path} is a directory", hint="Choose another --out")
        if path.exists() and not overwrite and not _written_by_autotune(path) and name not in listed:
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
