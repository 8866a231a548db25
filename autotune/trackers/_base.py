"""The tracker contract: what a trial's framework is told, and how autotune logs the study.

A :class:`Tracker` does two things for ``--report-to NAME``:

* **the trial's own run.** :meth:`Tracker.trial_env` gives the environment the framework's reporter
  reads (directories, project, run name), and the backends put ``NAME`` in the framework's own option
  (``report_to`` of TRL and ms-swift, ``trainer.logger`` of verl) with the run named
  ``<study>-trial-<n>`` (:attr:`TrialPlace.run_name`). A variable the user already set (their W&B
  project, their MLflow server) is theirs: the tracker only fills what is missing, or nests its run under
  the user's directory.
* **the study's run.** The study opens the tracker once (:meth:`Tracker.start`), hands it one
  :class:`TrialRow` per trial that ended (:meth:`Tracker.log_trial`: knobs as hyper-parameters,
  measurements as metrics) and closes it (:meth:`Tracker.finish`); this is what TensorBoard's HParams
  view, a W&B parallel-coordinates chart or MLflow's run comparison reads.

Every tracker imports its package inside its methods (``--help`` and a study without ``--report-to``
never load it); :meth:`Tracker.check_installed` says in one line which extra to install.
"""

from __future__ import annotations

import importlib.util
import math
import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from autotune.errors import UsageError

if TYPE_CHECKING:  # the CLI derives its help from the registry: importing it stays light
    from autotune.records import TrialResult

__all__ = ["StudyPlace", "TrialPlace", "TrialRow", "Tracker", "row_of", "knob_value", "user_env"]

KnobValue = bool | int | float | str


@dataclass(frozen=True)
class StudyPlace:
    """The study a tracker logs.

    Attributes:
        name: the study's name (the project / experiment the runs are grouped under).
        directory: the study directory (where a tracker writes when the user named no place).
        knob_names: the searched knobs, in the space's order (the hyper-parameters of every row).
    """

    name: str
    directory: Path
    knob_names: tuple[str, ...] = ()


@dataclass(frozen=True)
class TrialPlace:
    """One run of a trial's framework: its study (name and directory), its directory and the run's name."""

    study: str
    study_dir: Path
    trial_dir: Path
    run: str | None = None

    @property
    def run_name(self) -> str:
        """``run`` when given; else ``<study>-trial-<n>`` for a trial, ``<study>-<directory>`` for a
        re-measurement run."""
        if self.run:
            return self.run
        name = self.trial_dir.name
        return f"{self.study}-trial-{name}" if name.isdigit() else f"{self.study}-{name}"


@dataclass(frozen=True)
class TrialRow:
    """What the study's run logs of one trial.

    Attributes:
        number: the trial's number.
        status: how it ended (``COMPLETE``, ``OOM``, ``PRUNED``, ...).
        is_baseline: the user's configuration.
        knobs: the trial's knob values (hyper-parameters).
        metrics: what it measured, units in the names (``throughput_completions_per_s``,
            ``tokens_per_s``, ``peak_mem_bytes_gpu0``, ``phase_rollout_s``, ``duration_s``, ``steps``);
            a measurement the trial does not have is absent.
    """

    number: int
    status: str
    is_baseline: bool
    knobs: Mapping[str, KnobValue]
    metrics: Mapping[str, float] = field(default_factory=dict)


def knob_value(value: object) -> KnobValue:
    """A knob's value as a tracker's hyper-parameter (bool, int, float or text)."""
    if isinstance(value, bool | int | float | str):
        return value
    return "none" if value is None else str(value)


def row_of(result: TrialResult) -> TrialRow:
    """The :class:`TrialRow` of a trial's result."""
    metrics: dict[str, float | int | None] = {
        "throughput_completions_per_s": result.throughput,
        "tokens_per_s": result.steady.tokens_per_s if result.steady is not None else None,
        "step_time_s": result.steady.step_time_s if result.steady is not None else None,
        "duration_s": result.duration_s,
        "steps": result.steps,
        "host_peak_rss_bytes": result.host_peak_rss_bytes,
    }
    for i, peak in enumerate(result.peak_mem_bytes):
        metrics[f"peak_mem_bytes_gpu{i}"] = peak
    phase_time_s = result.timeline_summary.phases.time_s if result.timeline_summary is not None else {}
    for name, seconds in phase_time_s.items():
        metrics[f"phase_{name}_s"] = seconds
    kept = {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v))
    }
    return TrialRow(
        number=result.number,
        status=result.status.value,
        is_baseline=result.is_baseline,
        knobs={k: knob_value(v) for k, v in result.params.items()},
        metrics=kept,
    )


class Tracker(ABC):
    """One experiment tracker behind ``--report-to`` (see the module docstring).

    Class facts: ``name`` (the flag's value, also the frameworks' ``report_to`` name), ``module`` (the
    package imported), ``extra`` (the ``pip install 'autotune-grpo[extra]'`` that brings it) and
    ``help`` (one line for the flag's help). Lifecycle: :meth:`check_installed` before the study;
    :meth:`trial_env` for every run, from the runs' threads; :meth:`start` once, then
    :meth:`log_trial` per ended trial, then :meth:`finish`, all from one thread at a time.
    """

    name: ClassVar[str]
    module: ClassVar[str]
    extra: ClassVar[str]
    help: ClassVar[str]

    def check_installed(self) -> None:
        """Raises :class:`~autotune.errors.UsageError` (one line) when the package is missing."""
        if importlib.util.find_spec(self.module) is None:
            raise UsageError(
                f"--report-to {self.name} needs the {self.module} package, which is not installed",
                hint=f"pip install 'autotune-grpo[{self.extra}]', or drop --report-to {self.name}",
            )

    @abstractmethod
    def trial_env(self, place: TrialPlace) -> dict[str, str]:
        """The environment the trial's framework reads for this tracker (only what the user left unset)."""

    @abstractmethod
    def start(self, study: StudyPlace) -> None:
        """Open the study's run."""

    @abstractmethod
    def log_trial(self, row: TrialRow) -> None:
        """Log one ended trial."""

    @abstractmethod
    def finish(self) -> None:
        """Close the study's run (idempotent)."""


def user_env(name: str) -> str | None:
    """A variable the user set (non-empty), else None."""
    value = os.environ.get(name, "").strip()
    return value or None
