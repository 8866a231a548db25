from __future__ import annotations

from pathlib import Path

from autotune.records import TrialResult, TrialStatus
from autotune.search import oom_dominated
from autotune.search._inference import needs_at_least
from autotune.space import load_space

SPACE = """
knobs:
  per_device_train_batch_size: {type: int, choices: [1, 2, 4, 8], default: 4, memory: increasing}
  gradient_checkpointing: {type: bool, default: true, memory: decreasing}
  zero_stage: {type: int, choices: [2, 3], default: 2}
  offload_optimizer: {type: bool, default: false, memory: decreasing}
  vllm_gpu_memory_utilization: {type: float, low: 0.3, high: 0.9, step: 0.1, default: 0.5, memory: increasing}
  dataloader_num_workers: {type: int, choices: [0, 4], default: 0}
"""


def space(tmp_path: Path):
    p = tmp_path / "s.yaml"
    p.write_text(SPACE)
    return load_space(p)


def oom(params: dict) -> TrialResult:
    return TrialResult(number=7, params=params, status=TrialStatus.OOM, reason="CUDA out of memory")


BASE = {
    "per_device_train_batch_size": 4,
    "gradient_checkpointing": True,
    "zero_stage": 2,
    "offload_optimizer": False,
    "vllm_gpu_memory_utilization": 0.5,
    "dataloader_num_workers": 0,
}


def test_more_memory_along_one_knob_is_inferred_infeasible(tmp_path: Path) -> None:
    s = space(tmp_path)
    failed = [oom(BASE)]
    for knob, value in [
        ("per_device_train_batch_size", 8),
        ("gradient_checkpointing", False),
        ("vllm_gpu_memory_utilization", 0.7),
    ]:
        assert oom_dominated(s, {**BASE, knob: value}, failed) is failed[0], knob


def test_less_memory_is_never_inferred_infeasible(tmp_path: Path) -> None:
    s = space(tmp_path)
    failed = [oom(BASE)]
    for knob, value in [
        ("per_device_train_batch_size", 2),
        ("gradient_checkpointing", True),
        ("offload_optimizer", True),
        ("vllm_gpu_memory_utilization", 0.3),
    ]:
        assert oom_dominated(s, {**BASE, knob: value}, failed) is None, knob
    # the failed configuration itself is not "strictly more"
    assert oom_dominated(s, dict(BASE), failed) is None


def test_a_knob_without_memory_order_blocks_inference(tmp_path: Path) -> None:
    s = space(tmp_path)
    failed = [oom(BASE)]
    # bigger batch but a different ZeRO stage (no declared order): cannot conclude
    assert oom_dominated(s, {**BASE, "per_device_train_batch_size": 8, "zero_stage": 3}, failed) is None
    assert oom_dominated(s, {**BASE, "per_device_train_batch_size": 8, "dataloader_num_workers": 4}, failed) is None


def test_mixed_directions_are_not_dominated(tmp_path: Path) -> None:
    s = space(tmp_path)
    # bigger batch but with offload: might fit
    cand = {**BASE, "per_device_train_batch_size": 8, "offload_optimizer": True}
    assert not needs_at_least(s, cand, BASE)
    # both more: dominated
    cand = {**BASE, "per_device_train_batch_size": 8, "vllm_gpu_memory_utilization": 0.9}
    assert needs_at_least(s, cand, BASE)


def test_only_oom_teaches(tmp_path: Path) -> None:
    s = space(tmp_path)
    for status in (TrialStatus.VLLM_INIT, TrialStatus.HOST_OOM, TrialStatus.HANG, TrialStatus.CRASH, TrialStatus.COMPLETE):
        r = TrialResult(number=1, params=BASE, status=status, reason="x")
        assert oom_dominated(s, {**BASE, "per_device_train_batch_size": 8}, [r]) is None


def test_different_active_knob_sets_are_not_compared(tmp_path: Path) -> None:
    s = space(tmp_path)
    cand = {k: v for k, v in BASE.items() if k != "offload_optimizer"}
    cand["per_device_train_batch_size"] = 8
    assert oom_dominated(s, cand, [oom(BASE)]) is None
