"""The memory model's two other faces, held to the per-trial estimate that test_memory_exact.py pins to
hand-computed bytes: the column path ``autotune plan`` evaluates every candidate with (numpy columns,
model states computed once per distinct input), and the record a trial stores (``to_dict`` /
``from_dict``, including records written before a field existed). Cheap: eight shapes, no plan."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from autotune.estimate import JobShape, MemoryEstimate, estimate_memory, find_gpu, find_model, should_prune
from autotune.estimate.columns import CONFIG_COLUMNS, ShapeColumns, column
from autotune.estimate.memory import memory_terms
from autotune.jobconfig import JobConfig

N = 4
BASE: dict[str, Any] = {
    "world_size": N,
    "global_batch": 64,
    "num_generations": 8,
    "grad_accum": 1,
    "per_device_batch": 16,
}
# one row per branch of the memory model: vLLM colocated (sleep, TP, offloads, ZeRO-3 batches, loaded
# first), vLLM as a server, generation in the trainer, FSDP, LoRA, reference offload, DDP
ROWS: list[dict[str, Any]] = [
    {"use_vllm": True, "vllm_util": 0.3, "deepspeed": True, "zero_stage": 2, "sleep_level": 1},
    {
        "use_vllm": True,
        "vllm_util": 0.4,
        "vllm_tp": 2,
        "deepspeed": True,
        "zero_stage": 3,
        "move_model_batches": 4,
        "weight_sync": "parameter",
        "beta": 0.04,
        "ds_offload_param": True,
    },
    {
        "use_vllm": True,
        "vllm_util": 0.9,
        "deepspeed": True,
        "zero_stage": 3,
        "rollout_offload_model": True,
        "rollout_offload_optimizer": True,
        "loads_before_vllm": True,
        "beta": 0.04,
        "vllm_max_model_len": 32768,
    },
    {
        "use_vllm": True,
        "vllm_mode": "server",
        "deepspeed": True,
        "zero_stage": 1,
        "ds_offload_optimizer": True,
    },
    {
        "use_vllm": False,
        "deepspeed": True,
        "zero_stage": 3,
        "per_device_batch": 2,
        "dataloader_num_workers": 2,
    },
    {
        "use_vllm": True,
        "vllm_util": 0.5,
        "fsdp": True,
        "zero_stage": 3,
        "rollout_offload_model": True,
        "gradient_checkpointing": True,
        "beta": 0.04,
        "reference_offload": True,
    },
    {
        "use_vllm": True,
        "vllm_util": 0.5,
        "lora_rank": 16,
        "deepspeed": True,
        "zero_stage": 2,
        "sleep_level": 2,
        "vllm_max_num_batched_tokens": 4096,
    },
    {"use_vllm": False, "per_device_batch": 4, "micro_batch_tokens": 8192},
]


def _configs() -> list[JobConfig]:
    return [JobConfig(**{**BASE, **row}) for row in ROWS]


def _columns(configs: list[JobConfig], model: Any) -> ShapeColumns:
    return ShapeColumns(
        {name: column([getattr(c, name) for c in configs], dtype) for name, dtype in CONFIG_COLUMNS.items()},
        model,
        N,
    )


@pytest.mark.parametrize("gpu", ["A10", "A100-80G"])
def test_every_term_of_the_column_path_equals_the_per_trial_one(gpu: str) -> None:
    model, card = find_model("Qwen2-7B"), find_gpu(gpu)
    assert model is not None and card is not None
    configs = _configs()
    cols = memory_terms(_columns(configs, model), card.memory_bytes)
    for i, config in enumerate(configs):
        one = memory_terms(JobShape(config, model, N), card.memory_bytes)
        for phase, comps in one.phases.items():
            for name, value in comps.items():
                assert np.broadcast_to(cols.phases[phase][name], (len(configs),))[i] == value, (
                    i,
                    phase,
                    name,
                )
        for name in ("has_rollout", "has_sync", "host_bytes", "server_note", "sleep_note"):
            assert np.broadcast_to(getattr(cols, name), (len(configs),))[i] == getattr(one, name), (i, name)
        for name in (
            "budget",
            "weights_tp",
            "kv_bytes",
            "kv_tokens",
            "concurrency",
            "asleep",
            "startup_ok",
            "startup_deficit",
            "kv_ok",
            "kv_deficit",
        ):
            assert np.broadcast_to(getattr(cols.vllm, name), (len(configs),))[i] == getattr(one.vllm, name), (
                i,
                name,
            )
        assert {
            k: int(np.asarray(t).reshape(-1)[i] if np.ndim(t) else t) for k, t in cols.totals().items()
        } == {k: int(t) for k, t in one.totals().items()}


def _failing() -> MemoryEstimate:
    """An estimate with every field away from its default: vLLM's start-up check and its KV cache both
    fail, notes, host bytes, a calibration."""
    model, card = find_model("Qwen2-7B"), find_gpu("A10")
    assert model is not None and card is not None
    config = JobConfig(**{**BASE, **ROWS[2], "sleep_level": 1, "vllm_max_model_len": 131072})
    est = estimate_memory(JobShape(config, model, N), card)
    return est.scaled(1.25)


def test_a_stored_estimate_reads_back_equal() -> None:
    est = _failing()
    assert not est.vllm_startup_ok and not est.kv_ok and est.kv_tokens > 0 and est.rollout_concurrency > 0
    assert est.notes and est.host_bytes > 0 and est.calibration_factor == 1.25
    stored = est.to_dict()
    assert MemoryEstimate.from_dict(stored) == est
    over = est.overflow()
    assert over is not None
    # the record's keys and derived values, as study.json and the reports read them
    assert stored == {
        "components_bytes": est.components_bytes,
        "peak_bytes": est.peak_bytes,
        "peak_phase": est.peak_phase,
        "phases_bytes": {k: sum(c.values()) for k, c in est.phases.items()},
        "phases": est.phases,
        "capacity_bytes": est.capacity_bytes,
        "host_bytes": est.host_bytes,
        "kv_tokens": est.kv_tokens,
        "kv_bytes": est.kv_bytes,
        "rollout_concurrency": est.rollout_concurrency,
        "vllm_startup_ok": False,
        "vllm_startup_deficit_bytes": est.vllm_startup_deficit_bytes,
        "kv_ok": False,
        "kv_deficit_bytes": est.kv_deficit_bytes,
        "on_gpu": True,
        "calibration_factor": 1.25,
        "fits": False,
        # the peak's excess is the largest failure: blamed on the peak phase's largest component
        "overflow": {"component": "optimizer_states", "bytes": est.peak_bytes - est.capacity_bytes},
        "reason": est.reason(),
        "notes": list(est.notes),
    }


def test_a_record_from_before_the_phases_and_vllm_fields_reads_with_their_defaults() -> None:
    old = {
        "components_bytes": {"policy_weights": 100, "activations": 50},
        "peak_bytes": 150,
        "capacity_bytes": 1000,
    }
    assert MemoryEstimate.from_dict(old) == MemoryEstimate(
        components_bytes={"policy_weights": 100, "activations": 50},
        peak_bytes=150,
        peak_phase="train",
        phases={"train": {"policy_weights": 100, "activations": 50}},
        capacity_bytes=1000,
        host_bytes=0,
        kv_tokens=0,
        kv_bytes=0,
        rollout_concurrency=0,
        vllm_startup_ok=True,
        vllm_startup_deficit_bytes=0,
        kv_ok=True,
        kv_deficit_bytes=0,
    )
    # a peak phase given without its phases: the components are that phase
    rollout = MemoryEstimate.from_dict({**old, "peak_phase": "rollout"})
    assert rollout.phases == {"rollout": {"policy_weights": 100, "activations": 50}}


# --- what an estimate says of itself: fits, overflow, reason, prune (hand-built estimates) ----------

GIB = 1 << 30


def _est(components: dict[str, int], peak: int, capacity: int, **kw: Any) -> MemoryEstimate:
    fields: dict[str, Any] = {
        "components_bytes": components,
        "peak_bytes": peak,
        "peak_phase": "train",
        "phases": {"train": components},
        "capacity_bytes": capacity,
        "host_bytes": 0,
        "kv_tokens": 0,
        "kv_bytes": 0,
        "rollout_concurrency": 0,
        "vllm_startup_ok": True,
        "vllm_startup_deficit_bytes": 0,
        "kv_ok": True,
        "kv_deficit_bytes": 0,
    }
    return MemoryEstimate(**{**fields, **kw})


def test_overflow_blames_the_largest_failure_by_bytes_not_by_name() -> None:
    comps = {"policy_weights": 8 * GIB, "activations": 5 * GIB}
    assert _est(comps, 10 * GIB, 10 * GIB).overflow() is None  # exactly full still fits
    assert _est(comps, 10 * GIB + 1, 10 * GIB).overflow() == ("policy_weights", 1)
    # the peak is 3 GiB over, vLLM's start-up check 1 GiB short: the peak's largest component is blamed
    startup = _est(comps, 13 * GIB, 10 * GIB, vllm_startup_ok=False, vllm_startup_deficit_bytes=GIB)
    assert startup.overflow() == ("policy_weights", 3 * GIB)
    assert _est(
        comps, 9 * GIB, 10 * GIB, vllm_startup_ok=False, vllm_startup_deficit_bytes=GIB
    ).overflow() == (
        "vllm_reserved",
        GIB,
    )
    assert _est(comps, 9 * GIB, 10 * GIB, kv_ok=False, kv_deficit_bytes=2 * GIB).overflow() == (
        "vllm_reserved",
        2 * GIB,
    )


def test_fits_up_to_the_margin_inclusive() -> None:
    est = _est({"policy_weights": 8 * GIB}, 8 * GIB, 10 * GIB)
    assert est.fits(0.2) and not est.fits(0.21)


def test_the_reason_lists_nonzero_components_largest_first() -> None:
    comps = {"activations": 3 * GIB, "policy_weights": 6 * GIB, "logits": 0, "nccl_buffers": 1}
    assert _est(comps, 9 * GIB + 1, 10 * GIB).reason() == (
        "needs 9.0 GiB of 10.0 GiB per GPU (train): policy_weights 6.0 GiB, activations 3.0 GiB, nccl_buffers 0.0 GiB"
    )
    assert _est(comps, 0, 0, on_gpu=False).reason() == "CPU-only trial: no GPU memory is predicted"


def test_prune_only_beyond_the_margin_and_only_on_a_gpu() -> None:
    comps = {"policy_weights": 1}
    # capacity 100 B, margin 15 %: a slack of 15 B
    assert not should_prune(_est(comps, 115, 100))  # exactly at the slack
    assert should_prune(_est(comps, 116, 100))
    assert not should_prune(_est(comps, 50, 100, vllm_startup_ok=False, vllm_startup_deficit_bytes=15))
    assert should_prune(_est(comps, 50, 100, vllm_startup_ok=False, vllm_startup_deficit_bytes=16))
    assert not should_prune(_est(comps, 50, 100, kv_ok=False, kv_deficit_bytes=15))
    assert should_prune(_est(comps, 50, 100, kv_ok=False, kv_deficit_bytes=16))
    # a 1-byte card is still a card; none at all, or a CPU-only trial, is never pruned
    assert should_prune(_est(comps, 2, 1))
    assert not should_prune(_est(comps, 2, 0))
    assert not should_prune(_est(comps, 200, 100, on_gpu=False))


def test_the_estimate_notes_say_what_was_left_out() -> None:
    model, card = find_model("Qwen2-7B"), find_gpu("A100-80G")
    assert model is not None and card is not None
    server = JobConfig(**{**BASE, **ROWS[3]})
    assert estimate_memory(JobShape(server, model, N), card).notes == (
        "vLLM server runs on other GPUs: not counted here",
    )
    sleeping = JobConfig(**{**BASE, **ROWS[0]})
    assert estimate_memory(JobShape(sleeping, model, N), card).notes == (
        "sleep level 1 keeps vLLM weights in host RAM between rollouts",
    )
    # a trial on GPUs but no GPU known: CPU-only for the estimate, nothing judged
    cpu = estimate_memory(JobShape(JobConfig(**{**BASE, **ROWS[7]}), model, N), None)
    assert (cpu.on_gpu, cpu.capacity_bytes, cpu.notes) == (
        False,
        0,
        ("CPU-only trial: GPU memory is not judged",),
    )


def test_no_gpu_known_means_no_vllm_figures_and_phases_that_never_peak() -> None:
    model = find_model("Qwen2-7B")
    assert model is not None
    # colocated vLLM asleep at level 1, but no GPU known: nothing of vLLM is predicted nor noted
    est = estimate_memory(JobShape(JobConfig(**{**BASE, **ROWS[0]}), model, N), None)
    assert (est.kv_tokens, est.kv_bytes, est.rollout_concurrency, est.vllm_startup_ok, est.kv_ok) == (
        0,
        0,
        0,
        True,
        True,
    )
    assert est.notes == ("CPU-only trial: GPU memory is not judged",)
    assert est.phases["train"]["vllm_reserved"] == 0
    # a vLLM server elsewhere and no generation here: only the train phase exists; the others total -1
    card = find_gpu("A100-80G")
    assert card is not None
    server = memory_terms(JobShape(JobConfig(**{**BASE, **ROWS[3]}), model, N), card.memory_bytes)
    totals = server.totals()
    assert (totals["rollout"], totals["sync"]) == (-1, -1)
    assert totals["train"] == sum(server.phases["train"].values()) > 0
    # one GPU: one rank's 3 GiB of host memory, no more
    alone = estimate_memory(JobShape(JobConfig(**{**BASE, **ROWS[7], "world_size": 1}), model, 1), card)
    assert alone.host_bytes == 3 * GIB
    # an estimate that fits records no overflow
    assert _est({"policy_weights": 1}, 1, 10).to_dict()["overflow"] is None


def test_rollout_offloads_zero_what_they_move_and_only_zero3_keeps_gradients() -> None:
    model, card = find_model("Qwen2-7B"), find_gpu("A100-80G")
    assert model is not None and card is not None
    moved = estimate_memory(JobShape(JobConfig(**{**BASE, **ROWS[2]}), model, N), card)
    assert (moved.phases["rollout"]["policy_weights"], moved.phases["rollout"]["optimizer_states"]) == (0, 0)
    # ZeRO-2 frees its gradients after the optimizer step: none are held while generating or syncing
    zero2 = estimate_memory(JobShape(JobConfig(**{**BASE, **ROWS[6], "lora_rank": 0}), model, N), card)
    assert (zero2.phases["rollout"]["gradients"], zero2.phases["sync"]["gradients"]) == (0, 0)
    assert zero2.phases["train"]["gradients"] > 0
    # a CPU-only estimate reads back as one
    cpu = estimate_memory(JobShape(JobConfig(**{**BASE, **ROWS[7]}), model, N), None)
    assert MemoryEstimate.from_dict(cpu.to_dict()) == cpu


# The column path computes model states once per distinct (world, LoRA rank, stage, DeepSpeed or FSDP,
# optimizer offload, parameter offload), packed into one integer key. Pairs of rows below differ in
# their states but come close in that key: a packing that merged them would give one row the other's
# states. Keys: ((((world · 2^20 + rank) · 4 + stage) · 2 + sharded) · 4 + off_opt · 2 + off_param.
STATES_ROWS: list[dict[str, Any]] = [
    # ZeRO-2 with the optimizer on the host (full fine-tuning) and ZeRO-0 with LoRA rank 8 (the flag
    # ignored below ZeRO-2): world · 2^20 + rank = 4,194,304 and 4,194,312, 8 apart, while the stages
    # are 2 apart (a rank step of 4 per stage step would merge them)
    {"world_size": 4, "deepspeed": True, "zero_stage": 2, "ds_offload_optimizer": True},
    {"world_size": 4, "deepspeed": True, "zero_stage": 0, "ds_offload_optimizer": True, "lora_rank": 8},
    # ZeRO-2 LoRA rank 8 on 4 GPUs and rank 128 on 1 GPU: 4 · 40 + 8 = 1 · 40 + 128 (a world step of 40
    # ranks would merge them)
    {"world_size": 4, "deepspeed": True, "zero_stage": 2, "lora_rank": 8},
    {"world_size": 1, "deepspeed": True, "zero_stage": 2, "lora_rank": 128},
    # plain DDP with both offload flags (ignored without DeepSpeed) and ZeRO-2 without offload: their
    # low digits are sharded · 4 + 3 and (sharded + 1) · 4 + 0, next to each other
    {"world_size": 4, "zero_stage": 2, "ds_offload_optimizer": True, "ds_offload_param": True},
    {"world_size": 4, "deepspeed": True, "zero_stage": 2},
]


def test_rows_with_different_states_never_share_one_computed_entry() -> None:
    model = find_model("Qwen2.5-0.5B")
    assert model is not None
    configs = [JobConfig(**{**BASE, "use_vllm": False, **row}) for row in STATES_ROWS]
    cols = memory_terms(_columns(configs, model), 0)
    names = ("policy_weights", "gradients", "optimizer_states")
    seen = set()
    for i, config in enumerate(configs):
        one = memory_terms(JobShape(config, model, N), 0)
        states = tuple(int(one.phases["train"][name]) for name in names)
        assert tuple(int(cols.phases["train"][name][i]) for name in names) == states, i
        assert int(cols.host_bytes[i]) == int(one.host_bytes), i
        seen.add(states)
    assert len(seen) == len(STATES_ROWS)  # every row's states differ from every other's
