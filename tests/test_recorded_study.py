"""A recorded real CPU study (TRL, tiny-qwen2, 4 trials) renders the same report tables, ``best/`` and
exports as it did when it was recorded.

The fixture was recorded with ``autotune search --model tiny-qwen2 --trials 4`` and its expected outputs
rendered by the code of that day (``expected/``), before the redesign that gave each framework one home
for its facts: any change of behaviour in loading, recommending, reporting or exporting shows here.
``@STUDY@`` stands for the study directory's path.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from autotune.reports import render_study

from autotune.app.best import write_best
from autotune.app.export import export_study
from autotune.backends.trl.aliases import installed_aliases
from autotune.errors import UsageError
from autotune.export import EXPORT_FORMATS

FIXTURE = Path(__file__).parent / "fixtures" / "recorded_trl_study"
EXPECTED = FIXTURE / "expected"
TEXT_SUFFIXES = (".json", ".sh", ".log", ".jsonl")


@pytest.fixture
def study(tmp_path: Path) -> Path:
    work = tmp_path / "demo"
    shutil.copytree(FIXTURE / "study", work)
    for path in work.rglob("*"):
        if path.is_file() and path.suffix in TEXT_SUFFIXES:
            path.write_text(path.read_text().replace("@STUDY@", str(work)))
    return work


def _placeholder(text: str, study: Path) -> str:
    return text.replace(str(study), "@STUDY@")


def _expected(path: Path) -> str:
    """An expected file as the installed transformers names its fields: the recording's transformers
    (5.24) calls checkpointing ``activation_checkpointing``; one without that rename (5.19, which vLLM's
    CPU build pins) keeps ``gradient_checkpointing``, and the export follows the installed class."""
    text = path.read_text()
    if "gradient_checkpointing" not in installed_aliases():
        text = text.replace("activation_checkpointing:", "gradient_checkpointing:")
    return text


def test_report_tables_unchanged(study: Path) -> None:
    render_study(study)
    md = _placeholder((study / "report.md").read_text(), study)
    tables = [line for line in md.splitlines() if line.startswith("|")]
    assert tables == (EXPECTED / "report_tables.md").read_text().splitlines()


def test_best_dir_unchanged(study: Path) -> None:
    write_best(study)
    written = {p.name: _placeholder(p.read_text(), study) for p in (study / "best").iterdir()}
    expected = {p.name: _expected(p) for p in (EXPECTED / "best").iterdir()}
    assert written == expected


@pytest.mark.parametrize("fmt", EXPORT_FORMATS)
def test_exports_unchanged(study: Path, fmt: str) -> None:
    refusals = json.loads((EXPECTED / "export" / "refusals.json").read_text())
    if fmt in refusals:
        with pytest.raises(UsageError) as info:
            export_study(study, fmt)
        assert _placeholder(info.value.one_line(), study) == refusals[fmt]
        return
    files = export_study(study, fmt).files
    expected_dir = EXPECTED / "export" / fmt
    assert {n: _placeholder(t, study) for n, t in files.items()} == {
        p.name: _expected(p) for p in expected_dir.iterdir()
    }
