"""The study's run in the experiment trackers (``--report-to``), fed by the study's view events.

:class:`TrackingView` stands in front of the live view: it passes every event on, opens the trackers'
study run when the study starts, logs each trial that ends (a row: knobs, measurements, status) and
closes the run with the view. The trials' own framework runs are the executor's
(:class:`autotune.trial.execute.Executor`, ``trackers``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.records import TrialResult, TrialStatus
from autotune.trackers import TRACKERS, StudyPlace, Trackers, TrialPlace
from autotune.trial.live import LiveGpus

__all__ = ["TrackingView", "trackers_for", "tracking_view", "ProfileTracking"]


def trackers_for(names: tuple[str, ...]) -> Trackers | None:
    """The trackers of ``--report-to`` (each one's package checked now), or None without any.

    Raises:
        UsageError: an unknown tracker, or one whose package is not installed.
    """
    return Trackers(names, TRACKERS) if names else None


def tracking_view(
    view: object,
    trackers: Trackers | None,
    out: Path,
    knob_names: tuple[str, ...],
    stop: threading.Event | None = None,
) -> Any:
    """``view``, or a :class:`TrackingView` in front of it that also logs the study in ``trackers``."""
    if trackers is None:
        return view
    place = StudyPlace(name=out.name, directory=out, knob_names=knob_names)
    return TrackingView(view, trackers, place, stop=stop)


class TrackingView:
    """A study view that logs the study in the trackers and forwards everything to ``inner``.

    Args:
        inner: the live view (the CLI's rich table, or a quiet one).
        trackers: the study's trackers.
        study: the study as the trackers name it.
        stop: the study's stop (the user's signal): a wait on a tracker that has not answered ends
            when it is set, and the study stops as between trials.
    """

    def __init__(
        self, inner: Any, trackers: Trackers, study: StudyPlace, *, stop: threading.Event | None = None
    ) -> None:
        self.inner = inner
        self.trackers = trackers
        self.study = study
        self.stop = stop

    def use_labels(self, labels: Mapping[str, str]) -> None:
        self.inner.use_labels(labels)

    def gpu_board(self) -> LiveGpus | None:
        board: LiveGpus | None = self.inner.gpu_board()
        return board

    def study_started(self, cfg: Any, done: int, budget: int) -> None:
        self.trackers.start(self.study, stop=self.stop)
        self.inner.study_started(cfg, done, budget)

    def trial_started(self, number: int, params: Mapping[str, Any], is_baseline: bool) -> None:
        self.inner.trial_started(number, params, is_baseline)

    def trial_step(self, number: int, step: int, throughput: float | None) -> None:
        self.inner.trial_step(number, step, throughput)

    def trial_finished(self, result: TrialResult) -> None:
        if result.status is not TrialStatus.INTERRUPTED:  # an interrupted trial runs again: logged then
            self.trackers.log(result, stop=self.stop)
        self.inner.trial_finished(result)

    def notice(self, text: str) -> None:
        self.inner.notice(text)

    def remeasure_started(self, runs: int) -> None:
        self.inner.remeasure_started(runs)

    def remeasure_ran(self) -> None:
        self.inner.remeasure_ran()

    def close(self) -> None:
        try:
            self.trackers.finish()
        finally:
            self.inner.close()


class ProfileTracking:
    """``autotune profile --report-to``: the command's own run gets the trackers' variables (its
    framework reports where the command says, into the profile's directory, named after it), and the
    profile is logged as a study of one row.

    Args:
        names: the ``--report-to`` values.
        out: the profile's directory.

    Raises:
        UsageError: an unknown tracker, or one whose package is not installed (before anything runs).
    """

    def __init__(self, names: tuple[str, ...], out: Path) -> None:
        self.trackers = trackers_for(names)
        self.out = out

    def env(self) -> dict[str, str]:
        """The variables the command runs with (none without trackers)."""
        if self.trackers is None:
            return {}
        place = TrialPlace(study=self.out.name, study_dir=self.out, trial_dir=self.out, run=self.out.name)
        return self.trackers.trial_env(place)

    def log(self, result: TrialResult) -> None:
        """Log the profiled run as the one row of a study named after the directory."""
        if self.trackers is None:
            return
        self.trackers.start(StudyPlace(name=self.out.name, directory=self.out))
        try:
            self.trackers.log(result)
        finally:
            self.trackers.finish()
