"""ms-swift's ``vllm_max_num_seqs`` knob, added by touching only the ms-swift backend and its space.

The knob is rendered as ms-swift's flag, decoded into ``JobConfig.vllm_max_num_seqs`` (default 256, as
ms-swift 4.6's ``GRPOArgumentsMixin`` has it), and from there the estimator, the search and plan see
it without knowing its name.
"""

from __future__ import annotations

from pathlib import Path

from autotune.backends import job_shape
from autotune.backends.swift.backend import SwiftBackend
from autotune.estimate import estimate_memory, find_gpu, find_model
from autotune.space import load_space
from tests.backends.test_swift.test_swift_backend import GPU_KNOBS, backend, make_ctx, render

JOB = {"global_batch": 64, "num_generations": 8, "max_completion_length": 1024}


def test_the_space_offers_it_under_colocated_vllm_with_ms_swifts_default() -> None:
    space = load_space(SwiftBackend().default_space(), backend="swift", known_knobs=SwiftBackend.knob_names)
    knob = space["vllm_max_num_seqs"]
    assert knob.default == 256 and knob.memory == "increasing" and knob.applies == "gpu"
    assert knob.active({"use_vllm": True, "vllm_mode": "colocate"})
    assert not knob.active({"use_vllm": True, "vllm_mode": "server"})


def test_it_is_rendered_as_ms_swifts_flag(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, gpus=4, model="Qwen2.5-7B-Instruct")
    argv = render(backend(), {**GPU_KNOBS, "vllm_max_num_seqs": 64}, ctx).argv
    assert argv[argv.index("--vllm_max_num_seqs") + 1] == "64"
    cpu = render(backend(), {"num_processes": 1, "vllm_max_num_seqs": 64}, make_ctx(tmp_path / "cpu")).argv
    assert "--vllm_max_num_seqs" not in cpu  # a vLLM flag: dropped from a trial without vLLM


def test_the_estimator_sees_it_through_the_job_config() -> None:
    model, gpu = find_model("Qwen2.5-7B"), find_gpu("A100-80G")
    assert model is not None and gpu is not None
    colocate = {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.5}
    few = job_shape("swift", {**colocate, "vllm_max_num_seqs": 64}, {}, JOB, model, 4)
    many = job_shape("swift", {**colocate, "vllm_max_num_seqs": 256}, {}, JOB, model, 4)
    default = job_shape("swift", colocate, {}, JOB, model, 4)
    assert (few.vllm_max_num_seqs, many.vllm_max_num_seqs, default.vllm_max_num_seqs) == (64, 256, 256)
    assert few.config.knob("vllm_max_num_seqs") == "vllm_max_num_seqs"
    # more sequences in flight: a larger profiled activation peak, so less KV cache
    assert estimate_memory(few, gpu).kv_bytes > estimate_memory(many, gpu).kv_bytes
