"""What Optuna's own tools show of a study, kept honest and small.

* **Values are measurements.** A trial's intermediate values are its measured throughput so far
  (completions/s of the steps it ran, the runner's steady estimate), never the optimistic bound the
  pruner judges by; the bound is handed to the pruner beside them (:class:`MeasuredReports`). A PRUNED
  trial's value (Optuna takes its last intermediate value) is the throughput it measured: when the
  trial's final estimate differs from the last value reported, it is reported once more, one step after
  its last step. A trial pruned before it ran has no value.
* **Attributes people read stay small.** ``optuna studies`` prints every user attribute of a study on
  one row; those are a few short facts and ``study_json``, the path of ``study.json`` that holds the full
  settings (:func:`shown_attrs`; not named ``settings``, which older studies used for the settings
  themselves and :class:`MachineAttrs` still reads). What autotune itself reads back (the full settings, the study's
  identity, the hardware, the workers' records) lives in the study's *system* attributes
  (:class:`MachineAttrs`), which Optuna's listings do not print.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import optuna

__all__ = ["MachineAttrs", "MeasuredReports", "shown_attrs"]

_PREFIX = "autotune:"


class MachineAttrs:
    """The attributes autotune reads back from a study, stored as Optuna system attributes.

    Optuna's ``Study`` has no public setter or getter of study system attributes since 3.1; the
    storage's own (``BaseStorage.set_study_system_attr`` / ``get_study_system_attrs``) are public and
    are what this class calls. Studies written before these attributes moved kept them as user
    attributes: :meth:`get` and :meth:`items` read those when the system attribute is absent.
    """

    def __init__(self, study: optuna.Study) -> None:
        self._study = study
        # the one link from a Study to its storage Optuna keeps private
        self._storage: optuna.storages.BaseStorage = study._storage
        self._id = self._storage.get_study_id_from_name(study.study_name)

    def set(self, key: str, value: Any) -> None:
        """Store ``value`` (JSON-serialisable) under ``key``."""
        self._storage.set_study_system_attr(self._id, _PREFIX + key, value)

    def get(self, key: str, default: object = None) -> Any:
        """The value under ``key`` (a legacy user attribute of that name when there is none)."""
        stored = self._storage.get_study_system_attrs(self._id)
        if _PREFIX + key in stored:
            return stored[_PREFIX + key]
        return self._study.user_attrs.get(key, default)

    def items(self) -> Iterator[tuple[str, Any]]:
        """Every attribute autotune stored (legacy user attributes first, overridden by the new ones)."""
        merged = dict(self._study.user_attrs)
        stored = self._storage.get_study_system_attrs(self._id)
        merged.update({k[len(_PREFIX) :]: v for k, v in stored.items() if k.startswith(_PREFIX)})
        return iter(merged.items())


def shown_attrs(*, backend: str, model: str, gpus: str, settings_path: str) -> dict[str, str]:
    """The study's user attributes: what a person reads in ``optuna studies`` or optuna-dashboard.

    Args:
        backend: the framework (``trl``, ``swift``, ...).
        model: the model's short name.
        gpus: the GPUs in a few words (``2x NVIDIA H100 80GB HBM3``, ``cpu``).
        settings_path: where the full settings are (``study.json``).
    """
    return {"backend": backend, "model": model[:60], "gpus": gpus[:60], "study_json": settings_path}


class MeasuredReports:
    """A trial's reports to Optuna: measured throughput as the value, the optimistic bound for the pruner.

    One per study process; trials of several worker threads report through it (each trial number is
    one thread's).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bound: dict[int, float] = {}
        self._last: dict[int, tuple[int, float]] = {}

    def report(self, trial: optuna.Trial, step: int, throughput: float, optimistic: float) -> None:
        """Report the throughput measured up to ``step``; keep ``optimistic`` for :meth:`bound`."""
        trial.report(throughput, step)
        with self._lock:
            self._bound[trial.number] = optimistic
            self._last[trial.number] = (step, throughput)

    def bound(self, number: int) -> float | None:
        """The optimistic end of trial ``number``'s latest estimate (what the pruner compares)."""
        with self._lock:
            return self._bound.get(number)

    def finish_pruned(self, trial: optuna.Trial, throughput: float | None, steps: int) -> None:
        """Before a PRUNED trial is told: make its last intermediate value the throughput it measured."""
        with self._lock:
            last = self._last.pop(trial.number, None)
            self._bound.pop(trial.number, None)
        if throughput is None or (last is not None and last[1] == throughput):
            return
        step = last[0] + 1 if last is not None else max(steps, 0)
        trial.report(throughput, step)

    def forget(self, number: int) -> None:
        """Drop what is kept of a trial that ended otherwise."""
        with self._lock:
            self._last.pop(number, None)
            self._bound.pop(number, None)
