"""Real vLLM (its CPU build) in TRL studies on the CPU, through the installed CLI.

Each vLLM trial costs 20-40 s on an idle 2-core machine (engine start-up), so these studies are small.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl")
pytest.importorskip("vllm")

#: the packaged space's vLLM knobs, with a CPU range this host can always give
SPACE = """backend: trl
knobs:
  per_device_train_batch_size: {type: int, choices: [2, 4], default: 4, memory: increasing}
  use_vllm: {type: bool, default: false, applies: vllm}
  vllm_gpu_memory_utilization:
    {type: float, low: 0.3, high: 0.9, step: 0.05, default: 0.3, when: {use_vllm: [true]}, applies: vllm,
     cpu: {low: 0.1, high: 0.15, default: 0.1}}
  vllm_enable_sleep_mode: {type: bool, default: false, when: {use_vllm: [true]}, applies: vllm_sleep}
"""
JOB = ("--max-steps", "3", "--global-batch", "4", "--num-generations", "2", "--max-completion-length", "8")


def _results(out: Path) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in sorted((out / "trials").glob("[0-9]*/result.json"))]


@pytest.mark.e2e
@pytest.mark.trl
def test_trl_study_runs_real_vllm_and_times_its_generation_and_weight_sync(cli, tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    out = tmp_path / "study"
    args = ("search", "--model", "tiny-qwen2", "--backend", "trl", "--space", str(space), "--out", str(out))
    done = cli(*args, "--trials", "2", *JOB, "--pin", "use_vllm=true", "--confirm-runs", "0", timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # what vLLM's CPU platform refuses is dropped with its own words
    assert "Sleep mode is not supported on current platform." in done.stdout + done.stderr
    healthy = [r for r in _results(out) if r["status"] == "COMPLETE" and r["params"]["use_vllm"] is True]
    assert healthy, [(r["number"], r["status"], r["reason"]) for r in _results(out)]
    seconds = healthy[0]["timeline_summary"]["phases"]["seconds"]
    assert seconds["rollout"] > 0 and seconds["weight_sync"] > 0, seconds
    report = (out / "report.md").read_text()
    assert "vLLM's CPU build" in report  # what a CPU run cannot show of vLLM on GPUs


@pytest.mark.e2e
@pytest.mark.trl
def test_a_memory_share_the_host_cannot_give_is_vllms_own_start_up_failure(cli, tmp_path: Path) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(
        SPACE.replace("cpu: {low: 0.1, high: 0.15, default: 0.1}", "cpu: {choices: [0.99], default: 0.99}")
    )
    out = tmp_path / "study"
    args = ("search", "--model", "tiny-qwen2", "--backend", "trl", "--space", str(space), "--out", str(out))
    done = cli(*args, "--trials", "1", *JOB, "--pin", "use_vllm=true", "--confirm-runs", "0", timeout=900)
    (result,) = _results(out)
    assert result["status"] == "VLLM_INIT", (result["status"], result["reason"], done.stdout[-2000:])
    assert "less than desired CPU memory utilization" in (result.get("evidence") or ""), result
