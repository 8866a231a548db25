"""Every DeepSpeed JSON autotune writes, loaded by DeepSpeed's own ``DeepSpeedConfig``.

Two writers, each on a seeded sample of its backend's plan (:mod:`tests.contract.plan_sample`):

- a TRL trial's ``ds_config.json`` (``"auto"`` values): filled by transformers' DeepSpeed integration from
  the trial's own ``GRPOConfig`` (``trainer_config_process`` / ``trainer_config_finalize``, as the Trainer
  does; a mismatch raises there), then loaded by ``DeepSpeedConfig``;
- the ``--format deepspeed`` export (:func:`autotune.export.deepspeed.ds_config`) for the TRL and ms-swift
  candidates that run ZeRO: concrete values, loaded as they are.

``DeepSpeedConfig`` checks ``train_batch_size = micro batch × accumulation × data-parallel world``, and it
reads the world from ``deepspeed.comm``; no process group runs here, so ``deepspeed.comm`` answers with
the trial's world size, as it would inside the launched trial.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.contract.plan_sample import plan_sample, plan_space

pytestmark = pytest.mark.deepspeed
deepspeed = pytest.importorskip("deepspeed")


def _load(config: dict[str, Any], world: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``DeepSpeedConfig(config)`` in a process of a ``world``-rank data-parallel job."""
    from deepspeed.runtime import config as ds_runtime_config

    monkeypatch.setattr(ds_runtime_config.dist, "get_rank", lambda *a, **k: 0)
    monkeypatch.setattr(ds_runtime_config.dist, "get_world_size", lambda *a, **k: world)
    try:
        return ds_runtime_config.DeepSpeedConfig(json.loads(json.dumps(config)))
    except Exception as exc:  # noqa: BLE001 - DeepSpeed raises AssertionError, ValueError, pydantic errors
        pytest.fail(f"DeepSpeedConfig refuses {config} (world {world}): {type(exc).__name__}: {exc}")


@pytest.mark.trl
def test_every_trl_trials_ds_config_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("trl")
    import transformers.training_args
    from transformers import HfArgumentParser
    from trl import GRPOConfig, ModelConfig

    from autotune.backends.trl.backend import TrlBackend

    monkeypatch.setattr(transformers.training_args, "is_torch_bf16_gpu_available", lambda: True)
    backend = TrlBackend()
    sample = [s for s in plan_sample(backend, tmp_path, seed=39) if int(s.params["zero_stage"]) > 0]
    searched = {v for v in plan_space(backend)["zero_stage"].values() if v > 0}
    assert len(sample) > 50 and {s.params["zero_stage"] for s in sample} == searched
    stages = set()
    for item in sample:
        backend.render(item.spec, item.ctx)
        kwargs = json.loads((item.ctx.trial_dir / "trial_config.json").read_text())["grpo_config"]
        args, _ = HfArgumentParser((GRPOConfig, ModelConfig)).parse_dict(kwargs)
        hf = args.hf_deepspeed_config  # read from the trial's ds_config.json by transformers
        hf.trainer_config_finalize(args, None, args.max_steps)  # raises on a mismatch with GRPOConfig
        world = int(item.spec.derived["world_size"])
        filled = {**hf.config, "train_batch_size": args.per_device_train_batch_size
                  * args.gradient_accumulation_steps * world}  # fmt: skip  # the Trainer's world, not this host's
        ds = _load(filled, world, monkeypatch)
        assert ds.zero_optimization_stage == item.params["zero_stage"]
        assert ds.zero_config.offload_optimizer is not None or not item.params["offload_optimizer"]
        stages.add(ds.zero_optimization_stage)
    assert stages == searched


@pytest.mark.parametrize("name", ["trl", "swift"])
def test_every_exported_ds_config_loads(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.backends import get_backend
    from autotune.export.deepspeed import ds_config

    backend = get_backend(name)
    sample = plan_sample(backend, tmp_path, seed=40)
    loaded = 0
    for item in sample:
        k = backend.describe(item.params, item.spec.derived, item.ctx.fixed, len(item.ctx.gpus))
        if k.sharding_stage is None:
            continue
        config = ds_config(k, bf16=True, fp16=False, hidden_size=896, comment="autotune")
        ds = _load(config, k.world_size, monkeypatch)
        assert ds.zero_optimization_stage == k.sharding_stage
        assert ds.train_batch_size == k.per_device_batch * k.grad_accum * k.world_size
        loaded += 1
    assert loaded > 20


def test_the_check_can_fail(monkeypatch: pytest.MonkeyPatch) -> None:
    """A misspelt ZeRO key and a batch that does not match the world are DeepSpeed's refusals."""
    base = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}
    assert _load({**base, "zero_optimization": {"stage": 2}}, 2, monkeypatch).zero_optimization_stage == 2
    with pytest.raises(pytest.fail.Exception, match="overlap_com"):
        _load({**base, "zero_optimization": {"stage": 2, "overlap_com": True}}, 2, monkeypatch)
    with pytest.raises(pytest.fail.Exception, match="train_batch_size"):
        _load({**base, "zero_optimization": {"stage": 2}}, 4, monkeypatch)
