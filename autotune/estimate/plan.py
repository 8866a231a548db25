"""Every candidate of a search space judged by the estimates, without a GPU (``autotune plan``).

A space holds tens of thousands of candidates (the default ms-swift space on 4 GPUs: 162,440
configurations). Three things make judging them take seconds, not minutes, with the numbers the
per-candidate path gives (``tests/estimate/test_plan_columns.py`` compares them):

- the backend's decoder runs once per *group*: candidates that differ only in *pass-through* knobs,
  knobs that set one JobConfig field to their own value and nothing else (``vllm_util``, ``max_num_seqs``,
  sleep level, ...). Which knobs pass through is checked, not assumed: each one's values are decoded once
  and must move only its field, to the value; every group's decoded configuration must agree too;
- the memory and step-time formulas run once over numpy columns of every candidate
  (:class:`~autotune.estimate.columns.ShapeColumns`): the same functions ``estimate_memory`` runs on one
  trial, written once for both;
- a :class:`Candidate` (its estimates as objects) is built only when read.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from types import SimpleNamespace
from typing import Any, overload

import numpy as np

from autotune.estimate import _vec as v
from autotune.estimate.catalog import GpuSpec, ModelSpec
from autotune.estimate.ceiling import CEILING_PHASES, PeakBasis, StepCeiling, StepWork, ceiling_terms
from autotune.estimate.columns import CONFIG_COLUMNS, ShapeColumns, column
from autotune.estimate.memory import MemoryEstimate, MemoryTerms, memory_terms, terms_estimate
from autotune.estimate.shape import JobShape
from autotune.estimate.timing import TimeEstimate, step_time_terms
from autotune.jobconfig import JobConfig
from autotune.jsontypes import JsonObject
from autotune.space import Knob, SearchSpace

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
        shape_of: builds the candidate's :class:`JobShape` (its decoder runs when ``shape`` is read).
        ceiling: the physical ceiling of its step (:mod:`autotune.estimate.ceiling`), at the declared
            lengths: no run of it can be faster.
    """

    params: dict[str, Any]
    derived: dict[str, Any]
    memory: MemoryEstimate
    time: TimeEstimate
    relative_speed: float | None
    pruned: bool
    speed_rank: int | None = None
    shape_of: Callable[[], JobShape] | None = field(default=None, repr=False, compare=False)
    ceiling: StepCeiling | None = None

    @cached_property
    def shape(self) -> JobShape:
        if self.shape_of is None:
            raise AttributeError("shape")
        return self.shape_of()

    @property
    def fits(self) -> bool:
        return self.memory.fits()

    @property
    def ceiling_fraction(self) -> float | None:
        """The ceiling over the predicted step time (how near the prediction is to the limit)."""
        if self.ceiling is None or self.time.total_s <= 0:
            return None
        return self.ceiling.step_s / self.time.total_s

    def to_dict(self) -> JsonObject:
        return {
            "params": dict(self.params),
            "derived": dict(self.derived),
            "fits": self.fits,
            "pruned": self.pruned,
            "relative_speed": self.relative_speed,
            "speed_rank": self.speed_rank,
            "memory": self.memory.to_dict(),
            "time": self.time.to_dict(),
            "ceiling": self.ceiling.to_dict() if self.ceiling is not None else None,
            "ceiling_fraction": self.ceiling_fraction,
        }


class Candidates(Sequence[Candidate]):
    """The judged candidates in plan order; a :class:`Candidate` is built when it is read.

    The columns answer what a table or a count needs without building every candidate: ``fits``,
    ``pruned``, ``speed_rank`` (0 where it does not fit), the knobs (``knob_values``, ``knob_index``)
    and ``params(i)``.
    """

    def __init__(
        self,
        build: Callable[[int], Candidate],
        params: Callable[[int], dict[str, Any]],
        fits: np.ndarray,
        pruned: np.ndarray,
        speed_rank: np.ndarray,
        knob_values: Mapping[str, Sequence[Any]],
        knob_index: np.ndarray,
    ) -> None:
        self._build = build
        self._params = params
        self._cache: dict[int, Candidate] = {}
        self.fits = fits
        self.pruned = pruned
        self.speed_rank = speed_rank
        self.knob_values = knob_values  # knob → its values, in space order
        self.knob_index = knob_index  # candidates × knobs: index into knob_values, -1 inactive

    def __len__(self) -> int:
        return len(self.fits)

    @overload
    def __getitem__(self, i: int) -> Candidate: ...

    @overload
    def __getitem__(self, i: slice) -> list[Candidate]: ...

    def __getitem__(self, i: int | slice) -> Candidate | list[Candidate]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        if i not in self._cache:
            self._cache[i] = self._build(i)
        return self._cache[i]

    def __iter__(self) -> Iterator[Candidate]:
        return (self[i] for i in range(len(self)))

    def params(self, i: int) -> dict[str, Any]:
        """The knobs of the ``i``-th candidate (without building it)."""
        return self._params(i)


