"""Reading study directories: everything optional, nothing crashes, bad input is one UsageError."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import make_fixture as mf
import pytest
from autotune.reports._load import load_profile, load_study, spans_from_markers
from autotune.reports._signals import signals

from autotune.errors import UsageError
from autotune.records import TrialStatus


def test_fixture_loads_every_trial(fixture_study: Path) -> None:
    data = load_study(fixture_study)
    assert [t.number for t in data.trials] == list(range(16))
    assert data.problems == []
    assert data.hardware is not None and len(data.hardware.gpus) == 4
    assert data.baseline is not None and data.baseline.number == 0
    assert data.best_command is not None and data.best_knobs == mf.spec(3).knobs
    assert mf.ORIGINAL_ROOT in data.roots  # where the study was written, learnt from launch.json
    pruned = data.trial(9)
    assert pruned.timeline is None and pruned.steps == [] and pruned.files == {}
    t0 = data.trial(0)
    assert t0.timeline is not None and len(t0.steps) == 6 and len(t0.spans) == 6 * 3 + 5


def test_not_a_study_is_one_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="is not a study directory") as err:
        load_study(tmp_path)
    assert err.value.exit_code == 2 and "\n" not in str(err.value)
    with pytest.raises(UsageError):
        load_study(tmp_path / "missing")


def test_damaged_files_become_notes(tmp_path: Path, fixture_study: Path) -> None:
    root = tmp_path / "s"
    shutil.copytree(fixture_study, root)
    (root / "trials" / "1" / "result.json").write_text("{not json")
    (root / "trials" / "2" / "timeline.parquet").write_bytes(b"PAR1 garbage")
    with (root / "trials" / "3" / "metrics.jsonl").open("a") as fh:
        fh.write("half a line\n")
    with (root / "trials" / "3" / "phases.jsonl").open("a") as fh:
        fh.write('{"phase": "train"}\n')
    (root / "trials" / "4" / "result.json").write_text(json.dumps({"number": 4}))
    (root / "trials" / "16").mkdir()
    (root / "trials" / "16" / "stdout.log").write_text("still running\n")
    (root / "trials" / "notanumber").mkdir()
    (root / "study.json").write_text("[]")
    data = load_study(root)
    text = "\n".join(data.problems)
    assert "trials/1/result.json: unreadable" in text
    assert "trials/2/timeline.parquet: unreadable" in text
    assert "trials/3/metrics.jsonl: 1 unreadable line(s) skipped" in text
    assert "trials/3/phases.jsonl: 1 unreadable line(s) skipped" in text
    assert "trials/4/result.json: not a trial result" in text
    assert "trials/16: no result.json" in text
    assert "study.json is not a JSON object" in text
    numbers = [t.number for t in data.trials]
    assert 1 not in numbers and 4 not in numbers and 2 in numbers
    assert data.trial(2).timeline is None
    assert len(data.trial(3).steps) == 6
    assert data.hardware is None
    # Signals still compute for every trial that loaded.
    for t in data.trials:
        signals(data, t)


def test_study_with_only_trials(tmp_path: Path) -> None:
    root = tmp_path / "s"
    mf.write_study(root, [mf.spec(9)])
    (root / "study.json").unlink()
    data = load_study(root)
    assert data.meta == {} and [t.number for t in data.trials] == [9]


def test_markers_pair_into_spans_and_an_unclosed_phase_is_open() -> None:
    markers = [
        {"phase": "rollout", "event": "begin", "t_mono_s": 1.0, "step": 1},
        {"phase": "rollout", "event": "end", "t_mono_s": 3.0, "step": 1},
        {"phase": "train", "event": "begin", "t_mono_s": 3.0, "step": 1},
        {"phase": "train", "event": "end", "t_mono_s": 5.0, "step": 1},
        {"phase": "weight_sync", "event": "begin", "t_mono_s": 5.0, "step": 2},
        {"phase": "train", "event": "end", "t_mono_s": 6.0, "step": 2},  # an end without a begin: ignored
    ]
    spans = spans_from_markers(markers, end_mono_s=9.0)
    assert [(s.phase, s.t0_mono_s, s.t1_mono_s, s.open) for s in spans] == [
        ("rollout", 1.0, 3.0, False),
        ("train", 3.0, 5.0, False),
        ("weight_sync", 5.0, 9.0, True),
    ]


def test_cpu_study_has_host_signals_only(tmp_path: Path) -> None:
    root = tmp_path / "cpu"
    mf.build_cpu_study(root)
    data = load_study(root)
    assert data.gpu_count == 0
    sig = signals(data, data.trial(0))
    assert sig.peak_bytes == [] and sig.util_mean_pct is None
    assert sig.phase_seconds["rollout"] > 0 and sig.phase_seconds["train"] > 0


def test_profile_directory(tmp_path: Path) -> None:
    src = tmp_path / "s"
    mf.write_study(src, [mf.spec(0)])
    prof = tmp_path / "prof"
    shutil.copytree(src / "trials" / "0", prof)
    (prof / "profile.json").write_text(
        json.dumps({"command": ["python", "train.py"], "hardware": mf.hardware().model_dump(mode="json")})
    )
    data = load_profile(prof)
    assert data.kind == "profile" and len(data.trials) == 1 and data.trials[0].status is TrialStatus.COMPLETE
    (prof / "result.json").unlink()
    data = load_profile(prof)
    assert data.trials[0].result.reason == "profiled run (no result.json)" and len(data.trials[0].steps) == 6
    with pytest.raises(UsageError, match="not a profile directory"):
        load_profile(tmp_path / "s" / "trials")


def test_phases_are_inferred_by_probes_when_no_markers_were_written(tmp_path: Path) -> None:
    pytest.importorskip("autotune.probes.timeline")
    root = tmp_path / "s"
    mf.write_study(root, [mf.spec(0)])
    (root / "trials" / "0" / "phases.jsonl").unlink()
    data = load_study(root)
    trial = data.trial(0)
    assert trial.markers == [] and trial.spans, data.problems
    assert {s.source for s in trial.spans} != {"markers"}
    assert {s.phase for s in trial.spans} <= {"rollout", "train", "weight_sync", "other"}
    signals(data, trial)
