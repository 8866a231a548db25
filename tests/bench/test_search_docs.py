"""docs/search.md's 20-seed tables are what the bench prints from the committed records (nothing
restated by hand): rendering the records again gives the lines the page shows."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import search_efficiency as se  # noqa: E402

RECORDS = ROOT / "bench" / "records" / "search-v4-budget12.jsonl"
STRATEGIES = ("autotune-v4", "autotune", "random", "tpe", "gp")


def test_the_page_shows_the_tables_the_bench_renders_from_the_committed_records() -> None:
    recorded = se.read_records(RECORDS, 12)
    metrics = list(recorded.values())
    assert (
        len(metrics) == 4 * 4 * 20 * 5 + 20 * 5
    )  # 16 simulated surfaces and the replay, 20 seeds, 5 searches
    assert {m.kind for m in metrics} == set(se.KINDS)
    order = {s.name: n for n, s in enumerate(se.SETTINGS)}
    metrics.sort(key=lambda m: (order[m.setting], m.seed, STRATEGIES.index(m.strategy)))
    page = (ROOT / "docs" / "search.md").read_text()
    families = se.render_families(metrics, STRATEGIES).strip()
    surfaces = se.render(metrics, STRATEGIES, 12, list(range(100, 120))).strip()
    assert families in page
    assert surfaces in page
