"""A study directory bound to its Optuna study: one name, one uid, trial numbers that never collide.

Trial numbers come from the Optuna storage while results are kept on disk by number (``trials/<n>/``).
The two are bound together so that a finished trial is never written over:

- ``study.json`` records the Optuna study's ``name`` and a ``uid``; the storage records the same uid
  (the study's user attribute ``study_uid``). A renamed or copied directory resumes under the name it
  recorded, not under its new directory name.
- A ``--study-name`` other than the recorded one is refused: it would open another, empty Optuna
  study whose numbering starts again at 0.
- A storage that holds fewer trials than the directory (``study.db`` emptied, deleted, or an
  in-memory storage) is rebuilt from the trial directories, which hold every result; a storage that
  holds another study's uid, or a shared storage that lost trials, is refused in one line.
- Last, a trial number the storage hands out whose directory already holds a result is refused before
  anything is written (:func:`claim_number`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import optuna

from autotune.errors import StudyError, UsageError
from autotune.records import TrialResult, TrialStatus
from autotune.space import SearchSpace
from autotune.studydir import StudyDir
from autotune.studysettings import StudySettings

__all__ = ["UID_ATTR", "Bound", "bound_name", "study_uid", "bind_storage", "claim_number"]

#: the storage's user attribute that holds the study directory's uid
UID_ATTR = "study_uid"


@dataclass(frozen=True)
class Bound:
    """A study directory bound to its storage.

    Attributes:
        uid: the study's uid (``study.json``'s ``uid``): the directory's, or in a shared storage the
            storage's (every worker's directory joins the one study).
        rebuilt: how many trials were rebuilt from the trial directories (0: none needed).
    """

    uid: str
    rebuilt: int = 0


def study_uid(old: StudySettings | None) -> str:
    """The study's uid: the one ``study.json`` recorded, or a new one for a new study."""
    recorded = old.uid if old is not None else None
    return recorded or uuid.uuid4().hex


def bound_name(sd: StudyDir, old: StudySettings | None, requested: str | None) -> str | None:
    """The Optuna study name a run on ``sd`` must use (None: the caller's default, for a new study).

    Raises:
        UsageError: ``requested`` (``--study-name``) names another study than the one recorded.
    """
    recorded = old.name if old is not None else None
    if not recorded:
        return requested
    if requested is not None and requested != recorded:
        raise UsageError(
            f"{sd.root} is the study {recorded!r} (study.json: name), not {requested!r}: another name "
            "would start its trial numbers again over the finished ones",
            hint=f"Resume it with --study-name {recorded} (or without --study-name), or choose a new --out",
        )
    return recorded


def bind_storage(
    study: optuna.Study,
    sd: StudyDir,
    uid: str,
    *,
    shared: bool,
    own: bool = True,
    space: SearchSpace,
    attrs: Callable[[TrialResult], dict[str, Any]],
    where: str,
) -> Bound:
    """Check that ``study`` (just opened) is the directory's study, rebuild it when it lost its trials,
    and record ``uid`` in it.

    A shared storage (workers, each maybe with its own directory) is the study: a worker's directory
    takes the storage's uid.

    Args:
        study: the Optuna study opened for ``sd``.
        sd: the study directory.
        uid: the directory's uid (:func:`study_uid`).
        shared: workers may share the storage (its uid wins; a lost storage is refused, not rebuilt:
            two workers could rebuild it at once).
        own: the storage is the directory's own ``study.db`` (its uid wins); an outside one
            (``--storage``) holding another directory's uid is refused.
        space: the study's space (the rebuilt trials' distributions).
        attrs: the user attributes a finished trial keeps in the storage.
        where: the storage, as it may be shown (password masked).

    Returns:
        The uid to record and how many trials were rebuilt.

    Raises:
        UsageError: the storage holds another study, or lost trials that cannot be rebuilt here.
    """
    stored_uid = study.user_attrs.get(UID_ATTR)
    if (shared or own) and isinstance(stored_uid, str):
        uid = stored_uid  # the directory's own study.db, or the study every worker joins
    if isinstance(stored_uid, str) and stored_uid != uid:
        raise UsageError(
            f"the study {study.study_name!r} in {where} belongs to another study directory than "
            f"{sd.root} (uid {stored_uid[:8]}, not {uid[:8]})",
            hint="Resume that study from its own directory, or choose another --study-name or --out",
        )
    results = {r.number: r for r in sd.results()}
    stored = len(study.get_trials(deepcopy=False))
    rebuilt = 0
    if results and max(results) >= stored:
        if stored or shared:
            raise UsageError(
                f"the study storage {where} holds {stored} trial(s) but {sd.trials_dir} holds results up to "
                f"trial {max(results)}: new trials would be written over them",
                hint=f"Restore {sd.DB} from a backup, or move it away (alone on this --out) so that it is "
                "rebuilt from the trial directories",
            )
        rebuilt = _rebuild(study, results, space, attrs)
    if stored_uid != uid:
        study.set_user_attr(UID_ATTR, uid)
    return Bound(uid=uid, rebuilt=rebuilt)


