"""The ``autotune`` command. Each subcommand lives in its own small module and imports heavy
packages inside its body, so ``autotune --help`` stays instant."""

from __future__ import annotations

import sys

import click
import typer

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
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

for module in (gpus_cmd, plan_cmd, search_cmd, report_cmd, export_cmd, profile_cmd):
    module.register(app)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: every user error becomes one line and exit code 2."""
    command = typer.main.get_command(app)
    try:
        rc = command.main(args=argv if argv is not None else sys.argv[1:], prog_name="autotune", standalone_mode=False)
    except click.exceptions.NoArgsIsHelpError as exc:
        # click >= 8.2 raises this instead of printing help itself.
        click.echo(exc.ctx.get_help() if exc.ctx else "", err=False)
        sys.exit(0)
    except click.UsageError as exc:
        cmd = exc.ctx.command_path if exc.ctx else "autotune"
        abort(f"{exc.format_message()} (see '{cmd} --help')", 2)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        abort("aborted", 130)
    except click.ClickException as exc:
        abort(exc.format_message(), exc.exit_code)
    except AutotuneError as exc:
        abort(exc.one_line(), exc.exit_code)
    except KeyboardInterrupt:
        abort("interrupted", 130)
    sys.exit(rc if isinstance(rc, int) else 0)
