"""The verdict in both reports: the speedup with its interval (never bare), "no measurable speedup" when
the interval includes 1, the re-measurement's runs and cost, and the host-load flag per trial and beside
the verdict. Rendered from a copy of the fixture study with a judged recommendation written in."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from autotune.reports import render_study

from autotune.recommend import recommend
from autotune.records import Confirmation, ConfirmRun, Recommendation, TrialStatus
from autotune.study.verdict import METHOD, judge
from autotune.studydir import StudyDir


def _strip_scripts(html: str) -> str:
    return re.sub(r"<script\b[^>]*>.*?</script>", "", html, flags=re.S | re.I)


def _run(trial: int, k: int, order: int, step_s: float, *, loaded: bool = False) -> ConfirmRun:
    return ConfirmRun(
        trial=trial,
        round=k,
        order=order,
        role="baseline" if trial == 0 else "winner",
        status=TrialStatus.COMPLETE,
        step_time_s=step_s,
        rel_ci95=0.02,
        steady_steps=5,
        throughput=32 / step_s,
        duration_s=300.0,
        gpu_seconds=1200.0,
        other_busy_cores=9.5 if loaded else 0.2,
        host_loaded=loaded,
    )


def _study(
    tmp_path: Path, fixture_study: Path, winner_times: list[float], *, loaded: bool = False
) -> tuple[Path, Recommendation]:
    """The fixture study with trial 0 re-measured at 28 and 29 s per step and trial 3 at ``winner_times``;
    the winner's second run on a loaded host when ``loaded``; trial 5's search run on a loaded host."""
    root = tmp_path / "study"
    shutil.copytree(fixture_study, root)
    sd = StudyDir(root)
    results = sd.results()
    settings = sd.read_settings()
    rec = recommend(results, sd.hardware(settings))
    assert rec is not None and rec.trial == 3 and rec.baseline_trial == 0
    runs = [
        _run(0, 1, 1, 28.0),
        _run(3, 1, 2, winner_times[0]),
        _run(3, 2, 3, winner_times[1], loaded=loaded),
        _run(0, 2, 4, 29.0),
    ]
    conf = Confirmation(rounds=2, runs=runs, duration_s=1200.0, gpu_seconds=4800.0, method=METHOD)
    judged = judge(rec, conf, {r.number: r for r in results}, sd.hardware(settings))
    sd.write_settings(settings.model_copy(update={"recommendation": judged.model_dump(mode="json")}))
    five = sd.trial(5).result_json
    data = json.loads(five.read_text())
    data["timeline_summary"]["host"] |= {"other_busy_cores_mean": 12.4, "host_cpu_count": 48}
    five.write_text(json.dumps(data))
    return root, judged


@pytest.fixture
def reports(tmp_path: Path, fixture_study: Path, request: pytest.FixtureRequest):
    times, loaded = request.param
    root, judged = _study(tmp_path, fixture_study, times, loaded=loaded)
    paths = render_study(root, png=False)
    md = re.sub(r"\\([\[\]*])", r"\1", paths.markdown.read_text())  # markdown's escapes of [ ] *
    return judged, _strip_scripts(paths.html.read_text()), md


@pytest.mark.parametrize("reports", [([18.0, 18.5], False)], indirect=True)
def test_a_measurable_speedup_is_shown_with_its_interval(reports) -> None:
    judged, html, md = reports
    assert judged.measurable is True and judged.speedup_low is not None
    interval = f"{judged.speedup:.2f}× [{judged.speedup_low:.2f}, {judged.speedup_high:.2f}]"
    for text in (html, md):
        assert (
            f"speedup over the baseline: **{interval}**" in text or f'<div class="v">{interval}</div>' in text
        )
        assert "Verdict:" in text and "speedup over the baseline (trial 0): " + interval in text
        assert "Re-measurement" in text and "2 time(s) each, interleaved" in text
        assert "4 run(s), 20.0 min, 1.33 GPU-hours" in text
        assert "Student t-interval (95 %) on the difference of the mean log step time" in text
        assert "re-measurement runs" not in text.split("Verdict:")[1].split("\n")[0]  # no load note
        # trial 5's search run: flagged in its row
        assert (
            "host loaded by other processes during this trial (12.4 of 48 cores busy outside the trial)"
            in text
        )
        assert "1.52×" in text  # the search's single-run ratio, shown as what it was
        versus = judged.confirmation.versus_winner[0]  # type: ignore[union-attr]
        assert f"Against the winner: trial 0 (the baseline) {versus.text()}" in text


@pytest.mark.parametrize("reports", [([24.0, 33.0], False)], indirect=True)
def test_noise_is_shown_as_no_measurable_speedup_never_as_a_bare_ratio(reports) -> None:
    judged, html, md = reports
    assert judged.measurable is False
    interval = f"{judged.speedup:.2f}× [{judged.speedup_low:.2f}, {judged.speedup_high:.2f}]"
    assert judged.speedup_low is not None and judged.speedup_low < 1.0
    for text in (html, md):
        assert f"no measurable speedup: {interval}" in text
        assert f"no measurable speedup over the baseline (trial 0): {interval}" in text
        assert not re.search(r"\*\*\d+\.\d\d×\*\*", text)  # no bold bare ratio in the headline
        assert f'<div class="v">{judged.speedup:.2f}×</div>' not in text


@pytest.mark.parametrize("reports", [([18.0, 18.5], True)], indirect=True)
def test_a_speedup_the_loaded_host_decided_is_not_measurable_and_shows_no_ratio(reports) -> None:
    judged, html, md = reports
    assert judged.measurable is False and judged.host_noise is not None and judged.speedup_low is None
    for text in (html, md):
        assert "not measurable on this host" in text
        assert "speedup over the baseline (trial 0) not measurable on this host: " in text
        # the winner's second run was loaded: said beside the verdict and in the runs table
        assert "host loaded by other processes during 1 of 4 re-measurement runs" in text
        assert f"{judged.speedup:.2f}× [" not in text  # no interval shown as a result