@dataclass(frozen=True)
class PlanResult:
    """Candidates, fitting ones first and fastest first, then the ones that do not fit, closest first."""

    backend: str
    model: ModelSpec
    gpu: GpuSpec
    n_gpus: int
    fixed: dict[str, Any]
    margin: float
    candidates: Candidates
    invalid: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)  # knob → short name (the space's labels)
    basis: PeakBasis | None = None  # the peaks the candidates' ceilings divide by

    @property
    def n_fit(self) -> int:
        return int(self.candidates.fits.sum())

    @property
    def n_pruned(self) -> int:
        return int(self.candidates.pruned.sum())

    def to_dict(self, top: int | None = None) -> JsonObject:
        shown = self.candidates[:top]
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
            "ceiling_basis": self.basis.to_dict() if self.basis is not None else None,
            "candidates": [c.to_dict() for c in shown],
        }


#: start-up rules, in the order they are checked (index 0: none broken).
RULES: tuple[str | None, ...] = (
    None,
    "global_batch_divisible",
    "generation_batch_num_generations",
    "vllm_mode_required",
    "vllm_tp_divides_world",
    "vllm_tp_divides_heads",
)


def candidate_rules(config: JobConfig, model: ModelSpec, n_gpus: int) -> str | None:
    """The first framework start-up rule a candidate breaks (a stable rule name), or None when valid.

    The rules TRL and ms-swift share (frameworks.md): the global batch splits into micro-batches of
    every rank; the generation batch is a multiple of num_generations; vLLM's tensor-parallel size
    divides the world size (colocate) and the model's attention heads; a framework without a default
    ``vllm_mode`` (its decoder leaves it None) needs one.
    """
    mode = config.vllm_mode
    return RULES[_rule_code(config, mode is None, mode == "server", model.heads, n_gpus)]


def _rule_code(c: Any, mode_missing: Any, server: Any, heads: int, n_gpus: int) -> Any:
    """Index in :data:`RULES` of the first rule broken, for one configuration or columns of them."""
    world = max(1, n_gpus)
    pdbs, tp = c.per_device_batch, v.lmax(1, c.vllm_tp)
    code = v.where(c.use_vllm & (heads % tp != 0), 5, 0)
    code = v.where(c.use_vllm & v.neg(server) & (world % tp != 0), 4, code)
    code = v.where(c.use_vllm & mode_missing, 3, code)
    code = v.where(c.global_batch % c.num_generations != 0, 2, code)
    return v.where(v.either(pdbs <= 0, c.global_batch % v.lmax(1, pdbs * world) != 0), 1, code)


# ------------------------------------------------------------------------------ the candidates


def _unique_values(knob: Knob) -> list[Any]:
    unique: list[Any] = []
    for x in knob.values():
        if not any(type(u) is type(x) and u == x for u in unique):
            unique.append(x)
    return unique


_MISSING = object()


def _walk(space: SearchSpace, values: Sequence[Sequence[Any]]) -> list[tuple[int, ...]]:
    """Every configuration as per-knob value indices (-1: the knob is inactive), in grid order.

    The walk :meth:`SearchSpace.grid` does, over ``values`` (a knob with one value does not branch).
    """
    knobs = space.knobs
    ctx: dict[str, Any] = dict(space.dropped_defaults)  # earlier knobs' values, for conditions
    acc: list[int] = []
    out: list[tuple[int, ...]] = []

    def rec(i: int) -> None:
        if i == len(knobs):
            out.append(tuple(acc))
            return
        knob = knobs[i]
        if knob.active(ctx):
            saved = ctx.get(knob.name, _MISSING)
            for j, x in enumerate(values[i]):
                ctx[knob.name] = x
                acc.append(j)
                rec(i + 1)
                acc.pop()
            if saved is _MISSING:
                del ctx[knob.name]
            else:
                ctx[knob.name] = saved
        else:
            acc.append(-1)
            rec(i + 1)
            acc.pop()

    rec(0)
    return out


