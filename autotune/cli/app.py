"""The ``autotune`` command. Each subcommand lives in its own small module and imports heavy
packages inside its body, so ``autotune --help`` stays instant."""

from __future__ import annotations

import importlib
import sys
from typing import cast

import typer

from autotune.cli import doctor as doctor_cmd
from autotune.cli import export as export_cmd
from autotune.cli import gpus as gpus_cmd
from autotune.cli import plan as plan_cmd
from autotune.cli import profile as profile_cmd
from autotune.cli import report as report_cmd
from autotune.cli import search as search_cmd
from autotune.cli._console import abort
from autotune.errors import AutotuneError

__all__ = ["app", "main"]

app = typer.Typer(
    name="autotune",
    help="Profile and auto-tune GRPO fine-tuning jobs (ms-swift, TRL, verl) on the GPUs you have.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _show_version(value: bool) -> None:
    if value:
        from autotune.version import __version__

        print(f"autotune {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", "-V", help="Print the version and exit.", callback=_show_version, is_eager=True
    ),
) -> None:
    """Profile and auto-tune GRPO fine-tuning jobs (ms-swift, TRL, verl) on the GPUs you have."""


for module in (gpus_cmd, doctor_cmd, plan_cmd, search_cmd, report_cmd, export_cmd, profile_cmd):
    module.register(app)


def _classes(name: str) -> tuple[type[BaseException], ...]:
    """An exception class by name from typer's vendored click and from click itself (whichever exist)."""
    found = []
    for module_name in ("typer._click.exceptions", "click.exceptions"):
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        cls = getattr(module, name, None)
        if isinstance(cls, type) and cls not in found:
            found.append(cls)
    return tuple(found)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: every user error becomes one line and exit code 2."""
    no_args: tuple[type[BaseException], ...] = _classes("NoArgsIsHelpError")
    usage: tuple[type[BaseException], ...] = _classes("UsageError")
    click_exc = _classes("ClickException")
    exits: tuple[type[BaseException], ...] = (*_classes("Exit"), cast("type[BaseException]", typer.Exit))
    aborts: tuple[type[BaseException], ...] = (*_classes("Abort"), cast("type[BaseException]", typer.Abort))
    command = typer.main.get_command(app)
    try:
        rc = command.main(
            args=argv if argv is not None else sys.argv[1:], prog_name="autotune", standalone_mode=False
        )
    except no_args as exc:
        ctx = getattr(exc, "ctx", None)
        print(ctx.get_help() if ctx else "run 'autotune --help'")
        sys.exit(0)
    except usage as exc:
        ctx = getattr(exc, "ctx", None)
        cmd = ctx.command_path if ctx else "autotune"
        abort(f"{_flat(exc.format_message())} (see '{cmd} --help')", 2)  # type: ignore[attr-defined]
    except exits as exc:
        sys.exit(getattr(exc, "exit_code", 0))
    except aborts:
        abort("aborted", 130)
    except click_exc as exc:
        abort(_flat(exc.format_message()), getattr(exc, "exit_code", 1))  # type: ignore[attr-defined]
    except AutotuneError as exc:
        abort(exc.one_line(), exc.exit_code)
    except KeyboardInterrupt:
        abort("interrupted", 130)
    except OSError as exc:  # the last guard: a path the system refused that no reader named (one line)
        if exc.filename is None:
            raise
        abort(*_os_error_line(exc))
    sys.exit(rc if isinstance(rc, int) else 0)


def _os_error_line(exc: OSError) -> tuple[str, int]:
    """One line and the exit code for an ``OSError`` about a file: 74 when the disk refused a write
    (full, read-only, I/O), 2 for a path that cannot be used (too long, not found, no permission)."""
    import errno

    from autotune.errors import EXIT_USAGE, WriteError

    disk = {errno.ENOSPC, errno.EROFS, errno.EIO, getattr(errno, "EDQUOT", errno.ENOSPC)}
    name = str(exc.filename)
    shown = name if len(name) <= 120 else name[:60] + "…" + name[-40:]
    cause = exc.strerror or exc.__class__.__name__
    if exc.errno in disk:
        return (
            f"cannot write {shown}: {cause}. Free space or fix the disk, then run the same command again",
            (WriteError.exit_code),
        )
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (
            f"cannot use {shown}: permission denied. Fix its permissions (or its folder's), "
            "or run as the user who owns it",
            EXIT_USAGE,
        )
    return f"cannot use {shown}: {cause}. Choose another path (shorter, existing, writable)", EXIT_USAGE


def _flat(text: str) -> str:
    return " ".join(text.split())
