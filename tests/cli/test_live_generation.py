"""The live view says how much of each trial's step went to generation (its timeline's rollout share)."""

from __future__ import annotations

import io

from rich.console import Console

from autotune.cli._live import RichView
from autotune.records import TrialResult, TrialStatus


def _result(share: float | None) -> TrialResult:
    phases = {"seconds": {"rollout": 0.6, "train": 0.4}, "share": {"rollout": share, "train": 0.4}}
    return TrialResult(
        number=1,
        params={"use_vllm": True},
        status=TrialStatus.COMPLETE,
        reason="completed 3 steps",
        steps=3,
        throughput=9.0,
        timeline_summary={"phases": phases},
    )


def test_each_trial_line_gives_the_generation_share_when_the_timeline_measured_it() -> None:
    out = io.StringIO()
    view = RichView(Console(file=out, force_terminal=False, width=200))
    view.trial_finished(_result(0.6))
    view.trial_finished(_result(None))
    view.close()
    lines = out.getvalue().splitlines()
    assert "generation 60% of the step" in lines[0]
    assert "generation" not in lines[1]
    table = Console(file=io.StringIO(), width=200)
    table.print(view._render())
    assert "generation" in table.file.getvalue()
