"""ms-swift's ``vllm_max_num_seqs`` knob, added by touching only the ms-swift backend and its space.

The knob is rendered as ms-swift's flag, decoded into ``JobConfig.vllm_max_num_seqs`` (default null, as
ms-swift 4.6's ``RolloutTrainerArgumentsMixin`` has it: the per-device batch × vLLM TP ×
steps_per_generation), and from there the estimator, the search and plan see it without knowing its name.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from autotune.backends import job_shape
from autotune.backends.swift.backend import SwiftBackend
from autotune.estimate import estimate_memory, find_gpu, find_model
from autotune.space import load_space
from tests.backends.test_swift.test_swift_backend import GPU_KNOBS, backend, make_ctx, render

JOB = {"global_batch": 64, "num_generations": 8, "max_completion_length": 1024}


def test_the_space_offers_it_under_colocated_vllm_with_ms_swifts_default() -> None:
    space = load_space(SwiftBackend().default_space(), backend="swift", known_knobs=SwiftBackend.knob_names)
    knob = space["vllm_max_num_seqs"]
    assert knob.default is None and knob.memory == "increasing" and knob.applies == "vllm"  # CPU too
    assert set(knob.values()) == {None, 64, 256}
    assert knob.active({"use_vllm": True, "vllm_mode": "colocate"})
    assert not knob.active({"use_vllm": True, "vllm_mode": "server"})


def test_it_is_rendered_as_ms_swifts_flag(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, gpus=4, model="Qwen2.5-7B-Instruct")
    argv = render(backend(), {**GPU_KNOBS, "vllm_max_num_seqs": 64}, ctx).argv
    assert argv[argv.index("--vllm_max_num_seqs") + 1] == "64"
    cpu = render(backend(), {"num_processes": 1, "vllm_max_num_seqs": 64}, make_ctx(tmp_path / "cpu")).argv
    assert "--vllm_max_num_seqs" not in cpu  # a vLLM flag: dropped from a trial without vLLM
    unset = render(backend(), {**GPU_KNOBS, "vllm_max_num_seqs": None}, ctx).argv
    assert "--vllm_max_num_seqs" not in unset  # null: ms-swift's own default runs


def test_the_default_is_ms_swifts_own(swift_python: str) -> None:
    """The space's default is the default of the field ms-swift's ``swift rlhf`` parses (4.6: None)."""
    code = (
        "import dataclasses, json; from swift.arguments import RLHFArguments; "
        "print(json.dumps({f.name: f.default for f in dataclasses.fields(RLHFArguments) "
        "if f.name == 'vllm_max_num_seqs'}))"
    )
    proc = subprocess.run([swift_python, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])["vllm_max_num_seqs"]
    space = load_space(SwiftBackend().default_space(), backend="swift", known_knobs=SwiftBackend.knob_names)
    assert space["vllm_max_num_seqs"].default == theirs


def test_the_estimator_sees_it_through_the_job_config() -> None:
    model, gpu = find_model("Qwen2.5-7B"), find_gpu("A100-80G")
    assert model is not None and gpu is not None
    colocate = {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.5}
    few = job_shape("swift", {**colocate, "vllm_max_num_seqs": 64}, {}, JOB, model, 4)
    many = job_shape("swift", {**colocate, "vllm_max_num_seqs": 256}, {}, JOB, model, 4)
    default = job_shape("swift", colocate, {}, JOB, model, 4)
    assert (few.vllm_max_num_seqs, many.vllm_max_num_seqs) == (64, 256)
    # ms-swift's own default (rollout_mixin._prepare_vllm_engine): per-device batch × TP × steps_per_generation
    # (steps_per_generation defaults to gradient_accumulation_steps: args_mixin.py)
    c = default.config
    assert default.vllm_max_num_seqs == c.per_device_batch * c.vllm_tp * c.grad_accum < 64
    assert few.config.knob("vllm_max_num_seqs") == "vllm_max_num_seqs"
    # more sequences in flight: a larger profiled activation peak, so less KV cache
    assert estimate_memory(few, gpu).kv_bytes > estimate_memory(many, gpu).kv_bytes


@pytest.fixture
def swift_python() -> str:
    """The interpreter with ms-swift installed (``$AUTOTUNE_SWIFT_PYTHON``, or the checkout's ``.venv-swift``)."""
    path = os.environ.get("AUTOTUNE_SWIFT_PYTHON") or str(
        Path(__file__).parents[3] / ".venv-swift" / "bin" / "python"
    )
    if not Path(path).exists():
        pytest.skip("no ms-swift interpreter ($AUTOTUNE_SWIFT_PYTHON or .venv-swift)")
    return path
