"""A study's files rebuilt from its storage, on any host: what ``report`` and ``export`` read.

Workers on several hosts each keep their own trial directories; the storage holds what every worker
recorded (:func:`autotune.study.loop.stored_attrs`: each trial's result and launch plan, and the
study's settings with its outcome). :func:`pull` writes these into a study directory so that the
usual report and export run on it. Files already on disk are kept, except a result still marked
RUNNING that the storage has since finished, and a ``study.json`` the storage's outcome is newer than.
Timelines stay with the worker that sampled them: a pulled study's report has no timeline charts for
trials that ran elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from autotune.errors import UsageError
from autotune.records import TrialResult, TrialStatus
from autotune.secrets import SecretRule
from autotune.study.optuna_view import MachineAttrs
from autotune.study.storage import open_storage, workers_of
from autotune.studydir import StudyDir, ensure_writable, write_text_atomic
from autotune.studysettings import StudySettings

__all__ = ["Pulled", "pull"]


@dataclass(frozen=True)
class Pulled:
    """What :func:`pull` wrote: the trials it wrote a result for, and the workers the study had."""

    directory: Path
    trials_written: tuple[int, ...]
    trials_in_storage: int
    workers: tuple[str, ...]


def pull(url: str, study_name: str, directory: Path, secrets: SecretRule | None = None) -> Pulled:
    """Write the study ``study_name`` of the storage ``url`` into ``directory``.

    Raises:
        UsageError: the storage cannot be opened, or holds no study of that name (the names it holds
            are listed), or the study holds no settings (no autotune worker ever ran in it).
    """
    rule = secrets or SecretRule()
    storage = open_storage(url, rule)
    if storage is None:
        raise UsageError(
            "a study in ':memory:' lives only in the process that ran it",
            hint="Pass the --storage URL the workers shared (sqlite:////path.db, postgresql://…)",
        )
    try:
        study = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        raise UsageError(
            f"no study named {study_name!r} in {rule.redact_url(url)}",
            hint=f"Pass one of its studies with --study-name: {', '.join(names) or 'it holds none'}",
        ) from None
    settings = MachineAttrs(study).get("settings")
    if not isinstance(settings, dict):
        raise UsageError(
            f"the study {study_name!r} in {rule.redact_url(url)} was not written by autotune search",
            hint="Pass the --study-name that autotune search workers joined",
        )
    ensure_writable(directory, flag="DIR")  # only now: a storage or study that fails leaves no folder
    sd = StudyDir(directory)
    sd.own_dir(sd.trials_dir)
    _write_settings(sd, settings)
    written: list[int] = []
    trials = study.get_trials(deepcopy=False)
    for t in trials:
        if "duplicate_of" in t.user_attrs or t.state is optuna.trial.TrialState.WAITING:
            continue
        result = _result_of(t)
        if result is None:
            continue
        on_disk = sd.read_result(t.number)
        if on_disk is not None and not (
            on_disk.status is TrialStatus.RUNNING and result.status is not TrialStatus.RUNNING
        ):
            continue
        sd.write_result(result)
        launch = t.user_attrs.get("launch")
        path = sd.trial(t.number).launch_json
        if isinstance(launch, str) and not path.exists():
            write_text_atomic(path, launch)
        written.append(t.number)
    workers = tuple(str(w.get("name")) for w in workers_of(study))
    return Pulled(
        directory=sd.root, trials_written=tuple(written), trials_in_storage=len(trials), workers=workers
    )


def _result_of(t: optuna.trial.FrozenTrial) -> TrialResult | None:
    raw = t.user_attrs.get("result")
    if isinstance(raw, str):
        try:
            result = TrialResult.from_json(raw)
        except ValueError:
            result = None
        if result is not None and result.number == t.number:
            return result
    is_baseline = bool(t.user_attrs.get("is_baseline"))
    if t.state is optuna.trial.TrialState.RUNNING:
        return TrialResult.running(
            t.number, t.params, reason="running on another worker", is_baseline=is_baseline
        )
    if t.state is optuna.trial.TrialState.FAIL:
        return TrialResult.interrupted(
            t.number, t.params, reason="its worker ended before recording it", is_baseline=is_baseline
        )
    return None


def _write_settings(sd: StudyDir, settings: dict[str, Any]) -> None:
    """The storage's settings, unless the directory's own are as new (a worker's own --out)."""
    theirs = StudySettings.from_json(settings)
    if sd.study_json.exists():
        try:
            mine = sd.read_settings()
        except UsageError:  # unreadable, not an object, a link: the storage's replace it
            mine = StudySettings()
        if (mine.finished_wall_s or 0) >= (theirs.finished_wall_s or 0):
            return
    sd.write_settings(theirs)
