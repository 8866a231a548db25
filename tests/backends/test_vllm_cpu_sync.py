"""The CPU weight-sync shim (:mod:`autotune.backends.vllm_cpu_sync`) against the real vLLM CPU engine.

A sync that runs without error is not enough (vLLM's own reload leaves a tied head stale): after a
perturbed update, vLLM's greedy tokens must be the updated Hugging Face model's, token for token.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

CHECK = Path(__file__).with_name("vllm_sync_check.py")


def _run(model_dir: Path, *extra: str) -> dict[str, list[int]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    proc = subprocess.run(
        [sys.executable, str(CHECK), str(model_dir), "patch", *extra],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.e2e
@pytest.mark.parametrize("embeddings", ["tied", "untied"])
def test_vllm_generates_the_updated_policy_after_a_sync(embeddings: str, tmp_path: Path) -> None:
    from autotune.workload.tinymodels import ensure_model

    model = ensure_model("tiny-qwen2")
    extra = ("untied", str(tmp_path / "untied")) if embeddings == "untied" else ()
    seen = _run(model, *extra)
    assert seen["after_vllm"] != seen["before"]  # the update changed what the policy generates
    assert seen["after_vllm"] == seen["after_hf"]
