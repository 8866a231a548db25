"""Which phase a trial's own log shows it in: phase lines (ms-swift's, through vLLM) and phase markers
(autotune's TRL worker, any script under the command backend)."""

from __future__ import annotations

from pathlib import Path

import pytest
from autotune.probes import phases
from autotune.probes.callback import PhaseTracker

from autotune.backends import OpenPhase, PhaseMark
from autotune.backends._phases import LinePhases, MarkerPhases
from autotune.backends.command import CommandParser
from autotune.backends.swift._log import PHASE_MARKS, SwiftLogParser
from autotune.backends.trl.backend import TrlMetricsParser

MARKS = (
    PhaseMark("weight_sync", "begin", r"sync starts", "a test framework"),
    PhaseMark("weight_sync", "end", r"sync done", "a test framework"),
)
# What vLLM prints after each sleep-mode wake-up (Executor.wake_up), as ms-swift's colocate mode calls
# it around the weight sync: the tags are ms-swift's list, or a set when vLLM reports its own.
WAKE_WEIGHTS = "(EngineCore pid=1)  INFO 11-21 10:14:03 [abstract.py:330] It took 0.310214 seconds to wake up tags ['weights']."
WAKE_KV = "INFO 11-21 10:14:04 [abstract.py:330] It took 0.052107 seconds to wake up tags ['kv_cache']."
WAKE_ALL = (
    "INFO 11-21 10:14:04 [abstract.py:330] It took 0.3 seconds to wake up tags {'weights', 'kv_cache'}."
)
ASLEEP = "INFO 11-21 10:14:09 [abstract.py:300] It took 0.210000 seconds to fall asleep."
SWIFT_STEP = (
    "{'loss': '6e-08', 'grad_norm': '1.643', 'global_step/max_steps': '%d/5', 'elapsed_time': '1s', "
    "'remaining_time': '3s', 'train_speed(s/it)': '0.5'}"
)


# --------------------------------------------------------------------------------------------------
# LinePhases


def test_a_phase_is_open_from_its_begin_line_to_its_end_line() -> None:
    lines = LinePhases(MARKS)
    assert lines.open() is None
    lines.feed("loading ...", 1.0)
    lines.feed("[rank0]: sync starts (bucket 1 of 3)", 2.0)
    assert lines.open() == OpenPhase("weight_sync", 2.0, "[rank0]: sync starts (bucket 1 of 3)")
    lines.feed("sync done", 3.0)
    assert lines.open() is None


def test_interleaved_ranks_keep_the_phase_open_until_every_rank_left_it() -> None:
    lines = LinePhases(MARKS)
    lines.feed("[rank0]: sync starts", 1.0)
    lines.feed("[rank1]: sync starts", 1.1)
    lines.feed("[rank0]: sync done", 1.5)
    open_phase = lines.open()
    assert open_phase is not None and open_phase.since_mono_s == 1.0  # entered with the first rank
    lines.feed("[rank1]: sync done", 1.6)
    assert lines.open() is None


def test_a_step_closes_what_a_missed_end_line_left_open() -> None:
    lines = LinePhases(MARKS)
    lines.feed("sync starts", 1.0)
    lines.step()
    assert lines.open() is None
    lines.feed("sync done", 2.0)  # an end without a begin opens nothing
    assert lines.open() is None


def test_a_mark_with_an_unknown_phase_is_a_backend_bug() -> None:
    with pytest.raises(ValueError, match="phase must be one of"):
        LinePhases((PhaseMark("weights", "begin", "x", "nowhere"),))


# --------------------------------------------------------------------------------------------------
# ms-swift: vLLM's wake-up lines around the weight sync


def test_swift_marks_cite_their_source() -> None:
    assert {m.phase for m in PHASE_MARKS} == {"weight_sync"}
    assert all("rollout_mixin.py" in m.source or "vllm" in m.source for m in PHASE_MARKS)


