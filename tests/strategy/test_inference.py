from __future__ import annotations

import random
from pathlib import Path

import pytest

from autotune.backends.trl.backend import TrlBackend
from autotune.records import TrialResult, TrialStatus
from autotune.space import SearchSpace, canonical_key, load_space
from autotune.strategy import infer_infeasible, oom_dominated
from autotune.strategy._inference import is_kv_failure, is_memory_failure, needs_at_least, needs_less_kv

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
    return load_space(p).with_roles(TrlBackend.knob_roles())


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
    assert (
        oom_dominated(s, {**BASE, "per_device_train_batch_size": 8, "dataloader_num_workers": 4}, failed)
        is None
    )


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
    for status in (
        TrialStatus.VLLM_INIT,
        TrialStatus.HOST_OOM,
        TrialStatus.HANG,
        TrialStatus.CRASH,
        TrialStatus.COMPLETE,
    ):
        r = TrialResult(number=1, params=BASE, status=status, reason="x")
        assert oom_dominated(s, {**BASE, "per_device_train_batch_size": 8}, [r]) is None
    # the same history with the status an OOM has, or vLLM's free-memory start-up failure, teaches
    for status, reason in (
        (TrialStatus.OOM, "x"),
        (TrialStatus.VLLM_INIT, "Free memory on device (20.1/79.1 GiB) is less than desired"),
    ):
        r = TrialResult(number=1, params=BASE, status=status, reason=reason)
        assert oom_dominated(s, {**BASE, "per_device_train_batch_size": 8}, [r]) is r, status


def test_different_active_knob_sets_are_not_compared(tmp_path: Path) -> None:
    s = space(tmp_path)
    cand = {k: v for k, v in BASE.items() if k != "offload_optimizer"}
    cand["per_device_train_batch_size"] = 8
    assert oom_dominated(s, cand, [oom(BASE)]) is None


# --- vLLM failures ----------------------------------------------------------------------------------
def vllm_fail(params: dict, reason: str) -> TrialResult:
    return TrialResult(number=3, params=params, status=TrialStatus.VLLM_INIT, reason=reason)


STARTUP = "vLLM could not start: free GPU memory is below the requested gpu_memory_utilization"
KV = "vLLM could not start: the KV cache cannot hold one sequence of max_model_len"


def test_vllm_startup_failure_teaches_like_an_oom(tmp_path: Path) -> None:
    s = space(tmp_path)
    failed = [vllm_fail(BASE, STARTUP)]
    more = {**BASE, "vllm_gpu_memory_utilization": 0.7}
    inference = infer_infeasible(s, more, failed)
    assert inference is not None and inference.trial is failed[0]
    assert "left vLLM too little free memory" in inference.reason
    assert oom_dominated(s, more, failed) is failed[0]
    assert infer_infeasible(s, {**BASE, "vllm_gpu_memory_utilization": 0.3}, failed) is None


def test_vllms_cpu_start_up_failure_teaches_like_its_gpu_one(tmp_path: Path) -> None:
    """On CPU the share is of host memory; vLLM's own text there: '... on startup is less than desired CPU
    memory utilization' (the reason autotune gives: 'free host memory is below ...')."""
    s = space(tmp_path)
    more = {**BASE, "vllm_gpu_memory_utilization": 0.7}
    for reason in (
        "vLLM could not start: free host memory is below the requested gpu_memory_utilization (CPU platform)",
        "Available memory on node 0 (8.99/13.84 GiB) on startup is less than desired CPU memory utilization",
    ):
        failed = [vllm_fail(BASE, reason)]
        inference = infer_infeasible(s, more, failed)
        assert inference is not None and inference.trial is failed[0], reason
        assert infer_infeasible(s, {**BASE, "vllm_gpu_memory_utilization": 0.3}, failed) is None


def test_kv_cache_failure_rules_out_only_lower_utilization(tmp_path: Path) -> None:
    s = space(tmp_path)
    failed = [vllm_fail(BASE, KV)]
    lower = {**BASE, "vllm_gpu_memory_utilization": 0.3}
    inference = infer_infeasible(s, lower, failed)
    assert inference is not None and "KV cache" in inference.reason
    # more utilization is exactly the fix; other knobs changed: nothing is concluded
    assert infer_infeasible(s, {**BASE, "vllm_gpu_memory_utilization": 0.7}, failed) is None
    assert infer_infeasible(s, {**lower, "per_device_train_batch_size": 2}, failed) is None
    # a KV failure is not a memory failure: it never rules out larger batches
    assert infer_infeasible(s, {**BASE, "per_device_train_batch_size": 8}, failed) is None


def test_failure_kind_is_read_from_the_reason() -> None:
    assert is_memory_failure(oom(BASE))
    assert is_memory_failure(vllm_fail(BASE, STARTUP))
    assert not is_memory_failure(vllm_fail(BASE, KV)) and is_kv_failure(vllm_fail(BASE, KV))
    # vLLM's own text, when a result was classified elsewhere
    raw = "ValueError: No available memory for the cache blocks. Try increasing gpu_memory_utilization"
    assert is_kv_failure(vllm_fail(BASE, raw))
    assert not is_kv_failure(vllm_fail(BASE, "vLLM could not start")) and not is_memory_failure(
        vllm_fail(BASE, "x")
    )


