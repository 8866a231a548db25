"""``-h`` lists options under panels (Workload, Hardware, ...) taken from the shared option definitions
(``autotune.cli._options``), in an 80-column terminal as a user sees it."""

from __future__ import annotations

from typing import Annotated

import typer
from typer.testing import CliRunner

from autotune.cli import _options as o
from autotune.cli.app import app


def _sections(output: str) -> dict[str, list[str]]:
    """Each section heading of ``-h`` (a line ``Name:`` at column 0) → the flags listed under it."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in output.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            current = sections.setdefault(line[:-1], [])
        elif current is not None and line.startswith("  -"):
            current.append(line.split()[0].rstrip(","))
    return sections


def _help(runner_app: typer.Typer, *args: str) -> str:
    result = CliRunner().invoke(runner_app, [*args, "-h"], terminal_width=80)
    assert result.exit_code == 0, result.output
    return result.output


def test_search_lists_every_option_under_its_panel() -> None:
    command = typer.main.get_command(app).commands["search"]  # type: ignore[attr-defined]
    sections = _sections(_help(app, "search"))
    assert [name for name in sections if name in o.PANELS] == list(o.PANELS)
    options = [p for p in command.params if p.param_type_name == "option"]
    assert len(options) > 30
    for param in options:
        flag = param.opts[0]
        shown_under = [name for name, flags in sections.items() if flag in flags]
        assert shown_under == [o.panel_of(param)], (flag, shown_under)
        assert o.panel_of(param) in o.PANELS, flag
    assert sections[o.OTHER_PANEL] == ["-h"]


def test_an_option_without_a_panel_is_listed_apart() -> None:
    """The check above can fail: an option defined without a panel lands under "Options"."""
    planted = typer.Typer(rich_markup_mode=None, context_settings={"help_option_names": ["-h", "--help"]})

    @planted.command("cmd", cls=o.PanelledCommand)
    def cmd(
        gpus: o.Gpus = None,
        loose: Annotated[int, typer.Option("--loose", help="Defined here, with no panel.")] = 0,
    ) -> None:
        """A command."""

    @planted.command("other")
    def other() -> None:
        """Makes the app a group."""

    sections = _sections(_help(planted, "cmd"))
    assert sections["Hardware"] == ["--gpus"]
    assert sections[o.OTHER_PANEL] == ["--loose", "-h"]


def test_plan_and_search_share_their_common_options() -> None:
    """The options both commands take are the same definitions: the same flag, help and panel."""
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    plan = {p.opts[0]: p for p in commands["plan"].params}
    search = {p.opts[0]: p for p in commands["search"].params}
    common = set(plan) & set(search) - {"--backend"}  # plan lists the backends it can judge
    assert {"--model", "--gpus", "--gpu-type", "--space", "--global-batch", "--pin", "--json"} <= common
    for flag in common:
        assert plan[flag].help == search[flag].help, flag
        assert o.panel_of(plan[flag]) == o.panel_of(search[flag]), flag


def test_every_command_lists_its_options_by_panel() -> None:
    """A command registered without ``cls=PanelledCommand`` would list its options in one heap (and the
    CLI reference, which reads ``PanelledCommand.panels``, would fail)."""
    commands = typer.main.get_command(app).commands  # type: ignore[attr-defined]
    plain = [name for name, command in commands.items() if not isinstance(command, o.PanelledCommand)]
    assert plain == []
