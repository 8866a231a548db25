"""Each tracker with its real package and no network, read back with the package's own reader:
TensorBoard event files through tensorboard's EventAccumulator (scalars and hparams per trial), W&B in
offline mode through its run files (the records in ``run-*.wandb`` parsed with wandb's protobufs, and the
trials table), MLflow's local file store through ``MlflowClient``. Then what the framework is told, and
the one-line error of a missing package."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest

from autotune.errors import UsageError
from autotune.records import SteadyEstimate, TrialResult, TrialStatus
from autotune.trackers import TRACKERS, StudyPlace, Trackers, TrialPlace

KNOBS = ("per_device_train_batch_size", "gradient_checkpointing", "vllm_mode")


def _results() -> list[TrialResult]:
    steady = SteadyEstimate(
        step_time_s=4.0, rel_ci95=0.02, steady_steps=5, warmup_steps=1, throughput=4.0, tokens_per_s=512.0
    )
    summary = {"phases": {"source": "markers", "seconds": {"rollout": 2.5, "train": 1.0, "weight_sync": 0.5}}}
    complete = TrialResult(
        number=0,
        params={"per_device_train_batch_size": 4, "gradient_checkpointing": True, "vllm_mode": "colocate"},
        is_baseline=True,
        status=TrialStatus.COMPLETE,
        reason="completed",
        steps=6,
        steady=steady,
        peak_mem_bytes=[30 * 2**30, 31 * 2**30],
        timeline_summary=summary,
        duration_s=40.0,
    )
    oom = TrialResult(
        number=1,
        params={"per_device_train_batch_size": 16, "gradient_checkpointing": False, "vllm_mode": "server"},
        status=TrialStatus.OOM,
        reason="CUDA out of memory",
        steps=1,
        duration_s=12.0,
    )
    return [complete, oom]


def _log(names: list[str], tmp_path: Path) -> Path:
    study = tmp_path / "demo"
    study.mkdir()
    trackers = Trackers(names, TRACKERS)
    trackers.start(StudyPlace(name="demo", directory=study, knob_names=KNOBS))
    for result in _results():
        trackers.log(result)
    trackers.finish()
    return study


def test_tensorboard_event_files_hold_each_trials_hparams_and_scalars(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import api_pb2, metadata

    study = _log(["tensorboard"], tmp_path)
    root = study / "tensorboard" / "autotune"
    experiment = EventAccumulator(str(root))
    experiment.Reload()
    content = experiment.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.EXPERIMENT_TAG]
    info = metadata.parse_experiment_plugin_data(content)
    assert [h.name for h in info.hparam_infos][:3] == list(KNOBS)
    assert "throughput_completions_per_s" in {m.name.tag for m in info.metric_infos}

    def session(n: int) -> tuple[dict, dict, int]:
        acc = EventAccumulator(str(root / f"trial-{n}"))
        acc.Reload()
        plugin = acc.PluginTagToContent(metadata.PLUGIN_NAME)
        start = metadata.parse_session_start_info_plugin_data(plugin[metadata.SESSION_START_INFO_TAG])
        end = metadata.parse_session_end_info_plugin_data(plugin[metadata.SESSION_END_INFO_TAG])
        hparams = {
            k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind")) for k, v in start.hparams.items()
        }
        scalars = {tag: acc.Scalars(tag)[0].value for tag in acc.Tags()["scalars"]}
        return hparams, scalars, end.status

    hparams, scalars, status = session(0)
    assert hparams == {
        "per_device_train_batch_size": 4.0,
        "gradient_checkpointing": True,
        "vllm_mode": "colocate",
        "trial": 0.0,
        "status": "COMPLETE",
    }
    assert scalars["throughput_completions_per_s"] == pytest.approx(4.0)
    assert scalars["tokens_per_s"] == pytest.approx(512.0)
    assert scalars["peak_mem_bytes_gpu1"] == pytest.approx(31 * 2**30)
    assert scalars["phase_rollout_s"] == pytest.approx(2.5)
    assert status == api_pb2.STATUS_SUCCESS
    hparams, scalars, status = session(1)
    assert hparams["status"] == "OOM" and hparams["per_device_train_batch_size"] == 16.0
    assert "throughput_completions_per_s" not in scalars and scalars["duration_s"] == pytest.approx(12.0)
    assert status == api_pb2.STATUS_FAILURE


def _wandb_records(run_file: Path) -> list:
    """The records of a ``run-*.wandb`` file (W&B's log: 32 KiB blocks of checksummed chunks, after a
    7-byte header), parsed with wandb's own protobuf."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, chunk, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


