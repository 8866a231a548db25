"""The physical ceiling of a GRPO step: the least time each phase could take on the hardware, and the step.

A *lower bound*, never a prediction: each phase's time is the work it cannot avoid (FLOPs, bytes read
from device memory, bytes moved over a link) divided by the hardware's peak rate for it, at 100 %
efficiency. A measured step can approach it, never beat it; one that does is a measurement or model
error (the report says so). The formulas are written once (with :mod:`autotune.estimate._vec`) and run on
one trial (a :class:`~autotune.estimate.shape.JobShape`) or on every candidate of a plan
(:class:`~autotune.estimate.columns.ShapeColumns`), as the step-time estimate's are.

What is counted, per optimizer step of ``B`` completions (``global_batch``), ``Lp`` prompt and ``Lc``
completion tokens per sample, a model of ``body`` parameters besides its embedding and LM head
(``head = vocab × hidden``):

* **rollout prefill** (compute): ``2·body`` FLOPs per prompt token, for the *distinct* prompts only
  (``B / num_generations``: the generations of one prompt may share its prefix cache).
* **rollout decode** (the larger of compute and memory): ``2·(body + head)`` FLOPs per generated token;
  every decode iteration reads the engine's share of the bf16 weights (``2·(body + head) / tp`` bytes)
  and there are at least ``Lc`` iterations (a sequence's tokens come one after another), and at least
  ``seqs·Lc / max_num_seqs`` with vLLM's cap on running sequences; the KV cache each generated token
  attends to *within its own completion* (``Lc·(Lc−1)/2`` token-reads per sequence). Prefill and decode
  share the engine's FLOPs: the rollout is at least ``max(decode memory, prefill + decode compute)``.
* **reference pass** (compute, when ``beta > 0``): a forward over every token (``2·body``) and the LM
  head over completion tokens (``2·head``), on all training GPUs.
* **train** (the larger of compute and communication, which may overlap): forward and backward,
  ``6·body`` FLOPs per token (``4·body`` with LoRA: no weight gradients of the base), ``+2·body`` with
  gradient checkpointing, the LM head over completion tokens; with several GPUs each receives at least
  its share of the bf16 gradients (``2·trainable·(n−1)/n`` bytes), and under ZeRO-3 / FSDP full sharding
  the gathered bf16 weights once per micro-batch.
* **weight sync** (vLLM only): each engine GPU writes its share of the bf16 weights; a server engine
  receives them over the fastest link; ZeRO-3 gathers them first (the three may pipeline: the largest).
* **offload transfers** (host link, per GPU): DeepSpeed optimizer offload (gradients down, weights up),
  parameter offload (weights up for forward and backward of each micro-batch), the trainer's weights
  and optimizer states moved out of the way of a colocated rollout, vLLM sleep level 1 (weights to the
  host and back).
* **step** = rollout + reference + weight sync + max(train, DeepSpeed offload) + the rollout's offload
  transfers (the frameworks run these one after another; DeepSpeed may overlap its offload with the
  backward pass).

What is ignored (each only adds time, so ignoring it keeps the bound true): attention-score FLOPs, the
prompt's KV reads during decode, the optimizer step, the old-log-prob pass (no JobConfig field says when
a framework runs one), TP all-reduces, kernel launch and scheduler latency, Python, the CPU Adam,
reward computation, data loading, start-up. Weights are counted as bf16 (2 bytes) even where a run keeps
them in fp32. Token counts: the plan uses the declared lengths (``max_prompt_length``,
``max_completion_length``); a trial's ceiling uses the completion length it measured where known, and
counts only the prompt tokens it knows (none, when the framework logs no prompt length), since a
declared maximum is not a lower bound of the tokens processed.

Rates: a :class:`PeakBasis`: the GPU catalog's peaks (dense bf16 FLOP/s, nominal HBM bandwidth, NVLink
or PCIe per direction), or peaks measured on this machine (:mod:`autotune.estimate.peaks`), which on the
CPU are the host's fp32 matmul FLOP/s and RAM copy bandwidth. A ceiling from measured peaks bounds what
the machine reached in its micro-benchmarks, not its data sheet.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from autotune.estimate import _vec as v
from autotune.estimate.catalog import GpuSpec, ModelSpec, find_gpu
from autotune.estimate.peaks import CPU_DEVICE, MeasuredPeaks
from autotune.estimate.shape import JobShape
from autotune.estimate.states import lora_params
from autotune.jsontypes import JsonObject

if TYPE_CHECKING:
    from autotune.estimate.columns import ShapeColumns

__all__ = [
    "CEILING_PHASES",
    "TIMELINE_PHASES",
    "PeakBasis",
    "StepCeiling",
    "StepWork",
    "ceiling_terms",
    "step_ceiling",
    "step_ceiling_s",
]

BF16_BYTES = 2

#: the ceiling's phases, in step order (``rollout`` is prefill and decode together).
CEILING_PHASES = (
    "rollout_prefill",
    "rollout_decode",
    "rollout",
    "reference",
    "train",
    "weight_sync",
    "offload",
)

#: the timeline's phases (``timeline_summary.phases``) a measured time can be held against: the
#: ceiling of the work that surely falls inside each (the reference pass and the offload transfers
#: may land in either phase, so they bound the step only).
TIMELINE_PHASES = ("rollout", "train", "weight_sync")


@dataclass(frozen=True)
class PeakBasis:
    """The peak rates a ceiling divides by (one device's, per direction for links).

    Attributes:
        source: ``catalog`` (the GPU catalog's data-sheet peaks) or ``measured`` (this machine's
            micro-benchmarks).
        device: the GPU's name, or ``cpu``.
        flops_per_s: dense matmul FLOP/s of one device.
        memory_bytes_per_s: device memory (or host RAM) bandwidth.
        peer_bytes_per_s: device-to-device bandwidth per direction (NVLink, else PCIe; all-reduce bus
            bandwidth when measured).
        host_link_bytes_per_s: host-to-device bandwidth per direction (offload traffic).
        known: False for a GPU the catalog does not know (its peaks are a guess, not a bound).
        measured_at: when measured peaks were taken (ISO-8601 UTC); None for catalog peaks.
    """

    source: Literal["catalog", "measured"]
    device: str
    flops_per_s: float
    memory_bytes_per_s: float
    peer_bytes_per_s: float
    host_link_bytes_per_s: float
    known: bool = True
    measured_at: str | None = None

    @classmethod
    def from_gpu(cls, gpu: GpuSpec) -> PeakBasis:
        """The catalog's peaks of ``gpu``."""
        return cls(
            source="catalog",
            device=gpu.name,
            flops_per_s=gpu.bf16_flops,
            memory_bytes_per_s=gpu.hbm_bytes_s,
            peer_bytes_per_s=max(gpu.peer_bytes_s, gpu.pcie_bytes_s),
            host_link_bytes_per_s=gpu.pcie_bytes_s,
            known=gpu.known,
        )

    @classmethod
    def from_peaks(cls, peaks: MeasuredPeaks, gpu: GpuSpec | None = None) -> PeakBasis:
        """Measured ``peaks``; links not measured come from the catalog's ``gpu`` (on the CPU, where
        nothing crosses a link, from the memory bandwidth)."""
        fallback = peaks.memory_bytes_per_s
        peer = peaks.allreduce_bus_bytes_per_s or (
            max(gpu.peer_bytes_s, gpu.pcie_bytes_s) if gpu is not None else fallback
        )
        host = peaks.host_to_device_bytes_per_s or (gpu.pcie_bytes_s if gpu is not None else fallback)
        return cls(
            source="measured",
            device=peaks.device,
            flops_per_s=peaks.matmul_flops_per_s,
            memory_bytes_per_s=peaks.memory_bytes_per_s,
            peer_bytes_per_s=peer,
            host_link_bytes_per_s=host,
            measured_at=peaks.measured_at,
        )

    @classmethod
    def resolve(cls, gpu: GpuSpec | None, peaks: MeasuredPeaks | None) -> PeakBasis | None:
        """Measured peaks when they are of this device (the CPU, or a GPU the catalog resolves to
        ``gpu``), else ``gpu``'s catalog peaks; None for a CPU without measured peaks."""
        if peaks is not None:
            if gpu is None and peaks.device == CPU_DEVICE:
                return cls.from_peaks(peaks)
            if gpu is not None and peaks.device != CPU_DEVICE and _same_gpu(peaks.device, gpu):
                return cls.from_peaks(peaks, gpu)
        return cls.from_gpu(gpu) if gpu is not None else None

    def text(self) -> str:
        """``catalog peaks of H100 (989 TFLOP/s, 3,350 GB/s)``."""
        what = "measured peaks" if self.source == "measured" else "catalog peaks"
        guess = "" if self.known else ", an unknown GPU's guessed peaks: not a bound"
        when = f", measured {self.measured_at}" if self.measured_at else ""
        return (
            f"{what} of {self.device} ({self.flops_per_s / 1e12:.3g} TFLOP/s, "
            f"{self.memory_bytes_per_s / 1e9:,.0f} GB/s{when}{guess})"
        )

    def to_dict(self) -> JsonObject:
        return asdict(self)


def _same_gpu(device: str, gpu: GpuSpec) -> bool:
    """``device`` (an NVML name) is ``gpu``: by name, or the catalog entry it resolves to."""
    if device == gpu.name or device in gpu.nvml_names:
        return True
    found = find_gpu(device)
    return found is not None and found.name == gpu.name


@dataclass(frozen=True)
class StepWork:
    """The tokens one step processes, where known better than the declared maximum lengths.

    Attributes:
        prompt_tokens_per_sample: mean prompt tokens of a sample; None: ``max_prompt_length``.
        completion_tokens_per_sample: mean completion tokens of a sample; None:
            ``max_completion_length``.
    """

    prompt_tokens_per_sample: float | None = None
    completion_tokens_per_sample: float | None = None

    def text(self) -> str:
        """What the ceiling counted, in words."""

        def one(value: float | None, declared: str) -> str:
            return f"the declared {declared}" if value is None else f"{value:.4g}"

        return (
            f"prompt tokens per sample: {one(self.prompt_tokens_per_sample, 'maximum')}; "
            f"completion tokens per sample: {one(self.completion_tokens_per_sample, 'maximum')}"
        )


@dataclass(frozen=True)
class StepCeiling:
    """The least seconds of each phase of one optimizer step, and of the step.

    Attributes:
        rollout_prefill_s: prompt prefill (compute).
        rollout_decode_s: decode (the larger of its compute and its memory reads).
        rollout_s: the whole rollout (prefill and decode share the engines' FLOPs).
        reference_s: the reference model's forward pass (0 when ``beta`` is 0).
        train_s: forward and backward of every micro-batch, with gradient and ZeRO-3 traffic.
        weight_sync_s: weights into vLLM (0 without vLLM).
        offload_s: host-link transfers (DeepSpeed offload, rollout offload, sleep level 1).
        step_s: the step (see the module's docstring for how the phases combine).
        basis: the peak rates used.
        work: the tokens counted.
    """

    rollout_prefill_s: float
    rollout_decode_s: float
    rollout_s: float
    reference_s: float
    train_s: float
    weight_sync_s: float
    offload_s: float
    step_s: float
    basis: PeakBasis
    work: StepWork

    def phase_s(self) -> dict[str, float]:
        """Seconds per phase of :data:`CEILING_PHASES`."""
        return {p: float(getattr(self, f"{p}_s")) for p in CEILING_PHASES}

    def timeline_s(self) -> dict[str, float]:
        """The bound of each timeline phase of :data:`TIMELINE_PHASES`."""
        return {p: float(getattr(self, f"{p}_s")) for p in TIMELINE_PHASES}

    def to_dict(self) -> JsonObject:
        return {
            **{f"{p}_s": s for p, s in self.phase_s().items()},
            "step_s": self.step_s,
            "basis": self.basis.to_dict(),
            "work": asdict(self.work),
        }


# ----------------------------------------------------------------------------------- the formulas


def _body_params(m: ModelSpec) -> int:
    """Parameters of the decoder's matmuls besides the LM head (no embedding, no vision tower)."""
    head = m.vocab * m.hidden
    return max(0, m.params - m.vision_params - head * (1 if m.tie_embeddings else 2))


def _trainable(s: Any) -> Any:
    """Trainable parameters: the LoRA adapters' (per distinct rank on columns), else the model's."""
    lora = v.per_value(lambda rank: lora_params(s.model, rank), s.lora_rank)
    return v.where(s.lora, lora, float(s.model.params))


def _rollout(s: Any, b: PeakBasis, lp: Any, lc: Any) -> tuple[Any, Any, Any]:
    """(prefill, decode, rollout) seconds."""
    m = s.model
    body, head = _body_params(m), m.vocab * m.hidden
    tp = v.lmax(1, s.vllm_tp)  # 1 without vLLM (the shape says so)
    engines = v.where(
        s.use_vllm,
        v.where(s.vllm_mode == "colocate", v.lmax(1, s.world_size // tp), 1),
        v.lmax(1, s.world_size),
    )
    seqs = s.global_batch / engines
    prompts = seqs / v.lmax(1, s.num_generations)
    prefill = 2.0 * body * prompts * lp / (tp * b.flops_per_s)
    capped = s.use_vllm & (s.vllm_max_num_seqs > 0)
    iterations = v.where(capped, v.lmax(lc, seqs * lc / v.lmax(1, s.vllm_max_num_seqs)), lc)
    kv_bytes = seqs * lc * v.lmax(0.0, lc - 1) / 2 * m.kv_bytes_per_token
    decode_memory = (iterations * BF16_BYTES * (body + head) + kv_bytes) / tp / b.memory_bytes_per_s
    decode_compute = 2.0 * (body + head) * seqs * lc / (tp * b.flops_per_s)
    decode = v.lmax(decode_memory, decode_compute)
    return prefill, decode, v.lmax(decode_memory, prefill + decode_compute)


def _reference(s: Any, b: PeakBasis, lp: Any, lc: Any) -> Any:
    m = s.model
    body, head = _body_params(m), m.vocab * m.hidden
    n = v.lmax(1, s.world_size)
    flops = s.global_batch * (2.0 * body * (lp + lc) + 2.0 * head * lc)
    return v.where(s.beta > 0, flops / (n * b.flops_per_s), 0.0)


def _train(s: Any, b: PeakBasis, lp: Any, lc: Any) -> Any:
    m = s.model
    body, head = _body_params(m), m.vocab * m.hidden
    n = v.lmax(1, s.world_size)
    passes = v.where(s.lora, 4.0, 6.0)
    per_token = passes * body + v.where(s.gradient_checkpointing, 2.0 * body, 0.0)
    flops = s.global_batch * (per_token * (lp + lc) + passes * head * lc)
    compute = flops / (n * b.flops_per_s)
    ring = (n - 1) / n
    grads = BF16_BYTES * _trainable(s) * ring / b.peer_bytes_per_s
    gathers = v.where(
        v.num(s.states_sharding) == 3, s.grad_accum * BF16_BYTES * m.params * ring / b.peer_bytes_per_s, 0.0
    )
    return v.lmax(compute, grads + gathers)  # both 0 on one GPU: ring is 0


def _weight_sync(s: Any, b: PeakBasis) -> Any:
    m = s.model
    weights = BF16_BYTES * m.params
    n = v.lmax(1, s.world_size)
    load = weights / v.lmax(1, s.vllm_tp) / b.memory_bytes_per_s
    broadcast = v.where(s.vllm_mode == "server", weights / b.peer_bytes_per_s, 0.0)
    gather = v.where(v.num(s.states_sharding) == 3, weights * (n - 1) / n / b.peer_bytes_per_s, 0.0)
    return v.where(s.use_vllm, v.lmax(load, broadcast, gather), 0.0)


def _offload(s: Any, b: PeakBasis) -> tuple[Any, Any]:
    """(DeepSpeed offload during training, transfers around the rollout) seconds."""
    m = s.model
    n = v.lmax(1, s.world_size)
    link = b.host_link_bytes_per_s
    weights = BF16_BYTES * m.params
    trainable = _trainable(s)
    train = v.where(s.ds_offload_optimizer, 2 * (BF16_BYTES * trainable / n) / link, 0.0)
    train = train + v.where(s.ds_offload_param, s.grad_accum * 2 * weights / n / link, 0.0)
    held = v.where(s.zero_stage == 3, weights / n, weights)
    rollout = v.where(s.rollout_offload_model, 2 * held / link, 0.0)
    states = 12 * trainable / v.where(v.num(s.states_sharding) >= 1, n, 1)
    rollout = rollout + v.where(
        s.rollout_offload_optimizer & v.neg(s.ds_offload_optimizer), 2 * states / link, 0.0
    )
    rollout = rollout + v.where(s.sleep_level == 1, 2 * weights / v.lmax(1, s.vllm_tp) / link, 0.0)
    return train, rollout


def ceiling_terms(
    s: JobShape | ShapeColumns, basis: PeakBasis, prompt_tokens: object, completion_tokens: object
) -> dict[str, Any]:
    """The ceiling of every phase of :data:`CEILING_PHASES` and of the step, in seconds.

    Args:
        s: one trial (a JobShape: Python numbers) or every candidate of a plan (ShapeColumns).
        basis: the peak rates.
        prompt_tokens: prompt tokens per sample (a number or a column).
        completion_tokens: completion tokens per sample (a number or a column).

    Returns:
        Phase name (and ``step``) → seconds (numbers, or columns).
    """
    prefill, decode, rollout = _rollout(s, basis, prompt_tokens, completion_tokens)
    reference = _reference(s, basis, prompt_tokens, completion_tokens)
    train = _train(s, basis, prompt_tokens, completion_tokens)
    sync = _weight_sync(s, basis)
    offload_train, offload_rollout = _offload(s, basis)
    step = rollout + reference + sync + v.lmax(train, offload_train) + offload_rollout
    return {
        "rollout_prefill": prefill,
        "rollout_decode": decode,
        "rollout": rollout,
        "reference": reference,
        "train": train,
        "weight_sync": sync,
        "offload": offload_train + offload_rollout,
        "step": step,
    }


def step_ceiling(shape: JobShape, basis: PeakBasis, work: StepWork | None = None) -> StepCeiling:
    """The ceiling of one trial's step, phase by phase.

    Args:
        shape: the trial.
        basis: the peak rates (:meth:`PeakBasis.resolve`).
        work: the tokens per sample where known; default: the declared maximum lengths.
    """
    work = work or StepWork()
    lp = work.prompt_tokens_per_sample
    lc = work.completion_tokens_per_sample
    terms = ceiling_terms(
        shape,
        basis,
        float(shape.max_prompt_length if lp is None else lp),
        float(shape.max_completion_length if lc is None else lc),
    )
    return StepCeiling(
        **{f"{p}_s": float(terms[p]) for p in CEILING_PHASES},
        step_s=float(terms["step"]),
        basis=basis,
        work=work,
    )


def step_ceiling_s(shape: JobShape, basis: PeakBasis, work: StepWork | None = None) -> float:
    """The least seconds one optimizer step of ``shape`` could take: no untried configuration can be
    faster than its own ceiling (what a search strategy may bound its predictions with)."""
    return step_ceiling(shape, basis, work).step_s
