"""A CPU-only trial's cores: split among ranks, and every process of the trial pinned to them."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from autotune.affinity import CORES_ENV, format_cores, parse_cores, pin, rank_cores, usable_cores
from autotune.backends.command import CommandParser
from autotune.records import LaunchPlan
from autotune.trial.runner import EarlyStopConfig, WatchdogConfig, run_trial

FAST = WatchdogConfig(startup_timeout_s=20, hang_k=3, hang_floor_s=0.6, grace_s=0.5, poll_interval_s=0.05)
REPORT_AFFINITY = (
    "import json, os, subprocess, sys\n"
    "child = subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'],"
    " capture_output=True, text=True).stdout.strip()\n"
    "open('affinity.json', 'w').write(json.dumps({'self': sorted(os.sched_getaffinity(0)), 'child': child}))\n"
)


def test_ranks_get_disjoint_contiguous_shares_of_the_trial_cores() -> None:
    assert [rank_cores((0, 1, 2, 3), r, 2) for r in range(2)] == [(0, 1), (2, 3)]
    assert [rank_cores((4, 5, 6), r, 2) for r in range(2)] == [(4, 5), (6,)]
    assert [rank_cores((0, 1, 2, 3, 4), r, 3) for r in range(3)] == [(0, 1), (2, 3), (4,)]
    assert [rank_cores((7,), r, 2) for r in range(2)] == [(7,), (7,)]  # fewer cores than ranks: shared
    assert [rank_cores((0, 1), r, 4) for r in range(4)] == [(0,), (1,), (0,), (1,)]
    assert rank_cores((), 0, 2) == ()


def test_the_environment_names_the_cores_or_nothing() -> None:
    assert parse_cores({CORES_ENV: format_cores((0, 3))}) == (0, 3)
    assert parse_cores({CORES_ENV: "0,x"}) == () and parse_cores({CORES_ENV: "-1"}) == ()
    assert parse_cores({}) == ()


def test_a_refused_pin_is_a_note_not_an_error() -> None:
    assert pin(0, ()) is None
    note = pin(0, (10**6,))  # no such core
    assert note is not None and note.startswith("not pinned to cores 1000000: ")


@pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(usable_cores()) < 2, reason="needs two cores to pin"
)
def test_the_runner_pins_the_trial_and_its_children_to_the_trial_cores(tmp_path: Path) -> None:
    core = usable_cores()[-1]
    plan = LaunchPlan(
        argv=(sys.executable, "-c", REPORT_AFFINITY),
        env={CORES_ENV: str(core), "AUTOTUNE_METRICS_FILE": str(tmp_path / "m.jsonl")},
        cwd=str(tmp_path),
        metrics_paths=(str(tmp_path / "m.jsonl"),),
    )
    run_trial(
        plan,
        CommandParser(tmp_path / "m.jsonl"),
        tmp_path,
        global_batch=16,
        watchdog=FAST,
        early_stop=EarlyStopConfig(enabled=False),
    )
    seen = json.loads((tmp_path / "affinity.json").read_text())
    assert seen == {"self": [core], "child": str([core])}
    assert json.loads((tmp_path / "proc.json").read_text())["cpu_cores"] == [core]
