"""Shared fixtures of the report tests: the committed fixture study and one render of it."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURE_STUDY = Path(__file__).resolve().parents[1] / "fixtures" / "study"


@pytest.fixture(scope="session")
def fixture_study() -> Path:
    return FIXTURE_STUDY


@pytest.fixture(scope="session")
def rendered(tmp_path_factory: pytest.TempPathFactory):
    """The fixture study rendered once (HTML + markdown + PNGs) into a temporary directory."""
    from autotune.reports import render_study

    out = tmp_path_factory.mktemp("report")
    return render_study(FIXTURE_STUDY, out_dir=out)
