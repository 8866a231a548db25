"""``--report-to wandb``: Weights & Biases runs.

The trial's framework logs its run named ``<study>-trial-<n>`` in the group ``<study>``
(``WANDB_NAME``, ``WANDB_RUN_GROUP``; the Trainer's ``run_name``, verl's ``trainer.experiment_name``), in
the user's ``WANDB_PROJECT`` (else the study's name) and ``WANDB_DIR`` (else the trial's directory).
``WANDB_MODE`` and the credentials are the user's: autotune sets neither.

The study's run is ``<study>-autotune`` in the same project and group: one history row per ended trial
(``trial``, the knobs under ``knob/``, the measurements, ``status``) and a ``trials`` table of every row
so far, which W&B's parallel-coordinates and scatter charts plot.
"""

from __future__ import annotations

from typing import Any

from autotune.trackers._base import StudyPlace, Tracker, TrialPlace, TrialRow, user_env

__all__ = ["WandbTracker", "TABLE_KEY"]

#: the key of the table of trials in the study's run
TABLE_KEY = "trials"


class WandbTracker(Tracker):
    name = "wandb"
    module = "wandb"
    extra = "wandb"
    help = "Weights & Biases runs (WANDB_MODE=offline works without a network)"

    def __init__(self) -> None:
        self._run: Any = None
        self._rows: list[TrialRow] = []
        self._knobs: tuple[str, ...] = ()

    def trial_env(self, place: TrialPlace) -> dict[str, str]:
        env = {"WANDB_NAME": place.run_name, "WANDB_RUN_GROUP": place.study}
        if user_env("WANDB_PROJECT") is None:
            env["WANDB_PROJECT"] = place.study
        if user_env("WANDB_DIR") is None:
            env["WANDB_DIR"] = str(place.trial_dir)
        return env

    def start(self, study: StudyPlace) -> None:
        import wandb

        self._knobs = study.knob_names
        self._run = wandb.init(
            project=user_env("WANDB_PROJECT") or study.name,
            group=study.name,
            name=f"{study.name}-autotune",
            job_type="autotune-study",
            dir=user_env("WANDB_DIR") or str(study.directory),
            config={"study": study.name, "knobs": list(study.knob_names)},
            reinit="create_new",
        )

    def log_trial(self, row: TrialRow) -> None:
        import wandb

        if self._run is None:
            raise RuntimeError("log_trial before start")
        self._rows.append(row)
        knobs = {f"knob/{k}": v for k, v in row.knobs.items()}
        self._run.log({"trial": row.number, "status": row.status, **knobs, **row.metrics})
        columns, data = _table(self._rows, self._knobs)
        self._run.log({TABLE_KEY: wandb.Table(columns=columns, data=data)})

    def finish(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


def _table(rows: list[TrialRow], knob_order: tuple[str, ...]) -> tuple[list[Any], list[Any]]:
    """Every row so far as one table: trial, status, the knobs, then every metric any row has."""
    knobs = [*knob_order, *sorted({k for r in rows for k in r.knobs} - set(knob_order))]
    metrics = sorted({m for r in rows for m in r.metrics})
    columns: list[Any] = ["trial", "status", "baseline", *knobs, *metrics]
    data = [
        [
            r.number,
            r.status,
            r.is_baseline,
            *(r.knobs.get(k) for k in knobs),
            *(r.metrics.get(m) for m in metrics),
        ]
        for r in rows
    ]
    return columns, data
