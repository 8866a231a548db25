"""Rendering: both reports from the study directory alone, safe, with every section and chart."""

from __future__ import annotations

import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import make_fixture as mf
import pytest
from autotune.reports import render_profile, render_study
from autotune.reports._load import load_study
from autotune.reports._render import compact_shell, md_cell, md_text, pick_winner

from autotune.records import TrialStatus

EXPECTED_RULES = {
    "hang_pattern",
    "unhealthy_trials",
    "rollout_idle",
    "host_memory",
    "offload_bottleneck",
    "host_cpu_stall",
    "zero3_gather_peak",
    "micro_batch_headroom",
    "oom_boundary",
    "other_failures",
}


def _strip_scripts(html: str) -> str:
    return re.sub(r"<script\b[^>]*>.*?</script>", "", html, flags=re.S | re.I)


class _Collector(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.scripts: list[dict[str, str | None]] = []
        self.ids: set[str] = set()
        self.rules: list[str] = []
        self.chart_divs: list[str] = []
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "script":
            self.scripts.append(a)
        if a.get("id"):
            self.ids.add(a["id"])
        if a.get("data-rule"):
            self.rules.append(a["data-rule"])
        if tag == "div" and "chart" in (a.get("class") or "").split():
            self.chart_divs.append(a.get("id") or "")
        if tag == "a" and a.get("href"):
            self.hrefs.append(a["href"])


@pytest.fixture(scope="module")
def html_text(rendered) -> str:
    return rendered.html.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def md_text_out(rendered) -> str:
    return rendered.markdown.read_text(encoding="utf-8")


def test_both_reports_written(rendered) -> None:
    assert rendered.html.name == "report.html" and rendered.markdown.name == "report.md"
    assert "plotly" not in rendered.html.read_text(encoding="utf-8").lower()  # charts are inline SVG
    assert {p.name for p in rendered.charts} >= {
        "throughput.png",
        "importance.png",
        "pareto.png",
        "progress.png",
        "timeline-trial-0.png",
        "timeline-trial-3.png",
    }


def test_summary_has_winner_speedup_headroom_and_command(html_text: str, md_text_out: str) -> None:
    page = _strip_scripts(html_text)
    for text in (page, md_text_out):
        assert "Recommended: trial 3" in text
        assert "1.71 completions/s" in text and "1.52×" in text
        assert "GPU 0" in text and "2.2 GiB" in text  # headroom per GPU
        assert "15 of 16 trials launched" in text or "15 / 16" in text
        assert "GPU-hours" in text
        assert "4 × NVIDIA A10 (22.5 GiB); driver 550.54.15, CUDA 12.4" in text
        assert "ms-swift 4.6.0" in text and "Qwen2-7B (Qwen/Qwen2-7B)" in text
        assert "--per_device_train_batch_size 4" in text and "--max_steps 1000" in text
        assert "lora_rank=16" in text


def test_every_expected_finding_is_in_both_reports(html_text: str, md_text_out: str) -> None:
    c = _Collector()
    c.feed(html_text)
    assert set(c.rules) == EXPECTED_RULES
    for title in (
        "Rollout leaves the GPUs idle",
        "Offload traffic stalls the GPUs",
        "GPUs wait for a saturated host CPU",
        "ZeRO-3 gather",
        "Out-of-memory boundary",
        "Trials hang",
        "Trials that do not learn",
    ):
        assert title in html_text and title in md_text_out


def test_trials_table_has_every_trial_and_sorting(html_text: str, md_text_out: str) -> None:
    c = _Collector()
    c.feed(html_text)
    assert {f"trial-{n}" for n in range(16)} <= c.ids
    assert 'class="trials sortable"' in html_text and "sorted-asc" in html_text
    for status in (
        "COMPLETE",
        "UNHEALTHY",
        "OOM",
        "VLLM_INIT",
        "HOST_OOM",
        "HANG",
        "TIMEOUT",
        "INVALID",
        "CRASH",
        "PRUNED",
        "INTERRUPTED",
    ):
        assert f">{status}<" in html_text
        assert f"| {status} |" in md_text_out
    assert "1.71 ± 0.051" in html_text  # throughput with its uncertainty
    assert "5 steady of 6 (1 warm-up)" in md_text_out
    rows = [line for line in md_text_out.splitlines() if re.match(r"^\| \d+", line)]
    assert len(rows) == 16
    header = next(line for line in md_text_out.splitlines() if line.startswith("| # |"))
    assert all(row.count(" | ") >= header.count(" | ") - 1 for row in rows)


def test_every_chart_div_holds_its_svg_and_no_script_draws(html_text: str) -> None:
    c = _Collector()
    c.feed(html_text)
    assert {
        "chart-throughput",
        "chart-importance",
        "chart-pareto",
        "chart-progress",
        "chart-timeline-0",
        "chart-timeline-3",
    } <= set(c.chart_divs)
    for chart in c.chart_divs:
        body = html_text.split(f'<div class="chart" id="{chart}">', 1)[1]
        assert body.lstrip().startswith("<svg"), chart
    assert len(re.findall(r'<div class="chart" id=', html_text)) == len(c.chart_divs)
    assert not [s for s in c.scripts if s.get("src")]  # nothing loaded from anywhere
    assert not [s for s in c.scripts if s.get("type") == "application/json"]  # no figure specs to draw


def test_no_network_resources(html_text: str) -> None:
    page = _strip_scripts(html_text)
    assert not re.search(
        r"<(?:script|link|img|iframe|source)\b[^>]*\b(?:src|href)\s*=\s*[\"']?(?:https?:)?//", page, re.I
    )


def test_log_text_is_escaped_and_secrets_never_appear(html_text: str, md_text_out: str, rendered) -> None:
    assert "<script>alert(" not in html_text and "<script>alert(" not in md_text_out
    assert "&lt;script&gt;alert(" in html_text
    assert "&lt;script>alert(" in md_text_out  # a "<" that could open a tag is an entity; ">" alone is not
    for secret in (mf.SECRET_TOKEN, mf.SECRET_WANDB):
        assert secret not in html_text and secret not in md_text_out
    for png in rendered.charts:
        assert mf.SECRET_TOKEN.encode() not in png.read_bytes()


def test_paths_are_relative_to_the_study(html_text: str, md_text_out: str) -> None:
    # the Command row is the command as typed: its --out names the study where it was written
    command_row = next(line for line in md_text_out.splitlines() if line.startswith("| Command |"))
    assert f"--out {mf.ORIGINAL_ROOT}" in command_row and "--out ." not in command_row
    html_rest = re.sub(r"<tr><td>Command</td>.*?</tr>", "", html_text, flags=re.S)
    md_rest = md_text_out.replace(command_row, "")
    assert mf.ORIGINAL_ROOT not in html_rest and mf.ORIGINAL_ROOT not in md_rest
    assert str(mf.FIXTURE_DIR) not in html_text and str(mf.FIXTURE_DIR) not in md_text_out
    assert "--output_dir trials/3/output" in md_text_out


def test_markdown_image_and_file_links_resolve(rendered, md_text_out: str, html_text: str) -> None:
    links = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", md_text_out)
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", md_text_out)
    assert len(images) >= 4 + 13  # summary charts + a timeline per trial that ran
    for link in links:
        assert not link.startswith(("/", "http")), link
        assert (rendered.markdown.parent / link).is_file(), link
    c = _Collector()
    c.feed(html_text)
    # Written outside the study directory: no link climbs out of the report's folder.
    assert not [h for h in c.hrefs if not h.startswith("#")]


def test_timelines_put_baseline_and_winner_side_by_side(md_text_out: str, html_text: str) -> None:
    assert re.search(r"\| Trial 0 \(baseline\).*\| Trial 3 \(winner\).* \|", md_text_out)
    first_two = re.findall(r'id="(chart-timeline-\d+)"', html_text)[:2]
    assert first_two == ["chart-timeline-0", "chart-timeline-3"]


def test_render_into_the_study_directory_by_default(tmp_path: Path, fixture_study: Path) -> None:
    root = tmp_path / "study"
    shutil.copytree(fixture_study, root)
    paths = render_study(root, png=False)
    assert paths.html == root / "report.html" and paths.markdown.is_file()
    assert not (root / "charts").exists()
    text = paths.html.read_text()
    assert str(root) not in text and 'href="trials/3/stdout.log"' in text
    c = _Collector()
    c.feed(text)
    file_links = [h for h in c.hrefs if not h.startswith("#")]
    assert len(file_links) > 40 and all((root / h).is_file() for h in file_links)


def test_cpu_study_renders_with_host_charts(tmp_path: Path) -> None:
    root = tmp_path / "cpu"
    mf.build_cpu_study(root)
    paths = render_study(root)
    html = paths.html.read_text()
    md = paths.markdown.read_text()
    assert "no GPU (CPU-only run)" in html and "CPU-hours" in html
    assert "trial CPU (% of all cores)" in html
    assert "Recommended: trial 2" in md  # the shortest rollout
    assert (root / "charts" / "timeline-trial-0.png").is_file()


def test_study_with_nothing_to_recommend(tmp_path: Path) -> None:
    root = tmp_path / "s"
    mf.write_study(root, [mf.spec(2), mf.spec(9), mf.spec(13)])
    paths = render_study(root, png=False)
    md = paths.markdown.read_text()
    assert "No trial can be recommended" in md and "Recommended:" not in md
    assert "needs at least 3 completed trials" in md


def _store_recommendation(root: Path, recommendation: object) -> None:
    settings = json.loads((root / "study.json").read_text())
    settings["recommendation"] = recommendation
    (root / "study.json").write_text(json.dumps(settings))


def test_the_recommendation_stored_when_the_study_ended_is_the_one_shown(
    tmp_path: Path, fixture_study: Path
) -> None:
    root = tmp_path / "study"
    shutil.copytree(fixture_study, root)
    data = load_study(root)
    decided = pick_winner(data)
    assert decided is not None
    other = next(
        r
        for r in data.results
        if r.status is TrialStatus.COMPLETE and r.throughput and r.number != decided.trial
    )
    stored = decided.model_copy(
        update={"trial": other.number, "throughput": other.throughput, "why": "stored when the study ended"}
    )
    _store_recommendation(root, stored.model_dump(mode="json"))
    assert pick_winner(load_study(root)) == stored
    md = render_study(root, png=False).markdown.read_text()
    assert f"Recommended: trial {other.number}**" in md and "stored when the study ended" in md


def test_a_study_that_ended_without_a_recommendation_shows_none(tmp_path: Path, fixture_study: Path) -> None:
    root = tmp_path / "study"
    shutil.copytree(fixture_study, root)
    _store_recommendation(root, None)
    md = render_study(root, png=False).markdown.read_text()
    assert "No trial can be recommended" in md and "Recommended:" not in md


def test_an_unreadable_stored_recommendation_is_a_note_and_decided_from_the_results(
    tmp_path: Path, fixture_study: Path
) -> None:
    root = tmp_path / "study"
    shutil.copytree(fixture_study, root)
    decided = pick_winner(load_study(root))
    assert decided is not None
    _store_recommendation(root, {"trial": "the third"})
    md = render_study(root, png=False).markdown.read_text()
    assert f"Recommended: trial {decided.trial}**" in md
    assert "study.json: the recommendation is unreadable" in md


def test_profile_report(tmp_path: Path) -> None:
    src = tmp_path / "s"
    mf.write_study(src, [mf.spec(0)])
    prof = tmp_path / "prof"
    shutil.copytree(src / "trials" / "0", prof)
    (prof / "profile.json").write_text(
        json.dumps(
            {
                "command": ["python", "train.py", "--hub_token", "abcdef123456"],
                "hardware": mf.hardware().model_dump(mode="json"),
                # the copied trial holds ms-swift knobs: its backend reads them, as in the study
                "backend": "swift",
            }
        )
    )
    paths = render_profile(prof)
    html = paths.html.read_text()
    md = paths.markdown.read_text()
    assert "Profiled run" in md and "python train.py --hub_token ***" in md
    assert "abcdef123456" not in html and "abcdef123456" not in md
    assert 'data-rule="rollout_idle"' in html  # same diagnosis as in a study
    assert "Search insight" not in md and "All trials" not in md
    assert (prof / "charts" / "timeline-trial-0.png").is_file()


def test_markdown_escaping_helpers() -> None:
    assert md_cell("a | b\nc") == "a \\| b c"
    assert (
        md_text("<b>*x*</b> [l](u) per_device_train_batch_size _x_")
        == "&lt;b>\\*x\\*&lt;/b> \\[l\\](u) per_device_train_batch_size \\_x\\_"
    )


def test_compact_shell_keeps_every_word_in_order() -> None:
    text = "#!/usr/bin/env bash\ncd x\nswift \\\n  rlhf \\\n  --a \\\n  1 \\\n  --flag \\\n  --b \\\n  'two words'\n"
    out = compact_shell(text)
    assert (
        out == "#!/usr/bin/env bash\ncd x\nswift \\\n  rlhf \\\n  --a 1 \\\n  --flag \\\n  --b 'two words'\n"
    )
    assert out.replace("\\\n", " ").split() == text.replace("\\\n", " ").split()


def test_markdown_text_keeps_a_plain_less_than_readable() -> None:
    from autotune.reports._render import md_text

    assert md_text("peak < 80 % of capacity & rising") == "peak < 80 % of capacity & rising"
    assert md_text("<img src=x>") == "&lt;img src=x>" and md_text("&amp;") == "&amp;amp;"


def test_both_importance_methods_are_tabled_where_they_disagree(
    tmp_path: Path, fixture_study: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from autotune.reports import _render
    from autotune.reports.insight import Importance

    root = tmp_path / "study"
    shutil.copytree(fixture_study, root)
    imp = Importance(
        {"bs": 0.7, "workers": 0.25, "ckpt": 0.05},
        "both are shown",
        "PED-ANOVA",
        {"bs": 0.8, "ckpt": 0.15, "workers": 0.05},
    )
    monkeypatch.setattr(_render, "param_importances", lambda results: imp)
    paths = render_study(root, png=False)
    md = paths.markdown.read_text()
    assert "| knob | importance | fANOVA |" in md
    assert "| workers | 0.25 | 0.05 |" in md and "| ckpt | 0.05 | 0.15 |" in md
    html = paths.html.read_text()
    assert "<th>PED-ANOVA</th><th>fANOVA</th>" in html
    assert '<td>workers</td><td class="num">0.25</td><td class="num">0.05</td>' in html
