"""vLLM's real token budget per forward, as the estimator models it (review #8).

- Without chunked prefill verl raises ``max_num_batched_tokens`` to ``max_model_len`` (null: the model's
  ``max_position_embeddings``; verl 0.9.1 ``vllm_async_server.py`` ``_validate_configs``), so vLLM profiles a
  forward of that many tokens and keeps that much less for its KV cache.
- vLLM's default budget of the offline engine is 16384 tokens on GPUs of 70 GiB or more, except A100s,
  which keep 8192 (``engine/arg_utils.py`` ``get_batch_defaults``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from autotune.backends import job_shape
from autotune.backends.verl.config import BATCHED_TOKENS, CHUNKED_PREFILL, MAX_MODEL_LEN
from autotune.estimate import estimate_memory, find_gpu, find_model

JOB = {"global_batch": 64, "num_generations": 8, "max_completion_length": 1024}


def _kv(params: dict[str, Any], gpu_name: str = "H100-80G", rename: str | None = None) -> int:
    model, gpu = find_model("Qwen2-7B"), find_gpu(gpu_name)
    assert model is not None and gpu is not None
    if rename is not None:
        gpu = dataclasses.replace(gpu, name=rename)
    return estimate_memory(job_shape("verl", params, {}, JOB, model, 4), gpu).kv_bytes


def test_without_chunked_prefill_a_forward_holds_the_models_whole_length() -> None:
    model = find_model("Qwen2-7B")
    assert model is not None and model.max_position > 8192
    on = _kv({CHUNKED_PREFILL: True, BATCHED_TOKENS: 8192})
    off = _kv({CHUNKED_PREFILL: False, BATCHED_TOKENS: 8192})
    assert off < on  # a 131072-token forward profiled, not 8192
    # a max_model_len given bounds it: off with max_model_len 8192 is the same forward as on
    bounded = _kv({CHUNKED_PREFILL: False, BATCHED_TOKENS: 8192, MAX_MODEL_LEN: 8192})
    assert bounded == _kv({CHUNKED_PREFILL: True, BATCHED_TOKENS: 8192, MAX_MODEL_LEN: 8192})


def test_vllms_default_budget_keeps_a100s_at_8192_tokens() -> None:
    model, a100 = find_model("Qwen2.5-7B"), find_gpu("A100-80G")
    assert model is not None and a100 is not None and "A100" in a100.name
    other = dataclasses.replace(a100, name="X100-80G")  # the same memory, not an A100
    shape = job_shape("swift", {"use_vllm": True, "vllm_mode": "colocate"}, {}, JOB, model, 4)
    assert shape.config.vllm_max_num_batched_tokens is None  # vLLM's own default
    # 16384 tokens profiled on the other 80 GiB GPU, 8192 on the A100: the A100 keeps more KV cache
    assert estimate_memory(shape, a100).kv_bytes > estimate_memory(shape, other).kv_bytes
