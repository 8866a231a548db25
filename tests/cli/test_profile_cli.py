"""``autotune profile`` through the installed CLI around a real CPU GRPO trial (TRL, tiny Qwen2): the
timeline with its host series, phases from the markers the trial writes, the result and the report."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from autotune.probes.timeline import read_timeline

from autotune.backends._base import ModelRef, TrialContext
from autotune.records import TrialSpec


@pytest.mark.e2e
@pytest.mark.trl
def test_profile_of_a_real_trl_trial(cli, tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from autotune.backends.trl.backend import TrlBackend
    from autotune.workload.tinymodels import ensure_model

    model = ensure_model("tiny-qwen2", tmp_path / "models")
    trial_dir = tmp_path / "job"
    trial_dir.mkdir()
    ctx = TrialContext(
        study_dir=tmp_path,
        trial_dir=trial_dir,
        model=ModelRef("tiny-qwen2", str(model), local=True),
        gpus=(),
        global_batch=16,
        num_generations=4,
        max_steps=3,
        max_completion_length=16,
        fixed={"beta": 0.04},
    )
    backend = TrlBackend()
    params = {"per_device_train_batch_size": 8}
    plan = backend.render(TrialSpec(number=1, params=params, derived=backend.derive(params, ctx)), ctx)
    out = tmp_path / "profile"

    proc = cli("profile", "--out", str(out), "--metrics-file", plan.metrics_paths[0], "--", *plan.argv)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "COMPLETE" and result["steps"] == 3
    timeline = read_timeline(out / "timeline.parquet")
    host = timeline[timeline["source"] == "host"]
    assert len(host) >= 2 and host["rss_bytes"].max() > 0
    markers = [json.loads(line) for line in (out / "phases.jsonl").read_text().splitlines()]
    assert {(m["phase"], m["step"]) for m in markers} >= {
        (p, s) for p in ("rollout", "train") for s in (1, 2, 3)
    }
    phases = result["timeline_summary"]["phases"]
    assert (
        phases["source"] == "markers" and phases["seconds"]["rollout"] > 0 and phases["seconds"]["train"] > 0
    )
    assert (out / "report.html").stat().st_size > 0 and "report.md" in proc.stdout


USER_SCRIPT = Path(__file__).parents[1] / "probes" / "data" / "user_grpo_script.py"


def test_profile_of_a_clean_exit_without_steps_is_a_finished_run(cli, tmp_path: Path) -> None:
    """No step records and exit 0: a whole-run profile, not a crash; labels name what was measured."""
    import sys

    out = tmp_path / "profile"
    script = "import time\nt = time.monotonic()\nwhile time.monotonic() - t < 1.0:\n    pass\n"
    proc = cli("profile", "--out", str(out), "--", sys.executable, "-c", script)

    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "COMPLETE" and result["steps"] == 0
    assert "whole run" in result["reason"]
    summary = result["timeline_summary"]
    # without steps the window is the whole sampled timeline (recorded timestamps, not a length)
    window = summary["window"]
    assert window["t1_mono_s"] > window["t0_mono_s"]
    assert summary["duration_s"] == pytest.approx(window["t1_mono_s"] - window["t0_mono_s"], rel=1e-9)
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    assert "CRASH" not in md and "COMPLETE" in md
    if not summary["gpus"]:  # the host probe measured the CPU: no label may call it a GPU
        assert "GPU utilization" not in md and "GPU utilization" not in html
        assert re.search(r"^- Mean CPU use \(share of all cores\): \d+ %$", md, re.M), md
        assert "Peak memory per GPU" not in md
        assert re.search(r"^- Peak RSS \(process tree\): [\d.]+ [KMG]iB RSS;", md, re.M), md
    else:
        assert "Mean GPU utilization" in md


def _profile_user_script(
    cli, tmp_path: Path, profile_options: tuple[str, ...] = (), script_options: tuple[str, ...] = ()
) -> tuple[Path, dict]:
    """``autotune profile [options] -- python user_grpo_script.py MODEL OUT [options]``; (run dir, result)."""
    pytest.importorskip("trl")
    import sys

    from autotune.workload.tinymodels import ensure_model

    model = ensure_model("tiny-qwen2", tmp_path / "models")
    out = tmp_path / "profile"
    script = [sys.executable, str(USER_SCRIPT), str(model), str(tmp_path / "o")]
    proc = cli("profile", "--out", str(out), *profile_options, "--", *script, *script_options)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, json.loads((out / "result.json").read_text())


@pytest.mark.e2e
@pytest.mark.trl
def test_profile_of_a_user_script_with_the_callback(cli, tmp_path: Path) -> None:
    """``autotune profile -- python user_script.py``: the callback's step records and exact phases."""
    out, result = _profile_user_script(cli, tmp_path)
    assert result["status"] == "COMPLETE" and result["steps"] == 3, result["reason"]
    records = [json.loads(x) for x in (out / "command_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3] and all(r["samples"] == 8 for r in records)
    markers = [json.loads(line) for line in (out / "phases.jsonl").read_text().splitlines()]
    assert {(m["phase"], m["step"]) for m in markers} >= {
        (p, s) for p in ("rollout", "other", "train") for s in (1, 2, 3)
    }
    phases = result["timeline_summary"]["phases"]
    assert phases["source"] == "markers"
    assert (
        phases["seconds"]["rollout"] > 0 and phases["seconds"]["train"] > 0 and phases["seconds"]["other"] > 0
    )


@pytest.mark.e2e
@pytest.mark.trl
def test_profile_of_a_plain_trl_script_reads_its_printed_dicts(cli, tmp_path: Path) -> None:
    """Without the callback the trainer's printed log dicts are the step records."""
    out, result = _profile_user_script(cli, tmp_path, ("--global-batch", "8"), ("--no-callback",))
    assert result["status"] == "COMPLETE" and result["steps"] == 3, result["reason"]
    assert not (out / "command_metrics.jsonl").exists()
    assert result["steady"] is None or result["steady"]["throughput"] > 0


def test_profile_streams_the_commands_output_and_says_its_seconds_per_step(cli, tmp_path: Path) -> None:
    """The command's own lines reach the terminal while it runs (still recorded in its logs), in order
    with its steps; without --global-batch the summary still gives the seconds per step it measured."""
    import subprocess
    import sys

    from tests.cli.conftest import autotune_exe

    go = tmp_path / "go"
    script = (
        "import json, os, sys, time\n"
        "print('hello from the job', flush=True)\n"
        "print('a warning of the job', file=sys.stderr, flush=True)\n"
        # waits until the test has seen the first line: proof it arrived while the job ran
        f"while not os.path.exists({str(go)!r}):\n"
        "    time.sleep(0.05)\n"
        "for i in range(1, 7):\n"
        "    time.sleep(0.1)\n"
        "    print(json.dumps({'step': i, 'loss': 0.5}), flush=True)\n"
    )
    out = tmp_path / "profile"
    proc = subprocess.Popen(
        [autotune_exe(), "profile", "--out", str(out), "--", sys.executable, "-c", script],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert "hello from the job" in first  # seen while the command still runs (it waits for us)
    assert proc.poll() is None
    go.touch()
    rest, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "a warning of the job" in err
    assert "hello from the job" in (out / "stdout.log").read_text()
    summary = next(line for line in rest.splitlines() if line.startswith("COMPLETE:"))
    assert "6 step(s)" in summary and " s/step at steady state" in summary and "--global-batch" in summary
