"""``autotune profile`` through the installed CLI around a real CPU GRPO trial (TRL, tiny Qwen2): the
timeline with its host series, phases from the markers the trial writes, the result and the report."""

from __future__ import annotations

import json
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
