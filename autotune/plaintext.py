"""Text from outside (a trial's output, a file's content) made safe to print or write as text.

A trial's error text reaches the terminal, ``result.json`` and ``report.md``: an escape sequence in it
could retitle the terminal (OSC), move the cursor or hide what follows. :func:`plain` drops every
terminal control sequence and control character but tabs and newlines.
"""

from __future__ import annotations

import re

from autotune.errors import UsageError

__all__ = ["comment_line", "plain", "shell_name"]

# ESC-introduced sequences: OSC/DCS/APC/PM/SOS up to their terminator (BEL or ST), CSI with its
# parameters, and two-character escapes; then C1 controls (CSI/OSC as single bytes) and lone controls
_SEQUENCES = re.compile(
    r"\x1b[\]PX^_][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
    r"|\x1b\[[0-?]*[ -/]*[@-~]"
    r"|\x1b[@-Z\\-_ -/]?[0-~]?"
    r"|[\x9b\x9d\x90\x98\x9e\x9f][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"
)
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def plain(text: str) -> str:
    """``text`` without terminal control sequences or control characters (tabs and newlines kept)."""
    if not text or (text.isprintable() and "\x1b" not in text):
        return text
    return _CONTROLS.sub("", _SEQUENCES.sub("", text))


_SHELL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def comment_line(text: str) -> str:
    """``text`` made one line of a ``#`` comment in a script or YAML: every character that is not
    printable (newlines, ``\\r``, Unicode line separators, terminal escapes) is written as its escape.

    ``$(...)`` and backticks are harmless in a comment; what is not harmless is a character that ends
    the comment, and none is left.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def shell_name(name: str) -> str:
    """``name`` as an environment variable name written into a script (``export NAME=...``, ``unset``).

    Raises:
        UsageError: ``name`` is not a shell variable name (it would be run as code, not named).
    """
    if not _SHELL_NAME.match(name):
        raise UsageError(
            f"{comment_line(name)!r} is not an environment variable name",
            hint="Rename it (letters, digits and _), or fix the trial's launch.json",
        )
    return name
