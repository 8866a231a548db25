"""The committed fixture study is exactly what make_fixture.py writes (regenerate it after changes)."""

from __future__ import annotations

from pathlib import Path

import make_fixture as mf
import pandas as pd


def test_committed_fixture_matches_its_generator(tmp_path: Path, fixture_study: Path) -> None:
    fresh = tmp_path / "study"
    mf.build_study(fresh)
    committed = sorted(p.relative_to(fixture_study) for p in fixture_study.rglob("*") if p.is_file())
    generated = sorted(p.relative_to(fresh) for p in fresh.rglob("*") if p.is_file())
    assert committed == generated, "run: python tests/reports/make_fixture.py"
    for rel in generated:
        if rel.suffix == ".parquet":
            pd.testing.assert_frame_equal(pd.read_parquet(fixture_study / rel), pd.read_parquet(fresh / rel))
        else:
            assert (fixture_study / rel).read_text() == (fresh / rel).read_text(), (
                f"{rel} differs: run python tests/reports/make_fixture.py"
            )


def test_fixture_is_small(fixture_study: Path) -> None:
    total = sum(p.stat().st_size for p in fixture_study.rglob("*") if p.is_file())
    assert total < 2_000_000
