"""The live view says what the study does after its trials: the re-measurement, counted in the ETA."""

from __future__ import annotations

import io
from types import SimpleNamespace

from rich.console import Console

from autotune.cli._live import RichView


def _view(terminal: bool) -> tuple[RichView, io.StringIO]:
    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, width=160, color_system=None)
    return RichView(console), out


def test_without_a_terminal_the_re_measurement_is_announced_and_counted() -> None:
    view, out = _view(terminal=False)
    view.study_started(SimpleNamespace(confirm_runs=2), done=0, budget=4)
    view.remeasure_started(4)
    view.remeasure_ran()
    view.close()
    lines = out.getvalue().splitlines()
    assert "the ETA counts 4 re-measurement runs after the trials (--confirm-runs)" in lines
    assert any(
        line.startswith("re-measuring: the winner and the baseline") and "0 of 4 runs done" in line
        for line in lines
    )
    assert any("1 of 4 runs done (counted in the ETA)" in line for line in lines)


def test_the_live_table_shows_the_re_measurement_under_the_trials() -> None:
    view, _ = _view(terminal=False)
    view.study_started(SimpleNamespace(confirm_runs=2), done=4, budget=4)
    view.remeasure_started(4)
    rendered = io.StringIO()
    Console(file=rendered, width=160, color_system=None).print(view._render())
    view.close()
    text = rendered.getvalue()
    assert "re-measuring: the winner and the baseline" in text and "0 of 4 runs done" in text
    assert "trials + 4 re-measurement runs" in text
