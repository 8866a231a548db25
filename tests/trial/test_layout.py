"""Rules of the trial modules that no behaviour test would notice breaking."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import autotune
from autotune.studydir import StudyDir, TrialDir

PACKAGE = Path(autotune.__file__).parent
TRIAL_FILES = [
    "trial/runner.py",
    "trial/launch.py",
    "tail.py",
    "trial/watchdog.py",
    "trial/run_record.py",
    "trial/pipeline.py",
    "trial/execute.py",
    "trial/outcome.py",
    "trial/evidence.py",
    "trial/hygiene.py",
    "trial/steady.py",
    "trial/early.py",
    "app/profile.py",
]
FILE_NAMES = {
    TrialDir.LAUNCH,
    TrialDir.COMMAND,
    TrialDir.STDOUT,
    TrialDir.STDERR,
    TrialDir.METRICS,
    TrialDir.TIMELINE,
    TrialDir.PHASES,
    TrialDir.PROC,
    TrialDir.RESULT,
    TrialDir.PROFILE,
    StudyDir.TRIALS,
}


def _tree(relative: str) -> ast.Module:
    return ast.parse((PACKAGE / relative).read_text(encoding="utf-8"))


def test_the_runner_does_not_import_the_outcome() -> None:
    # The runner decides when to stop, the outcome what the end means; both read failure text from
    # evidence.py. An import the other way round would make the two one module again.
    imported: set[str] = set()
    for node in ast.walk(_tree("trial/runner.py")):
        if isinstance(node, ast.ImportFrom):
            imported.add(node.module or "")
            imported.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            imported.update(a.name for a in node.names)
    assert not [name for name in imported if "outcome" in name]


@pytest.mark.parametrize("relative", TRIAL_FILES)
def test_trial_file_names_come_from_studydir(relative: str) -> None:
    literals = [
        node.value
        for node in ast.walk(_tree(relative))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in FILE_NAMES
    ]
    assert literals == [], f"{relative}: use TrialDir / StudyDir for {literals}"
