"""The trackers one study reports to (``--report-to``, repeatable), as one object."""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from autotune.errors import UsageError
from autotune.trackers._base import StudyPlace, Tracker, TrialPlace, row_of

if TYPE_CHECKING:
    from autotune.records import TrialResult

__all__ = ["Trackers", "trackers_help"]


def trackers_help(registry: Mapping[str, type[Tracker]]) -> str:
    """The flag's help, from the registry."""
    names = " / ".join(registry)
    each = "; ".join(f"{name}: {cls.help}" for name, cls in registry.items())
    return (
        f"Report to an experiment tracker, repeatable ({names}): each trial's framework logs its run"
        f" there (named <study>-trial-<n>) and autotune logs the study, one row per trial. {each}."
    )


class Trackers:
    """The study's trackers: the framework's ``report_to`` names and environment for each run, and the
    study's run (each ended trial logged to every tracker). Thread-safe: workers of one process share it.

    Args:
        names: the ``--report-to`` values, in order (repeats are dropped).
        registry: name → tracker class (:data:`autotune.trackers.TRACKERS`).

    Raises:
        UsageError: a name the registry does not have, or a tracker whose package is not installed.
    """

    def __init__(self, names: Sequence[str], registry: Mapping[str, type[Tracker]]) -> None:
        unknown = [n for n in names if n not in registry]
        if unknown:
            raise UsageError(
                f"--report-to {unknown[0]} is not a tracker autotune knows",
                hint=f"Use one of: {', '.join(registry)}",
            )
        self.trackers: list[Tracker] = [registry[n]() for n in dict.fromkeys(names)]
        for tracker in self.trackers:
            tracker.check_installed()
        self._lock = threading.Lock()
        self._started = False

    @property
    def report_to(self) -> tuple[str, ...]:
        """The frameworks' ``report_to`` names (the same words in the Trainer and in verl)."""
        return tuple(t.name for t in self.trackers)

    def trial_env(self, place: TrialPlace) -> dict[str, str]:
        """Every tracker's variables for one run of the framework."""
        env: dict[str, str] = {}
        for tracker in self.trackers:
            env.update(tracker.trial_env(place))
        return env

    def start(self, study: StudyPlace) -> None:
        """Open the study's run in every tracker (once; a second call does nothing)."""
        with self._lock:
            if self._started:
                return
            for tracker in self.trackers:
                tracker.start(study)
            self._started = True

    def log(self, result: TrialResult) -> None:
        """Log an ended trial in every tracker (after :meth:`start`)."""
        row = row_of(result)
        with self._lock:
            if not self._started:
                return
            for tracker in self.trackers:
                tracker.log_trial(row)

    def finish(self) -> None:
        """Close every tracker's study run (idempotent)."""
        with self._lock:
            for tracker in self.trackers:
                tracker.finish()
            self._started = False
