"""Per-GPU memory of one GRPO trial, by component and by phase.

A GRPO step passes through phases that hold different things on the GPU:

- ``startup``: colocated vLLM starts while the trainer already holds its weights; vLLM refuses to start
  unless free memory ≥ ``gpu_memory_utilization × total``.
- ``train``: model states + reference model + activations + logits, beside a sleeping (or awake) vLLM.
- ``rollout``: vLLM's whole budget beside what the trainer keeps (ms-swift ``offload_model`` /
  ``offload_optimizer`` move weights / optimizer states to the CPU for this phase).
- ``sync``: weights pushed into vLLM; under ZeRO-3 they are gathered (all at once, per parameter, or in
  ``move_model_batches`` groups, by framework).

The peak is the largest phase. Model states follow DeepSpeed's own estimators
(:mod:`autotune.estimate.states`); the rest are the approximations documented next to each constant. Numbers are bytes per GPU unless named ``host``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np

from autotune.estimate import _vec as v
from autotune.estimate.catalog import GIB, GpuSpec, ModelSpec
from autotune.estimate.shape import JobShape
from autotune.estimate.states import ModelStates, lora_params, model_states
from autotune.jsontypes import JsonObject

__all__ = [
    "COMPONENTS",
    "MemoryEstimate",
    "MemoryTerms",
    "estimate_memory",
    "memory_terms",
    "should_prune",
    "terms_estimate",
]

#: Stable component names, in the order reports list them.
COMPONENTS: tuple[str, ...] = (
    "policy_weights",
    "gradients",
    "optimizer_states",
    "reference_model",
    "activations",
    "logits",
    "vllm_reserved",
    "zero3_gather",
    "cuda_context",
    "nccl_buffers",
)

CUDA_CONTEXT_BYTES = int(0.5 * GIB)  # CUDA context + cuBLAS/cuDNN workspaces of one process
NCCL_BYTES = int(0.25 * GIB)  # NCCL communicator buffers when world size > 1
# ZeRO-1/2 reduce and allgather buckets, elements: ms-swift's presets set 2e8; autotune's TRL
# ds_config leaves DeepSpeed's default of 5e8.
VLLM_OVERHEAD_BYTES = int(0.5 * GIB)  # CUDA graphs + non-torch memory of one vLLM worker
VLLM_TP_EXTRA_BYTES = int(0.25 * GIB)  # custom all-reduce / NCCL buffers of vLLM at TP > 1
LOGITS_BYTES_PER_ELEMENT = 6  # bf16 logits + a bf16 temperature-scaled copy (or fp32 upcast) + bf16 gradient
HOST_RANK_BYTES = 3 * GIB  # resident set of one training rank (torch, CUDA libraries, tokenizer)
HOST_WORKER_BYTES = int(0.5 * GIB)  # one data-loader worker process


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted memory of one trial.

    Attributes:
        components_bytes: per-GPU bytes of each component at the peak phase (names in
            :data:`COMPONENTS`); they sum to ``peak_bytes``.
        peak_bytes: per-GPU peak over the phases.
        peak_phase: the phase of the peak (``train``, ``rollout``, ``sync``).
        phases: per-GPU components of every phase.
        capacity_bytes: memory of one GPU (0 on a CPU-only trial).
        host_bytes: host RAM the node needs (offloaded states, sleeping vLLM weights, the ranks).
        kv_tokens: tokens the vLLM KV cache holds per instance (0 without colocated vLLM).
        kv_bytes: bytes left for the KV cache per GPU (negative: vLLM finds no memory for it).
        rollout_concurrency: sequences one vLLM instance decodes at once.
        vllm_startup_ok: vLLM's start-up free-memory check passes (True without colocated vLLM).
        vllm_startup_deficit_bytes: how much free memory the start-up check lacks.
        kv_ok: the KV cache holds at least one sequence of ``max_model_len``.
        kv_deficit_bytes: how much KV memory is missing for one sequence.
        on_gpu: False for a CPU-only trial (nothing is judged there).
        calibration_factor: factor applied to the modelled part by a :class:`Calibration` (1 = raw).
        notes: short explanations (what was assumed).
    """

    components_bytes: dict[str, int]
    peak_bytes: int
    peak_phase: str
    phases: dict[str, dict[str, int]]
    capacity_bytes: int
    host_bytes: int
    kv_tokens: int
    kv_bytes: int
    rollout_concurrency: int
    vllm_startup_ok: bool
    vllm_startup_deficit_bytes: int
    kv_ok: bool
    kv_deficit_bytes: int
    on_gpu: bool = True
    calibration_factor: float = 1.0
    notes: tuple[str, ...] = field(default=())

    @property
    def phases_bytes(self) -> dict[str, int]:
        """Per-GPU total of every phase."""
        return {name: sum(comps.values()) for name, comps in self.phases.items()}

    @property
    def headroom_bytes(self) -> int:
        """Capacity minus peak (negative when it does not fit)."""
        return self.capacity_bytes - self.peak_bytes

    @property
    def vllm_ok(self) -> bool:
        return self.vllm_startup_ok and self.kv_ok

    def fits(self, margin: float = 0.0) -> bool:
        """True when the peak leaves ``margin × capacity`` free and vLLM can start with a KV cache.

        A CPU-only trial always fits (nothing is predicted for it).
        """
        if not self.on_gpu:
            return True
        return self.vllm_ok and self.peak_bytes <= self.capacity_bytes * (1.0 - margin)

    def overflow(self) -> tuple[str, int] | None:
        """The component to blame and by how many bytes the estimate overflows, or None when it fits.

        Of the failures that apply, the largest is reported: a failed vLLM start-up check blames
        ``vllm_reserved`` by the missing free memory; a KV cache too small for one sequence blames
        ``vllm_reserved`` by the missing KV bytes; a peak over capacity blames the largest component of
        the peak phase, by ``peak − capacity``.
        """
        if not self.on_gpu:
            return None
        failures: list[tuple[str, int]] = []
        if not self.vllm_startup_ok:
            failures.append(("vllm_reserved", self.vllm_startup_deficit_bytes))
        if not self.kv_ok:
            failures.append(("vllm_reserved", self.kv_deficit_bytes))
        over = self.peak_bytes - self.capacity_bytes
        if over > 0:
            failures.append((max(self.components_bytes.items(), key=lambda kv: kv[1])[0], over))
        return max(failures, key=lambda f: f[1]) if failures else None

    def reason(self) -> str:
        """One line: what is needed against what there is, and the components, largest first."""
        if not self.on_gpu:
            return "CPU-only trial: no GPU memory is predicted"
        parts = ", ".join(
            f"{name} {_gib(b)}"
            for name, b in sorted(self.components_bytes.items(), key=lambda kv: -kv[1])
            if b > 0
        )
        head = f"needs {_gib(self.peak_bytes)} of {_gib(self.capacity_bytes)} per GPU ({self.peak_phase})"
        if not self.vllm_startup_ok:
            head = (
                f"vLLM start-up check fails: {_gib(self.vllm_startup_deficit_bytes)} less free memory than "
                f"gpu_memory_utilization reserves; {head}"
            )
        elif not self.kv_ok:
            head = f"vLLM KV cache lacks {_gib(self.kv_deficit_bytes)} for one max_model_len sequence; {head}"
        return f"{head}: {parts}"

    def to_dict(self) -> JsonObject:
        """JSON-friendly form (``TrialResult.estimate``)."""
        over = self.overflow()
        return {
            "components_bytes": dict(self.components_bytes),
            "peak_bytes": self.peak_bytes,
            "peak_phase": self.peak_phase,
            "phases_bytes": dict(self.phases_bytes),
            "phases": {k: dict(v) for k, v in self.phases.items()},
            "capacity_bytes": self.capacity_bytes,
            "host_bytes": self.host_bytes,
            "kv_tokens": self.kv_tokens,
            "kv_bytes": self.kv_bytes,
            "rollout_concurrency": self.rollout_concurrency,
            "vllm_startup_ok": self.vllm_startup_ok,
            "vllm_startup_deficit_bytes": self.vllm_startup_deficit_bytes,
            "kv_ok": self.kv_ok,
            "kv_deficit_bytes": self.kv_deficit_bytes,
            "on_gpu": self.on_gpu,
            "calibration_factor": self.calibration_factor,
            "fits": self.fits(),
            "overflow": {"component": over[0], "bytes": over[1]} if over else None,
            "reason": self.reason(),
            "notes": list(self.notes),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MemoryEstimate:
        """Inverse of :meth:`to_dict` (derived keys are ignored)."""
        return cls(
            components_bytes={k: int(v) for k, v in data["components_bytes"].items()},
            peak_bytes=int(data["peak_bytes"]),
            peak_phase=str(data.get("peak_phase", "train")),
            phases={k: {c: int(b) for c, b in v.items()} for k, v in data.get("phases", {}).items()}
            or {
                str(data.get("peak_phase", "train")): {k: int(v) for k, v in data["components_bytes"].items()}
            },
            capacity_bytes=int(data["capacity_bytes"]),
            host_bytes=int(data.get("host_bytes", 0)),
            kv_tokens=int(data.get("kv_tokens", 0)),
            kv_bytes=int(data.get("kv_bytes", 0)),
            rollout_concurrency=int(data.get("rollout_concurrency", 0)),
            vllm_startup_ok=bool(data.get("vllm_startup_ok", True)),
            vllm_startup_deficit_bytes=int(data.get("vllm_startup_deficit_bytes", 0)),
            kv_ok=bool(data.get("kv_ok", True)),
            kv_deficit_bytes=int(data.get("kv_deficit_bytes", 0)),
            on_gpu=bool(data.get("on_gpu", True)),
            calibration_factor=float(data.get("calibration_factor", 1.0)),
            notes=tuple(data.get("notes", ())),
        )

    def scaled(self, factor: float) -> MemoryEstimate:
        """The estimate with every modelled component times ``factor`` (relative to the raw estimate).

        ``vllm_reserved`` is exact (utilization × total) and the vLLM checks do not depend on the
        trainer's activations, so both are kept as they are. The peak phase may change.
        """
        if factor == self.calibration_factor:
            return self
        rel = factor / self.calibration_factor
        phases = {
            name: {k: (v if k == "vllm_reserved" else int(round(v * rel))) for k, v in comps.items()}
            for name, comps in self.phases.items()
        }
        peak_phase = max(phases, key=lambda k: sum(phases[k].values()))
        return replace(
            self,
            components_bytes=dict(phases[peak_phase]),
            peak_bytes=sum(phases[peak_phase].values()),
            peak_phase=peak_phase,
            phases=phases,
            calibration_factor=factor,
        )


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def should_prune(est: MemoryEstimate, margin: float = 0.15) -> bool:
    """True only when the estimate fails by more than ``margin``: the peak exceeds capacity by more than
    ``margin × capacity``, or vLLM's start-up (free memory, or KV for one sequence) lacks more than
    ``margin × capacity``. A CPU-only estimate is never pruned.
    """
    if not est.on_gpu or est.capacity_bytes <= 0:
        return False
    slack = margin * est.capacity_bytes
    if est.vllm_startup_deficit_bytes > slack or est.kv_deficit_bytes > slack:
        return True
    return est.peak_bytes > est.capacity_bytes + slack


# ------------------------------------------------------------------------------------- the estimate


# ------------------------------------------------------------------------------------- the estimate
#
# The functions below take ``s``: one trial (a JobShape: Python numbers) or every candidate of a plan
# (ShapeColumns: numpy columns of the same names). They are written once, with autotune.estimate._vec.


def _activation_bytes_per_token_layer(m: ModelSpec) -> int:
    """bf16 activations one decoder layer keeps for backward, per token (no checkpointing).

    Counted for an HF Llama/Qwen layer with SDPA attention: two RMSNorms (fp32 input, fp32 normalised,
    bf16 output ≈ 10·h bytes each), q/k/v/rope/repeat_kv/attention output (≈ 12·h + 8·kv bytes), and
    the SwiGLU MLP (gate, up, act, product ≈ 8·I bytes).
    """
    kv = m.kv_heads * m.head_dim
    return 32 * m.hidden + 8 * kv + 8 * m.intermediate


def _train_activations(s: Any) -> Any:
    m = s.model
    tokens = s.micro_batch_tokens
    full_layer = tokens * _activation_bytes_per_token_layer(m)
    # checkpointing: layer inputs kept (2·h bytes per token per layer) + one layer recomputed in full
    return v.where(
        s.gradient_checkpointing, m.layers * tokens * 2 * m.hidden + full_layer, m.layers * full_layer
    )


def _logits(s: Any) -> Any:
    # Frameworks compute logits only for completion tokens (logits_to_keep); a token-packed micro-batch
    # holds completions in the share they have of a sequence.
    completion_tokens = s.micro_batch_tokens * s.max_completion_length // v.lmax(1, s.seq_len)
    return completion_tokens * s.model.vocab * LOGITS_BYTES_PER_ELEMENT


def _kv_bytes_per_token_gpu(m: ModelSpec, tp: Any) -> Any:
    kv_heads_gpu = v.lmax(1, v.ceil(m.kv_heads / tp))
    return 2 * m.layers * kv_heads_gpu * m.head_dim * 2


def _vllm_batched_tokens(s: Any, capacity_bytes: int, gpu_name: str = "") -> Any:
    # vLLM's default for the offline LLM class (engine/arg_utils.py get_batch_defaults): 16384 on GPUs
    # of 70 GiB or more except the A100 (vLLM PR #17885), else 8192.
    large = capacity_bytes >= 70 * GIB and "a100" not in gpu_name.lower()
    given = v.num(s.vllm_max_num_batched_tokens)
    tokens = v.where(given > 0, given, 16384 if large else 8192)
    # without chunked prefill one forward holds a whole max_model_len prompt: vLLM requires the budget
    # to cover it, and verl raises it there itself (vllm_async_server.py _validate_configs)
    return v.where(s.vllm_chunked_prefill, tokens, v.lmax(tokens, s.vllm_max_model_len))


def _vllm_activation_peak(s: Any, capacity_bytes: int, gpu_name: str = "") -> Any:
    """vLLM's profiled forward peak: MLP intermediates of a full batch of tokens + sampler logits."""
    m, tp = s.model, s.vllm_tp
    tokens = _vllm_batched_tokens(s, capacity_bytes, gpu_name)
    per_token = (6 * m.intermediate + 8 * m.hidden) // tp
    sampler = v.lmin(s.vllm_max_num_seqs, 1024) * m.vocab * 4 * 2
    return tokens * per_token + sampler


def _sync_gather(s: Any) -> Any:
    """Extra bytes gathered to push ZeRO-3 weights into vLLM (0 outside ZeRO-3 or without vLLM)."""
    m = s.model
    batches = v.num(s.move_model_batches)
    embeds = m.vocab * m.hidden * (1 if m.tie_embeddings else 2) + m.hidden
    per_layer = (m.params - m.vision_params - embeds) / m.layers
    layers_per_batch = v.ceil(m.layers / v.lmax(1, batches))
    in_batches = v.to_int(2 * v.lmax(layers_per_batch * per_layer, embeds, m.vision_params))
    whole = v.where(v.either(s.weight_sync == "model", batches == 0), 2 * m.params, in_batches)
    gather = v.where(s.weight_sync == "parameter", 2 * m.largest_layer_params, whole)
    return v.where(s.colocate & (v.num(s.states_sharding) == 3), gather, 0)


def _reference_bytes(s: Any, zero3: Any, n: Any) -> Any:
    """The reference model: bf16 weights, partitioned (or offloaded) like the policy under ZeRO-3."""
    m = s.model
    held = v.where(zero3, v.where(s.ds_offload_param, 0, v.to_int(2 * m.params / n)), 2 * m.params)
    # offloaded: one unit gathered at a time from host memory
    held = v.where(s.reference_offload, 2 * m.largest_layer_params, held)
    return v.where(s.has_reference, held, 0)


def _nccl_bytes(s: Any) -> Any:
    """NCCL communicator buffers, plus DeepSpeed's reduce and all-gather buckets at ZeRO-1/2."""
    buckets = v.where(
        s.deepspeed & ((s.zero_stage == 1) | (s.zero_stage == 2)),
        2 * s.ds_bucket_elements * 2,  # reduce (ipg) + allgather buckets, bf16
        0,
    )
    return v.where(s.world_size <= 1, 0, NCCL_BYTES + buckets)


@dataclass(frozen=True)
class _Colocated:
    """What a colocated vLLM engine reserves and leaves, per GPU (zeros without one)."""

    budget: Any = 0
    weights_tp: Any = 0
    kv_bytes: Any = 0
    kv_tokens: Any = 0
    concurrency: Any = 0
    asleep: Any = 0
    startup_ok: Any = True
    startup_deficit: Any = 0
    kv_ok: Any = True
    kv_deficit: Any = 0


def _colocated(s: Any, capacity: int, reference: Any, zero3: Any, n: Any, gpu_name: str = "") -> _Colocated:
    """vLLM's budget, KV cache and start-up check when it shares the training GPUs (zeros elsewhere)."""
    m = s.model
    here = s.colocate & (capacity > 0)
    if not v.is_array(here) and not here:
        return _Colocated()
    tp = s.vllm_tp
    budget = v.to_int(s.vllm_util * capacity)
    weights_tp = v.to_int(2 * m.params / tp)
    overhead = VLLM_OVERHEAD_BYTES + v.where(tp > 1, VLLM_TP_EXTRA_BYTES, 0)
    kv_bytes = budget - weights_tp - _vllm_activation_peak(s, capacity, gpu_name) - overhead
    per_token = _kv_bytes_per_token_gpu(m, tp)
    kv_tokens = v.lmax(0, kv_bytes // per_token)
    need_kv = s.vllm_max_model_len * per_token
    seqs_per_instance = v.lmax(1, v.ceil(s.global_batch / v.lmax(1, n // tp)))
    # Start-up: what the trainer already holds when vLLM starts. A framework that loads first
    # (loads_before_vllm) holds policy and reference, less what offload_model moved away; one that
    # starts vLLM first holds neither, unless DeepSpeed is off (the policy is on the GPU at load);
    # ZeRO-3 partitions both at load (zero.Init).
    # FSDP builds fp32 shards before the rollout engine starts; parameter offload moves them first.
    held_policy = v.where(
        zero3,
        v.where(s.ds_offload_param, 0, v.to_int(2 * m.params / n)),
        v.where(
            s.loads_before_vllm,
            v.where(s.rollout_offload_model, 0, 2 * m.params),
            v.where(s.deepspeed, 0, 2 * m.params),
        ),
    )
    held_policy = v.where(
        s.fsdp, v.where(s.rollout_offload_model, 0, v.to_int(4 * m.params / n)), held_policy
    )
    held_reference = v.where(v.either(s.loads_before_vllm, zero3), reference, 0)
    free = capacity - (CUDA_CONTEXT_BYTES + held_policy + held_reference)
    made = _Colocated(
        budget=budget,
        weights_tp=weights_tp,
        kv_bytes=kv_bytes,
        kv_tokens=kv_tokens,
        concurrency=v.lmin(s.vllm_max_num_seqs, kv_tokens // v.lmax(1, s.seq_len), seqs_per_instance),
        asleep=v.where(s.sleep_level > 0, overhead, budget),
        startup_ok=free >= budget,
        startup_deficit=v.lmax(0, budget - free),
        kv_ok=kv_bytes >= need_kv,
        kv_deficit=v.lmax(0, need_kv - kv_bytes),
    )
    if not v.is_array(here):
        return made
    empty = _Colocated()
    return _Colocated(**{f: np.where(here, getattr(made, f), getattr(empty, f)) for f in _COLOCATED_FIELDS})


_COLOCATED_FIELDS = tuple(f.name for f in fields(_Colocated))


def _phases(
    s: Any, states: Any, reference: Any, vllm: _Colocated, capacity: int, zero3: Any
) -> tuple[dict[str, dict[str, Any]], Any, Any]:
    """Per-GPU bytes by component in each phase, and whether the rollout and sync phases exist.

    ``train`` always; ``rollout`` and ``sync`` with a colocated vLLM; ``rollout`` alone (generation in
    the trainer) on GPUs without vLLM. ZeRO-3 keeps its gradient partitions allocated between steps
    (one flat buffer, DeepSpeed's ``grad_partitions_flat_buffer``); ZeRO-1/2 free theirs after the
    optimizer step, and plain DDP's are set to None by ``zero_grad``.
    """
    m = s.model
    base = {
        "policy_weights": states.weights_bytes,
        "gradients": states.gradients_bytes,
        "optimizer_states": states.optimizer_bytes,
        "reference_model": reference,
        "activations": 0,
        "logits": 0,
        "vllm_reserved": 0,
        "zero3_gather": 0,
        "cuda_context": CUDA_CONTEXT_BYTES,
        "nccl_buffers": _nccl_bytes(s),
    }
    kept_gradients = v.where(zero3, states.gradients_bytes, 0)
    train = {
        **base,
        "activations": _train_activations(s),
        "logits": _logits(s),
        "vllm_reserved": vllm.asleep,
    }
    colocated = s.colocate & (capacity > 0)
    # model.generate in the trainer: HF KV cache for the local generation batch; ZeRO-3 gathers the
    # whole model for generation (ds3_gather_for_generation, the default).
    gen_batch = s.per_device_batch * s.grad_accum
    in_trainer = s.on_gpu & v.neg(s.use_vllm)
    rollout = {
        **base,
        "policy_weights": v.where(colocated & s.rollout_offload_model, 0, states.weights_bytes),
        "gradients": kept_gradients,
        "optimizer_states": v.where(colocated & s.rollout_offload_optimizer, 0, states.optimizer_bytes),
        "activations": v.where(
            colocated,
            0,
            gen_batch * s.seq_len * _kv_bytes_per_token_gpu(m, 1) + gen_batch * m.vocab * 4 * 2,
        ),
        "vllm_reserved": v.where(colocated, vllm.budget, 0),
        "zero3_gather": v.where(colocated, 0, v.where(zero3, 2 * m.params, 0)),
    }
    sync = {
        **base,
        "gradients": kept_gradients,
        # woken for the sync: its weights back beside what it kept asleep (graphs; TP buffers at TP > 1)
        "vllm_reserved": v.where(s.sleep_level == 0, vllm.budget, vllm.weights_tp + vllm.asleep),
        "zero3_gather": _sync_gather(s),
    }
    return {"train": train, "rollout": rollout, "sync": sync}, v.either(colocated, in_trainer), colocated


def _host_bytes(s: Any, states: Any, vllm: _Colocated, zero3: Any, n: Any) -> Any:
    """Host memory of the whole node: ranks, loader workers, offloaded states, sleeping vLLM weights."""
    m = s.model
    host = states.host_bytes + n * (HOST_RANK_BYTES + s.dataloader_num_workers * HOST_WORKER_BYTES)
    host = host + v.where(s.has_reference & zero3 & s.ds_offload_param, 2 * m.params, 0)
    # fp32 (verl loads its reference with model_dtype fp32)
    host = host + v.where(s.has_reference & s.reference_offload, 4 * m.params, 0)
    host = host + v.where(s.colocate & (s.sleep_level == 1), n * vllm.weights_tp, 0)
    moved = v.where(zero3, v.to_int(2 * m.params), n * states.weights_bytes)
    # FSDP offloads gradients with the weights
    moved = v.where(s.fsdp, n * (states.weights_bytes + states.gradients_bytes), moved)
    moved_any = v.either(s.fsdp, v.neg(zero3 & s.ds_offload_param))
    host = host + v.where(s.rollout_offload_model & moved_any, moved, 0)
    return host + v.where(
        s.rollout_offload_optimizer & v.neg(s.ds_offload_optimizer), n * states.optimizer_bytes, 0
    )


@dataclass(frozen=True)
class MemoryTerms:
    """Every number of the estimate, for one trial (Python numbers) or a column per candidate.

    Attributes:
        phases: components of ``train``, ``rollout`` and ``sync`` (the latter two computed everywhere,
            meaningful only where ``has_rollout`` / ``has_sync``).
        has_rollout, has_sync: whether the phase exists.
        server_note, sleep_note: whether the vLLM server / sleep level 1 notes apply.
    """

    phases: dict[str, dict[str, Any]]
    has_rollout: Any
    has_sync: Any
    host_bytes: Any
    vllm: _Colocated
    server_note: Any
    sleep_note: Any

    def totals(self) -> dict[str, Any]:
        """Per-GPU total of each phase; -1 where the phase does not exist (so it never peaks)."""
        present = {"train": True, "rollout": self.has_rollout, "sync": self.has_sync}
        return {name: v.where(present[name], sum(comps.values()), -1) for name, comps in self.phases.items()}


def memory_terms(s: Any, capacity: int, gpu_name: str = "") -> MemoryTerms:
    """The estimate's numbers for ``s`` (a JobShape, or ShapeColumns) on GPUs of ``capacity`` bytes
    (``gpu_name``: the GPU's name, for vLLM's per-GPU defaults)."""
    n = v.lmax(1, s.world_size)
    zero3 = v.num(s.states_sharding) == 3  # DeepSpeed ZeRO-3 or FSDP full shard
    states = _model_states_of(s)
    reference = _reference_bytes(s, zero3, n)
    vllm = _colocated(s, capacity, reference, zero3, n, gpu_name)
    phases, has_rollout, has_sync = _phases(s, states, reference, vllm, capacity, zero3)
    return MemoryTerms(
        phases=phases,
        has_rollout=has_rollout,
        has_sync=has_sync,
        host_bytes=_host_bytes(s, states, vllm, zero3, n),
        vllm=vllm,
        server_note=v.neg(s.colocate & (capacity > 0)) & s.use_vllm & (s.vllm_mode == "server"),
        sleep_note=s.colocate & (capacity > 0) & (s.sleep_level == 1),
    )


@dataclass(frozen=True)
class _StatesColumns:
    weights_bytes: Any
    gradients_bytes: Any
    optimizer_bytes: Any
    host_bytes: Any


def _model_states_of(s: Any) -> Any:
    """:func:`model_states` of the trial, or of every candidate (computed once per distinct input)."""
    m = s.model

    def one(world: int, stage: int, ds: bool, off_opt: bool, off_param: bool, rank: int) -> ModelStates:
        return model_states(
            params=m.params,
            largest_layer_params=m.largest_layer_params,
            n_gpus=world,
            zero_stage=stage,
            deepspeed=ds,
            offload_optimizer=off_opt,
            offload_param=off_param,
            trainable_params=lora_params(m, rank) if rank > 0 else None,
        )

    inputs = (
        s.world_size,
        s.zero_stage,
        v.either(s.deepspeed, s.fsdp),  # FSDP shards states as the ZeRO stage of its strategy does
        s.ds_offload_optimizer,
        s.ds_offload_param,
        s.lora_rank,
    )
    if not v.is_array(*inputs):
        return one(*inputs)
    world, stage, ds, off_opt, off_param, rank = (np.asarray(c, dtype=np.int64) for c in inputs)
    packed = (((world * 2**20 + rank) * 4 + stage) * 2 + ds) * 4 + off_opt * 2 + off_param
    _, first, inverse = np.unique(packed, return_index=True, return_inverse=True)
    made = [
        one(int(world[i]), int(stage[i]), bool(ds[i]), bool(off_opt[i]), bool(off_param[i]), int(rank[i]))
        for i in first
    ]
    inverse = inverse.reshape(-1)
    return _StatesColumns(
        *(np.array([getattr(x, f) for x in made], dtype=np.int64)[inverse] for f in _STATES_FIELDS)
    )


_STATES_FIELDS = ("weights_bytes", "gradients_bytes", "optimizer_bytes", "host_bytes")


def terms_estimate(terms: MemoryTerms, capacity: int, on_gpu: bool) -> MemoryEstimate:
    """The :class:`MemoryEstimate` of one trial's terms (Python numbers)."""
    notes: list[str] = []
    if terms.server_note:
        notes.append("vLLM server runs on other GPUs: not counted here")
    if terms.sleep_note:
        notes.append("sleep level 1 keeps vLLM weights in host RAM between rollouts")
    present = {"train": True, "rollout": bool(terms.has_rollout), "sync": bool(terms.has_sync)}
    phases = {
        name: {k: int(b) for k, b in comps.items()} for name, comps in terms.phases.items() if present[name]
    }
    totals = {name: sum(c.values()) for name, c in phases.items()}
    peak_phase = max(totals, key=lambda k: totals[k])
    if not on_gpu:
        notes.append("CPU-only trial: GPU memory is not judged")
    vllm = terms.vllm
    return MemoryEstimate(
        components_bytes=dict(phases[peak_phase]),
        peak_bytes=int(totals[peak_phase]),
        peak_phase=peak_phase,
        phases=phases,
        capacity_bytes=int(capacity),
        host_bytes=int(terms.host_bytes),
        kv_tokens=int(vllm.kv_tokens),
        kv_bytes=int(vllm.kv_bytes),
        rollout_concurrency=int(vllm.concurrency),
        vllm_startup_ok=bool(vllm.startup_ok),
        vllm_startup_deficit_bytes=int(vllm.startup_deficit),
        kv_ok=bool(vllm.kv_ok),
        kv_deficit_bytes=int(vllm.kv_deficit),
        on_gpu=on_gpu,
        notes=tuple(notes),
    )


def estimate_memory(shape: JobShape, gpu: GpuSpec | None) -> MemoryEstimate:
    """Predict per-GPU memory by component and phase, host memory, KV capacity and vLLM's checks.

    Args:
        shape: the trial (its configuration from the backend's decoder, on a model and GPUs).
        gpu: the GPU; None (or ``shape.n_gpus == 0``) for a CPU-only trial, which is never judged.
    """
    capacity = gpu.memory_bytes if gpu is not None and shape.on_gpu else 0
    terms = memory_terms(shape, capacity, gpu.name if gpu is not None else "")
    return terms_estimate(terms, capacity, bool(shape.on_gpu and gpu is not None))