def _config_fields(config: JobConfig) -> dict[str, Any]:
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.compare}


def _same_value(a: object, b: object) -> bool:
    return (
        type(a) is type(b)
        and a == b
        or (
            not isinstance(a, bool)
            and not isinstance(b, bool)
            and isinstance(a, (int, float))
            and isinstance(b, (int, float))
            and a == b
        )
    )


class _NotPassThrough(Exception):
    """A knob thought to pass through does not, in some group: decode it per group instead."""

    def __init__(self, index: int) -> None:
        self.index = index


@dataclass
class _Table:
    """Every candidate of a space: its knobs (as value indices) and its configuration's columns."""

    knobs: tuple[Knob, ...]
    values: list[list[Any]]
    index: np.ndarray  # rows × knobs value indices, -1 inactive, grid order
    config: dict[str, np.ndarray]
    first_config: Callable[[int], JobConfig]  # the decoded configuration of a row's group

    def params(self, row: int) -> dict[str, Any]:
        return {
            k.name: self.values[i][j]
            for i, (k, j) in enumerate(zip(self.knobs, self.index[row], strict=True))
            if j >= 0
        }


def _table(space: SearchSpace, describe: Callable[[dict[str, Any]], JobConfig]) -> _Table:
    """Decode the space once per group of candidates that differ only in pass-through knobs."""
    knobs = space.knobs
    values = [_unique_values(k) for k in knobs]
    conditioned = {other for k in knobs for other in k.when}
    passing = {i for i, k in enumerate(knobs) if k.name not in conditioned and len(values[i]) > 1}
    while True:
        try:
            return _table_with(space, describe, values, passing)
        except _NotPassThrough as e:  # always one of them: remove, so that a wrong one fails, not loops
            passing.remove(e.index)


def _table_with(
    space: SearchSpace,
    describe: Callable[[dict[str, Any]], JobConfig],
    values: list[list[Any]],
    passing: set[int],
) -> _Table:
    knobs = space.knobs
    # a group stands for its pass-through knobs' last values (the first group checks every value)
    group_values = [vals[-1:] if i in passing else vals for i, vals in enumerate(values)]
    groups = _walk(space, group_values)

    def params_of(idx: Sequence[int], vals: Sequence[Sequence[Any]] = values) -> dict[str, Any]:
        return {k.name: vals[i][j] for i, (k, j) in enumerate(zip(knobs, idx, strict=True)) if j >= 0}

    # which field each pass-through knob sets: decoded at its first group, value by value
    field_of: dict[int, str] = {}
    field_values: dict[int, list[Any]] = {}
    for i in sorted(passing):
        base = next((g for g in groups if g[i] >= 0), None)
        if base is None:
            continue
        try:
            decoded = [
                _config_fields(describe({**params_of(base, group_values), knobs[i].name: x}))
                for x in values[i]
            ]
        except Exception:
            raise _NotPassThrough(i) from None
        moved = {f for d in decoded[1:] for f, x in d.items() if x != decoded[0][f]}
        if len(moved) != 1:
            raise _NotPassThrough(i)
        (name,) = moved
        if name not in CONFIG_COLUMNS or name in field_of.values():
            raise _NotPassThrough(i)
        if not all(_same_value(d[name], x) for d, x in zip(decoded, values[i], strict=True)):
            raise _NotPassThrough(i)
        field_of[i] = name
        field_values[i] = [d[name] for d in decoded]

    configs: list[JobConfig] = []
    for g in groups:
        config = describe(params_of(g, group_values))
        for i, name in field_of.items():
            if g[i] >= 0 and not _same_value(getattr(config, name), values[i][-1]):
                raise _NotPassThrough(i)
        configs.append(config)

    # rows: each group times the values of its active pass-through knobs
    blocks: list[np.ndarray] = []
    group_of: list[np.ndarray] = []
    for n, g in enumerate(groups):
        ranges = [
            range(len(values[i])) if (i in field_of and g[i] >= 0) else (g[i],) for i in range(len(knobs))
        ]
        if not ranges:
            blocks.append(np.zeros((1, 0), dtype=np.int64))
            group_of.append(np.full(1, n, dtype=np.int64))
            continue
        grids = np.meshgrid(*(np.asarray(r, dtype=np.int64) for r in ranges), indexing="ij")
        block = np.stack([g_.reshape(-1) for g_ in grids], axis=1)
        blocks.append(block)
        group_of.append(np.full(len(block), n, dtype=np.int64))
    # (the walk gives one group at least; a space without knobs has one candidate, in order)
    index, group = np.concatenate(blocks), np.concatenate(group_of)
    order = np.lexsort(index.T[::-1]) if knobs else np.zeros(1, dtype=np.int64)
    index, group = index[order], group[order]

    columns = {
        name: column([getattr(c, name) for c in configs], dtype)[group]
        for name, dtype in CONFIG_COLUMNS.items()
    }
    for i, name in field_of.items():
        col = index[:, i]
        vals = column(field_values[i], CONFIG_COLUMNS[name])
        columns[name] = np.where(col >= 0, vals[np.maximum(col, 0)], columns[name])
    return _Table(
        knobs=knobs, values=values, index=index, config=columns, first_config=lambda r: configs[group[r]]
    )