def test_swift_parser_sees_the_weight_sync_between_vllm_waking_weights_and_kv_cache() -> None:
    parser = SwiftLogParser(samples=16)
    parser.feed("stdout", WAKE_WEIGHTS, 10.0, 1e9)
    open_phase = parser.open_phase()
    assert open_phase is not None
    assert (open_phase.phase, open_phase.since_mono_s) == ("weight_sync", 10.0)
    assert "wake up tags ['weights']" in open_phase.evidence
    parser.feed("stdout", WAKE_KV, 11.0, 1e9)
    assert parser.open_phase() is None


def test_swift_parser_a_full_wake_up_or_sleep_is_not_a_sync_start() -> None:
    parser = SwiftLogParser(samples=16)
    parser.feed("stdout", WAKE_ALL, 1.0, 1e9)  # old vLLM, no tags: weights and KV at once
    assert parser.open_phase() is None
    parser.feed("stdout", WAKE_WEIGHTS, 2.0, 1e9)
    parser.feed("stdout", ASLEEP, 3.0, 1e9)  # vLLM sleeps after the rollout: the sync before it ended
    assert parser.open_phase() is None


def test_swift_parser_a_step_record_ends_the_sync() -> None:
    parser = SwiftLogParser(samples=16)
    parser.feed("stdout", WAKE_WEIGHTS, 1.0, 1e9)
    steps = parser.feed("stdout", SWIFT_STEP % 1, 2.0, 1e9)
    assert [s.step for s in steps] == [1]
    assert parser.open_phase() is None
    parser.feed("stdout", WAKE_WEIGHTS, 3.0, 1e9)
    open_phase = parser.open_phase()
    assert open_phase is not None and open_phase.since_mono_s == 3.0


# --------------------------------------------------------------------------------------------------
# Marker files: autotune's TRL worker and command scripts


def _markers(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(phases.ENV_FILE, str(path))
    monkeypatch.delenv("RANK", raising=False)


def test_markers_written_by_the_trl_worker_tracker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "phases.jsonl"
    _markers(path, monkeypatch)
    tracker = PhaseTracker(phases)  # what the TRL worker wraps around rollout, sync and train
    reader = MarkerPhases(path)
    reader.poll()
    assert reader.open() is None  # no file yet
    with tracker.rollout(step=1):
        with tracker.weight_sync(step=1):
            reader.poll()
            open_phase = reader.open()
            assert open_phase is not None and open_phase.phase == "weight_sync"
            assert open_phase.evidence == "phase marker: weight_sync began at step 1"
        reader.poll()
        open_phase = reader.open()
        assert open_phase is not None and open_phase.phase == "rollout"  # the rollout resumed
    tracker.train_ready(step=1)
    tracker.step_end(step=1)
    reader.poll()
    assert reader.open() is None


def test_marker_reader_waits_for_a_partial_line_and_skips_junk(tmp_path: Path) -> None:
    path = tmp_path / "phases.jsonl"
    begin = '{"phase":"weight_sync","event":"begin","t_mono_s":5.5,"t_wall_s":1.0,"step":2,"pid":1,"rank":0}'
    path.write_text("not json\n" + '{"phase":"nap","event":"begin","t_mono_s":1}\n' + begin[:30])
    reader = MarkerPhases(path)
    reader.poll()
    assert reader.open() is None
    with path.open("a") as fh:
        fh.write(begin[30:] + "\n")
    reader.poll()
    assert reader.open() == OpenPhase("weight_sync", 5.5, "phase marker: weight_sync began at step 2")


@pytest.mark.parametrize("make", [TrlMetricsParser, CommandParser])
def test_parsers_that_read_markers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make: type) -> None:
    path = tmp_path / "phases.jsonl"
    _markers(path, monkeypatch)
    parser = make(tmp_path / "metrics.jsonl", path)
    phases.mark("weight_sync", "begin", step=3)
    assert parser.open_phase() is None  # read on poll, as the runner polls
    parser.poll(1.0, 1.0)
    open_phase = parser.open_phase()
    assert open_phase is not None and open_phase.phase == "weight_sync"
    phases.mark("weight_sync", "end", step=3)
    parser.poll(2.0, 2.0)
    assert parser.open_phase() is None
    assert make(tmp_path / "metrics.jsonl").open_phase() is None  # no marker file: says nothing
