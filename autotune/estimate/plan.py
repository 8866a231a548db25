"""Every candidate of a search space judged by the estimates, without a GPU (``autotune plan``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autotune.estimate.catalog import GpuSpec, ModelSpec
from autotune.estimate.memory import MemoryEstimate, estimate_memory, should_prune
from autotune.estimate.shape import JobShape
from autotune.estimate.timing import TimeEstimate, estimate_step_time
from autotune.jobconfig import JobConfig
from autotune.space import SearchSpace

__all__ = ["Candidate", "PlanResult", "candidate_rules", "plan_space", "speed_key"]


def speed_key(throughput: float) -> float:
    """A predicted throughput as candidates are ranked and tied: to 9 significant digits.

    Two candidates the time model cannot tell apart (knobs it holds neutral, such as more KV cache than
    the rollout needs) get bit-identical predictions; rounding to 9 digits also ties sums whose terms
    came in another order, and nothing coarser: predictions that differ in the 4th or 5th digit differ
    in the model, so they rank apart.
    """
    return float(f"{throughput:.9g}")


@dataclass(frozen=True)
class Candidate:
    """One configuration and what the estimates say about it.

    Attributes:
        relative_speed: predicted throughput ÷ that of the fastest candidate that fits (None when
            nothing fits).
        speed_rank: among the candidates that fit, 1 + the number of distinct predicted step times
            faster than this one's (equal ranks are ties of the time model); None when it does not fit.
    """

    params: dict[str, Any]
    derived: dict[str, Any]
    shape: JobShape
    memory: MemoryEstimate
    time: TimeEstimate
    relative_speed: float | None
    pruned: bool
    speed_rank: int | None = None

    @property
    def fits(self) -> bool:
        return self.memory.fits()

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": dict(self.params),
            "derived": dict(self.derived),
            "fits": self.fits,
            "pruned": self.pruned,
            "relative_speed": self.relative_speed,
            "speed_rank": self.speed_rank,
            "memory": self.memory.to_dict(),
            "time": self.time.to_dict(),
        }


@dataclass(frozen=True)
class PlanResult:
    """Candidates, fitting ones first and fastest first, then the ones that do not fit, closest first."""

    backend: str
    model: ModelSpec
    gpu: GpuSpec
    n_gpus: int
    fixed: dict[str, Any]
    margin: float
    candidates: tuple[Candidate, ...]
    invalid: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)  # knob → short name (the space's labels)

    @property
    def n_fit(self) -> int:
        return sum(1 for c in self.candidates if c.fits)

    @property
    def n_pruned(self) -> int:
        return sum(1 for c in self.candidates if c.pruned)

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        shown = self.candidates if top is None else self.candidates[:top]
        return {
            "backend": self.backend,
            "model": {"name": self.model.name, "params": self.model.params, "hub_id": self.model.hub_id},
            "gpu": {"name": self.gpu.name, "memory_bytes": self.gpu.memory_bytes, "known": self.gpu.known},
            "n_gpus": self.n_gpus,
            "fixed": dict(self.fixed),
            "margin": self.margin,
            "counts": {
                "candidates": len(self.candidates),
                "fit": self.n_fit,
                "do_not_fit": len(self.candidates) - self.n_fit,
                "pruned": self.n_pruned,
                "invalid": sum(self.invalid.values()),
            },
            "invalid": dict(self.invalid),
            "notes": list(self.notes),
            "candidates": [c.to_dict() for c in shown],
        }


def candidate_rules(config: JobConfig, model: ModelSpec, n_gpus: int) -> str | None:
    """The first framework start-up rule a candidate breaks (a stable rule name), or None when valid.

    The rules TRL and ms-swift share (frameworks.md): the global batch splits into micro-batches of
    every rank; the generation batch is a multiple of num_generations; vLLM's tensor-parallel size
    divides the world size (colocate) and the model's attention heads; a framework without a default
    ``vllm_mode`` (its decoder leaves it None) needs one.
    """
    world = max(1, n_gpus)
    pdbs = config.per_device_batch
    if pdbs <= 0 or config.global_batch % (pdbs * world) != 0:
        return "global_batch_divisible"
    if config.global_batch % config.num_generations != 0:
        return "generation_batch_num_generations"
    if config.use_vllm:
        tp = config.vllm_tp
        if config.vllm_mode is None:
            return "vllm_mode_required"
        if config.vllm_mode != "server" and world % tp != 0:
            return "vllm_tp_divides_world"
        if model.heads % tp != 0:
            return "vllm_tp_divides_heads"
    return None


def _grid(space: SearchSpace) -> list[dict[str, Any]]:
    """Every distinct configuration, in :meth:`SearchSpace.grid` order.

    The same walk as ``SearchSpace.grid``, cheaper: plans enumerate tens of thousands of
    configurations. Values are made unique per knob up front, so the walk yields no duplicates.
    """
    knobs = space.knobs
    values: list[list[Any]] = []
    for knob in knobs:
        unique: list[Any] = []
        for v in knob.values():
            if not any(type(u) is type(v) and u == v for u in unique):
                unique.append(v)
        values.append(unique)
    ctx: dict[str, Any] = dict(space.dropped_defaults)  # earlier knobs' values, for conditions
    acc: dict[str, Any] = {}
    out: list[dict[str, Any]] = []

    def rec(i: int) -> None:
        if i == len(knobs):
            out.append(dict(acc))
            return
        knob = knobs[i]
        if knob.active(ctx):
            saved = ctx.get(knob.name, _MISSING)
            for v in values[i]:
                acc[knob.name] = ctx[knob.name] = v
                rec(i + 1)
            del acc[knob.name]
            if saved is _MISSING:
                del ctx[knob.name]
            else:
                ctx[knob.name] = saved
        else:
            rec(i + 1)

    rec(0)
    return out


_MISSING = object()


#: what a backend's decoder looks like (:meth:`autotune.backends.Backend.describe`).
Describe = Callable[[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any], int], JobConfig]


def plan_space(
    space: SearchSpace,
    *,
    backend: str,
    describe: Describe,
    model: ModelSpec,
    gpu: GpuSpec,
    n_gpus: int,
    fixed: Mapping[str, Any],
    margin: float = 0.15,
) -> PlanResult:
    """Judge every valid configuration of ``space`` on ``n_gpus`` × ``gpu``.

    Args:
        space: the (restricted, narrowed) search space.
        backend: ``trl`` or ``swift``.
        model: architecture facts.
        gpu: GPU facts.
        describe: the backend's decoder of a candidate's knobs (its ``Backend.describe``).
        n_gpus: GPUs per trial.
        fixed: job facts (``global_batch``, ``num_generations``, ``max_prompt_length``,
            ``max_completion_length``, ``beta``, LoRA, ``vllm_max_model_len``), framework names.
        margin: the pruning margin reported per candidate.
    """
    rows: list[tuple[dict[str, Any], dict[str, Any], JobShape, MemoryEstimate, TimeEstimate]] = []
    invalid: Counter[str] = Counter()
    for params in _grid(space):
        config = describe(params, {"world_size": max(1, n_gpus)}, fixed, n_gpus)
        rule = candidate_rules(config, model, n_gpus)
        if rule is not None:
            invalid[rule] += 1
            continue
        derived = {"world_size": config.world_size, "gradient_accumulation_steps": config.grad_accum}
        shape = JobShape(config, model, n_gpus)
        mem = estimate_memory(shape, gpu)
        rows.append((params, derived, shape, mem, estimate_step_time(shape, gpu, mem)))
    best = max((t.throughput for _, _, _, m, t in rows if m.fits()), default=None)
    distinct = sorted({speed_key(t.throughput) for _, _, _, m, t in rows if m.fits()}, reverse=True)
    rank = {k: i for i, k in enumerate(distinct, 1)}
    cands = [
        Candidate(
            params=p,
            derived=d,
            shape=s,
            memory=m,
            time=t,
            relative_speed=(t.throughput / best) if best else None,
            pruned=should_prune(m, margin),
            speed_rank=rank[speed_key(t.throughput)] if m.fits() else None,
        )
        for p, d, s, m, t in rows
    ]

    def key(c: Candidate) -> tuple[int, float, int]:
        if c.fits:
            # faster first; a tie of the time model (equal predictions): more headroom first
            return (0, -speed_key(c.time.throughput), c.memory.peak_bytes)
        over = c.memory.overflow()
        return (1, (over[1] if over else 0) / max(1, c.memory.capacity_bytes), c.memory.peak_bytes)

    cands.sort(key=key)
    labels = {k.name: k.short for k in space.knobs if k.label}
    notes = tuple(f"knob {k} dropped: {why}" for k, why in space.dropped.items())
    return PlanResult(
        backend=backend,
        model=model,
        gpu=gpu,
        n_gpus=n_gpus,
        fixed=dict(fixed),
        margin=margin,
        candidates=tuple(cands),
        invalid=dict(invalid),
        notes=notes,
        labels=labels,
    )
