"""``best/``: the winner of a study in its own backend's format, written when the study ends.

``best/`` is autotune's own directory: it is emptied and rewritten. It holds ``knobs.json`` (the json
export) and the export of the study's backend: for ms-swift ``command.sh`` (the ``swift rlhf`` script);
for TRL ``command.sh`` + ``grpo.yaml`` + ``accelerate.yaml`` (+ ``ds_config.json``); for the command
backend ``command.sh`` (the trial's own command). Every one is written by :mod:`autotune.export`, so
``best/`` and ``autotune export`` never disagree.
"""

from __future__ import annotations

from pathlib import Path

from autotune.errors import UsageError
from autotune.studydir import StudyDir, write_text_atomic

__all__ = ["write_best"]


def write_best(study_dir: Path) -> Path | None:
    """Write ``best/`` for the study's recommended trial (None when there is none).

    A backend format that cannot express the winner (an ms-swift study exported by hand with a custom
    DeepSpeed JSON, say) leaves ``best/`` with ``knobs.json`` and a ``README.txt`` saying why, instead of
    failing the study at its end.

    Args:
        study_dir: the study directory; its recommendation is read from ``study.json``.
    """
    from autotune.app.export import default_format, export_winner, load_study_winner
    from autotune.export import MARKER, write_export

    sd = StudyDir(Path(study_dir))
    rec = sd.recommendation()
    if rec is None:
        return None
    best = sd.own_dir(sd.best_dir)  # never a link: it is emptied and rewritten
    for stale in best.iterdir():  # a resumed study's earlier winner may have had other files
        if stale.is_file():
            stale.unlink()
    fmt = "json"
    try:
        winner = load_study_winner(sd.root)  # the recommendation, with its reason
        write_export(export_winner(winner, "json"), best, overwrite=True)
        fmt = default_format(winner.backend)
        write_export(export_winner(winner, fmt), best, overwrite=True)
    except UsageError as exc:  # the study's results stand; only best/ is incomplete
        write_text_atomic(
            best / "README.txt", f"{MARKER}: no {fmt} export for trial {rec.trial}: {exc.one_line()}\n"
        )
    return best
