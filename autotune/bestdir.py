"""``best/``: the winner of a study as a re-runnable command and a JSON of its knobs."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from autotune.studydir import StudyDir, write_json_atomic

__all__ = ["write_best"]


def write_best(study_dir: Path, outcome: Any) -> Path | None:
    """Write ``best/command.sh`` and ``best/knobs.json`` for the recommended trial (None if there is none)."""
    rec = outcome.recommendation
    if rec is None:
        return None
    sd = StudyDir(study_dir)
    result = next(r for r in outcome.results if r.number == rec.trial)
    best = sd.best_dir
    best.mkdir(parents=True, exist_ok=True)
    src = sd.trial_dir(rec.trial) / "command.sh"
    if src.exists():
        shutil.copyfile(src, best / "command.sh")
        (best / "command.sh").chmod(0o755)
    write_json_atomic(
        best / "knobs.json",
        {
            "trial": rec.trial,
            "params": result.params,
            "derived": result.derived,
            "throughput_completions_per_s": rec.throughput,
            "rel_ci95": result.steady.rel_ci95 if result.steady else None,
            "speedup_over_baseline": rec.speedup,
            "baseline_trial": rec.baseline_trial,
            "peak_mem_bytes": result.peak_mem_bytes,
            "headroom_bytes": rec.headroom_bytes,
        },
    )
    return best
