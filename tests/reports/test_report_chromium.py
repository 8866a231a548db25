"""Open report.html in headless Chromium: no script errors, every chart drawn, nothing fetched.

A copy of the report gets two small probe scripts: one first in <head> that records ``window.onerror``,
unhandled rejections and ``console.error``; one that, after load, writes what it saw and how many
charts show an SVG with drawn content (laid out at a visible size), which ``--dump-dom`` prints. Skipped when Chromium is not installed
(CI installs Debian's ``chromium``).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

CHROMIUM = next(
    (p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None
)
pytestmark = [
    pytest.mark.infra,
    pytest.mark.skipif(
        CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium)"
    ),
]

PROBE_HEAD = """<script>
window.__probe = {errors: []};
window.addEventListener("error", function (e) { window.__probe.errors.push("error: " + (e.message || (e.target && (e.target.src || e.target.href)) || "resource")); }, true);
window.addEventListener("unhandledrejection", function (e) { window.__probe.errors.push("rejection: " + e.reason); });
(function () { var orig = console.error; console.error = function () { window.__probe.errors.push("console.error: " + Array.prototype.join.call(arguments, " ")); return orig.apply(console, arguments); }; })();
</script>"""
PROBE_TAIL = """<script>
window.addEventListener("load", function () { setTimeout(function () {
  var charts = document.querySelectorAll("div.chart");
  var drawn = 0, svgs = 0, failed = 0;
  for (var i = 0; i < charts.length; i++) {
    var svg = charts[i].querySelector("svg");
    if (svg) { svgs++; }
    var box = svg ? svg.getBoundingClientRect() : null;
    if (box && box.width > 200 && box.height > 100 && svg.querySelectorAll("path, use, text").length > 5) { drawn++; }
    if (!svg) { failed++; }
  }
  var out = document.createElement("div");
  out.id = "probe-result";
  out.setAttribute("data-result", JSON.stringify({errors: window.__probe.errors, charts: charts.length, drawn: drawn, svgs: svgs, failed: failed,
    marks: Array.prototype.slice.call(charts).map(function (c) { return c.querySelectorAll("svg path").length; })}));
  document.body.appendChild(out);
}, 1000); });
</script>"""


class _Result(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.result: dict | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id") == "probe-result" and a.get("data-result"):
            self.result = json.loads(a["data-result"])


def _chromium(args: list[str], tmp_path: Path, *, width_px: int = 1400) -> subprocess.CompletedProcess[str]:
    argv = [
        str(CHROMIUM),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-extensions",
        "--no-first-run",
        "--no-default-browser-check",
        "--mute-audio",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        f"--window-size={width_px},2000",
        "--virtual-time-budget=60000",
        *args,
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)


def _probe(report: Path, tmp_path: Path) -> dict:
    html = report.read_text(encoding="utf-8")
    html = html.replace("<head>", "<head>\n" + PROBE_HEAD, 1).replace("</body>", PROBE_TAIL + "\n</body>", 1)
    probed = report.with_name("probed.html")
    probed.write_text(html, encoding="utf-8")
    proc = _chromium(["--dump-dom", probed.as_uri()], tmp_path)
    parser = _Result()
    parser.feed(proc.stdout)
    assert parser.result is not None, f"no probe result (exit {proc.returncode}): {proc.stderr[-2000:]}"
    parser.result["stderr"] = proc.stderr
    return parser.result


def test_study_report_renders_every_chart_without_errors(rendered, tmp_path: Path) -> None:
    expected = len(re.findall(r'<div class="chart" id=', rendered.html.read_text(encoding="utf-8")))
    result = _probe(rendered.html, tmp_path)
    assert result["errors"] == []
    assert "Uncaught" not in result["stderr"]
    assert expected >= 17
    assert result["charts"] == expected
    assert result["drawn"] == expected and result["svgs"] == expected and result["failed"] == 0
    assert all(n > 0 for n in result["marks"])


def test_profile_report_renders_in_chromium(tmp_path: Path) -> None:
    import make_fixture as mf
    from autotune.reports import render_profile

    src = tmp_path / "s"
    mf.write_study(src, [mf.spec(7)])
    prof = tmp_path / "prof"
    shutil.copytree(src / "trials" / "7", prof)
    (prof / "profile.json").write_text(json.dumps({"command": "python train.py"}))
    paths = render_profile(prof, png=False)
    result = _probe(paths.html, tmp_path)
    assert result["errors"] == [] and result["charts"] == 1 and result["drawn"] == 1


def test_screenshot_of_the_report(rendered, tmp_path: Path) -> None:
    """The page paints (a non-trivial PNG); look at tests' tmp output by hand when changing the layout."""
    shot = tmp_path / "report.png"
    proc = _chromium(["--hide-scrollbars", f"--screenshot={shot}", rendered.html.as_uri()], tmp_path)
    assert shot.is_file(), proc.stderr[-2000:]
    assert shot.stat().st_size > 50_000


def test_the_probe_catches_a_missing_chart(tmp_path: Path) -> None:
    """Negative control: a chart whose SVG is missing shows up as an undrawn chart."""
    import make_fixture as mf
    from autotune.reports import render_profile

    src = tmp_path / "s"
    mf.write_study(src, [mf.spec(15)])
    prof = tmp_path / "prof"
    shutil.copytree(src / "trials" / "15", prof)
    paths = render_profile(prof, png=False)
    html = paths.html.read_text(encoding="utf-8")
    broken = re.sub(r'(<div class="chart" id="[^"]+">)<svg\b.*?</svg>', r"\1", html, count=1, flags=re.S)
    assert broken != html
    paths.html.write_text(broken, encoding="utf-8")
    result = _probe(paths.html, tmp_path)
    assert result["failed"] == 1 and result["drawn"] == 0


KNOB_PROBE = """<script>
window.addEventListener("load", function () { setTimeout(function () {
  var wrap = document.querySelector(".tablewrap").getBoundingClientRect();
  var heads = document.querySelectorAll("#trials-table th[data-type=mixed]");
  var knobs = [];
  for (var i = 0; i < heads.length; i++) {
    var b = heads[i].getBoundingClientRect();
    knobs.push({name: heads[i].title, left: b.left, right: b.right});
  }
  var out = document.createElement("div");
  out.id = "probe-result";
  out.setAttribute("data-result", JSON.stringify({viewport: window.innerWidth, wrap_right: wrap.right, knobs: knobs}));
  document.body.appendChild(out);
}, 500); });
</script>"""


@pytest.mark.infra
def test_the_knob_columns_are_in_view_at_1280_px(rendered, tmp_path: Path) -> None:
    """Every knob column of the trials table is inside the viewport and the table's box at 1280 px,
    without scrolling the table sideways."""
    html = rendered.html.read_text(encoding="utf-8").replace("</body>", KNOB_PROBE + "\n</body>", 1)
    probed = rendered.html.with_name("knobs.html")
    probed.write_text(html, encoding="utf-8")
    proc = _chromium(["--dump-dom", probed.as_uri()], tmp_path, width_px=1280)
    parser = _Result()
    parser.feed(proc.stdout)
    assert parser.result is not None, f"no probe result (exit {proc.returncode}): {proc.stderr[-2000:]}"
    seen = parser.result
    assert seen["knobs"], "the trials table has knob columns"
    edge = min(seen["viewport"], seen["wrap_right"]) + 0.5
    hidden = [k["name"] for k in seen["knobs"] if k["right"] > edge or k["left"] < 0]
    assert hidden == [], f"knob columns behind the horizontal scrollbar at 1280 px: {hidden}"
