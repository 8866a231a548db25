"""The replay of a recorded surface (``bench/_replay.py``) and the recorder's table (``record_surface``).

The first tests replay a small table written here in the recorder's format, with made-up timings, to
pin what the replay does with one. The last ones read the committed recording
(``bench/recorded/trl-cpu.json``, real CPU trials): it is what it says it is, the bench registers it as
the ``replay`` family, and an exhaustive search through the real study loop finds its optimum.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))

import record_surface  # noqa: E402
import search_efficiency as se  # noqa: E402
from _replay import RECORDED, SCHEMA, RecordedSetting, RecordedTable, ReplaySurface  # noqa: E402
from _settings import SETTINGS  # noqa: E402

from autotune.records import TrialStatus  # noqa: E402
from autotune.space import canonical_key  # noqa: E402
from autotune.study.loop import Study  # noqa: E402


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


# -- the committed recording --------------------------------------------------------------------------
COMMITTED = RECORDED["trl tiny-qwen2 CPU (recorded)"]


@pytest.fixture(scope="module")
def recorded() -> tuple[RecordedSetting, dict]:
    (setting,) = [s for s in se.SETTINGS if isinstance(s, RecordedSetting)]
    return setting, json.loads(COMMITTED.read_text())


def _when(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text)


def test_the_committed_recording_is_real_trials_with_their_versions_host_and_timings(
    recorded: tuple[RecordedSetting, dict],
) -> None:
    _, data = recorded
    assert data["schema"] == SCHEMA
    versions = data["versions"]
    for package in ("torch", "transformers", "trl", "deepspeed", "vllm", "accelerate"):
        assert versions[package], package  # every framework a trial's time depends on, by version
    assert len(versions["autotune_commit"]) == 40
    host = data["host"]
    assert host["hostname"] and host["cpu_cores_logical"] >= 1 and host["ram_total_bytes"] > 2**30
    assert len(host["load_avg_at_start"]) == 3
    assert _when(data["started_at"]) < _when(data["finished_at"])
    assert len(data["rows"]) >= 100
    for row in data["rows"]:
        for rep in row["repeats"]:
            status = TrialStatus(rep["status"])
            start, end = _when(rep["started_at"]), _when(rep["finished_at"])
            assert _when(data["started_at"]) <= start < end <= _when(data["finished_at"]), row["params"]
            if status is TrialStatus.COMPLETE:
                # a measured step, and the throughput is the job's completions over it
                assert rep["step_time_s"] > 0 and rep["steady_steps"] >= 2, row["params"]
                assert rep["throughput"] == pytest.approx(data["fixed"]["global_batch"] / rep["step_time_s"])
                assert rep["rel_ci95"] is not None and rep["phases"], row["params"]
    # run-to-run noise is recorded, not invented: configurations measured more than once
    assert sum(len(row["repeats"]) >= 2 for row in data["rows"]) >= 20


def test_the_replay_family_holds_every_configuration_its_space_can_ask_for(
    recorded: tuple[RecordedSetting, dict],
) -> None:
    setting, data = recorded
    assert setting.kind == "replay" and "replay" in se.KINDS
    grid = {canonical_key(p) for p in setting.space().grid()}
    assert grid == {canonical_key(row["params"]) for row in data["rows"]}
    assert canonical_key(setting.space().active(dict(setting.baseline))) in grid
    assert setting.hardware().gpus == ()  # what the CLI sees on the recording's host


@pytest.mark.parametrize("seed", [0, 1])
def test_an_exhaustive_search_on_the_replay_finds_the_recorded_optimum(
    recorded: tuple[RecordedSetting, dict], seed: int, tmp_path: Path
) -> None:
    setting, _ = recorded
    table = RecordedTable(setting.table, setting)
    surface = ReplaySurface(table, seed)
    best, best_tp, _ = surface.optimum()
    # the optimum, by exhaustive search over the table: the best median of configurations whose every
    # recorded repeat completed
    medians = {
        canonical_key(params): statistics.median(r["throughput"] for r in reps)
        for params, reps in table.rows.values()
        if all(r["status"] == "COMPLETE" for r in reps)
    }
    assert canonical_key(best) == max(medians, key=medians.__getitem__) and best_tp == max(medians.values())
    # the study loop's grid over the replay (nothing pruned) runs every configuration once and
    # recommends one whose recorded median is the optimum's, within the recorded run-to-run spread
    space = setting.space()
    hardware = setting.hardware()
    cfg = se.bench_config(setting, tmp_path / "grid", hardware, seed, "grid", table.n_rows, prune=False)
    study = Study(cfg, setting.make_backend(), space, se.SimulatedExecutor(surface, 1))
    outcome = study.run()
    every = sorted(canonical_key(p) for p, _ in table.rows.values())
    assert sorted(canonical_key(r.params) for r in outcome.results) == every
    rec = outcome.recommendation
    assert rec is not None
    chosen = next(r for r in outcome.results if r.number == rec.trial)
    spread = _spread(table, best)
    assert surface.usable_throughput(chosen.params) >= best_tp * (1 - spread), (chosen.params, best)


def _spread(table: RecordedTable, params: dict) -> float:
    """The largest relative distance between the recorded repeats of ``params`` and their median (at
    least the 95 % interval one trial measured)."""
    _, reps = table.rows[canonical_key(params)]
    tps = [r["throughput"] for r in reps]
    med = statistics.median(tps)
    return max(max(abs(t - med) / med for t in tps), *(float(r["rel_ci95"] or 0.0) for r in reps))


def test_the_deepspeed_sweep_is_not_run_where_there_is_no_gpu(recorded: tuple[RecordedSetting, dict]) -> None:
    setting, _ = recorded
    assert not se.runs_on(setting, "ds-sweep")  # it prices model states on a GPU
    assert all(se.runs_on(setting, s) for s in se.STRATEGIES if s != "ds-sweep")
    assert se.runs_on(SETTINGS[0], "ds-sweep")


def test_collect_fills_only_the_versions_a_recording_lacks_and_says_which() -> None:
    info = {"versions": {"trl": "0.0.1", "vllm": None, "autotune_commit": "a" * 40}, "host": {}}
    out = record_surface.with_missing_versions(info)
    assert out["versions"]["trl"] == "0.0.1" and out["versions"]["autotune_commit"] == "a" * 40  # kept
    assert out["versions"]["vllm"] and "vllm" in out["versions_filled_at_collect"]
    assert "trl" not in out["versions_filled_at_collect"]
