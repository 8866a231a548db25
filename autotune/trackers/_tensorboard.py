"""``--report-to tensorboard``: event files TensorBoard's Scalars and HParams views read.

The trial's framework writes its own event files into ``<trial>/tensorboard`` (``TENSORBOARD_LOGGING_DIR``
for the Hugging Face Trainer that TRL and ms-swift run, ``TENSORBOARD_DIR`` for verl), or under the
user's own directory when they set one (``<theirs>/<study>-<id>/<run>``, ``<id>`` a digest of the study
directory's path: two studies whose folders share a name never share, nor delete, each other's files). The study's run is
``<study>/tensorboard/autotune``: the hparams experiment (knobs and metrics) at its root and one session
per trial in ``trial-<n>/`` (the knobs as hyper-parameters, the measurements as scalars, the status as
the session's end), so ``tensorboard --logdir <study>`` shows the trials side by side in HParams.

Written with ``tensorboard``'s own protos and event writer (no TensorFlow, no torch).
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

from autotune.trackers._base import StudyPlace, Tracker, TrialPlace, TrialRow, user_env
from autotune.writable import ensure_writable

__all__ = ["TensorBoardTracker", "STUDY_RUN"]

#: the study run's folder under the tracker's directory
STUDY_RUN = "autotune"
_HF_DIR = "TENSORBOARD_LOGGING_DIR"
_VERL_DIR = "TENSORBOARD_DIR"


class TensorBoardTracker(Tracker):
    name = "tensorboard"
    module = "tensorboard"
    extra = "tensorboard"
    help = "TensorBoard event files (trials' curves, and the trials side by side in HParams)"

    def __init__(self) -> None:
        self._root: Path | None = None
        self._metrics: set[str] = set()
        self._knobs: tuple[str, ...] = ()

    def trial_env(self, place: TrialPlace) -> dict[str, str]:
        theirs = user_env(_HF_DIR) or user_env(_VERL_DIR)
        where = (
            Path(theirs) / _study_folder(place.study, place.study_dir) / place.run_name
            if theirs
            else place.trial_dir / "tensorboard"
        )
        return {_HF_DIR: str(where), _VERL_DIR: str(where)}

    def start(self, study: StudyPlace) -> None:
        theirs = user_env(_HF_DIR)
        if theirs:  # checked before the first trial, not found unusable after it
            ensure_writable(Path(theirs), flag=_HF_DIR)
        base = (
            Path(theirs) / _study_folder(study.name, study.directory)
            if theirs
            else study.directory / "tensorboard"
        )
        self._root = base / STUDY_RUN
        self._knobs = study.knob_names

    def log_trial(self, row: TrialRow) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2

        if self._root is None:
            raise RuntimeError("log_trial before start")
        knobs = dict(row.knobs)
        hparams: dict[str, Any] = {k: _hparam(v) for k, v in knobs.items()}
        hparams["trial"] = _hparam(row.number)
        hparams["status"] = _hparam(row.status)
        start = plugin_data_pb2.SessionStartInfo(
            group_name=f"trial-{row.number}", start_time_secs=time.time(), hparams=hparams
        )
        end = plugin_data_pb2.SessionEndInfo(
            status=api_pb2.STATUS_SUCCESS if row.status == "COMPLETE" else api_pb2.STATUS_FAILURE,
            end_time_secs=time.time(),
        )
        values = [
            _plugin_value(
                "_hparams_/session_start_info", plugin_data_pb2.HParamsPluginData(session_start_info=start)
            ),
            *(summary_pb2.Summary.Value(tag=name, simple_value=value) for name, value in row.metrics.items()),
            _plugin_value(
                "_hparams_/session_end_info", plugin_data_pb2.HParamsPluginData(session_end_info=end)
            ),
        ]
        _write(
            self._root / f"trial-{row.number}", [event_pb2.Event(summary=summary_pb2.Summary(value=values))]
        )
        new = set(row.metrics) - self._metrics
        if new:  # the experiment lists every metric seen so far: rewritten when a trial brings one
            self._metrics |= new
            self._write_experiment(self._root, knobs)

    def _write_experiment(self, root: Path, knobs: dict[str, Any]) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.plugins.hparams import api_pb2, plugin_data_pb2

        names = [*self._knobs, *(k for k in knobs if k not in self._knobs), "trial", "status"]
        experiment = api_pb2.Experiment(
            name=root.parent.name,
            time_created_secs=time.time(),
            hparam_infos=[api_pb2.HParamInfo(name=n) for n in names],
            metric_infos=[api_pb2.MetricInfo(name=api_pb2.MetricName(tag=m)) for m in sorted(self._metrics)],
        )
        value = _plugin_value(
            "_hparams_/experiment", plugin_data_pb2.HParamsPluginData(experiment=experiment)
        )
        for old in root.glob("events.out.tfevents.*"):
            old.unlink()
        _write(root, [event_pb2.Event(summary=summary_pb2.Summary(value=[value]))])

    def finish(self) -> None:
        self._root = None


def _study_folder(name: str, directory: Path) -> str:
    """The study's folder in a directory of the user's that several studies may share."""
    digest = hashlib.sha256(str(directory.resolve()).encode("utf-8", "surrogateescape")).hexdigest()
    return f"{name}-{digest[:8]}"


def _hparam(value: object) -> Any:
    from google.protobuf import struct_pb2

    if isinstance(value, bool):
        return struct_pb2.Value(bool_value=value)
    if isinstance(value, int | float):
        return struct_pb2.Value(number_value=float(value))
    return struct_pb2.Value(string_value=str(value))


def _plugin_value(tag: str, data: Any) -> Any:
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.plugins.hparams import metadata

    data.version = metadata.PLUGIN_DATA_VERSION
    return summary_pb2.Summary.Value(
        tag=tag,
        metadata=metadata.create_summary_metadata(data),
        tensor=metadata.NULL_TENSOR,
    )


def _write(directory: Path, events: list[Any]) -> None:
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    directory.mkdir(parents=True, exist_ok=True)
    writer = EventFileWriter(str(directory))
    try:
        for event in events:
            event.wall_time = time.time()
            writer.add_event(event)
    finally:
        writer.close()
