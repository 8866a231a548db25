"""The replay of a recorded surface (``bench/_replay.py``) and the recorder's table (``record_surface``).

No real surface is recorded yet (it takes the CPU for an hour): these tests replay a small table
written here in the recorder's format, with made-up timings, to pin what the replay does with one.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import record_surface  # noqa: E402
from _replay import SCHEMA, RecordedTable, ReplaySurface  # noqa: E402
from _settings import SETTINGS  # noqa: E402

from autotune.records import TrialStatus  # noqa: E402


def _rep(tp: float | None, status: str = "COMPLETE") -> dict:
    return {
        "status": status,
        "reason": "completed" if status == "COMPLETE" else "CUDA out of memory",
        "step_time_s": 64 / tp if tp else None,
        "throughput": tp,
        "startup_s": 20.0,
        "peak_bytes": 2**30,
        "phases": {"rollout": 0.7 * 64 / tp, "train": 0.3 * 64 / tp} if tp else None,
        "failed_phase": None if status == "COMPLETE" else "train",
        "started_at": "2026-11-28T00:00:00+00:00",
        "finished_at": "2026-11-28T00:01:00+00:00",
    }


@pytest.fixture
def table(tmp_path: Path) -> RecordedTable:
    rows = [
        {"params": {"per_device_train_batch_size": 1, "gradient_checkpointing": True}, "repeats": [_rep(1.0), _rep(1.1), _rep(0.9)]},
        {"params": {"per_device_train_batch_size": 2, "gradient_checkpointing": True}, "repeats": [_rep(2.0), _rep(1.6), _rep(1.9)]},
        {"params": {"per_device_train_batch_size": 2, "gradient_checkpointing": False}, "repeats": [_rep(2.5), _rep(None, "OOM"), _rep(2.4)]},
        {"params": {"per_device_train_batch_size": 1, "gradient_checkpointing": False}, "repeats": [_rep(1.2), _rep(1.3), _rep(1.25)]},
    ]  # fmt: skip
    path = tmp_path / "table.json"
    data = {"schema": SCHEMA, "versions": {"trl": "x"}, "host": {"hostname": "h"}, "capacity_bytes": 2**34}
    path.write_text(json.dumps({**data, "rows": rows}))
    return RecordedTable(path, SETTINGS[0])


def test_the_optimum_is_the_best_median_of_configurations_that_always_completed(table: RecordedTable) -> None:
    surface = ReplaySurface(table, 0)
    best, tp, info = surface.optimum()
    # batch 2 without checkpointing is fastest when it runs, but one repeat ran out of memory
    assert best == {"per_device_train_batch_size": 2, "gradient_checkpointing": True}
    assert tp == pytest.approx(statistics.median([2.0, 1.6, 1.9]))
    assert info["usable_frac"] == pytest.approx(3 / 4)
    assert (
        surface.usable_throughput({"per_device_train_batch_size": 2, "gradient_checkpointing": False}) == 0.0
    )


def test_a_seed_shows_one_recorded_repeat_of_each_configuration(table: RecordedTable) -> None:
    params = {"per_device_train_batch_size": 2, "gradient_checkpointing": False}
    seen = {ReplaySurface(table, seed).truth(params).status for seed in range(40)}
    assert seen == {TrialStatus.COMPLETE, TrialStatus.OOM}  # the recorded noise, failures included
    shown = {
        ReplaySurface(table, seed).truth({**params, "gradient_checkpointing": True}).throughput
        for seed in range(40)
    }
    assert shown == {2.0, 1.6, 1.9}
    assert ReplaySurface(table, 3).truth(params) == ReplaySurface(table, 3).truth(params)
    with pytest.raises(KeyError):
        ReplaySurface(table, 0).truth({"per_device_train_batch_size": 4, "gradient_checkpointing": True})


def test_the_recorder_refuses_a_folder_that_is_not_empty(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("keep")
    with pytest.raises(SystemExit) as exc:
        record_surface.main(["--out", str(tmp_path), "--table", str(tmp_path / "t.json")])
    assert exc.value.code == 2 and (tmp_path / "mine.txt").read_text() == "keep"
