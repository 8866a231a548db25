"""MkDocs hook: the knob and CLI reference pages, generated at build time from their registries.

A page holds a marker (``<!-- autotune:knob-reference -->`` or ``<!-- autotune:cli-reference -->``) that
this hook replaces with Markdown made from ``search_spaces/*.yaml`` (through :func:`autotune.space.load_space`,
the loader the search uses) and from the typer commands (the click command tree ``autotune`` runs). Nothing
in those pages is written by hand, so they cannot drift from the code. Run as a script it prints both.
"""

from __future__ import annotations

import html
import sys
from importlib.resources import files
from typing import Any

KNOB_MARKER = "<!-- autotune:knob-reference -->"
CLI_MARKER = "<!-- autotune:cli-reference -->"


def _cell(text: Any) -> str:
    """Text safe inside a Markdown table cell: no HTML, no column break, one line."""
    return html.escape(str(text), quote=False).replace("|", "\\|").replace("\n", " ")


def _values(knob: Any) -> str:
    if knob.choices is not None:
        return ", ".join(f"`{c!r}`" if isinstance(c, str) else f"`{c}`" for c in knob.choices)
    scale = " (log scale)" if knob.log else ""
    step = f", step {knob.step:g}" if knob.step else ""
    return f"{knob.type} from `{knob.low:g}` to `{knob.high:g}`{step}{scale}"


def _when(knob: Any) -> str:
    if not knob.when:
        return ""
    return "; ".join(f"{name} in {', '.join(str(v) for v in values)}" for name, values in knob.when.items())


def _header_comment(text: str) -> str:
    """The comment lines a space file starts with: what the file is, in its author's words."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def knob_reference() -> str:
    """One section per shipped search space: every knob with its values, default, and when it applies."""
    from autotune.space import load_space

    spaces = files("autotune.search_spaces")
    out: list[str] = []
    for resource in sorted((r for r in spaces.iterdir() if r.name.endswith(".yaml")), key=lambda r: r.name):
        space = load_space(resource)
        name = resource.name.removesuffix(".yaml")
        out += [
            f"## {name}",
            "",
            f"`search_spaces/{resource.name}`: {_cell(_header_comment(resource.read_text()))}",
            "",
        ]
        out += [
            "| knob | label | values | default | active when | machine | memory as it grows | what it does |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for k in space.knobs:
            out.append(
                f"| `{k.name}` | {_cell(k.label)} | {_values(k)} | `{k.default!r}` | {_cell(_when(k))} "
                f"| {k.applies} | {_cell(k.memory or '')} | {_cell(k.help)} |"
            )
        out.append("")
    return "\n".join(out)


def _row(names: str, help_text: str) -> str:
    return f"| `{names}` | {_cell(help_text)} |"


def _option_rows(command: Any, ctx: Any) -> dict[str, list[str]]:
    """The command's options as table rows, grouped by their help panel as ``-h`` groups them."""
    return {
        panel: [_row(*param.get_help_record(ctx)) for param in params]
        for panel, params in command.panels(ctx).items()
    }


def cli_reference() -> str:
    """One section per ``autotune`` subcommand: its help, its usage line and its options by panel."""
    import typer

    from autotune.cli.app import app

    root = typer.main.get_command(app)
    root_ctx = root.make_context("autotune", [], resilient_parsing=True)
    out: list[str] = []
    for name, command in root.commands.items():
        ctx = command.make_context(name, [], parent=root_ctx, resilient_parsing=True)
        usage = " ".join(command.collect_usage_pieces(ctx))
        out += [
            f"## autotune {name}",
            "",
            "```text",
            f"autotune {name} {usage}",
            "",
            (command.help or "").replace("\b\n", "").strip(),
            "```",
            "",
        ]
        for panel, rows in _option_rows(command, ctx).items():
            out += [f"**{panel}**", "", "| option | what it does |", "|---|---|", *rows, ""]
    return "\n".join(out)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any, **_: Any) -> str:
    """MkDocs hook: fill the markers of the reference pages."""
    if KNOB_MARKER in markdown:
        markdown = markdown.replace(KNOB_MARKER, knob_reference())
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    return markdown


if __name__ == "__main__":
    sys.stdout.write(knob_reference() + "\n" + cli_reference() + "\n")