# --- property: the inference never marks a configuration that needs less memory --------------------
def _needs_less_somewhere(space_: SearchSpace, cand: dict, failed: dict) -> bool:
    for name, value in cand.items():
        knob = space_[name]
        rc, rf = knob.memory_rank(value), knob.memory_rank(failed[name])
        if rc is not None and rf is not None and rc < rf:
            return True
    return False


@pytest.mark.parametrize("seed", range(40))
def test_inference_is_sound_on_random_spaces(seed: int, random_space) -> None:
    s = random_space(seed)
    rng = random.Random(seed)
    configs = list(s.grid())
    for _ in range(15):
        failed_params = rng.choice(configs)
        failed = [oom(failed_params)]
        for cand in configs:
            inferred = infer_infeasible(s, cand, failed)
            if inferred is None:
                continue
            # never a configuration that needs less memory along any ordered knob ...
            assert not _needs_less_somewhere(s, cand, failed_params), (cand, failed_params)
            # ... and only ones that differ from the failure in ordered knobs, at least one strictly more
            assert set(cand) == set(failed_params)
            for name, value in cand.items():
                if s[name].memory_rank(value) is None:
                    assert canonical_key({"v": value}) == canonical_key({"v": failed_params[name]})
            assert canonical_key(cand) != canonical_key(failed_params)


@pytest.mark.parametrize("seed", range(20))
def test_inference_is_complete_along_single_ordered_knobs(seed: int, random_space) -> None:
    """Every one-knob step towards more memory from an OOM is inferred (the issue's rule)."""
    s = random_space(seed)
    rng = random.Random(1000 + seed)
    configs = list(s.grid())
    failed_params = rng.choice(configs)
    for name, value in failed_params.items():
        knob = s[name]
        for other in knob.values():
            cand = s.active({**failed_params, name: other})
            if set(cand) != set(failed_params):
                continue  # changing a condition changes which knobs exist: not comparable
            r_c, r_f = knob.memory_rank(other), knob.memory_rank(value)
            expected = r_c is not None and r_f is not None and r_c > r_f
            assert (oom_dominated(s, cand, [oom(failed_params)]) is not None) == expected, (
                name,
                value,
                other,
            )


# --- each comparison and each reason, exactly -------------------------------------------------------
def test_the_reason_names_the_failed_trial_and_every_knob_that_differs(tmp_path: Path) -> None:
    s = space(tmp_path)
    bigger = {**BASE, "per_device_train_batch_size": 8, "gradient_checkpointing": False}
    inference = infer_infeasible(s, bigger, [oom(BASE)])
    assert inference is not None and inference.reason == (
        "needs more GPU memory than trial 7, which ran out of memory"
        " (per_device_train_batch_size 8 vs 4, gradient_checkpointing False vs True)"
    )
    startup = infer_infeasible(s, {**BASE, "vllm_gpu_memory_utilization": 0.7}, [vllm_fail(BASE, STARTUP)])
    assert startup is not None and startup.reason == (
        "needs more GPU memory than trial 3, which left vLLM too little free memory to start"
        " (vllm_gpu_memory_utilization 0.7 vs 0.5)"
    )
    kv_failed = vllm_fail(BASE, KV)
    kv = infer_infeasible(s, {**BASE, "vllm_gpu_memory_utilization": 0.3}, [kv_failed])
    assert kv is not None and kv.trial is kv_failed
    assert kv.reason == (
        "leaves vLLM less KV cache than trial 3, whose KV cache was already too small"
        " (vllm_gpu_memory_utilization 0.3 vs 0.5)"
    )


def test_vllms_own_text_in_the_evidence_decides_the_kind(tmp_path: Path) -> None:
    # a result classified elsewhere: a bare reason, vLLM's text kept as the evidence line
    raw = "ValueError: Free memory on device (12.18/23.56 GiB) on startup is less than desired"
    failed = TrialResult(
        number=3, params=BASE, status=TrialStatus.VLLM_INIT, reason="vLLM could not start", evidence=raw
    )
    assert is_memory_failure(failed) and not is_kv_failure(failed)


def test_the_same_configuration_is_not_more_nor_less(tmp_path: Path) -> None:
    s = space(tmp_path)
    assert needs_at_least(s, BASE, BASE) is False
    assert needs_less_kv(s, BASE, BASE) is False
    assert needs_less_kv(s, {**BASE, "vllm_gpu_memory_utilization": 0.7}, BASE) is False


def test_knobs_the_space_does_not_order_or_hold_are_compared_by_value(tmp_path: Path) -> None:
    s = space(tmp_path)
    # a fixed argument outside the space: equal values compare, different ones block the inference
    extra = {**BASE, "seed": 1}
    assert needs_at_least(s, {**extra, "per_device_train_batch_size": 8}, extra) is True
    assert needs_at_least(s, {**extra, "per_device_train_batch_size": 8, "seed": 2}, extra) is False
    # an ordered knob unset on one side only (None has no memory rank): not comparable
    assert (
        needs_at_least(
            s, {**BASE, "per_device_train_batch_size": None, "gradient_checkpointing": False}, BASE
        )
        is False
    )
    # different knob sets and a space without a vLLM budget role: no KV lesson
    lower = {**BASE, "vllm_gpu_memory_utilization": 0.3}
    assert needs_less_kv(s, {**lower, "seed": 1}, BASE) is False
    p = tmp_path / "plain.yaml"
    p.write_text(SPACE)
    assert needs_less_kv(load_space(p), lower, BASE) is False
