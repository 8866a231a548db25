"""``-h`` prints each example of a command on its own line (click rewraps paragraphs unless told not to),
and each fits an 80-column terminal (a longer one wraps there, mid-command)."""

from __future__ import annotations

import pytest
import typer
from typer.testing import CliRunner

from autotune.cli.app import app


@pytest.mark.parametrize("name", ["search", "plan", "doctor", "profile", "gpus"])
def test_every_example_is_a_line_of_its_own(name: str) -> None:
    result = CliRunner().invoke(app, [name, "-h"], terminal_width=80)
    assert result.exit_code == 0
    help_text = typer.main.get_command(app).commands[name].help or ""
    examples = [
        line.strip() for line in help_text.split("Examples:")[1].split("\n\n")[0].splitlines() if line.strip()
    ]
    assert len(examples) >= 2
    printed = {line.strip(): line for line in result.output.splitlines()}
    for example in examples:
        assert example in printed, (example, result.output)
        assert len(printed[example]) <= 80, printed[example]