def test_wandb_offline_run_files_hold_a_row_per_trial_and_the_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for name in ("WANDB_PROJECT", "WANDB_DIR", "WANDB_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    study = _log(["wandb"], tmp_path)
    (run_dir,) = (study / "wandb").glob("offline-run-*")
    run_file = next(run_dir.glob("run-*.wandb"))
    # wandb's service process writes the file: finish() can return before the last records land
    records: list = []
    for _ in range(600):
        records = _wandb_records(run_file)
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            break
        time.sleep(0.05)
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.project == "demo" and run.display_name == "demo-autotune" and run.run_group == "demo"
    rows = []
    for r in records:
        if r.WhichOneof("record_type") == "history":
            row = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item}
            if "trial" in row:
                rows.append(row)
    assert [r["trial"] for r in rows] == [0, 1]
    assert rows[0]["knob/per_device_train_batch_size"] == 4 and rows[0]["knob/vllm_mode"] == "colocate"
    assert rows[0]["throughput_completions_per_s"] == pytest.approx(4.0) and rows[0]["status"] == "COMPLETE"
    assert rows[1]["status"] == "OOM" and "throughput_completions_per_s" not in rows[1]
    tables = sorted((run_dir / "files" / "media" / "table").glob("trials_*.table.json"))
    last = max((json.loads(p.read_text()) for p in tables), key=lambda t: len(t["data"]))
    columns = last["columns"]
    assert columns[:6] == ["trial", "status", "baseline", *KNOBS]
    by_trial = {row[0]: dict(zip(columns, row, strict=True)) for row in last["data"]}
    assert by_trial[0]["throughput_completions_per_s"] == pytest.approx(4.0)
    assert by_trial[1]["status"] == "OOM" and by_trial[1]["throughput_completions_per_s"] is None


def test_mlflow_file_store_holds_a_nested_run_per_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    study = _log(["mlflow"], tmp_path)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(study / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("demo")
    assert experiment is not None
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    parent = runs["demo-autotune"]
    assert parent.info.status == "FINISHED"
    for name in ("trial-0", "trial-1"):
        assert runs[name].data.tags["mlflow.parentRunId"] == parent.info.run_id
    t0, t1 = runs["trial-0"].data, runs["trial-1"].data
    assert t0.params == {
        "per_device_train_batch_size": "4",
        "gradient_checkpointing": "True",
        "vllm_mode": "colocate",
    }
    assert t0.metrics["throughput_completions_per_s"] == pytest.approx(4.0)
    assert t0.metrics["peak_mem_bytes_gpu0"] == pytest.approx(30 * 2**30)
    assert t0.tags["status"] == "COMPLETE" and t0.tags["baseline"] == "true"
    assert t1.tags["status"] == "OOM" and "throughput_completions_per_s" not in t1.metrics
    assert runs["trial-1"].info.status == "FAILED"


def test_each_run_of_the_framework_is_named_after_the_study_and_trial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("WANDB_PROJECT", "WANDB_DIR", "MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    monkeypatch.delenv("TENSORBOARD_DIR", raising=False)
    trackers = Trackers(["wandb", "tensorboard", "mlflow", "wandb"], TRACKERS)
    assert trackers.report_to == ("wandb", "tensorboard", "mlflow")
    study = tmp_path / "demo"
    place = TrialPlace(study="demo", study_dir=study, trial_dir=study / "trials" / "3")
    assert place.run_name == "demo-trial-3"
    env = trackers.trial_env(place)
    assert env["WANDB_NAME"] == "demo-trial-3" and env["WANDB_PROJECT"] == "demo"
    assert env["WANDB_DIR"] == str(study / "trials" / "3")
    assert (
        env["TENSORBOARD_LOGGING_DIR"]
        == env["TENSORBOARD_DIR"]
        == str(study / "trials" / "3" / "tensorboard")
    )
    assert env["MLFLOW_TRACKING_URI"] == (study.resolve() / "mlruns").as_uri()
    assert env["MLFLOW_EXPERIMENT_NAME"] == "demo"
    # the user's own settings are theirs: autotune names the run, nests its directory, sets nothing else
    monkeypatch.setenv("WANDB_PROJECT", "team")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow.internal:5000")
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    again = trackers.trial_env(
        TrialPlace(study="demo", study_dir=study, trial_dir=study / "trials" / "confirm-3-1")
    )
    assert "WANDB_PROJECT" not in again and "MLFLOW_TRACKING_URI" not in again
    assert again["WANDB_NAME"] == "demo-confirm-3-1"
    folder = Path(again["TENSORBOARD_LOGGING_DIR"]).relative_to(tmp_path / "tb")
    assert folder.parts[0].startswith("demo-") and folder.parts[1:] == ("demo-confirm-3-1",)


def test_an_unknown_or_missing_tracker_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(
        UsageError, match="--report-to neptune is not a tracker autotune knows.*tensorboard, wandb, mlflow"
    ):
        Trackers(["neptune"], TRACKERS)
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(UsageError) as err:
        Trackers(["tensorboard", "wandb"], TRACKERS)
    line = err.value.one_line()
    assert "\n" not in line and "wandb package" in line and "pip install 'autotune-grpo[wandb]'" in line


def test_profile_names_the_commands_run_after_its_directory_and_logs_one_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from autotune.app.tracking import ProfileTracking

    for name in ("TENSORBOARD_LOGGING_DIR", "TENSORBOARD_DIR", "WANDB_PROJECT", "WANDB_DIR"):
        monkeypatch.delenv(name, raising=False)
    out = tmp_path / "profile-1"
    out.mkdir()
    tracking = ProfileTracking(("tensorboard", "wandb"), out)
    env = tracking.env()
    assert env["WANDB_NAME"] == "profile-1" and env["WANDB_DIR"] == str(out)
    assert env["TENSORBOARD_LOGGING_DIR"] == str(out / "tensorboard")
    assert ProfileTracking((), out).env() == {}
    only_tb = ProfileTracking(("tensorboard",), out)
    only_tb.log(_results()[0].model_copy(update={"number": 0, "params": {}}))
    acc = EventAccumulator(str(out / "tensorboard" / "autotune" / "trial-0"))
    acc.Reload()
    assert acc.Scalars("throughput_completions_per_s")[0].value == pytest.approx(4.0)
