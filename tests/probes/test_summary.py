"""The timeline summary record: every shape a ``result.json`` holds reads and writes back the same."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from autotune.probes.summary import GpuSummary, PhaseSplit, TimelineSummary

from autotune.records import TrialResult

ROOT = Path(__file__).resolve().parents[2]
#: every committed result.json holding a summary: the fixtures' older shapes (no ``window``, no host
#: load) and the newest one (the recorded TRL study, the H200 study's trials)
RESULTS = sorted(
    p
    for folder in ("tests/fixtures", "docs/gpu")
    for p in (ROOT / folder).rglob("*result.json")
    if json.loads(p.read_text()).get("timeline_summary") is not None
)


def test_the_committed_results_hold_several_shapes_of_summary() -> None:
    shapes = {frozenset(json.loads(p.read_text())["timeline_summary"]["host"]) for p in RESULTS}
    assert len(RESULTS) >= 20 and len(shapes) >= 2


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_an_old_file_reads_and_writes_back_the_same_json(path: Path) -> None:
    raw = json.loads(path.read_text())["timeline_summary"]
    summary = TimelineSummary.from_json(raw)
    assert summary.to_json() == raw
    assert json.dumps(summary.to_json()) == json.dumps(raw)  # key order too: the file is rewritten alike
    assert TimelineSummary.from_json(summary.to_json()) == summary


@pytest.mark.parametrize("path", RESULTS[:3], ids=lambda p: str(p.relative_to(ROOT)))
def test_a_result_round_trips_through_the_record_unchanged(path: Path) -> None:
    raw = json.loads(path.read_text())
    result = TrialResult.model_validate(raw)
    assert isinstance(result.timeline_summary, TimelineSummary)
    assert result.model_dump(mode="json")["timeline_summary"] == raw["timeline_summary"]
    assert result.model_dump()["timeline_summary"] == raw["timeline_summary"]
    assert TrialResult.model_validate_json(result.model_dump_json()) == result


def test_attributes_carry_units_and_map_the_names_on_disk() -> None:
    raw = {
        "gpus": [{"index": 1, "idle_share": 0.25, "mfu": 0.4, "peak_mem_bytes": 7}],
        "phases": {"source": "markers", "seconds": {"rollout": 3.0}, "share": {"rollout": 0.75}},
    }
    summary = TimelineSummary.from_json(raw)
    assert summary.gpu(1) == GpuSummary.from_json(raw["gpus"][0])
    gpu = summary.gpus[0]
    assert (gpu.idle_fraction, gpu.mfu_fraction, gpu.peak_mem_bytes) == (0.25, 0.4, 7)
    assert summary.phases.time_s == {"rollout": 3.0} and summary.phases.share_fraction == {"rollout": 0.75}
    assert summary.phases.measured and not PhaseSplit.from_json({"source": "inferred"}).measured
    assert summary.gpu(0) is None and summary.host.peak_rss_bytes is None and summary.window.steps is None
    assert summary.to_json() == raw  # what the file lacked stays out


def test_unknown_keys_are_kept_and_wrong_types_read_as_unknown() -> None:
    raw = {"host": {"peak_rss_bytes": "lots", "future_metric": [1, 2]}, "added_later": {"x": 1}, "gpus": [3]}
    summary = TimelineSummary.from_json(raw)
    assert summary.host.peak_rss_bytes is None and summary.gpus == ()
    assert summary.extra == {"added_later": {"x": 1}} and summary.host.extra == {"future_metric": [1, 2]}
    written = {"gpus": [], "host": {"peak_rss_bytes": None, "future_metric": [1, 2]}, "added_later": {"x": 1}}
    assert summary.to_json() == written


def test_an_unreadable_timeline_is_its_one_line_on_disk() -> None:
    summary = TimelineSummary.unreadable("timeline unreadable: truncated")
    assert summary.error == "timeline unreadable: truncated" and summary.gpus == ()
    assert summary.to_json() == {"error": "timeline unreadable: truncated"}
    assert TimelineSummary.from_json(None) == TimelineSummary.from_json({})
