"""The deepspeed export, read by DeepSpeed's own ``DeepSpeedConfig`` (which refuses "auto" values)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from autotune.app.export import export_study
from autotune.errors import UsageError
from tests.export.conftest import make_study

pytestmark = pytest.mark.deepspeed
pytest.importorskip("deepspeed")


class _DataParallel:
    """The ``mpu`` DeepSpeed asks for the data-parallel world size (no process group on this machine)."""

    def __init__(self, world: int) -> None:
        self.world = world

    def get_data_parallel_world_size(self) -> int:
        return self.world


def deepspeed_reads(config: dict[str, Any], world: int, monkeypatch: pytest.MonkeyPatch) -> Any:
    import deepspeed.runtime.config as ds_config

    monkeypatch.setattr(ds_config.dist, "get_rank", lambda *a, **k: 0)
    return ds_config.DeepSpeedConfig(config, mpu=_DataParallel(world))


SWIFT_PRESETS = {
    "zero1": (1, "none", "none"),
    "zero2": (2, "none", "none"),
    "zero2_offload": (2, "cpu", "none"),
    "zero3": (3, "none", "none"),
    "zero3_offload": (3, "cpu", "cpu"),
}


@pytest.mark.parametrize("preset", sorted(SWIFT_PRESETS))
def test_swift_presets_export_configs_deepspeed_accepts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preset: str
) -> None:
    study = make_study(
        tmp_path / preset,
        backend="swift",
        gpus=4,
        params={"per_device_train_batch_size": 2, "deepspeed": preset},
        derived={"world_size": 4, "gradient_accumulation_steps": 4},
        global_batch=32,
    )
    config = json.loads(export_study(study, "deepspeed").files["ds_config.json"])
    parsed = deepspeed_reads(config, 4, monkeypatch)
    stage, optimizer_device, param_device = SWIFT_PRESETS[preset]
    assert parsed.zero_optimization_stage == stage
    assert parsed.train_batch_size == 32 and parsed.train_micro_batch_size_per_gpu == 2
    assert parsed.gradient_accumulation_steps == 4
    offload_opt = parsed.zero_config.offload_optimizer
    offload_param = parsed.zero_config.offload_param
    assert (str(offload_opt.device) if offload_opt else "none") == optimizer_device
    assert (str(offload_param.device) if offload_param else "none") == param_device


@pytest.mark.parametrize(
    ("zero_stage", "offload_optimizer", "offload_param"),
    [
        (2, False, False),
        (2, True, False),
        (3, False, False),
        (3, True, False),
        (3, True, True),
        (3, False, True),
    ],
)
def test_trl_zero_knobs_export_configs_deepspeed_accepts(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    zero_stage: int,
    offload_optimizer: bool,
    offload_param: bool,
) -> None:
    study = make_study(
        tmp_path / "trl",
        backend="trl",
        gpus=2,
        compute_capability="7.0",  # V100: fp16, not bf16
        params={
            "per_device_train_batch_size": 4,
            "zero_stage": zero_stage,
            "offload_optimizer": offload_optimizer,
            "offload_param": offload_param,
        },
        derived={"world_size": 2, "gradient_accumulation_steps": 2},
        global_batch=16,
        num_generations=4,
    )
    config = json.loads(export_study(study, "deepspeed").files["ds_config.json"])
    parsed = deepspeed_reads(config, 2, monkeypatch)
    assert parsed.zero_optimization_stage == zero_stage
    assert parsed.float16_config.enabled and not parsed.bfloat16_config.enabled
    assert bool(parsed.zero_config.offload_optimizer) == offload_optimizer
    assert bool(parsed.zero_config.offload_param) == offload_param
    assert '"auto"' not in json.dumps(config)  # DeepSpeed alone cannot read "auto"


def test_fixture_export_is_accepted_with_its_world_size_only(
    fixture_study: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = json.loads(export_study(fixture_study, "deepspeed").files["ds_config.json"])
    assert deepspeed_reads(config, 4, monkeypatch).zero_optimization_stage == 3
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):
        deepspeed_reads(config, 2, monkeypatch)  # the batch is concrete: another GPU count must not pass


def test_a_winner_without_deepspeed_is_refused(tmp_path: Path) -> None:
    study = make_study(
        tmp_path / "s",
        backend="trl",
        params={"per_device_train_batch_size": 4, "zero_stage": 0},
        derived={"world_size": 4, "gradient_accumulation_steps": 4},
    )
    with pytest.raises(UsageError, match=r"runs without DeepSpeed \(knob zero_stage=0\)"):
        export_study(study, "deepspeed")
