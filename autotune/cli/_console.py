"""The one console of the CLI. Markup is off for foreign text (logs, paths, framework messages)."""

from __future__ import annotations

import sys
from typing import NoReturn

from rich.console import Console

from autotune.plaintext import plain

__all__ = ["console", "err_console", "abort", "say", "notice"]

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)


def say(text: str) -> None:
    """Print foreign or plain text verbatim (no markup interpretation)."""
    console.print(plain(text), markup=False)


def notice(text: str) -> None:
    """A one-line notice on stderr (dropped knobs, fallbacks)."""
    err_console.print(f"note: {plain(text)}", markup=False, style="yellow")


def abort(message: str, code: int = 2) -> NoReturn:
    """One line on stderr, then exit with ``code``. No traceback."""
    err_console.print(f"error: {plain(message)}", markup=False, style="bold red")
    sys.exit(code)