def plan_space(
    space: SearchSpace,
    *,
    backend: str,
    describe: Describe,
    model: ModelSpec,
    gpu: GpuSpec,
    n_gpus: int,
    fixed: Mapping[str, object],
    margin: float = 0.15,
    basis: PeakBasis | None = None,
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
        basis: the peaks of each candidate's ceiling (default: ``gpu``'s catalog peaks).
    """
    world = max(1, n_gpus)

    def decode(params: Mapping[str, object]) -> JobConfig:
        return describe(params, {"world_size": world}, fixed, n_gpus)

    table = _table(space, lambda p: decode(p))
    cfg = table.config
    code = _rule_code(
        SimpleNamespace(**cfg), cfg["vllm_mode"] == "", cfg["vllm_mode"] == "server", model.heads, n_gpus
    )
    invalid = Counter(
        {RULES[c]: int(k) for c, k in zip(*np.unique(code, return_counts=True), strict=True) if c != 0}
    )
    valid = np.flatnonzero(code == 0)
    rows = ShapeColumns({k: c[valid] for k, c in cfg.items()}, model, n_gpus)
    # a DeepSpeed JSON of the user's own cannot be estimated: JobShape says so (UsageError)
    for r in valid:
        first = table.first_config(int(r))
        if first.ds_config_path is not None:
            JobShape(first, model, n_gpus)

    on_gpu = n_gpus > 0  # a CPU-only plan judges nothing: every candidate fits, as estimate_memory says
    capacity = gpu.memory_bytes if on_gpu else 0
    terms = memory_terms(rows, capacity, gpu.name if on_gpu else "")
    totals = terms.totals()
    stacked = np.stack([np.broadcast_to(totals[p], (len(rows),)) for p in ("train", "rollout", "sync")])
    peak = stacked.max(axis=0)
    vllm = terms.vllm
    startup_ok = np.broadcast_to(vllm.startup_ok, (len(rows),))
    kv_ok = np.broadcast_to(vllm.kv_ok, (len(rows),))
    fits = (startup_ok & kv_ok & (peak <= capacity)) | (not on_gpu)
    slack = margin * capacity
    pruned = (
        (np.broadcast_to(vllm.startup_deficit, (len(rows),)) > slack)
        | (np.broadcast_to(vllm.kv_deficit, (len(rows),)) > slack)
        | (peak > capacity + slack)
    ) & (capacity > 0)
    # how far a candidate that does not fit misses, by its worst check (a check that passes lacks 0)
    over = np.maximum(np.maximum(vllm.startup_deficit, vllm.kv_deficit), peak - capacity)
    times = [
        np.broadcast_to(np.asarray(t, dtype=np.float64), (len(rows),))
        for t in step_time_terms(rows, gpu, vllm.concurrency)
    ]
    throughput = times[5]
    peaks = basis or PeakBasis.from_gpu(gpu)
    limits = ceiling_terms(rows, peaks, rows.max_prompt_length, rows.max_completion_length)
    limit_cols = {
        k: np.broadcast_to(np.asarray(x, dtype=np.float64), (len(rows),)) for k, x in limits.items()
    }
    distinct_t, t_inverse = np.unique(throughput, return_inverse=True)
    keys = np.array([speed_key(float(t)) for t in distinct_t], dtype=np.float64)[t_inverse]
    best = float(throughput[fits].max()) if fits.any() else None
    ranked = sorted(set(keys[fits].tolist()), reverse=True)
    rank_of = {k: i for i, k in enumerate(ranked, 1)}
    rank = np.array(
        [rank_of[k] if f else 0 for k, f in zip(keys.tolist(), fits.tolist(), strict=True)], dtype=np.int64
    )
    secondary = np.where(fits, -keys, over)
    order = np.lexsort((peak, secondary, ~fits))

    row_terms = _RowTerms(terms, len(rows))

    def build(i: int) -> Candidate:
        r = int(order[i])
        full_row = int(valid[r])
        params = table.params(full_row)
        mem = terms_estimate(row_terms.at(r), capacity, on_gpu)
        t = TimeEstimate(*(float(x[r]) for x in times))
        return Candidate(
            params=params,
            derived={
                "world_size": int(rows.world_size[r]),
                "gradient_accumulation_steps": int(rows.grad_accum[r]),
            },
            memory=mem,
            time=t,
            relative_speed=(t.throughput / best) if best else None,
            pruned=bool(pruned[r]),
            speed_rank=int(rank[r]) if fits[r] else None,
            shape_of=lambda: JobShape(decode(params), model, n_gpus),
            ceiling=StepCeiling(
                **{f"{p}_s": float(limit_cols[p][r]) for p in CEILING_PHASES},
                step_s=float(limit_cols["step"][r]),
                basis=peaks,
                work=StepWork(),
            ),
        )

    cands = Candidates(
        build,
        lambda i: table.params(int(valid[order[i]])),
        fits=fits[order],
        pruned=pruned[order],
        speed_rank=rank[order],
        knob_values={k.name: vals for k, vals in zip(table.knobs, table.values, strict=True)},
        knob_index=table.index[valid][order],
    )
    labels = {k.name: k.short for k in space.knobs if k.label}
    notes = tuple(f"knob {k} dropped: {why}" for k, why in space.dropped.items())
    return PlanResult(
        backend=backend,
        model=model,
        gpu=gpu,
        n_gpus=n_gpus,
        fixed=dict(fixed),
        margin=margin,
        candidates=cands,
        invalid=dict(invalid),
        notes=notes,
        labels=labels,
        basis=peaks,
    )


class _RowTerms:
    """One candidate's :class:`MemoryTerms` as Python numbers, out of the columns of all of them.

    Every column becomes one column of an int64 matrix on first use (booleans as 0/1: the estimate
    reads them as truth values), so a row costs one ``tolist``.
    """

    def __init__(self, terms: MemoryTerms, n: int) -> None:
        self._terms, self._n = terms, n
        self._leaves: list[tuple[tuple[str, ...], Any]] = [
            *((("phases", p, k), b) for p, comps in terms.phases.items() for k, b in comps.items()),
            *((("vllm", f), getattr(terms.vllm, f)) for f in vars(terms.vllm)),
            *(
                ((f,), getattr(terms, f))
                for f in ("has_rollout", "has_sync", "host_bytes", "server_note", "sleep_note")
            ),
        ]
        self._matrix: np.ndarray | None = None

    def at(self, r: int) -> MemoryTerms:
        if self._matrix is None:
            self._matrix = np.stack(
                [np.broadcast_to(np.asarray(x, dtype=np.int64), (self._n,)) for _, x in self._leaves], axis=1
            )
        values = dict(zip((path for path, _ in self._leaves), self._matrix[r].tolist(), strict=True))
        t = self._terms
        return MemoryTerms(
            phases={p: {k: values["phases", p, k] for k in comps} for p, comps in t.phases.items()},
            has_rollout=values["has_rollout",],
            has_sync=values["has_sync",],
            host_bytes=values["host_bytes",],
            vllm=type(t.vllm)(**{f: values["vllm", f] for f in vars(t.vllm)}),
            server_note=values["server_note",],
            sleep_note=values["sleep_note",],
        )


#: what a backend's decoder looks like (:meth:`autotune.backends.Backend.describe`).
Describe = Callable[[Mapping[str, Any], Mapping[str, Any], Mapping[str, Any], int], JobConfig]
