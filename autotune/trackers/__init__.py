"""Experiment trackers behind ``--report-to``: one class per tracker, one registry (:data:`TRACKERS`)."""

from __future__ import annotations

from autotune.trackers._base import StudyPlace, Tracker, TrialPlace, TrialRow, knob_value, row_of
from autotune.trackers._mlflow import MlflowTracker
from autotune.trackers._set import Trackers, trackers_help
from autotune.trackers._tensorboard import TensorBoardTracker
from autotune.trackers._wandb import WandbTracker

__all__ = [
    "TRACKERS",
    "StudyPlace",
    "Tracker",
    "Trackers",
    "TrialPlace",
    "TrialRow",
    "knob_value",
    "row_of",
    "trackers_help",
]

#: every tracker ``--report-to`` accepts, by name (the flag's choices and help are derived from it)
TRACKERS: dict[str, type[Tracker]] = {
    cls.name: cls for cls in (TensorBoardTracker, WandbTracker, MlflowTracker)
}
