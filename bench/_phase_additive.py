"""Phase-additive GRPO worlds, for the search-efficiency bench: step time is a sum of phases.

A real GRPO step is a sequence of phases that each depend on a few knobs: generation (vLLM's tensor
parallelism, memory share, concurrency, sleep mode), the reference / old-policy log-prob forwards
(micro-batch, checkpointing, β, ZeRO-3's gathers), training (micro-batch, accumulation, checkpointing,
ZeRO stage), the weight sync into vLLM (ZeRO stage, sync batching, TP, LoRA merge) and offload
traffic (optimizer, parameter and rollout offload). Each phase here is a function of its own knobs
alone, with interactions *inside* a phase (TP × memory share through the KV cache, ZeRO-3 × micro-batch
through the gathers), so the step has strong main effects per phase and no interaction between
phases: the structure a per-phase additive model can learn from a handful of runs, and the one the
held-out worlds of issue 42 showed the search failing to exploit.

Memory feasibility is a monotone cliff in the memory knobs: a GPU's load is the trainer's states
(sharded by ZeRO stage, relieved by offload) plus activations (growing with the micro-batch, relieved
by checkpointing) plus colocated vLLM's share (less its residue while asleep); a load over the GPU is
an OOM in the phase that overflows, vLLM's start-up check fails when its share does not fit beside
what the trainer already holds, and the recommendation wants 5 % headroom. On top, one to three
specific combinations of two knob values fail (hang, crash or do not learn), as real bugs do.

Every coefficient, the direction of several effects (whether ZeRO-3 or sleep mode is cheap, how far
tensor parallelism scales, what offload costs), the memory cliff and the failing combinations are
drawn per seed. Like :mod:`_independent` it reads a configuration only through the framework's
decoder and rules (:class:`~_independent.ConfigTable`, whose rows it shares) and never imports
``autotune.estimate``. The truth reports the five phases folded into the four the timeline names:
generation → ``rollout``; log-probs + training → ``train``; weight sync → ``weight_sync``; offload
and data stalls → ``other``.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from _independent import ConfigTable, _pick_region
from _settings import FAILED_PHASES, HEADROOM, LIVE_STOP, REASON, STATUS, Truth

from autotune.records import TrialStatus
from autotune.space import canonical_key

__all__ = ["PHASES", "PhaseAdditiveSurface"]

_WORKERS = "dataloader_num_workers"
_KINDS = ("none", "startup", "oom", "hang", "unhealthy", "crash")
_PH = {name: i for i, name in enumerate(FAILED_PHASES)}
#: the world's own phases, and the timeline phase each is reported in
PHASES = {
    "generation": "rollout",
    "logprob": "train",
    "training": "train",
    "weight_sync": "weight_sync",
    "offload": "other",
}


class PhaseAdditiveSurface:
    """One phase-additive world for a setting and a seed (see the module docstring).

    Args:
        table: the setting's decoded configurations (shared with the independent world).
        seed: draws every coefficient, the memory cliff and the failing combinations.
    """

    def __init__(self, table: ConfigTable, seed: int) -> None:
        self.table = table
        self.setting = s = table.setting
        self.seed = seed
        rng = np.random.default_rng([seed, zlib.crc32(f"phase-additive:{s.name}".encode())])
        u = rng.uniform

        def lu(lo: float, hi: float) -> float:  # log-uniform
            return float(math.exp(u(math.log(lo), math.log(hi))))

        self.capacity = float(s.gpu_spec().memory_bytes)
        size = s.model_spec().params / 7e9
        # -- generation: G × TP scaling × concurrency, plus wake-up from sleep
        self.gen_s = lu(8.0, 30.0) * size**0.7
        self.hf_factor = lu(3.0, 10.0)  # generate() without vLLM
        self.tp_exp = u(0.15, 0.9)  # how far TP speeds decoding up ...
        self.tp_comm = lu(0.01, 0.25)  # ... and what each extra rank costs in all-reduces
        self.kv_need = lu(0.02, 0.12) * size  # memory share one engine's weights take, per TP rank
        self.conc_half = lu(8.0, 64.0)  # sequences in flight at half the peak decode rate
        self.kv_seqs = lu(200.0, 1500.0)  # sequences the KV cache of a whole GPU's spare share holds
        self.wake_s = (0.0, lu(0.2, 4.0), lu(0.5, 8.0))  # per sleep level
        # -- log-prob forwards (old policy, reference with β > 0)
        self.lp_s = lu(0.05, 0.3) * self.gen_s
        self.lp_micro = lu(0.2, 2.0)  # fixed cost per micro-batch, relative to one sample
        self.ref_f = u(0.6, 1.0)
        # -- training
        self.train_s = lu(0.2, 1.0) * self.gen_s
        self.micro_half = lu(0.5, 6.0)  # micro-batch at half the peak efficiency
        self.gc_cost = u(0.15, 0.45)
        self.zero_f = {0: 1.0, 1: u(0.95, 1.15), 2: u(0.9, 1.3), 3: lu(0.8, 1.8)}
        self.z3_micro = lu(0.02, 0.4) * self.train_s  # ZeRO-3 gathers per micro-batch
        self.z3_lp = u(0.0, 1.0)  # ... and the log-prob forwards gather too, as a share
        # -- weight sync
        self.sync_s = lu(0.05, 0.6) * self.gen_s * 0.2
        self.sync_z3 = lu(1.0, 4.0)
        self.sync_tp = u(-0.15, 0.25)  # per doubling of TP
        self.sync_batches = u(-0.2, 0.3)  # move_model_batches set: cheaper or dearer
        self.merge_s = lu(0.1, 2.0)
        # -- offload and other
        self.off_opt_s = lu(0.05, 0.6) * self.train_s
        self.off_param_s = lu(0.05, 0.4) * self.train_s  # per micro-batch of accumulation
        self.roff_s = (lu(0.05, 0.5) * self.gen_s * 0.2, lu(0.05, 0.5) * self.gen_s * 0.2)
        self.stall_s = (lu(0.3, 4.0), u(0.1, 0.6), u(0.0, 0.1))  # 0, 1, 2+ data-loader workers
        self.fixed_s = u(0.3, 2.0)
        # -- memory (shares of the GPU): the cliff
        full = 0.0 if table.setting.fixed.get("tuner_type") == "lora" else 1.0
        bytes_per_param = 2.0 + 14.0 * full  # bf16 weights; gradients and Adam states when all train
        self.states = lu(0.7, 1.3) * bytes_per_param * s.model_spec().params / self.capacity
        self.shard = {0: 1.0, 1: u(0.55, 0.7), 2: u(0.4, 0.55), 3: u(0.12, 0.3)}
        self.off_opt_save = u(0.4, 0.7)
        self.off_param_save = u(0.15, 0.3)
        self.act = lu(0.01, 0.06) * size**0.5  # per sample of the micro-batch
        self.gc_save = u(0.6, 0.85)
        self.base_mem = u(0.03, 0.08)
        self.v_resid = (1.0, u(0.05, 0.2), u(0.01, 0.05))  # vLLM's share kept, by sleep level
        self.roff_save = u(0.5, 0.9)
        # -- the idiosyncrasy of each configuration, per phase (small: the world is near-additive)
        self.idio = np.exp(rng.normal(0.0, u(0.01, 0.04), (len(PHASES), table.n_rows)))
        # -- specific failing combinations (never the user's baseline)
        base = table.row(table.space.active(dict(s.baseline)))
        self.regions: list[tuple[tuple[tuple[str, int], ...], str, str]] = []
        masks: list[np.ndarray] = []
        for _ in range(int(rng.integers(1, 4))):
            terms, mask = _pick_region(table, rng, base)
            if terms and len(terms) == 2:
                kind = str(rng.choice(["hang", "unhealthy", "crash"]))
                phase = (
                    "train" if kind == "unhealthy" else str(rng.choice(["rollout", "train", "weight_sync"]))
                )
                self.regions.append((terms, kind, phase))
                masks.append(mask)
        self._masks = masks
        self._cache: dict[str, Truth] = {}

    # -- the truth, vectorised over rows for one data-loader setting ------------------------------
    def _phases(self, c: Mapping[str, np.ndarray], workers: int) -> dict[str, np.ndarray]:
        """Seconds per step of each of the world's phases (:data:`PHASES`)."""
        use_vllm, colocate = c["use_vllm"] > 0, c["colocate"] > 0
        tp, pdbs, ga, gc, z = c["tp"], c["pdbs"], c["ga"], c["gc"] > 0, c["zero"]
        lora = c["lora"] > 0
        zf = np.vectorize(lambda v: self.zero_f[int(v)])(z) if len(z) else z
        # generation: TP scaling and concurrency, which the KV cache caps
        spare = np.clip(c["util"] - self.kv_need / np.maximum(tp, 1), 0.0, None)
        conc = np.minimum(c["seqs"], np.maximum(1.0, spare * self.kv_seqs * tp))
        vllm_gen = self.gen_s * (tp**-self.tp_exp + self.tp_comm * (tp - 1)) * (1 + self.conc_half / conc)
        wake = np.select([c["sleep"] == 1, c["sleep"] == 2], [self.wake_s[1], self.wake_s[2]], 0.0)
        generation = np.where(use_vllm, vllm_gen + wake, self.gen_s * self.hf_factor)
        # log-prob forwards: per-micro-batch overhead, the reference with β > 0, ZeRO-3 gathers
        ref = np.where((c["beta"] > 0) & ~lora, self.ref_f, 0.0)
        logprob = self.lp_s * (1 + ref) * (1 + self.lp_micro / pdbs) + np.where(
            z == 3, self.z3_lp * self.z3_micro * ga, 0.0
        )
        # training: efficiency that saturates with the micro-batch, recompute, ZeRO stage and gathers
        training = self.train_s * zf * (1 + self.micro_half / pdbs) * (1 + gc * self.gc_cost) + np.where(
            z == 3, self.z3_micro * ga, 0.0
        )
        # weight sync (colocated vLLM only)
        sync = (
            self.sync_s
            * np.where(z == 3, self.sync_z3, 1.0)
            * (1 + self.sync_tp * np.log2(np.maximum(tp, 1)))
        )
        sync = sync * np.where(c["mmb"] > 0, 1 + self.sync_batches, 1.0) + np.where(lora, self.merge_s, 0.0)
        sync = np.where(use_vllm & colocate, sync, 0.0)
        # offload and data
        stall = self.stall_s[min(workers, 2)]
        offload = (
            c["off_opt"] * self.off_opt_s
            + c["off_param"] * self.off_param_s * ga
            + c["roff_model"] * self.roff_s[0]
            + c["roff_opt"] * self.roff_s[1]
            + stall
            + self.fixed_s
        )
        out = {"generation": generation, "logprob": logprob, "training": training, "weight_sync": sync}
        out["offload"] = np.broadcast_to(offload, generation.shape).astype(float)
        return out

    def _memory(self, c: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Shares of the GPU: (trainer at vLLM's start, peak in rollout, peak in training)."""
        use_vllm, colocate = c["use_vllm"] > 0, c["colocate"] > 0
        shard = np.vectorize(lambda v: self.shard[int(v)])(c["zero"]) if len(c["zero"]) else c["zero"]
        states = (
            self.states
            * shard
            * (1 - self.off_opt_save * c["off_opt"])
            * (1 - self.off_param_save * c["off_param"])
        )
        act = self.act * c["pdbs"] * (1 - self.gc_save * (c["gc"] > 0))
        vllm = np.where(use_vllm & colocate, c["util"], 0.0)
        resid = np.select([c["sleep"] == 1, c["sleep"] == 2], [self.v_resid[1], self.v_resid[2]], 1.0)
        held_in_rollout = states * (1 - self.roff_save * np.maximum(c["roff_model"], c["roff_opt"]))
        at_start = self.base_mem + states
        rollout = self.base_mem + held_in_rollout + vllm
        train = self.base_mem + states + act + vllm * resid
        return at_start, rollout, train

    def _evaluate(self, workers: int, rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
        take: Callable[[np.ndarray], np.ndarray] = (lambda a: a) if rows is None else (lambda a: a[rows])
        c = {k: take(v) for k, v in self.table.cols.items()}
        phases = self._phases(c, workers)
        for i, name in enumerate(PHASES):
            phases[name] = phases[name] * take(self.idio[i])
        step = sum(phases.values())
        at_start, rollout_mem, train_mem = self._memory(c)
        colocated = (c["use_vllm"] > 0) & (c["colocate"] > 0)
        n = len(step)
        kind = np.zeros(n, dtype=np.int8)
        phase = np.zeros(n, dtype=np.int8)

        def put(mask: np.ndarray, k: str, ph: np.ndarray | int) -> None:
            nonlocal kind, phase
            hit = mask & (kind == 0)
            kind = np.where(hit, _KINDS.index(k), kind)
            phase = np.where(hit, ph, phase)

        put(colocated & (at_start + c["util"] > 1.0), "startup", _PH["startup"])
        put(
            np.maximum(rollout_mem, train_mem) > 1.0,
            "oom",
            np.where(rollout_mem > 1.0, _PH["rollout"], _PH["train"]),
        )
        for (_, k, ph), mask in zip(self.regions, self._masks, strict=True):
            put(take(mask), k, np.where(colocated | (ph != "weight_sync"), _PH[ph], _PH["train"]))
        startup = 30.0 + 20.0 * (c["zero"] == 3) + 40.0 * (c["use_vllm"] > 0) + 20.0 * (c["off_opt"] > 0)
        return {
            "valid": c["valid"] > 0,
            "peak": np.maximum(rollout_mem, train_mem) * self.capacity,
            "kind": kind,
            "phase": phase,
            "step": step,
            "throughput": float(self.setting.global_batch) / step,
            "startup": startup,
            **phases,
        }

    def _usable(self, ev: dict[str, np.ndarray]) -> np.ndarray:
        return ev["valid"] & (ev["kind"] == 0) & (ev["peak"] <= HEADROOM * self.capacity)

    def truth(self, params: Mapping[str, Any]) -> Truth:
        """What running ``params`` does in this world."""
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
        timeline = dict.fromkeys(("rollout", "train", "weight_sync", "other"), 0.0)
        for name, where in PHASES.items():
            timeline[where] += float(ev[name])
        truth = Truth(
            status=STATUS[kind] if failed else TrialStatus.COMPLETE,
            reason=REASON[kind] if failed else "completed",
            throughput=float(ev["throughput"]),
            step_s=float(ev["step"]),
            startup_s=float(ev["startup"]),
            peak_bytes=int(min(ev["peak"], self.capacity)),
            valid=bool(ev["valid"]),
            phases=timeline,
            failed_phase=FAILED_PHASES[int(ev["phase"])] if failed else None,
            live_stop_step=LIVE_STOP.get(kind),
            fail_after_steps=0 if kind in ("startup", "oom") else 1,
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
                    best_tp, best_params = float(ev["throughput"][i]), dict(self.table.configs[i])
                    if self.table.has_workers:
                        best_params[_WORKERS] = workers
        if best_params is None:
            raise ValueError(f"{self.setting.name} seed {self.seed}: no configuration works")
        return best_params, best_tp, {"valid": n_total, "usable_frac": n_usable / max(1, n_total)}
