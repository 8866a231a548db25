"""The headroom rule judges the memory that can grow, not a colocated vLLM's fixed pool (review #5).

vLLM reserves ``gpu_memory_utilization`` × total up front; that pool, KV cache included, does not grow
with a longer prompt. A trial at utilization 0.9 that leaves 3 GiB of 80 free has 3 GiB over a trainer
share of 8 GiB: it was refused as "would OOM on a longer prompt", and the fastest colocated
configurations with it.
"""

from __future__ import annotations

from typing import Any

from autotune.recommend import recommend, vllm_pool_bytes
from autotune.records import GpuInfo, Hardware, HostInfo, SteadyEstimate, TrialResult, TrialStatus

GIB = 2**30
HARDWARE = Hardware(
    gpus=(GpuInfo(index=0, name="H100", memory_total_bytes=80 * GIB),),
    host=HostInfo(
        hostname="h", cpu_cores_logical=8, cpu_cores_physical=4, ram_total_bytes=GIB, platform="linux"
    ),
)


def _estimate(train_vllm: int, rollout_vllm: int) -> dict[str, Any]:
    return {
        "phases": {
            "train": {"vllm_reserved": train_vllm, "activations": 5 * GIB},
            "rollout": {"vllm_reserved": rollout_vllm},
            "sync": {"vllm_reserved": rollout_vllm},
        }
    }


def _trial(number: int, throughput: float, peak_gib: float, estimate: dict[str, Any] | None) -> TrialResult:
    return TrialResult(
        number=number,
        params={},
        status=TrialStatus.COMPLETE,
        reason="completed",
        steady=SteadyEstimate(
            step_time_s=16 / throughput, rel_ci95=0.02, steady_steps=6, warmup_steps=1, throughput=throughput
        ),
        peak_mem_bytes=[int(peak_gib * GIB)],
        estimate=estimate,
        is_baseline=number == 0,
    )


def test_a_colocated_vllm_pool_is_not_counted_against_the_headroom() -> None:
    awake = _estimate(72 * GIB, 72 * GIB)  # utilization 0.9 × 80 GiB, awake throughout (sleep level 0)
    results = [_trial(0, 1.0, 40, None), _trial(1, 3.0, 77, awake)]
    rec = recommend(results, HARDWARE)
    assert rec is not None and rec.trial == 1  # 3 GiB free ≥ 5 % of the 8 GiB that can grow


def test_without_vllm_or_with_too_little_room_the_rule_holds() -> None:
    no_vllm = [_trial(0, 1.0, 40, None), _trial(1, 3.0, 77, _estimate(0, 0))]
    rec = recommend(no_vllm, HARDWARE)
    assert rec is not None and rec.trial == 0  # 3 GiB < 5 % of 80 GiB
    tight = [_trial(0, 1.0, 40, None), _trial(1, 3.0, 79.8, _estimate(72 * GIB, 72 * GIB))]
    rec = recommend(tight, HARDWARE)
    assert rec is not None and rec.trial == 0  # 0.2 GiB < 5 % of 8 GiB


def test_a_sleeping_vllm_counts_only_what_it_keeps_asleep() -> None:
    assert vllm_pool_bytes(_trial(1, 1.0, 1, _estimate(2 * GIB, 40 * GIB))) == 2 * GIB
    assert vllm_pool_bytes(_trial(1, 1.0, 1, None)) == 0
