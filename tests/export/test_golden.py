"""Golden outputs: every format of the committed fixture study and of two synthetic GPU studies.

Rewrite the golden files after an intended change with ``AUTOTUNE_UPDATE_GOLDEN=1 pytest tests/export``
and review the diff.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autotune.app.export import export_study
from tests.export.conftest import check_golden, make_study


@pytest.mark.parametrize("fmt", ["swift", "verl", "deepspeed", "json", "command"])
def test_fixture_study_exports_match_golden(fixture_study: Path, fmt: str) -> None:
    export = export_study(fixture_study, fmt)
    assert export.trial == 3  # the recommendation: fastest COMPLETE trial with headroom
    check_golden(export, f"fixture_{fmt}", fixture_study)


def trl_gpu_study(root: Path, rewards: list[str] | None = None) -> Path:
    """TRL on 4×A100: ZeRO-3 with full offload, colocated vLLM, a user reward, a Hub dataset."""
    fixed = {"beta": 0.04, "learning_rate": 1e-6, "logging_steps": 10}
    if rewards is not None:
        fixed["reward_funcs"] = rewards
    return make_study(
        root,
        backend="trl",
        params={
            "per_device_train_batch_size": 8,
            "gradient_checkpointing": False,
            "dataloader_num_workers": 2,
            "zero_stage": 3,
            "offload_optimizer": True,
            "offload_param": True,
            "use_vllm": True,
            "vllm_gpu_memory_utilization": 0.45,
            "vllm_enable_sleep_mode": False,
            "vllm_tensor_parallel_size": 2,
        },
        derived={"world_size": 4, "gradient_accumulation_steps": 2},
        fixed=fixed,
        dataset="trl-lib/DeepMath-103K",
    )


def swift_gpu_study(root: Path) -> Path:
    """ms-swift on 2×A100: zero2_offload, colocated vLLM with sleep level 0, LoRA, a local parquet file."""
    return make_study(
        root,
        backend="swift",
        gpus=2,
        params={
            "per_device_train_batch_size": 4,
            "gradient_checkpointing": True,
            "dataloader_num_workers": 4,
            "deepspeed": "zero2_offload",
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_gpu_memory_utilization": 0.5,
            "vllm_tensor_parallel_size": 1,
            "sleep_level": 0,
            "offload_optimizer": False,
            "offload_model": False,
        },
        derived={"world_size": 2, "gradient_accumulation_steps": 8},
        fixed={
            "tuner_type": "lora",
            "lora_rank": "32",
            "learning_rate": "1e-5",
            "max_completion_length": "512",
        },
        dataset="/data/math/train.parquet",
        global_batch=64,
    )


@pytest.mark.parametrize("fmt", ["trl", "deepspeed", "json"])
def test_trl_gpu_study_exports_match_golden(tmp_path: Path, fmt: str) -> None:
    study = trl_gpu_study(tmp_path / "trl-a100", rewards=["my_rewards:accuracy", "autotune"])
    check_golden(export_study(study, fmt), f"trl_gpu_{fmt}", study)


def test_trl_gpu_study_with_the_demo_reward_exports_to_swift(tmp_path: Path) -> None:
    study = trl_gpu_study(tmp_path / "trl-a100")
    check_golden(export_study(study, "swift"), "trl_gpu_swift", study)


@pytest.mark.parametrize("fmt", ["swift", "trl", "verl", "deepspeed"])
def test_swift_gpu_study_exports_match_golden(tmp_path: Path, fmt: str) -> None:
    study = swift_gpu_study(tmp_path / "swift-a100")
    check_golden(export_study(study, fmt), f"swift_gpu_{fmt}", study)
