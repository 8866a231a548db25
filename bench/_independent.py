"""GRPO response surfaces that owe nothing to autotune's estimator, for the search-efficiency bench.

The estimator-derived surfaces (:mod:`_surfaces`) distort autotune's own memory and step-time model, so
a search seeded by that model does well there partly by construction. The world here has its own
parameterisation, its own functional forms, interactions the estimator does not model, and failure
regions drawn at random per seed. It reads a configuration only through the framework's own decoder
(:meth:`autotune.backends.Backend.describe` → :class:`~autotune.jobconfig.JobConfig`) and validity
rules, and the hardware and model only through catalog constants (memory size, bandwidths, FLOP/s,
parameter, layer, head and vocabulary counts). It never imports ``autotune.estimate``.

Every coefficient below is drawn from the seed over a wide range.

Memory, per GPU and per phase of a step (rollout, training, weight sync):

- trainer states: bf16 weights, gradients of 2–4 bytes and optimizer states of 12–16 bytes (4–12 for
  a plain torch optimizer) per *trainable* parameter (LoRA: a random 0.2–0.8 % of the model per rank 16),
  sharded by ZeRO stage with padding overhead; DeepSpeed bucket buffers, DDP gradient buckets, ZeRO-3's
  live window of prefetched layers; optimizer/parameter offload keep staging buffers only; the reference
  model exists for full fine-tuning with β > 0 (LoRA disables the adapter instead);
- activations: per token per layer per hidden unit, full or checkpointed (plus one layer's working
  set), over micro-batches padded to their longest completion (padding grows with the batch), plus
  fp32 logits of the completions, and allocator fragmentation that grows with the micro-batch;
- colocated vLLM: the whole ``gpu_memory_utilization`` budget while awake (overshooting it a little in
  sampling, more with more sequences), a residue while asleep, its weights again at the weight sync;
  its KV cache is what the budget leaves after its weights, activations and CUDA graphs;
- the weight sync gathers: the whole model under ZeRO-3, one batch of layers with
  ``move_model_batches``, one parameter at a time (TRL), or a merged copy for LoRA.

Speed, seconds per step:

- rollout: vLLM decodes with concurrency = min(max_num_seqs, completions per engine, what the KV cache
  holds), each iteration costing a weight read plus a per-sequence cost (saturation), TP all-reduce
  latency that depends on the interconnect, preemption when the KV cache is short, prefill, wake-up
  from sleep; without vLLM, ``generate`` with Python overhead per token (and a full ZeRO-3 gather per
  token);
- training: FLOPs (6·P per token, 4·P for LoRA, + recompute, + the reference forward) at an
  efficiency that saturates with tokens per micro-batch, a fixed cost per micro-batch, DDP/ZeRO
  communication (ZeRO-3 gathers per micro-batch, so it punishes small batches), CPU Adam and PCIe
  transfers for offload;
- weight sync: gather + load into vLLM + LoRA merge, batches and per-parameter overheads;
- other: data stalls without data-loader workers (partly hidden by one), CPU contention with many,
  ms-swift's rollout offload moves over PCIe, reward and logging; a per-configuration idiosyncratic
  factor on everything.

Failures: start-up (vLLM's free-memory check against what the trainer already holds, a KV cache
that cannot hold one sequence, a TP size that does not divide the attention heads, host RAM), OOM in
the first phase whose memory exceeds the GPU, 1–3 random conjunctions of one or two knob values that
hang, do not learn or crash (each with a random kind and phase), and a rare random share of flaky
configurations that hang.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from _settings import FAILED_PHASES, HEADROOM, LIVE_STOP, REASON, STATUS, Setting, Truth

from autotune.backends import Backend, TrialContext, backend_class
from autotune.records import TrialStatus
from autotune.space import SearchSpace, canonical_key

__all__ = ["ConfigTable", "IndependentSurface"]

GIB = 1024**3
_WORKERS = "dataloader_num_workers"  # a host knob: evaluated apart, the table has one row per other knobs
_SYNC = ("parameter", "model", "batches")
# failure kinds in the order a run meets them (code 0: none)
_KINDS = ("none", "tp_heads", "host", "startup", "kv", "oom", "hang", "unhealthy", "crash")
_PH = {name: i for i, name in enumerate(FAILED_PHASES)}


class ConfigTable:
    """Every configuration of a setting's space (without the data-loader knob), decoded by the backend.

    Seed-independent: built once per setting. ``cols`` holds, per row, the JobConfig fields the world
    reads and ``valid`` (the framework's start-up rules); ``knob_idx`` the index of each knob's value in
    the space (−1 where the knob is inactive), on which random failure regions are drawn.

    Args:
        setting: the job and hardware.
        space: the bench space of the setting.
        backend: the framework's backend (``derive``, ``check_rules``).
        ctx: a trial context of the setting (for the rules).
    """

    def __init__(self, setting: Setting, space: SearchSpace, backend: Backend, ctx: TrialContext) -> None:
        self.setting = setting
        self.space = space
        describe = backend_class(setting.backend).describe
        core_space = space.narrow({_WORKERS: space[_WORKERS].values()[:1]}) if _WORKERS in space else space
        self.knobs = tuple(k for k in space.names if k != _WORKERS)
        self.knob_values = {k: space[k].values() for k in self.knobs}
        value_keys = {k: [canonical_key({"v": v}) for v in vals] for k, vals in self.knob_values.items()}
        cols: dict[str, list[float]] = {}
        idx: dict[str, list[int]] = {k: [] for k in self.knobs}
        self.configs: list[dict[str, Any]] = []
        self.index: dict[str, int] = {}
        max_position = setting.model_spec().max_position
        for params in core_space.grid():
            core = {k: v for k, v in params.items() if k != _WORKERS}
            derived = backend.derive(dict(params), ctx)
            valid = not backend.check_rules(dict(params), derived, ctx)
            cfg = describe(params, derived, setting.fixed, setting.n_gpus)
            self.index[canonical_key(core)] = len(self.configs)
            self.configs.append(core)
            row = {
                "valid": valid,
                "pdbs": cfg.per_device_batch,
                "ga": cfg.grad_accum,
                "gc": cfg.gradient_checkpointing,
                "ds": cfg.deepspeed,
                "zero": cfg.zero_stage if cfg.deepspeed else 0,
                "off_opt": cfg.ds_offload_optimizer,
                "off_param": cfg.ds_offload_param,
                "lora": cfg.lora_rank,
                "beta": cfg.beta,
                "use_vllm": cfg.use_vllm,
                "colocate": cfg.colocate,
                "util": cfg.vllm_util,
                "tp": cfg.vllm_tp,
                "sleep": cfg.sleep_level,
                "roff_model": cfg.rollout_offload_model,
                "roff_opt": cfg.rollout_offload_optimizer,
                "mmb": cfg.move_model_batches or 0,
                "seqs": cfg.vllm_max_num_seqs,
                "sync": _SYNC.index(cfg.weight_sync),
                "loads_first": cfg.loads_before_vllm,
                "max_len": cfg.vllm_max_model_len or max_position,
                "prompt": cfg.max_prompt_length,
                "completion": cfg.max_completion_length,
            }
            for name, value in row.items():
                cols.setdefault(name, []).append(float(value))
            for k in self.knobs:
                idx[k].append(value_keys[k].index(canonical_key({"v": core[k]})) if k in core else -1)
        self.cols = {k: np.asarray(v) for k, v in cols.items()}
        self.knob_idx = {k: np.asarray(v, dtype=np.int16) for k, v in idx.items()}
        self.n_rows = len(self.configs)
        self.has_workers = _WORKERS in space
        self.worker_values: tuple[int, ...] = tuple(space[_WORKERS].values()) if self.has_workers else (0,)

    def row(self, params: Mapping[str, Any]) -> int | None:
        return self.index.get(canonical_key({k: v for k, v in params.items() if k != _WORKERS}))


def _pick_region(
    table: ConfigTable, rng: np.random.Generator, avoid: int | None
) -> tuple[tuple[tuple[str, int], ...], np.ndarray]:
    """One or two knob values whose conjunction covers 0.5–20 % of the valid configurations."""
    valid = table.cols["valid"] > 0
    n_valid = max(1, int(valid.sum()))
    for _ in range(200):
        n = 1 if rng.uniform() < 0.4 else 2
        names = rng.choice(len(table.knobs), size=n, replace=False)
        terms = []
        for i in names:
            name = table.knobs[int(i)]
            terms.append((name, int(rng.integers(len(table.knob_values[name])))))
        mask = np.ones(table.n_rows, dtype=bool)
        for name, value in terms:
            mask &= table.knob_idx[name] == value
        share = float((mask & valid).sum()) / n_valid
        if 0.005 <= share <= 0.2 and (avoid is None or not mask[avoid]):
            return tuple(terms), mask
    return (), np.zeros(table.n_rows, dtype=bool)


class IndependentSurface:
    """One true world for a setting and a seed (see the module docstring).

    Args:
        table: the setting's decoded configurations.
        seed: draws every coefficient and failure region.
    """

    def __init__(self, table: ConfigTable, seed: int) -> None:
        self.table = table
        self.setting = s = table.setting
        self.seed = seed
        rng = np.random.default_rng([seed, zlib.crc32(f"independent:{s.name}".encode())])
        u = rng.uniform

        def lu(lo: float, hi: float) -> float:  # log-uniform
            return float(math.exp(u(math.log(lo), math.log(hi))))

        model, gpu = s.model_spec(), s.gpu_spec()
        self.model, self.gpu = model, gpu
        self.capacity = float(gpu.memory_bytes)
        self.host_ram = s.host_ram_gib * GIB
        # -- memory coefficients
        self.lora_frac16 = lu(0.002, 0.008)  # trainable share of the model at LoRA rank 16
        self.grad_b = u(2.0, 4.0)
        self.opt_b = u(12.0, 16.0)  # DeepSpeed: fp32 master + Adam moments
        self.opt_b_torch = u(4.0, 12.0)  # plain torch AdamW on bf16 weights
        self.shard_pad = u(1.0, 1.15)
        self.z3_live_layers = u(1.5, 5.0)
        self.ds_buf = u(0.3, 2.0) * GIB
        self.ddp_bucket_frac = u(0.0, 1.0)
        self.pinned_staging = u(0.1, 1.0) * GIB
        self.a_full = u(16.0, 40.0)  # bytes per hidden unit per token per layer, no checkpointing
        self.a_ckpt = u(2.0, 4.5)
        self.logit_b = u(4.0, 12.0)
        self.frag_k = u(0.0, 0.15)
        self.len_frac = u(0.35, 0.85)  # mean completion length / max
        self.pad_exp = u(0.3, 1.0)
        self.ctx_b = u(0.45, 1.0) * GIB
        self.nccl_b = u(0.2, 1.0) * GIB
        self.grad_kept = float(u() < 0.5)  # ZeRO keeps gradient buffers between steps
        self.ref_follows = float(u() < 0.5)  # rollout offload moves the reference model too
        self.v_weights_f = u(1.0, 1.05)
        self.v_act_seq = u(1.0, 6.0) * 2**20 * model.hidden / 4096
        self.v_graph = u(0.2, 1.5) * GIB
        self.v_base = u(0.3, 0.9) * GIB
        self.v_overshoot = u(0.0, 0.04)
        self.v_resid = u(0.2, 0.8) * GIB
        self.gather_f = u(1.0, 1.15)
        self.batch_gather_f = u(1.2, 2.0)
        self.param_gather_f = u(1.0, 3.0)
        self.merge_copy = u(0.0, 0.6)
        self.sync_staging = u(0.1, 0.5) * GIB
        self.trl_holds_policy = float(u() < 0.5)  # TRL's model is on the GPU before vLLM starts
        self.free_slack = u(0.0, 0.5) * GIB
        self.reserved = u(0.25, 0.7) * GIB  # driver and allocator: not usable
        # host memory
        self.host_proc = u(3.0, 8.0) * GIB
        self.host_load = u(0.5, 1.5)
        self.host_opt_b = u(12.0, 20.0)
        self.host_param_f = u(1.0, 1.5)
        self.host_worker = u(0.2, 1.5) * GIB
        self.host_limit = u(0.85, 0.97)
        # -- speed coefficients
        nvlink = gpu.interconnect == "nvlink" and gpu.nvlink_bytes_s > 0
        self.ic_bw = gpu.nvlink_bytes_s * u(0.3, 0.7) if nvlink else lu(4e9, 16e9)
        self.lat = (u(8.0, 25.0) if nvlink else u(30.0, 120.0)) * 1e-6
        self.e_bw = u(0.45, 0.8)
        self.e_dec = u(0.2, 0.6)
        self.e_pf = u(0.35, 0.7)
        self.t_sample = u(2.0, 10.0) * 1e-6
        self.t_sched = u(0.3, 1.5) * 1e-3
        self.tp_log = u(0.2, 0.8)
        self.tail = u(0.85, 1.0)
        self.kv_hold = u(0.5, 1.0)
        self.preempt_k = u(0.1, 0.8)
        self.roll_fixed = u(0.2, 1.5)
        self.hf_overhead = u(0.015, 0.04)
        self.e_bw_hf = u(0.3, 0.6)
        self.pcie_eff = u(0.3, 0.8)
        self.kv_realloc = u(0.1, 0.8)
        self.realloc2 = u(0.3, 2.0)
        self.e_max = u(0.3, 0.6)
        self.m_half = lu(500.0, 8000.0)  # tokens per micro-batch at half the peak efficiency
        self.gc_recompute = u(0.8, 1.0)
        self.t_micro = u(0.03, 0.15)
        self.ovl_ddp = u(0.3, 0.8)
        self.ovl_z2 = u(0.2, 0.7)
        self.ovl_z3 = u(0.1, 0.6)
        self.e_opt = u(0.2, 0.5)
        self.cpu_adam_ns = u(1.0, 6.0)
        self.t_batch = u(0.2, 1.5)
        self.t_gather = u(1.0, 5.0) * 1e-3
        self.t_tensor = u(1.0, 6.0) * 1e-3
        self.t_merge = u(0.5, 3.0)
        self.e_load = u(0.05, 0.25)
        self.step_fixed = u(0.5, 3.0)
        self.stall0 = u(0.5, 6.0)
        self.stall1 = u(0.1, 0.6)
        self.cores_free = u(16.0, 96.0)
        self.cont_k = u(0.05, 0.5)
        self.idio = np.exp(rng.normal(0.0, u(0.005, 0.015), table.n_rows))
        # start-up, seconds
        self.load_s = u(20.0, 40.0) + 2 * model.params / lu(1e9, 3e9)
        self.ds_init = u(10.0, 30.0)
        self.z3_init = u(10.0, 40.0)
        self.cpu_adam_init = u(20.0, 60.0)
        self.vllm_init = u(30.0, 60.0)
        self.vllm_load_bw = lu(1e9, 3e9)
        self.graph_init = u(10.0, 40.0)
        # -- failure regions of this seed
        base = table.row(table.space.active(dict(s.baseline)))  # no random region holds the user's baseline
        self.regions: list[tuple[tuple[tuple[str, int], ...], str, str, int]] = []
        region_masks: list[np.ndarray] = []
        for _ in range(int(rng.integers(1, 4))):
            terms, mask = _pick_region(table, rng, base)
            kind = str(rng.choice(["hang", "unhealthy", "crash"], p=[0.45, 0.3, 0.25]))
            phase = {
                "hang": str(rng.choice(["rollout", "train", "weight_sync"])),
                "unhealthy": "train",
                "crash": str(rng.choice(FAILED_PHASES)),
            }[kind]
            after = 0 if phase == "startup" else int(rng.integers(0, 3))
            if terms:
                self.regions.append((terms, kind, phase, after))
                region_masks.append(mask)
        self._region_masks = region_masks
        flaky_rate = u(0.005, 0.02)
        self.flaky = rng.uniform(0.0, 1.0, table.n_rows) < flaky_rate
        if base is not None:
            self.flaky[base] = False
        self.flaky_phase = rng.choice([_PH["rollout"], _PH["train"], _PH["weight_sync"]], table.n_rows)
        self.flaky_after = rng.integers(1, 4, table.n_rows)
        self._cache: dict[str, Truth] = {}

    # -- the truth, vectorised over rows for one data-loader setting ------------------------------
    def _evaluate(self, workers: int, rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
        take: Callable[[np.ndarray], np.ndarray] = (lambda a: a) if rows is None else (lambda a: a[rows])
        c = {k: take(v) for k, v in self.table.cols.items()}
        m, g, s = self.model, self.gpu, self.setting
        n_rows = len(c["valid"])
        P, L, H, V = float(m.params), float(m.layers), float(m.hidden), float(m.vocab)
        C, W = self.capacity, float(s.n_gpus)
        B = float(s.global_batch)
        lora = c["lora"] > 0
        colocate = c["colocate"] > 0
        use_vllm = c["use_vllm"] > 0
        z, ds, gc = c["zero"], c["ds"] > 0, c["gc"] > 0
        off_opt, off_param = c["off_opt"] > 0, c["off_param"] > 0
        tp, sleep, pdbs, ga = c["tp"], c["sleep"], c["pdbs"], c["ga"]
        roff_model, roff_opt = c["roff_model"], c["roff_opt"]
        Lp, Lc = c["prompt"], c["completion"]

        # ---- memory per GPU
        train_params = np.where(lora, P * self.lora_frac16 * c["lora"] / 16.0, P)
        z3 = z == 3
        per_shard = self.shard_pad / W
        weights = np.where(off_param, 0.0, 2 * P * np.where(z3, per_shard, 1.0))
        live = np.where(z3, self.z3_live_layers * 2.0 * m.largest_layer_params, 0.0)
        grads = self.grad_b * train_params * np.where(z >= 2, per_shard, 1.0)
        opt_full = (
            np.where(ds, self.opt_b, self.opt_b_torch) * train_params * np.where(z >= 1, per_shard, 1.0)
        )
        opt = np.where(off_opt, self.pinned_staging, opt_full)
        ref = np.where((c["beta"] > 0) & ~lora, 2 * P * np.where(z3, per_shard, 1.0), 0.0)
        buffers = np.where(ds, self.ds_buf, self.ddp_bucket_frac * 2 * train_params if W > 1 else 0.0)
        base = self.ctx_b + (self.nccl_b if W > 1 else 0.0) + np.where(tp > 1, 0.3 * self.nccl_b, 0.0)
        mean_len = self.len_frac
        t_pad = Lp + Lc * (mean_len + (1 - mean_len) * (1 - pdbs**-self.pad_exp))
        tokens_mb = pdbs * t_pad
        act = np.where(
            gc, tokens_mb * L * H * self.a_ckpt + tokens_mb * H * self.a_full, tokens_mb * L * H * self.a_full
        )
        logits = pdbs * Lc * V * self.logit_b
        act_train = (act + logits) * (1 + self.frag_k * (1 - np.exp(-pdbs / 4)))
        # vLLM
        budget = np.where(colocate, c["util"] * C, 0.0)
        v_weights = 2 * P / tp * self.v_weights_f
        kv_tok = 2 * L * np.maximum(1.0, m.kv_heads / tp) * m.head_dim * 2  # bytes per token on one GPU
        v_act = c["seqs"] * self.v_act_seq + self.v_graph * np.sqrt(c["seqs"] / 256)
        kv_bytes = budget - v_weights - v_act - self.v_base
        v_awake = budget * (1 + self.v_overshoot * c["seqs"] / 256)
        v_train = np.where(sleep == 0, budget, np.where(sleep == 1, self.v_resid, 0.5 * self.v_resid))
        v_sync = np.where(sleep == 0, budget, v_weights + self.v_resid)
        # phases
        states = weights + live + ref + grads + opt + buffers + base
        b_gen = B / W
        hf_gen = b_gen * (Lp + Lc) * 2 * L * m.kv_heads * m.head_dim * 2 + b_gen * V * 8
        rollout_mem = np.where(
            colocate,
            base
            + (weights + ref * self.ref_follows) * (1 - roff_model)
            + ref * (1 - self.ref_follows)
            + grads * self.grad_kept
            + opt * (1 - roff_opt)
            + buffers
            + v_awake,
            states + hf_gen,
        )
        train_mem = states + act_train + np.where(colocate, v_train, 0.0)
        gather = np.select(
            [c["sync"] == _SYNC.index("parameter"), c["sync"] == _SYNC.index("batches")],
            [
                2.0 * m.largest_layer_params * self.param_gather_f,
                2 * P / np.maximum(c["mmb"], 1) * self.batch_gather_f,
            ],
            np.where(z3, 2 * P * self.gather_f, np.where(lora, 2 * P * self.merge_copy, self.sync_staging)),
        )
        sync_mem = np.where(colocate, states - grads * (1 - self.grad_kept) + v_sync + gather, 0.0)
        usable = C - self.reserved
        phase_mem = {"rollout": rollout_mem, "train": train_mem, "weight_sync": sync_mem}
        peak = np.maximum(np.maximum(rollout_mem, train_mem), sync_mem)
        oom = peak > usable
        oom_phase = np.full(n_rows, _PH["weight_sync"])
        for name in ("weight_sync", "train", "rollout"):
            oom_phase = np.where(phase_mem[name] > usable, _PH[name], oom_phase)
        # start-up: what the trainer holds when vLLM checks its free memory
        held = base + np.where(
            c["loads_first"] > 0,
            (weights + ref) * (1 - roff_model),
            np.where(ds, 0.0, 2 * P * self.trl_holds_policy),
        )
        startup_fail = colocate & (budget > C - held - self.free_slack)
        kv_fail = colocate & (kv_bytes < c["max_len"] * kv_tok)
        tp_heads = use_vllm & (np.mod(m.heads, tp) != 0)
        host = (
            W * self.host_proc
            + 2 * P * self.host_load
            + np.where(off_opt, train_params * self.host_opt_b, 0.0)
            + np.where(off_param, 2 * P * self.host_param_f, 0.0)
            + np.where(colocate & (sleep == 1), 2 * P / tp * W, 0.0)
            + W * (weights * roff_model + opt_full * roff_opt)
            + workers * W * self.host_worker
        )
        host_fail = host > self.host_ram * self.host_limit

        # ---- seconds per step
        pcie = g.pcie_bytes_s * self.pcie_eff
        ring = (W - 1) / W
        crowd = 1 + self.cont_k * max(0.0, (workers * W - self.cores_free) / self.cores_free)
        # rollout by vLLM
        engines = W / tp
        per_engine = np.ceil(B / engines)
        mean_c = Lc * mean_len
        bw = g.hbm_bytes_s * self.e_bw
        kv_seqs = np.floor(np.maximum(kv_bytes, 0.0) / ((Lp + mean_c * self.kv_hold) * kv_tok))
        want = np.minimum(c["seqs"], per_engine)
        conc = np.maximum(1.0, np.minimum(want, kv_seqs))
        preempt = 1 + self.preempt_k * np.clip(1 - kv_seqs / want, 0.0, 1.0)
        t_seq = (Lp + mean_c / 2) * kv_tok / bw + 2 * P / tp / (g.bf16_flops * self.e_dec) + self.t_sample
        t_tp = np.where(tp > 1, 2 * L * self.lat * (1 + self.tp_log * np.log2(tp)), 0.0)
        t_iter = v_weights / bw + conc * t_seq + t_tp + self.t_sched
        iters = np.maximum(Lc * self.tail, per_engine * mean_c / conc)
        prefill = per_engine * Lp * 2 * P / tp / (g.bf16_flops * self.e_pf)
        wake = np.where(
            sleep == 1, v_weights / pcie + self.kv_realloc, np.where(sleep == 2, self.realloc2, 0.0)
        )
        roll_vllm = iters * t_iter * preempt + prefill + self.roll_fixed + wake
        # rollout by generate
        t_seq_hf = (Lp + mean_c / 2) * 2 * L * m.kv_heads * m.head_dim * 2 / bw
        t_iter_hf = (
            self.hf_overhead
            + 2 * P / (g.hbm_bytes_s * self.e_bw_hf)
            + b_gen * t_seq_hf
            + np.where(z3, 2 * P * ring / self.ic_bw + 2 * L * self.lat, 0.0)
            + np.where(off_param, 2 * P / W / pcie, 0.0)
        )
        roll_hf = Lc * self.tail * t_iter_hf
        rollout = np.where(colocate, roll_vllm, roll_hf)  # the bench spaces hold no vLLM server mode
        # training
        tokens = B * t_pad
        flops_tok = np.where(lora, 4 * P, 6 * P) + np.where(gc, 2 * P * self.gc_recompute, 0.0)
        flops_tok = flops_tok + np.where(c["beta"] > 0, 2 * P, 0.0)
        eff = self.e_max * tokens_mb / (tokens_mb + self.m_half)
        compute = tokens * flops_tok / (W * g.bf16_flops * eff)
        grad_bytes = 2 * train_params
        passes = 2 + gc.astype(float)
        comm = np.select(
            [z == 3, z == 2],
            [
                ga * passes * ring * 2 * P / self.ic_bw * (1 - self.ovl_z3)
                + ga * ring * grad_bytes / self.ic_bw
                + ga * passes * L * 8 * self.lat,
                ga * ring * grad_bytes / self.ic_bw * (1 - self.ovl_z2),
            ],
            2 * ring * grad_bytes / self.ic_bw * (1 - self.ovl_ddp),
        )
        shard_params = train_params * np.where(z >= 1, 1 / W, 1.0)
        optim = np.where(
            off_opt,
            shard_params * self.cpu_adam_ns * 1e-9 * crowd + 4 * shard_params / pcie,
            opt_full * 2 / (g.hbm_bytes_s * self.e_opt),
        )
        param_fetch = np.where(off_param, ga * passes * 2 * P / W / pcie, 0.0)
        train = compute + ga * self.t_micro * crowd + comm + optim + param_fetch
        # weight sync: gather (ZeRO-3), then vLLM loads every tensor (Python per tensor, then bytes)
        n_tensors = L * 12 + 3
        bytes_s = 2 * P * ring / self.ic_bw * self.gather_f
        gather_s = np.select(
            [c["sync"] == _SYNC.index("parameter"), c["sync"] == _SYNC.index("batches")],
            [n_tensors * self.t_gather + bytes_s, c["mmb"] * self.t_batch + bytes_s * self.batch_gather_f],
            4 * L * self.t_gather + bytes_s,
        )
        sync_s = (
            np.where(z3, gather_s, 0.0)
            + n_tensors * self.t_tensor
            + 2 * P / tp / (g.hbm_bytes_s * self.e_load)
        )
        sync_s = (
            sync_s + np.where(lora, self.t_merge * P / 7e9, 0.0) + np.where(sleep == 2, self.realloc2, 0.0)
        )
        sync_s = np.where(colocate, sync_s, 0.0)
        # other
        stall = self.stall0 if workers == 0 else self.stall0 * self.stall1 if workers == 1 else 0.0
        moves = 2 * (weights * roff_model + opt * roff_opt) / pcie
        to_sleep = np.where(colocate & (sleep == 1), v_weights / pcie, 0.0)
        other = self.step_fixed * crowd + stall + moves + to_sleep
        idio = take(self.idio)
        rollout, train, sync_s, other = rollout * idio, train * idio, sync_s * idio, other * idio
        step = rollout + train + sync_s + other
        startup = (
            self.load_s
            + ds * self.ds_init
            + z3 * self.z3_init
            + (off_opt | off_param) * self.cpu_adam_init
            + use_vllm
            * (self.vllm_init + 2 * P / tp / self.vllm_load_bw + self.graph_init * np.sqrt(c["seqs"] / 256))
            + np.where((c["beta"] > 0) & ~lora, 0.5 * self.load_s, 0.0)
        )

        # ---- failures, the first a run meets
        kind = np.zeros(n_rows, dtype=np.int8)
        phase = np.zeros(n_rows, dtype=np.int8)
        after = np.zeros(n_rows, dtype=np.int8)

        def put(mask: np.ndarray, k: str, ph: np.ndarray | int, n_after: np.ndarray | int = 0) -> None:
            nonlocal kind, phase, after
            hit = mask & (kind == 0)
            kind = np.where(hit, _KINDS.index(k), kind)
            phase = np.where(hit, ph, phase)
            after = np.where(hit, n_after, after)

        regions = [(r, take(mask)) for r, mask in zip(self.regions, self._region_masks, strict=True)]
        for (_, k, ph, _after), mask in regions:  # a crash at start-up comes before anything else
            if ph == "startup":
                put(mask, k, _PH[ph])
        put(tp_heads, "tp_heads", _PH["startup"])
        put(host_fail, "host", _PH["startup"])
        put(startup_fail, "startup", _PH["startup"])
        put(kv_fail, "kv", _PH["startup"])
        put(oom, "oom", oom_phase)
        for (_, k, ph, n_after), mask in regions:
            # no weight sync without colocated vLLM: the region then fails in training
            where = np.where(colocate | (ph != "weight_sync"), _PH[ph], _PH["train"])
            put(mask, k, where, n_after)
        put(
            take(self.flaky),
            "hang",
            np.where(colocate, take(self.flaky_phase), _PH["train"]),
            take(self.flaky_after),
        )
        return {
            "valid": c["valid"] > 0,
            "peak": peak,
            "kind": kind,
            "phase": phase,
            "after": after,
            "step": step,
            "rollout": rollout,
            "train": train,
            "weight_sync": sync_s,
            "other": other,
            "throughput": B / step,
            "startup": startup,
        }

    def _usable(self, ev: dict[str, np.ndarray]) -> np.ndarray:
        return ev["valid"] & (ev["kind"] == 0) & (ev["peak"] <= HEADROOM * self.capacity)

    def truth(self, params: Mapping[str, Any]) -> Truth:
        """What running ``params`` does on this surface."""
        key = canonical_key(params)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        row = self.table.row(params)
        if row is None:
            raise KeyError(f"configuration not in the bench space: {dict(params)}")
        workers = int(params.get(_WORKERS, 0) or 0)
        ev = {k: v[0] for k, v in self._evaluate(workers, np.asarray([row])).items()}
        kind = _KINDS[int(ev["kind"])]
        failed = kind != "none"
        truth = Truth(
            status=STATUS[kind] if failed else TrialStatus.COMPLETE,
            reason=REASON[kind] if failed else "completed",
            throughput=float(ev["throughput"]),
            step_s=float(ev["step"]),
            startup_s=float(ev["startup"]),
            peak_bytes=int(min(ev["peak"], self.capacity)),
            valid=bool(ev["valid"]),
            phases={p: float(ev[p]) for p in ("rollout", "train", "weight_sync", "other")},
            failed_phase=FAILED_PHASES[int(ev["phase"])] if failed else None,
            live_stop_step=LIVE_STOP.get(kind),
            fail_after_steps=int(ev["after"]),
        )
        self._cache[key] = truth
        return truth

    def usable_throughput(self, params: Mapping[str, Any]) -> float:
        """True throughput if the configuration runs and can be recommended, else 0."""
        t = self.truth(params)
        if t.status is not TrialStatus.COMPLETE or not t.valid or t.peak_bytes > HEADROOM * self.capacity:
            return 0.0
        return t.throughput

    def optimum(self) -> tuple[dict[str, Any], float, dict[str, float]]:
        """The best usable configuration of the whole space, its throughput, and the space's make-up."""
        best_tp, best_params = 0.0, None
        n_total = n_usable = 0
        for workers in self.table.worker_values:
            ev = self._evaluate(workers)
            usable = self._usable(ev)
            n_total += int(ev["valid"].sum())
            n_usable += int(usable.sum())
            if usable.any():
                i = int(np.argmax(np.where(usable, ev["throughput"], 0.0)))
                if ev["throughput"][i] > best_tp:
                    best_tp = float(ev["throughput"][i])
                    best_params = dict(self.table.configs[i])
                    if self.table.has_workers:
                        best_params[_WORKERS] = workers
        if best_params is None:
            raise ValueError(f"{self.setting.name} seed {self.seed}: no configuration works")
        return best_params, best_tp, {"valid": n_total, "usable_frac": n_usable / max(1, n_total)}
