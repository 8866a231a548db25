"""Exact seconds of every step-time term, worked out by hand on round numbers.

``test_timing.py`` checks orderings (the model only orders candidates); these check that each term is
the formula ``autotune/estimate/timing.py`` documents, on one trial (a JobShape: Python numbers) and on
many at once (ShapeColumns: numpy columns, the path ``autotune plan`` takes), so a changed factor, a
dropped term or a branch taken the wrong way shows.

The model and the GPUs are made up so the arithmetic stays readable:

- model: P = 1e9 parameters (weights 2P = 2e9 B), 10 layers, hidden 1000, 10 heads × 100, 2 KV heads,
  MLP 3000. KV bytes per token: 2 (K, V) · 10 layers · 2 heads · 100 · 2 B = 8,000. LoRA parameters per
  rank, all linear layers: 10 · ((1000 + 1000) + 2·(1000 + 200) + (1000 + 1000) + 2·(1000 + 3000)
  + (3000 + 1000)) = 10 · 18,400 = 184,000; rank 8 → 1,472,000.
- PCIE: 1e14 bf16 FLOP/s, 1e12 B/s HBM, PCIe between GPUs and to the host at 1e10 B/s.
- NVL: 1e13 bf16 FLOP/s (slow compute, so decode is compute-bound), 1e12 B/s HBM, NVLink 2e11 B/s
  both directions (1e11 one way), PCIe 1e10 B/s to the host.

The model's efficiencies: HBM 0.7 (7e11 B/s achieved), decode and prefill MFU 0.5, link 0.6 (PCIe:
6e9 B/s; NVLink: 6e10 B/s), training MFU 0.45 · min(1, tokens / 8192) ** 0.3, CPU Adam 1e9 params/s,
model.generate 3× slower than vLLM (3.6× under ZeRO-3), 0.005 s per decode step, 20 µs per TP
all-reduce (two per layer), 0.05 s per move_model_batches round.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from autotune.estimate import GpuSpec, JobShape, ModelSpec, estimate_memory, estimate_step_time
from autotune.estimate.columns import CONFIG_COLUMNS, ShapeColumns, column
from autotune.estimate.timing import step_time_terms
from autotune.jobconfig import JobConfig

MODEL = ModelSpec(
    name="round",
    hub_id="test/round",
    params=1_000_000_000,
    layers=10,
    hidden=1000,
    heads=10,
    kv_heads=2,
    head_dim=100,
    intermediate=3000,
    vocab=32_000,
    tie_embeddings=False,
    max_position=4096,
    largest_layer_params=32_000_000,
)
PCIE = GpuSpec(
    name="round-pcie", memory_bytes=80 * 1024**3, bf16_flops=1e14, hbm_bytes_s=1e12, interconnect="pcie",
    pcie_bytes_s=1e10,
)  # fmt: skip
NVL = GpuSpec(
    name="round-nvlink", memory_bytes=80 * 1024**3, bf16_flops=1e13, hbm_bytes_s=1e12, interconnect="nvlink",
    nvlink_bytes_s=2e11, pcie_bytes_s=1e10,
)  # fmt: skip


def _mfu(tokens: int) -> float:
    """Training MFU of a micro-batch of ``tokens`` (below 8192: on the power curve)."""
    return 0.45 * (tokens / 8192) ** 0.3


def _config(**fields: Any) -> JobConfig:
    return JobConfig(**fields)


# Each case: the configuration, the GPU, the rollouts in flight per colocated vLLM instance, and
# (rollout, train, sync, offload) seconds.
CASES: dict[str, tuple[JobConfig, GpuSpec, int, tuple[float, float, float, float]]] = {
    # A. vLLM colocated, TP 2 on 4 GPUs, ZeRO-3 with checkpointing, weights and optimizer offloaded
    # for the rollout, sleep level 1, the sync gathered in 3 batches.
    "colocate_zero3_tp2": (
        _config(
            world_size=4, global_batch=64, num_generations=8, per_device_batch=4, grad_accum=4,
            max_prompt_length=100, max_completion_length=200, deepspeed=True, zero_stage=3,
            use_vllm=True, vllm_mode="colocate", vllm_tp=2, sleep_level=1, move_model_batches=3,
            rollout_offload_model=True, rollout_offload_optimizer=True,
        ),
        PCIE,
        8,
        (
            # rollout: 4 // 2 = 2 instances, 64 / 2 = 32 sequences each, 8 in flight → 4 waves.
            #   decode read per step: 2e9 / 2 + 8 · (100 + 200/2) · 8000 / 2 = 1.0064e9 B → / 7e11 s;
            #   compute 2e9 · 8 / 2 / 5e13 = 1.6e-4 s (less: memory-bound);
            #   + TP all-reduces 2 · 10 · 20e-6 = 4e-4 s + 0.005 s overhead.
            #   prefill 2e9 · 32 · 100 / 2 / 5e13 = 0.064 s; 200 decode steps per wave.
            4 * 200 * (1.0064e9 / 7e11 + 4e-4 + 0.005) + 0.064,
            # train: 64 · 300 / 4 = 4800 tokens per GPU at (6P + 2P recompute) = 8e9 FLOP each
            #   → 3.84e13 / (1e14 · MFU(4 · 300 = 1200)); ZeRO-3 on 4 GPUs, ring 3/4: a full
            #   gather 2e9 · 0.75 / 6e9 = 0.25 s, gradients the same; 4 micro-batches · (3 gathers
            #   with checkpointing · 0.25 + 0.25) = 4.0 s, not overlapped.
            3.84e13 / (1e14 * _mfu(1200)) + 4 * (3 * 0.25 + 0.25),
            # sync: load 2 · 2e9 / 2 (TP) / 7e11; gather 2e9 · 3/4 / 6e9 = 0.25 s;
            #   (3 + 1) rounds · 0.05 = 0.2 s.
            2 * 2e9 / 2 / 7e11 + 0.25 + 0.2,
            # offload: weights held 2e9 / 4 (ZeRO-3) out and back: 2 · 5e8 / 6e9 = 1/6 s;
            #   optimizer 12 · 1e9 / 4 = 3e9 B out and back: 2 · 3e9 / 6e9 = 1.0 s;
            #   sleep level 1: weights 2e9 / 2 (TP) to the host and back: 2 · 1e9 / 6e9 = 1/3 s.
            2 * 5e8 / 6e9 + 2 * 3e9 / 6e9 + 2 * 1e9 / 6e9,
        ),
    ),
    # B. model.generate (no vLLM) on 2 GPUs, ZeRO-2 with the optimizer offloaded, LoRA rank 8, a
    # reference model (beta > 0), no checkpointing; a server mode that vLLM would have used.
    "generate_zero2_lora": (
        _config(
            world_size=2, global_batch=12, num_generations=4, per_device_batch=2, grad_accum=3,
            max_prompt_length=50, max_completion_length=100, deepspeed=True, zero_stage=2,
            ds_offload_optimizer=True, lora_rank=8, beta=0.04, gradient_checkpointing=False,
            use_vllm=False, vllm_mode="server", vllm_max_num_seqs=1,
        ),
        PCIE,
        99,
        (
            # rollout: the local batch 2 · 3 = 6 at once, one wave, 3× slower than vLLM.
            #   read 2e9 + 6 · (50 + 100/2) · 8000 = 2.0048e9 B → / 7e11 s (compute 2.4e-4 s: less);
            #   prefill 2e9 · 6 · 50 / 5e13 = 0.012 s.
            3.0 * (1 * 100 * (2.0048e9 / 7e11 + 0.005) + 0.012),
            # train: 12 · 150 / 2 = 900 tokens per GPU at (4P LoRA + 2P reference) = 6e9 FLOP
            #   → 5.4e12 / (1e14 · MFU(2 · 150 = 300)); ZeRO-2, ring 1/2: full 2e9 · 0.5 / 6e9 = 1/6 s,
            #   LoRA gradients 2 · 1,472,000 · 0.5 / 6e9 s; 3 · gradients + full, half overlapped.
            5.4e12 / (1e14 * _mfu(300)) + 0.5 * (3 * (1_472_000 / 6e9) + 2e9 * 0.5 / 6e9),
            0.0,  # no vLLM, no sync
            # offload: LoRA gradients down and weights up, 2 · (2 · 1,472,000 / 2) / 6e9 s, and CPU
            #   Adam 1,472,000 / 1e9 s; nothing colocated.
            2 * (2 * 1_472_000 / 2) / 6e9 + 1_472_000 / 1e9,
        ),
    ),
    # C. vLLM server on NVLink (compute-bound decode), ZeRO-1 on 8 GPUs, packed micro-batches of 4096
    # tokens, at most 16 sequences in flight.
    "server_zero1_packed": (
        _config(
            world_size=8, global_batch=64, num_generations=8, per_device_batch=8, grad_accum=1,
            max_prompt_length=100, max_completion_length=200, deepspeed=True, zero_stage=1,
            gradient_checkpointing=False, micro_batch_tokens=4096, use_vllm=True, vllm_mode="server",
            vllm_max_num_seqs=16,
        ),
        NVL,
        3,  # not read: the server's own concurrency is vllm_max_num_seqs
        (
            # rollout: one server, all 64 sequences, 16 in flight → 4 waves. Memory 2.0256e9 / 7e11
            #   = 2.89e-3 s < compute 2e9 · 16 / 5e12 = 6.4e-3 s; prefill 2e9 · 64 · 100 / 5e12 = 2.56 s.
            4 * 200 * (6.4e-3 + 0.005) + 2.56,
            # train: 64 · 300 / 8 = 2400 tokens at 6P → 1.44e13 / (1e13 · MFU(4096)); ZeRO-1, ring
            #   7/8 over NVLink: full = gradients = 2e9 · 0.875 / 6e10; 2 · gradients + full, halved.
            1.44e13 / (1e13 * _mfu(4096)) + 0.5 * 3 * (2e9 * 0.875 / 6e10),
            # sync: load 2 · 2e9 / 7e11; NCCL broadcast to the server over PCIe 2e9 / 6e9.
            2 * 2e9 / 7e11 + 2e9 / 6e9,
            0.0,  # not colocated, nothing offloaded
        ),
    ),
    # D. model.generate on one GPU, ZeRO-3 with optimizer and parameters offloaded, checkpointing.
    "one_gpu_zero3_offload_all": (
        _config(
            world_size=1, global_batch=8, num_generations=8, per_device_batch=4, grad_accum=2,
            max_prompt_length=100, max_completion_length=100, deepspeed=True, zero_stage=3,
            ds_offload_optimizer=True, ds_offload_param=True,
        ),
        PCIE,
        1,
        (
            # rollout: local batch 8, one wave, 3.6× slower under ZeRO-3; read 2e9 + 8 · 150 · 8000
            #   = 2.0096e9 B; prefill 2e9 · 8 · 100 / 5e13 = 0.032 s.
            3.6 * (100 * (2.0096e9 / 7e11 + 0.005) + 0.032),
            # train: 8 · 200 = 1600 tokens at 8P → 1.28e13 / (1e14 · MFU(800)); one GPU: no
            #   communication.
            1.28e13 / (1e14 * _mfu(800)),
            0.0,
            # offload: gradients and weights 2 · 2e9 / 6e9 + CPU Adam 1e9 / 1e9; parameters fetched
            #   2 micro-batches · 3 passes · 2e9 / 6e9 = 2.0 s.
            2 * 2e9 / 6e9 + 1.0 + 2 * 3 * 2e9 / 6e9,
        ),
    ),
    # E. vLLM colocated on 2 GPUs without DeepSpeed (DDP), more rollouts asked than there are
    # sequences, weights and optimizer offloaded for the rollout, sleep level 2.
    "colocate_ddp": (
        _config(
            world_size=2, global_batch=16, num_generations=8, per_device_batch=4, grad_accum=2,
            max_prompt_length=100, max_completion_length=100, gradient_checkpointing=False,
            use_vllm=True, vllm_mode="colocate", sleep_level=2, rollout_offload_model=True,
            rollout_offload_optimizer=True,
        ),
        PCIE,
        100,
        (
            # rollout: 2 instances of 8 sequences, all 8 in flight (100 capped) → one wave;
            #   read 2e9 + 8 · 150 · 8000 = 2.0096e9 B; prefill 2e9 · 8 · 100 / 5e13 = 0.032 s.
            100 * (2.0096e9 / 7e11 + 0.005) + 0.032,
            # train: 16 · 200 / 2 = 1600 tokens at 6P → 9.6e12 / (1e14 · MFU(800)); DDP: 2 gradient
            #   all-reduces of 2e9 · 0.5 / 6e9 = 1/6 s, halved.
            9.6e12 / (1e14 * _mfu(800)) + 0.5 * 2 * (2e9 * 0.5 / 6e9),
            2 * 2e9 / 7e11,  # sync: load only
            # offload: whole weights 2 · 2e9 / 6e9; whole optimizer 2 · 12e9 / 6e9 = 4.0 s; sleep 2
            #   keeps nothing on the host.
            2 * 2e9 / 6e9 + 2 * 12e9 / 6e9,
        ),
    ),
    # F. vLLM colocated at TP 1 on 2 GPUs, ZeRO-3 without checkpointing and with parameters offloaded,
    # the sync gathered in one batch, sleep level 1.
    "colocate_zero3_offload_param": (
        _config(
            world_size=2, global_batch=16, num_generations=8, per_device_batch=4, grad_accum=2,
            max_prompt_length=100, max_completion_length=100, gradient_checkpointing=False,
            deepspeed=True, zero_stage=3, ds_offload_param=True, use_vllm=True, vllm_mode="colocate",
            sleep_level=1, move_model_batches=1,
        ),
        PCIE,
        8,
        (
            # rollout: 2 instances of 8 sequences, 8 in flight: as E.
            100 * (2.0096e9 / 7e11 + 0.005) + 0.032,
            # train: 1600 tokens at 6P → 9.6e12 / (1e14 · MFU(800)); ZeRO-3, ring 1/2: full = gradients
            #   = 2e9 · 0.5 / 6e9 = 1/6 s; 2 micro-batches · (2 gathers without checkpointing · 1/6 + 1/6).
            9.6e12 / (1e14 * _mfu(800)) + 2 * (2 * (1 / 6) + 1 / 6),
            # sync: load 2 · 2e9 / 7e11; gather 2e9 · 1/2 / 6e9 = 1/6 s; (1 + 1) rounds · 0.05 = 0.1 s.
            2 * 2e9 / 7e11 + 1 / 6 + 0.1,
            # offload: parameters fetched 2 micro-batches · 2 passes · 2e9 / 2 / 6e9 = 2/3 s; sleep level 1
            #   at TP 1: weights 2 · 2e9 / 6e9 = 2/3 s.
            2 * 2 * 2e9 / 2 / 6e9 + 2 * 2e9 / 6e9,
        ),
    ),
    # G. vLLM colocated on one GPU, ZeRO-3 with checkpointing and the optimizer offloaded by DeepSpeed
    # (so the rollout's optimizer offload has nothing left to move); move_model_batches without a gather.
    "one_gpu_zero3_vllm": (
        _config(
            world_size=1, global_batch=8, num_generations=8, per_device_batch=4, grad_accum=2,
            max_prompt_length=100, max_completion_length=100, deepspeed=True, zero_stage=3,
            ds_offload_optimizer=True, use_vllm=True, vllm_mode="colocate", move_model_batches=3,
            rollout_offload_optimizer=True,
        ),
        PCIE,
        8,
        (
            # rollout: 1 // 1 = 1 instance of 8 sequences, 8 in flight: read 2.0096e9 B, prefill 0.032 s.
            100 * (2.0096e9 / 7e11 + 0.005) + 0.032,
            # train: 8 · 200 = 1600 tokens at 8P → 1.28e13 / (1e14 · MFU(800)); one GPU: nothing to gather.
            1.28e13 / (1e14 * _mfu(800)),
            2 * 2e9 / 7e11,  # sync: load only (one GPU: no gather, no batches)
            # offload: DeepSpeed's optimizer offload only, 2 · 2e9 / 6e9 + 1e9 / 1e9.
            2 * 2e9 / 6e9 + 1.0,
        ),
    ),
}  # fmt: skip


def _columns(configs: list[JobConfig]) -> ShapeColumns:
    return ShapeColumns(
        {name: column([getattr(c, name) for c in configs], dtype) for name, dtype in CONFIG_COLUMNS.items()},
        MODEL,
        8,
    )


@pytest.mark.parametrize("case", list(CASES))
def test_each_term_on_one_trial(case: str) -> None:
    config, gpu, concurrency, expected = CASES[case]
    rollout, train, sync, offload, total, throughput = step_time_terms(
        JobShape(config, MODEL, config.world_size), gpu, concurrency
    )
    assert (rollout, train, sync, offload) == pytest.approx(expected, rel=1e-12)
    assert total == pytest.approx(sum(expected), rel=1e-12)
    assert throughput == pytest.approx(config.global_batch / sum(expected), rel=1e-12)


@pytest.mark.parametrize("gpu", [PCIE, NVL], ids=["pcie", "nvlink"])
def test_every_case_at_once_in_columns(gpu: GpuSpec) -> None:
    # the plan's path: one column per field, micro-batch sizes and LoRA ranks computed per distinct value
    names = [n for n in CASES if CASES[n][1] is gpu]
    cols = _columns([CASES[n][0] for n in names])
    concurrency = np.array([CASES[n][2] for n in names])
    got = step_time_terms(cols, gpu, concurrency)
    for i, name in enumerate(names):
        expected = CASES[name][3]
        row = tuple(float(term[i]) if isinstance(term, np.ndarray) else float(term) for term in got)
        assert row[:4] == pytest.approx(expected, rel=1e-12), name
        assert row[4] == pytest.approx(sum(expected), rel=1e-12), name
        assert row[5] == pytest.approx(CASES[name][0].global_batch / sum(expected), rel=1e-12), name


def test_columns_with_repeated_sizes_keep_each_row_its_own() -> None:
    # rows A, B, A, E, B: the per-distinct-value MFU and LoRA parameters go back to their rows
    order = [
        "colocate_zero3_tp2",
        "generate_zero2_lora",
        "colocate_zero3_tp2",
        "colocate_ddp",
        "generate_zero2_lora",
    ]
    cols = _columns([CASES[n][0] for n in order])
    _, train, _, offload, _, _ = step_time_terms(cols, PCIE, np.array([CASES[n][2] for n in order]))
    assert train.tolist() == pytest.approx([CASES[n][3][1] for n in order], rel=1e-12)
    assert offload.tolist() == pytest.approx([CASES[n][3][3] for n in order], rel=1e-12)


def test_colocated_rollouts_run_at_least_one_at_a_time() -> None:
    # no KV room reported (0 in flight) still decodes one sequence at a time: 32 waves of one
    config = CASES["colocate_zero3_tp2"][0]
    shape = JobShape(config, MODEL, 4)
    assert step_time_terms(shape, PCIE, 0)[0] == step_time_terms(shape, PCIE, 1)[0]
    # one in flight, 32 waves: read 1e9 + 1 · 200 · 8000 / 2 = 1.0008e9 B per step
    assert step_time_terms(shape, PCIE, 1)[0] == pytest.approx(
        32 * 200 * (1.0008e9 / 7e11 + 4e-4 + 0.005) + 0.064, rel=1e-12
    )


def test_uneven_tp_groups_and_waves_round() -> None:
    # 5 GPUs at TP 2 make 5 // 2 = 2 instances of ceil(63 / 2) = 32 sequences; 12 in flight → 3 waves.
    config = _config(
        world_size=5, global_batch=63, num_generations=7, per_device_batch=1, grad_accum=13,
        max_prompt_length=100, max_completion_length=200, use_vllm=True, vllm_mode="colocate", vllm_tp=2,
    )  # fmt: skip
    rollout = step_time_terms(JobShape(config, MODEL, 5), PCIE, 12)[0]
    # read 2e9 / 2 + 12 · 200 · 8000 / 2 = 1.0096e9 B; prefill 2e9 · 32 · 100 / 2 / 5e13 = 0.064 s
    assert rollout == pytest.approx(3 * 200 * (1.0096e9 / 7e11 + 4e-4 + 0.005) + 0.064, rel=1e-12)


def test_an_empty_step_has_no_throughput() -> None:
    # no tokens at all (packed micro-batches, so the MFU is defined): nothing takes time, and the
    # throughput is 0, not a division by zero
    config = _config(
        world_size=1, global_batch=8, num_generations=8, per_device_batch=8, grad_accum=1,
        max_prompt_length=0, max_completion_length=0, micro_batch_tokens=4096,
    )  # fmt: skip
    assert step_time_terms(JobShape(config, MODEL, 1), PCIE, 1) == (0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


def test_estimate_step_time_reports_the_terms() -> None:
    config, gpu, _, (rollout, train, sync, offload) = CASES["one_gpu_zero3_offload_all"]
    shape = JobShape(config, MODEL, 1)
    e = estimate_step_time(shape, gpu)  # concurrency from the memory estimate: not read without vLLM
    assert (e.rollout_s, e.train_s, e.sync_s, e.offload_s) == pytest.approx((rollout, train, sync, offload))
    assert e.total_s == pytest.approx(rollout + train + sync + offload, rel=1e-12)
    assert e.throughput == pytest.approx(8 / (rollout + train + sync + offload), rel=1e-12)
    assert all(type(x) is float for x in e.to_dict().values())
    # the memory estimate given is the one used: the colocated case's concurrency comes from it
    config_a = CASES["colocate_zero3_tp2"][0]
    shape_a = JobShape(config_a, MODEL, 4)
    mem = estimate_memory(shape_a, PCIE)
    assert estimate_step_time(shape_a, PCIE, mem).rollout_s == pytest.approx(
        step_time_terms(shape_a, PCIE, mem.rollout_concurrency)[0], rel=1e-12
    )


def test_a_tp_group_wider_than_the_gpus_is_still_one_instance() -> None:
    # TP 2 on one GPU: max(1, 1 // 2) = 1 instance of all 8 sequences, 8 in flight, one wave
    config = _config(
        world_size=1, global_batch=8, num_generations=8, per_device_batch=8, grad_accum=1,
        max_prompt_length=100, max_completion_length=200, use_vllm=True, vllm_mode="colocate", vllm_tp=2,
    )  # fmt: skip
    rollout = step_time_terms(JobShape(config, MODEL, 1), PCIE, 8)[0]
    # read 2e9 / 2 + 8 · 200 · 8000 / 2 = 1.0064e9 B; prefill 2e9 · 8 · 100 / 2 / 5e13 = 0.016 s
    assert rollout == pytest.approx(200 * (1.0064e9 / 7e11 + 4e-4 + 0.005) + 0.016, rel=1e-12)


def test_compute_bound_decode_is_split_over_the_tp_group() -> None:
    # NVL, TP 2 on 4 GPUs: 2 instances of 32 sequences, 16 in flight → 2 waves; compute
    # 2e9 · 16 / 2 / 5e12 = 3.2e-3 s beats memory (1e9 + 16 · 200 · 8000 / 2) / 7e11 = 1.45e-3 s
    config = _config(
        world_size=4, global_batch=64, num_generations=8, per_device_batch=4, grad_accum=4,
        max_prompt_length=100, max_completion_length=200, use_vllm=True, vllm_mode="colocate", vllm_tp=2,
    )  # fmt: skip
    rollout = step_time_terms(JobShape(config, MODEL, 4), NVL, 16)[0]
    # prefill 2e9 · 32 · 100 / 2 / 5e12 = 0.64 s
    assert rollout == pytest.approx(2 * 200 * (3.2e-3 + 4e-4 + 0.005) + 0.64, rel=1e-12)


def test_model_generate_runs_the_local_batch_and_at_least_one_sequence() -> None:
    # one sequence per step: read 2e9 + 1 · (100 + 50) · 8000 = 2.0012e9 B; prefill 2e9 · 100 / 5e13
    one = 3.0 * (100 * (2.0012e9 / 7e11 + 0.005) + 2e9 * 100 / 5e13)
    for batch in (1, 0):  # a batch of 0 (packed micro-batches, so training has tokens) still runs one
        config = _config(
            world_size=1, global_batch=1, num_generations=1, per_device_batch=batch, grad_accum=1,
            max_prompt_length=100, max_completion_length=100, micro_batch_tokens=4096,
        )  # fmt: skip
        assert step_time_terms(JobShape(config, MODEL, 1), PCIE, 1)[0] == pytest.approx(one, rel=1e-12)


@pytest.mark.parametrize("tokens", [8192, 16384])
def test_training_mfu_stops_growing_at_8192_tokens(tokens: int) -> None:
    # 8 · 200 = 1600 tokens at 6P = 9.6e12 FLOP at the full 0.45 MFU, whatever the packed budget above
    config = _config(
        world_size=1, global_batch=8, num_generations=8, per_device_batch=8, grad_accum=1,
        max_prompt_length=100, max_completion_length=100, gradient_checkpointing=False,
        micro_batch_tokens=tokens,
    )  # fmt: skip
    expected = 9.6e12 / (1e14 * 0.45)
    assert step_time_terms(JobShape(config, MODEL, 1), PCIE, 1)[1] == pytest.approx(expected, rel=1e-12)
    train = step_time_terms(_columns([config, config]), PCIE, np.array([1, 1]))[1]
    assert train.tolist() == pytest.approx([expected, expected], rel=1e-12)


def test_no_process_count_reads_as_one_process() -> None:
    # num_processes=0 on a CPU-only study reaches the estimator as world_size 0: every term is that of one
    base = {
        "global_batch": 8, "num_generations": 8, "per_device_batch": 4, "grad_accum": 2, "deepspeed": True,
        "zero_stage": 3, "ds_offload_optimizer": True, "ds_offload_param": True,
    }  # fmt: skip
    zero = step_time_terms(JobShape(_config(world_size=0, **base), MODEL, 0), PCIE, 1)
    one = step_time_terms(JobShape(_config(world_size=1, **base), MODEL, 0), PCIE, 1)
    assert zero == one


def test_the_gathered_sync_adds_batch_rounds_only_when_batched() -> None:
    config = CASES["colocate_zero3_offload_param"][0]
    # no move_model_batches: the gather 1/6 s, no rounds
    whole = replace(config, move_model_batches=None)
    assert step_time_terms(JobShape(whole, MODEL, 2), PCIE, 8)[2] == pytest.approx(
        2 * 2e9 / 7e11 + 1 / 6, rel=1e-12
    )


def test_the_rollout_optimizer_offload_moves_the_zero_shard() -> None:
    # ZeRO-1 on 2 GPUs, colocated: the optimizer's 12 · 1e9 / 2 = 6e9 B out and back, 2 · 6e9 / 6e9 = 2 s
    config = _config(
        world_size=2, global_batch=16, num_generations=8, per_device_batch=4, grad_accum=2,
        deepspeed=True, zero_stage=1, use_vllm=True, vllm_mode="colocate", rollout_offload_optimizer=True,
    )  # fmt: skip
    assert step_time_terms(JobShape(config, MODEL, 2), PCIE, 8)[3] == 2.0
    # colocated without any rollout offload or sleep level 1: nothing
    plain = replace(config, rollout_offload_optimizer=False)
    assert step_time_terms(JobShape(plain, MODEL, 2), PCIE, 8)[3] == 0.0


def test_a_short_step_has_its_throughput() -> None:
    # one sequence of 1 + 1 tokens, under a second in all: the throughput is 1 / total, not 0 or 1
    config = _config(
        world_size=1, global_batch=1, num_generations=1, per_device_batch=1, grad_accum=1,
        max_prompt_length=1, max_completion_length=1, gradient_checkpointing=False, micro_batch_tokens=8192,
    )  # fmt: skip
    # rollout 3 · (1 · ((2e9 + 1.5 · 8000) / 7e11 + 0.005) + 2e9 · 1 / 5e13); train 2 · 6e9 / (1e14 · 0.45)
    total = 3 * ((2e9 + 1.5 * 8000) / 7e11 + 0.005 + 2e9 / 5e13) + 2 * 6e9 / (1e14 * 0.45)
    assert total < 1
    terms = step_time_terms(JobShape(config, MODEL, 1), PCIE, 1)
    assert terms[4] == pytest.approx(total, rel=1e-12)
    assert terms[5] == pytest.approx(1 / total, rel=1e-12)


def test_a_cpu_only_trial_is_timed_on_a_generic_gpu() -> None:
    # no GPU: 125e12 FLOP/s, 600e9 B/s (4.2e11 achieved); 8 sequences generated at once, 3× slower
    config = _config(
        world_size=1, global_batch=8, num_generations=8, per_device_batch=8, grad_accum=1,
        max_prompt_length=100, max_completion_length=100, gradient_checkpointing=False,
    )  # fmt: skip
    e = estimate_step_time(JobShape(config, MODEL, 0), None)
    # read 2e9 + 8 · 150 · 8000 = 2.0096e9 B per step; prefill 2e9 · 8 · 100 / 6.25e13 = 0.0256 s
    assert e.rollout_s == pytest.approx(3 * (100 * (2.0096e9 / 4.2e11 + 0.005) + 0.0256), rel=1e-12)
    # 8 · 200 = 1600 tokens at 6P
    assert e.train_s == pytest.approx(9.6e12 / (125e12 * _mfu(1600)), rel=1e-12)
    assert (e.sync_s, e.offload_s) == (0.0, 0.0)


def test_the_memory_estimate_on_the_trials_gpu_sets_the_concurrency() -> None:
    shape = JobShape(replace(CASES["colocate_zero3_tp2"][0], vllm_max_num_seqs=64), MODEL, 4)
    mem = estimate_memory(shape, PCIE)
    assert mem.rollout_concurrency > 1  # room for more than one sequence on the 80 GiB GPU
    assert estimate_step_time(shape, PCIE) == estimate_step_time(shape, PCIE, mem)
