"""Rules every framework shares, applied by one mechanism to every backend (``Backend.rules``).

vLLM refuses a tensor-parallel size that does not divide the model's attention heads
(``ModelConfig.verify_with_parallel_config``); only verl checked it, so an 8-GPU TRL or ms-swift study
of Qwen2 (28 heads) paid a whole start-up before vLLM refused TP 8 (review #18).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autotune.backends import Backend
from autotune.backends.trl.backend import TrlBackend
from autotune.backends.verl.backend import ROLLOUT_TP, VerlBackend
from autotune.records import ModelRef
from tests.backends.test_swift import test_swift_backend as swift_t
from tests.backends.test_trl import test_trl_backend as trl_t
from tests.backends.test_verl import test_verl_backend as verl_t

QWEN2 = ModelRef("Qwen2-7B", "Qwen/Qwen2-7B", facts={"heads": 28})


def _trl(tmp_path: Path, tp: int) -> tuple[Backend, Any, dict[str, Any]]:
    ctx = trl_t.make_ctx(tmp_path, gpus=8, model=QWEN2, global_batch=64, num_generations=8)
    params = {"per_device_train_batch_size": 2, "use_vllm": True, "vllm_tensor_parallel_size": tp}
    return TrlBackend(), ctx, params


def _swift(tmp_path: Path, tp: int) -> tuple[Backend, Any, dict[str, Any]]:
    ctx = swift_t.make_ctx(tmp_path, gpus=8, global_batch=64, num_generations=8, model="Qwen2-7B")
    ctx = type(ctx)(**{**ctx.__dict__, "model": QWEN2})
    params = {**swift_t.GPU_KNOBS, "per_device_train_batch_size": 2, "vllm_tensor_parallel_size": tp}
    return swift_t.backend(), ctx, params


def _verl(tmp_path: Path, tp: int) -> tuple[Backend, Any, dict[str, Any]]:
    backend = VerlBackend()
    ctx = verl_t.make_ctx(tmp_path, gpus=8, model=QWEN2)
    return backend, ctx, {**verl_t.baseline(backend), ROLLOUT_TP: tp}


@pytest.mark.parametrize("make", [_trl, _swift, _verl], ids=["trl", "swift", "verl"])
def test_vllm_tp_must_divide_the_heads_for_every_backend(tmp_path: Path, make: Any) -> None:
    for tp, broken in ((8, True), (4, False)):
        backend, ctx, params = make(tmp_path / str(tp), tp)
        rules = [v.rule for v in backend.rules(params, backend.derive(params, ctx), ctx)]
        assert ("vllm_tp_divides_heads" in rules) is broken, (tp, rules)


def test_the_rule_needs_vllm(tmp_path: Path) -> None:
    backend, ctx, params = _trl(tmp_path, 8)
    params["use_vllm"] = False
    assert "vllm_tp_divides_heads" not in [
        v.rule for v in backend.rules(params, backend.derive(params, ctx), ctx)
    ]
