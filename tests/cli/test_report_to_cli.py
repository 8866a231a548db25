"""``autotune search --report-to``: a short real study (``command`` backend) whose trials get the
tracker's variables and whose study run TensorBoard reads back (one HParams session per trial); an
unknown tracker is one line, exit 2, before anything is touched."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.cli.conftest import run_cli

FAULT = str(Path(__file__).resolve().parents[1] / "fixtures" / "faults" / "fault.py")


def test_search_reports_the_study_to_tensorboard(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    space = tmp_path / "space.yaml"
    space.write_text("backend: command\nknobs:\n  bs: {type: int, choices: [1, 2], default: 1}\n")
    out = tmp_path / "demo"
    proc = run_cli(
        "search", "--backend", "command", "--space", str(space), "--out", str(out), "--search", "grid",
        "--trials", "2", "--confirm-runs", "0", "--startup-timeout", "60s", "--report-to", "tensorboard",
        "--", sys.executable, FAULT, "--mode", "ok", "--steps", "5", "--step-s", "0.05",
        env={"TENSORBOARD_LOGGING_DIR": "", "TENSORBOARD_DIR": ""},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for n in (0, 1):
        launch = json.loads((out / "trials" / str(n) / "launch.json").read_text())
        assert launch["env"]["TENSORBOARD_LOGGING_DIR"] == str(out / "trials" / str(n) / "tensorboard")
        acc = EventAccumulator(str(out / "tensorboard" / "autotune" / f"trial-{n}"))
        acc.Reload()
        start = metadata.parse_session_start_info_plugin_data(
            acc.PluginTagToContent(metadata.PLUGIN_NAME)[metadata.SESSION_START_INFO_TAG]
        )
        assert (
            start.hparams["bs"].number_value == n + 1 and start.hparams["status"].string_value == "COMPLETE"
        )
        result = json.loads((out / "trials" / str(n) / "result.json").read_text())
        logged = acc.Scalars("throughput_completions_per_s")[0].value
        assert abs(logged - result["steady"]["throughput"]) <= 1e-6 * result["steady"]["throughput"]


def test_an_unknown_tracker_is_one_line_before_anything_is_touched(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = run_cli(
        "search", "--backend", "command", "--out", str(out), "--report-to", "neptune", "--", "true"
    )
    assert proc.returncode == 2
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "--report-to neptune is not a tracker" in lines[0], proc.stderr
    assert "tensorboard, wandb, mlflow" in lines[0] and "Traceback" not in proc.stderr
    assert not out.exists()
