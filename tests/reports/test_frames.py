"""``autotune.load_study``: a recorded real study as DataFrames holds the same rows as its report.md."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest
from autotune.reports import render_study
from autotune.reports._format import knob_value

import autotune

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "recorded_trl_study"


@pytest.fixture
def study(tmp_path: Path) -> Path:
    work = tmp_path / "demo"
    shutil.copytree(FIXTURE / "study", work)
    for path in work.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".sh", ".log", ".jsonl"):
            path.write_text(path.read_text().replace("@STUDY@", str(work)))
    return work


def _report_table(md: str) -> tuple[list[str], list[list[str]]]:
    """The trials table of report.md: its header cells and its rows' cells."""
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| # | status |"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return header, rows


def test_the_trials_frame_holds_the_rows_of_the_report(study: Path) -> None:
    render_study(study, png=False)
    header, rows = _report_table((study / "report.md").read_text())
    frame = autotune.load_study(study)
    trials = frame.trials
    assert len(rows) == len(trials) == 4
    knobs = header[header.index("predicted peak") + 1 : header.index("evidence")]
    assert frame.knobs == knobs
    for cells in rows:
        cell = dict(zip(header, cells, strict=True))
        number = int(cell["#"].split()[0])
        row = trials.loc[number]
        assert row["status"] == cell["status"]
        assert bool(row["is_baseline"]) == ("baseline" in cell["#"])
        assert bool(row["is_winner"]) == ("winner" in cell["#"])
        shown = f"{row['throughput']:.3g} ± {row['throughput_ci95']:.2g}"
        assert shown == cell["throughput (/s)"]
        assert f"{row['util_mean_pct']:.0f} %" == cell["CPU util (mean, all cores)"]
        assert cell["steps used"].startswith(f"{row['steady_steps']} steady of {row['steps']}")
        assert f"{row['peak_mem_bytes'] / 2**30:.1f} GiB RSS" == cell["peak RSS"]
        for knob in knobs:
            value = trials.at[number, knob]
            value = value.item() if hasattr(value, "item") else value  # numpy scalar → Python
            text = "" if value is pd.NA else knob_value(value)
            assert text == cell[knob].strip("*"), (number, knob)
    assert frame.recommendation is not None and trials["is_winner"].sum() == 1
    assert trials.index[trials["is_winner"]].tolist() == [frame.recommendation.trial]


def test_knob_columns_keep_their_types(study: Path) -> None:
    trials = autotune.load_study(study).trials
    assert str(trials["per_device_train_batch_size"].dtype) == "Int64"
    assert str(trials["gradient_checkpointing"].dtype) == "boolean"
    # a conditional knob is missing where it does not apply (ZeRO 0 has no offload)
    assert trials.at[0, "offload_optimizer"] is pd.NA


def test_timelines_and_phases_cover_the_trials(study: Path) -> None:
    frame = autotune.load_study(study)
    timelines, phases = frame.timelines, frame.phases
    assert set(timelines["trial"]) <= set(frame.trials.index) and len(timelines) > 0
    assert {"source", "t_mono_s"} <= set(timelines.columns)
    assert set(phases["trial"]) <= set(frame.trials.index) and len(phases) > 0
    assert (phases["t1_mono_s"] >= phases["t0_mono_s"]).all()
    assert (phases["duration_s"] >= 0).all()


def test_jupyter_shows_a_headline_and_the_table(study: Path) -> None:
    frame = autotune.load_study(study)
    html = frame._repr_html_()
    assert f"recommends trial {frame.recommendation.trial}" in html and "<table" in html
    assert "COMPLETE" in html and "PRUNED" in html


def test_not_a_study_is_a_usage_error(tmp_path: Path) -> None:
    from autotune.errors import UsageError

    with pytest.raises(UsageError, match="is not a study directory"):
        autotune.load_study(tmp_path)
