"""``--report-to mlflow``: MLflow runs.

The tracking server is the user's ``MLFLOW_TRACKING_URI``; without one, a local file store in the study
directory (``<study>/mlruns``, opened with ``MLFLOW_ALLOW_FILE_STORE``, which MLflow 3 asks for a file
store). The experiment is the user's ``MLFLOW_EXPERIMENT_NAME``, else the study's name (verl names it
after ``trainer.project_name``, which autotune sets to the study's name). The trial's framework logs its
run named ``<study>-trial-<n>`` (the Trainer's ``run_name``, verl's ``trainer.experiment_name``).

The study's run is ``<study>-autotune``, with one nested run per ended trial (``trial-<n>``: the knobs as
parameters, the measurements as metrics, ``status`` as a tag), which MLflow's run comparison and
parallel-coordinates plot read. Written through ``MlflowClient`` (no process-wide active run).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from autotune.trackers._base import StudyPlace, Tracker, TrialPlace, TrialRow, user_env

__all__ = ["MlflowTracker", "tracking_uri"]

_URI = "MLFLOW_TRACKING_URI"
_EXPERIMENT = "MLFLOW_EXPERIMENT_NAME"
_ALLOW_FILES = "MLFLOW_ALLOW_FILE_STORE"


def tracking_uri(study_dir: Path) -> str:
    """The user's tracking URI, else the study's local file store."""
    return user_env(_URI) or (study_dir.resolve() / "mlruns").as_uri()


class MlflowTracker(Tracker):
    name = "mlflow"
    module = "mlflow"
    extra = "mlflow"
    help = "MLflow runs (MLFLOW_TRACKING_URI, else a file store in the study directory)"

    def __init__(self) -> None:
        self._client: Any = None
        self._experiment_id: str | None = None
        self._parent: str | None = None

    def trial_env(self, place: TrialPlace) -> dict[str, str]:
        env = {}
        if user_env(_URI) is None:
            env[_URI] = tracking_uri(place.study_dir)
            env[_ALLOW_FILES] = "true"
        if user_env(_EXPERIMENT) is None:
            env[_EXPERIMENT] = place.study
        return env

    def start(self, study: StudyPlace) -> None:
        from mlflow.tracking import MlflowClient

        if user_env(_URI) is None:
            # a file store MLflow 3 only opens when asked to (the variable is read when the store opens)
            os.environ.setdefault(_ALLOW_FILES, "true")
        self._client = MlflowClient(tracking_uri=tracking_uri(study.directory))
        name = user_env(_EXPERIMENT) or study.name
        found = self._client.get_experiment_by_name(name)
        self._experiment_id = (
            found.experiment_id if found is not None else self._client.create_experiment(name)
        )
        run = self._client.create_run(self._experiment_id, run_name=f"{study.name}-autotune")
        self._parent = run.info.run_id
        self._client.log_param(self._parent, "knobs", ",".join(study.knob_names)[:6000])

    def log_trial(self, row: TrialRow) -> None:
        from mlflow.entities import Metric, Param, RunTag

        if self._client is None or self._parent is None:
            raise RuntimeError("log_trial before start")
        run = self._client.create_run(
            self._experiment_id,
            run_name=f"trial-{row.number}",
            tags={"mlflow.parentRunId": self._parent, "status": row.status, "trial": str(row.number)},
        )
        now_ms = int(run.info.start_time)
        self._client.log_batch(
            run.info.run_id,
            metrics=[Metric(k, v, now_ms, 0) for k, v in row.metrics.items()],
            params=[Param(k, str(v)) for k, v in row.knobs.items()],
            tags=[RunTag("baseline", str(row.is_baseline).lower())],
        )
        self._client.set_terminated(run.info.run_id, "FINISHED" if row.status == "COMPLETE" else "FAILED")

    def finish(self) -> None:
        if self._client is not None and self._parent is not None:
            self._client.set_terminated(self._parent)
        self._client = None
        self._parent = None
