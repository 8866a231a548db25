"""Estimator-derived GRPO response surfaces for the search-efficiency bench.

A *surface* is one "true world" for a setting (:mod:`_settings`) and a seed: the estimator's memory and step-time model (``autotune.estimate``) distorted by errors drawn from the seed,
plus what the estimator does not model at all:

- memory: per-component errors (model states ±3 %, activations and logits −15…+25 %, other buffers
  −10…+30 %, vLLM's non-KV share −10…+15 %, allocator fragmentation 0…5 %), so a configuration the
  estimate calls a fit may OOM and the other way round; vLLM's start-up free-memory check and its KV
  cache for one ``max_model_len`` sequence are judged on the true numbers; host RAM runs out too;
- time: each phase of the step (rollout, training, weight sync, offload) off by its own factor
  (roughly ±30 %), fewer concurrent rollouts when the true KV cache is smaller, wake-up costs of vLLM's
  sleep mode, TP all-reduce costs (worse on PCIe), ZeRO-3 gather and recompute overheads, data-loader
  stalls (no workers) and CPU contention (many), a per-configuration idiosyncratic ±1 %, and ±2 %
  noise per step;
- failures without memory: NCCL hangs where colocated vLLM spans every GPU and sleeps, ms-swift hangs
  under ZeRO-3 weight sync at TP > 1 without ``move_model_batches``, degenerate training with batch 1
  under ZeRO ≥ 2 with gradient accumulation, gibberish rollouts at ms-swift sleep level 2, and 2 % of
  colocated configurations hanging at random — each region present on some seeds only;
- costs: start-up of minutes (model load, DeepSpeed and CPU-Adam initialisation, vLLM start-up and
  CUDA graphs, the reference model), failures that cost what they would (a vLLM start-up failure costs
  the start-up, an OOM the start-up and part of a step, a hang the watchdog's wait).

The estimator's outputs for every configuration are computed once per setting (they do not depend on
the seed) and the truth is evaluated with numpy, so the optimum over the whole space is exact.

A truth carries the step's phases (the estimator's rollout term with vLLM's wake-up, its training and
weight-sync terms; offload moves and data-loader stalls are "other") and where a failure happens: an
OOM in the first phase whose memory exceeds the GPU, vLLM's checks and host OOMs at start-up, the
sleep/TP hang in the rollout, the ZeRO-3 sync hang in the weight sync, a random hang in a random phase.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np
from _settings import FAILED_PHASES, HEADROOM, LIVE_STOP, REASON, STATUS, Setting, Truth

from autotune.backends import Backend, TrialContext, job_shape
from autotune.estimate import GIB
from autotune.estimate.memory import estimate_memory
from autotune.estimate.timing import estimate_step_time
from autotune.records import TrialStatus
from autotune.space import SearchSpace, canonical_key

__all__ = ["RawTable", "Surface"]

_CORE_DROP = "dataloader_num_workers"  # the estimator's GPU memory and time ignore it: computed apart
_PHASES = ("train", "rollout", "sync")
# the estimator's memory phases in the order a step meets them, with the timeline's names
_STEP_ORDER = (("rollout", "rollout"), ("train", "train"), ("sync", "weight_sync"))


def _core(params: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in params.items() if k != _CORE_DROP}


class RawTable:
    """The estimator's outputs for every configuration of a setting (without the data-loader knob).

    Seed-independent: built once per setting, then every seed's truth is numpy arithmetic on it.
    """

    def __init__(self, setting: Setting, space: SearchSpace, backend: Backend, ctx: TrialContext) -> None:
        self.setting = setting
        model, gpu = setting.model_spec(), setting.gpu_spec()
        n = setting.n_gpus
        core_space = space.narrow({_CORE_DROP: (0,)}) if _CORE_DROP in space else space
        cols: dict[str, list[float]] = {}
        self.configs: list[dict[str, Any]] = []
        self.index: dict[str, int] = {}

        def put(name: str, value: float) -> None:
            cols.setdefault(name, []).append(float(value))

        per_token_kv = 2 * model.layers * model.head_dim * 2
        for params in core_space.grid():
            core = _core(params)
            derived = backend.derive(dict(params), ctx)
            valid = not backend.check_rules(dict(params), derived, ctx)
            shape = job_shape(setting.backend, params, derived, setting.fixed, model, n)
            mem = estimate_memory(shape, gpu)
            t = estimate_step_time(shape, gpu, mem)
            self.index[canonical_key(core)] = len(self.configs)
            self.configs.append(core)
            put("valid", valid)
            put("ga", shape.grad_accum)
            for ph in _PHASES:
                comps = mem.phases.get(ph)
                if comps is None:
                    for g in ("states", "act", "vllm", "other"):
                        put(f"{ph}_{g}", 0.0)
                    continue
                put(
                    f"{ph}_states",
                    comps["policy_weights"]
                    + comps["gradients"]
                    + comps["optimizer_states"]
                    + comps["reference_model"],
                )
                put(f"{ph}_act", comps["activations"] + comps["logits"])
                put(f"{ph}_vllm", comps["vllm_reserved"])
                put(f"{ph}_other", comps["zero3_gather"] + comps["cuda_context"] + comps["nccl_buffers"])
            train = mem.phases["train"]
            held_policy = 0 if shape.rollout_offload_model else train["policy_weights"]
            put("held", train["cuda_context"] + held_policy + train["reference_model"])
            put("budget", shape.vllm_util * gpu.memory_bytes if shape.colocate else 0.0)
            put("kv_bytes", mem.kv_bytes)
            put(
                "kv_need",
                shape.vllm_max_model_len * per_token_kv * max(1, math.ceil(model.kv_heads / shape.vllm_tp)),
            )
            put("conc", mem.rollout_concurrency)
            put("kv_tokens", mem.kv_tokens)
            put("host", mem.host_bytes)
            put("rollout_s", t.rollout_s)
            put("train_s", t.train_s)
            put("sync_s", t.sync_s)
            put("offload_s", t.offload_s)
            put("colocate", shape.colocate)
            put("use_vllm", shape.use_vllm)
            put("tp", shape.vllm_tp)
            put("sleep", shape.sleep_level)
            put("zero", shape.zero_stage if shape.deepspeed else 0)
            put("ds", shape.deepspeed)
            put("ds_offload", shape.ds_offload_optimizer or shape.ds_offload_param)
            put("pdbs", shape.per_device_batch)
            put("gc", shape.gradient_checkpointing)
            put("mmb", shape.move_model_batches or 0)
        self.cols = {k: np.asarray(v) for k, v in cols.items()}
        self.n_rows = len(self.configs)
        # host RAM per data-loader worker, measured from the estimator rather than copied from it
        probe = dict(self.configs[0])
        derived = backend.derive(dict(probe), ctx)
        h0 = estimate_memory(
            job_shape(setting.backend, {**probe, _CORE_DROP: 0}, derived, setting.fixed, model, n), gpu
        ).host_bytes
        h1 = estimate_memory(
            job_shape(setting.backend, {**probe, _CORE_DROP: 1}, derived, setting.fixed, model, n), gpu
        ).host_bytes
        self.host_per_worker = float(h1 - h0)
        self.has_workers = _CORE_DROP in space
        self.worker_values: tuple[int, ...] = tuple(space[_CORE_DROP].values()) if self.has_workers else (0,)

    def row(self, params: Mapping[str, Any]) -> int | None:
        return self.index.get(canonical_key(_core(params)))


class Surface:
    """One true world for a setting: the raw table distorted by errors drawn from ``seed``."""

    def __init__(self, table: RawTable, seed: int) -> None:
        self.table = table
        self.setting = s = table.setting
        self.seed = seed
        rng = np.random.default_rng(10_007 * seed + zlib.crc32(s.name.encode()))
        u = rng.uniform
        model, gpu = s.model_spec(), s.gpu_spec()
        self.capacity = float(gpu.memory_bytes)
        self.host_ram = s.host_ram_gib * GIB
        # memory errors
        self.f_states = u(0.97, 1.03)
        self.f_act = u(0.85, 1.25)
        self.f_other = u(0.9, 1.3)
        self.f_vllm = u(0.9, 1.15)
        self.frag = u(1.0, 1.05)
        self.f_host = u(0.95, 1.15)
        # time errors
        self.f_roll = math.exp(u(math.log(0.75), math.log(1.35)))
        self.f_train = math.exp(u(math.log(0.75), math.log(1.35)))
        self.f_sync = math.exp(u(math.log(0.6), math.log(1.6)))
        self.f_off = math.exp(u(math.log(0.6), math.log(1.8)))
        self.wake_s = u(0.5, 3.0) * model.params / 7e9
        self.gc_factor = u(0.95, 1.1)
        self.z3_factor = u(1.0, 1.2)
        self.tp_factor = u(1.0, 1.2) if gpu.interconnect == "pcie" else u(0.97, 1.06)
        self.no_worker_penalty = u(0.0, 0.04)
        self.contention_penalty = u(0.0, 0.03)
        self.idio = np.exp(rng.normal(0.0, 0.01, table.n_rows))
        self.flaky = rng.uniform(0.0, 1.0, table.n_rows) < 0.02
        # failure regions present on this seed
        self.hang_tp_sleep = bool(rng.uniform() < 0.5)
        knobs = s.space().names  # failure modes of frameworks that have the knobs behind them
        self.hang_z3_sync = bool(rng.uniform() < 0.5) and "move_model_batches" in knobs
        self.unhealthy_batch1 = bool(rng.uniform() < 0.5)
        self.gibberish_sleep2 = bool(rng.uniform() < 0.5) and "sleep_level" in knobs
        # where a random hang stops the step (drawn last, so the draws above are those of every seed before)
        self.flaky_phase = rng.integers(1, len(FAILED_PHASES), table.n_rows)
        # start-up costs (seconds)
        load_s = 25.0 + 2 * model.params / 1.5e9
        c = table.cols
        self.startup = (
            load_s
            + c["ds"] * 15.0
            + (c["zero"] == 3) * 20.0
            + c["ds_offload"] * 30.0
            + c["use_vllm"] * (40.0 + 2 * model.params / np.maximum(c["tp"], 1) / 2e9 + 25.0)
            + (0.5 * load_s if float(s.fixed.get("beta", 0.0)) > 0 else 0.0)
        )
        self._cache: dict[str, Truth] = {}

    # -- the truth, vectorised over rows for one data-loader setting ------------------------------
    def _evaluate(self, workers: int, rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
        c = self.table.cols
        take = (lambda a: a) if rows is None else (lambda a: a[rows])
        trainer = {
            ph: self.frag
            * (
                self.f_states * take(c[f"{ph}_states"])
                + self.f_act * take(c[f"{ph}_act"])
                + self.f_other * take(c[f"{ph}_other"])
            )
            for ph in _PHASES
        }
        phases = [trainer[ph] + take(c[f"{ph}_vllm"]) for ph in _PHASES]
        present = [
            take(c[f"{ph}_states"]) + take(c[f"{ph}_act"]) + take(c[f"{ph}_other"]) > 0 for ph in _PHASES
        ]
        peak = np.max([np.where(p, v, 0.0) for p, v in zip(present, phases, strict=True)], axis=0)
        colocate = take(c["colocate"]) > 0
        budget = take(c["budget"])
        held = self.frag * self.f_states * take(c["held"])
        startup_fail = colocate & (budget > self.capacity - held)
        kv_true = take(c["kv_bytes"]) - (self.f_vllm - 1.0) * (budget - take(c["kv_bytes"]))
        kv_fail = colocate & (kv_true < take(c["kv_need"]))
        host = (take(c["host"]) + workers * self.table.host_per_worker) * self.f_host
        host_fail = host > self.host_ram
        oom = peak > self.capacity
        # the first phase of a step (rollout, training, weight sync) whose memory exceeds the GPU
        oom_phase = np.full(peak.shape, FAILED_PHASES.index("weight_sync"))
        for name, phase in reversed(_STEP_ORDER):
            i = _PHASES.index(name)
            oom_phase = np.where(
                present[i] & (phases[i] > self.capacity), FAILED_PHASES.index(phase), oom_phase
            )
        # time
        kv_tokens = np.maximum(take(c["kv_tokens"]), 1.0)
        kv_scale = np.clip(kv_true / np.maximum(take(c["kv_bytes"]), 1.0), 0.05, 1.0)
        conc = take(c["conc"])
        limited_by_kv = (
            conc
            >= np.floor(
                kv_tokens / (self.setting.fixed["max_prompt_length"] + self.setting.max_completion_length)
            )
            - 0.5
        )
        conc_penalty = np.where(colocate & limited_by_kv & (kv_scale < 1.0), (1.0 / kv_scale) ** 0.7, 1.0)
        tp = take(c["tp"])
        rollout = (
            self.f_roll * take(c["rollout_s"]) * conc_penalty * self.tp_factor ** np.log2(np.maximum(tp, 1))
        )
        train = (
            self.f_train
            * take(c["train_s"])
            * np.where(take(c["gc"]) > 0, self.gc_factor, 1.0)
            * np.where(take(c["zero"]) == 3, self.z3_factor, 1.0)
        )
        wake = np.where(colocate & (take(c["sleep"]) > 0), self.wake_s, 0.0)
        sync = self.f_sync * take(c["sync_s"])
        step = rollout + train + sync + self.f_off * take(c["offload_s"]) + wake
        idio = take(self.idio)
        step = step * idio
        step = step * (
            1.0
            + (self.no_worker_penalty if workers == 0 else 0.0)
            + (self.contention_penalty if workers >= 8 else 0.0)
        )
        throughput = self.setting.global_batch / step
        # the phases of a step: vLLM's wake-up counts to the rollout, offload moves and data stalls to "other"
        rollout_s, train_s, sync_s = (rollout + wake) * idio, train * idio, sync * idio
        other_s = np.maximum(step - rollout_s - train_s - sync_s, 0.0)
        # failures without memory
        hang = take(self.flaky) & colocate
        hang_phase = take(self.flaky_phase)
        if self.hang_tp_sleep:
            region = colocate & (tp == self.setting.n_gpus) & (take(c["sleep"]) > 0)
            hang_phase = np.where(region, FAILED_PHASES.index("rollout"), hang_phase)
            hang |= region
        if self.hang_z3_sync:
            region = colocate & (take(c["zero"]) == 3) & (take(c["mmb"]) == 0) & (tp > 1)
            hang_phase = np.where(region, FAILED_PHASES.index("weight_sync"), hang_phase)
            hang |= region
        unhealthy = np.zeros_like(hang)
        if self.unhealthy_batch1:
            unhealthy |= (take(c["pdbs"]) == 1) & (take(c["zero"]) >= 2) & (take(c["ga"]) > 1)
        gibberish = np.zeros_like(hang)
        if self.gibberish_sleep2:
            gibberish |= colocate & (take(c["sleep"]) == 2)
        return {
            "peak": peak,
            "startup_fail": startup_fail,
            "kv_fail": kv_fail,
            "host_fail": host_fail,
            "oom": oom,
            "hang": hang,
            "unhealthy": unhealthy,
            "gibberish": gibberish,
            "step": step,
            "rollout_s": rollout_s,
            "train_s": train_s,
            "sync_s": sync_s,
            "other_s": other_s,
            "oom_phase": oom_phase,
            "hang_phase": hang_phase,
            "throughput": throughput,
            "valid": take(c["valid"]) > 0,
            "startup": take(self.startup),
        }

    @staticmethod
    def _usable(ev: dict[str, np.ndarray], capacity: float) -> np.ndarray:
        ok = ~(
            ev["startup_fail"]
            | ev["kv_fail"]
            | ev["host_fail"]
            | ev["oom"]
            | ev["hang"]
            | ev["unhealthy"]
            | ev["gibberish"]
        )
        return ev["valid"] & ok & (ev["peak"] <= HEADROOM * capacity)

    def truth(self, params: Mapping[str, Any]) -> Truth:
        """What running ``params`` does on this surface."""
        key = canonical_key(params)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        row = self.table.row(params)
        if row is None:
            raise KeyError(f"configuration not in the bench space: {dict(params)}")
        workers = int(params.get(_CORE_DROP, 0) or 0)
        ev = {k: v[0] for k, v in self._evaluate(workers, np.asarray([row])).items()}
        # failures in the order the run meets them
        kind, phase = next(
            (
                (kind, phase)
                for kind, phase, found in (
                    ("host", "startup", ev["host_fail"]),
                    ("startup", "startup", ev["startup_fail"]),
                    ("kv", "startup", ev["kv_fail"]),
                    ("oom", FAILED_PHASES[int(ev["oom_phase"])], ev["oom"]),
                    ("hang", FAILED_PHASES[int(ev["hang_phase"])], ev["hang"]),
                    ("unhealthy", "train", ev["unhealthy"]),
                    ("gibberish", "rollout", ev["gibberish"]),
                )
                if found
            ),
            (None, None),
        )
        truth = Truth(
            status=STATUS[kind] if kind else TrialStatus.COMPLETE,
            reason=REASON[kind] if kind else "completed",
            throughput=float(ev["throughput"]),
            step_s=float(ev["step"]),
            startup_s=float(ev["startup"]),
            peak_bytes=int(min(ev["peak"], self.capacity)),
            valid=bool(ev["valid"]),
            phases={
                "rollout": float(ev["rollout_s"]),
                "train": float(ev["train_s"]),
                "weight_sync": float(ev["sync_s"]),
                "other": float(ev["other_s"]),
            },
            failed_phase=phase,
            live_stop_step=LIVE_STOP.get(kind or ""),
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
            usable = self._usable(ev, self.capacity)
            n_total += int(ev["valid"].sum())
            n_usable += int(usable.sum())
            if usable.any():
                i = int(np.argmax(np.where(usable, ev["throughput"], 0.0)))
                if ev["throughput"][i] > best_tp:
                    best_tp = float(ev["throughput"][i])
                    best_params = dict(self.table.configs[i])
                    if self.table.has_workers:
                        best_params[_CORE_DROP] = workers
        if best_params is None:
            raise ValueError(f"{self.setting.name} seed {self.seed}: no configuration works")
        return best_params, best_tp, {"valid": n_total, "usable_frac": n_usable / max(1, n_total)}