def claim_number(sd: StudyDir, study: optuna.Study, trial: optuna.Trial) -> None:
    """Refuse a trial number whose directory already holds a result, before anything is written.

    Raises:
        StudyError: the storage handed out a number the directory already used (the trial is failed
            in the storage; nothing on disk is touched).
    """
    path = sd.trial(trial.number).result_json
    # a link planted in a study is never a result (the writers replace it, or refuse a linked directory)
    if sd.trial_dir(trial.number).is_symlink() or path.is_symlink() or not path.is_file():
        return
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    raise StudyError(
        f"the study storage gave trial number {trial.number}, which {sd.trial_dir(trial.number)} "
        "already holds: it is out of step with the study directory",
        hint=f"Restore {sd.DB}, or move it away so that it is rebuilt from the trial directories",
    )


def _rebuild(
    study: optuna.Study,
    results: Mapping[int, TrialResult],
    space: SearchSpace,
    attrs: Callable[[TrialResult], dict[str, Any]],
) -> int:
    """Add one storage trial per number up to the highest on disk (Optuna numbers them in order)."""
    for number in range(max(results) + 1):
        result = results.get(number)
        study.add_trial(_frozen(result, space, attrs) if result is not None else _gap())
    return len(results)


def _gap() -> optuna.trial.FrozenTrial:
    """A number with no directory (a duplicate told with its twin's result): a failed trial."""
    return optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, user_attrs={"duplicate_of": -1})


def _frozen(
    result: TrialResult, space: SearchSpace, attrs: Callable[[TrialResult], dict[str, Any]]
) -> optuna.trial.FrozenTrial:
    """The storage trial of a result on disk (a RUNNING one stays RUNNING: resuming recovers it)."""
    fixed = optuna.trial.FixedTrial(dict(result.params))
    try:
        space.suggest(fixed)
        params, distributions = fixed.params, fixed.distributions
    except (ValueError, TypeError, KeyError):  # a value the space no longer holds: kept in the attrs
        params, distributions = {}, {}
    state = optuna.trial.TrialState.FAIL
    value: float | None = None
    if result.status is TrialStatus.COMPLETE and result.throughput is not None:
        state, value = optuna.trial.TrialState.COMPLETE, result.throughput
    elif result.status is TrialStatus.PRUNED:
        state = optuna.trial.TrialState.PRUNED
    elif result.status is TrialStatus.RUNNING:
        state = optuna.trial.TrialState.RUNNING
    return optuna.trial.create_trial(
        state=state,
        value=value,
        params=params,
        distributions=distributions,
        user_attrs={"is_baseline": result.is_baseline, "rebuilt": True, **attrs(result)},
    )
