"""The plan's own logic, value by value, on hand-made inputs (no backend, no packaged space).

``test_plan_columns.py`` holds the whole plan to the per-candidate path on real spaces; these pin what
that comparison cannot see: each start-up rule and which one wins when several break, the ranking, fit
and pruning bounds, the edge plans, and the objects a caller reads (counts, ``to_dict``, lazy
candidates). ``test_plan_table_exact.py`` holds the grid walk and its pass-through groups. Every
expected value is worked out in the comment beside it. Cheap: a few candidates on a fake decoder.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from autotune.estimate import JobShape, estimate_memory, estimate_step_time, find_model
from autotune.estimate.plan import RULES, candidate_rules, speed_key
from autotune.jobconfig import JobConfig
from autotune.space import Knob, SearchSpace


def _model(heads: int = 28) -> Any:
    m = find_model("Qwen2-7B")  # 28 attention heads
    assert m is not None
    return dataclasses.replace(m, heads=heads)


def _config(**kw: Any) -> JobConfig:
    base: dict[str, Any] = {
        "world_size": 4,
        "global_batch": 64,
        "num_generations": 8,
        "per_device_batch": 4,
        "grad_accum": 4,
    }
    return JobConfig(**{**base, **kw})


# ------------------------------------------------------------------------------ the start-up rules


def test_rules_are_named_in_check_order() -> None:
    assert RULES == (
        None,
        "global_batch_divisible",
        "generation_batch_num_generations",
        "vllm_mode_required",
        "vllm_tp_divides_world",
        "vllm_tp_divides_heads",
    )


@pytest.mark.parametrize(
    ("kw", "heads", "n_gpus", "rule"),
    [
        # 64 = 4 per device × 4 GPUs × 4 steps; 64 % 8 == 0; no vLLM: valid
        ({}, 28, 4, None),
        # per-device batch 0 splits nothing, although 64 % max(1, 0·4) == 0
        ({"per_device_batch": 0}, 28, 4, "global_batch_divisible"),
        # 64 % (16 × 8) = 64: the global batch does not split over 8 ranks of 16
        ({"per_device_batch": 16}, 28, 8, "global_batch_divisible"),
        # one rank of 1: 3 % (1 × 1) == 0, an odd batch splits
        ({"global_batch": 3, "per_device_batch": 1, "num_generations": 1}, 28, 1, None),
        # no GPU counts as one rank: 3 % (3 × 1) == 0 (two ranks would need 6)
        ({"global_batch": 3, "per_device_batch": 3, "num_generations": 1}, 28, 0, None),
        # 60 % (1 × 4) == 0 but 60 % 8 = 4
        ({"global_batch": 60, "per_device_batch": 1}, 28, 4, "generation_batch_num_generations"),
        # both broken: 60 % (3 × 4) = 0? no: 60 % 12 == 0, so use 62: 62 % 12 = 2 and 62 % 8 = 6 → the first
        ({"global_batch": 62, "per_device_batch": 3}, 28, 4, "global_batch_divisible"),
        # vLLM without a mode (a framework with no default) ...
        ({"use_vllm": True, "vllm_mode": None}, 28, 4, "vllm_mode_required"),
        # ... wins over TP 3 that divides neither 4 GPUs nor 28 heads
        ({"use_vllm": True, "vllm_mode": None, "vllm_tp": 3}, 28, 4, "vllm_mode_required"),
        # ... but loses to the generation batch: 60 % 8 = 4
        (
            {"use_vllm": True, "vllm_mode": None, "global_batch": 60, "per_device_batch": 1},
            28,
            4,
            "generation_batch_num_generations",
        ),
        # no mode matters only with vLLM
        ({"use_vllm": False, "vllm_mode": None}, 28, 4, None),
        # colocated TP 4 on 2 GPUs: 2 % 4 = 2 (28 % 4 == 0), 64 % (4 × 2) == 0
        ({"use_vllm": True, "vllm_tp": 4}, 28, 2, "vllm_tp_divides_world"),
        # the same as a server: its GPUs are others, only the heads count
        ({"use_vllm": True, "vllm_tp": 4, "vllm_mode": "server"}, 28, 2, None),
        # TP 3: 4 % 3 = 1 and 28 % 3 = 1: the world rule is checked first
        ({"use_vllm": True, "vllm_tp": 3}, 28, 4, "vllm_tp_divides_world"),
        # TP 2 on 4 GPUs with 7 heads: 4 % 2 == 0, 7 % 2 = 1
        ({"use_vllm": True, "vllm_tp": 2}, 7, 4, "vllm_tp_divides_heads"),
        # a server with TP 2 and 7 heads breaks the heads rule too
        ({"use_vllm": True, "vllm_tp": 2, "vllm_mode": "server"}, 7, 4, "vllm_tp_divides_heads"),
        # TP 2 and 7 heads without vLLM: nothing is sharded
        ({"use_vllm": False, "vllm_tp": 2}, 7, 4, None),
        # TP 0 counts as 1: 7 % 1 == 0 and 4 % 1 == 0 (as 2 it would break the heads rule)
        ({"use_vllm": True, "vllm_tp": 0}, 7, 4, None),
    ],
)
def test_candidate_rules_first_broken(kw: dict[str, Any], heads: int, n_gpus: int, rule: str | None) -> None:
    assert candidate_rules(_config(**kw), _model(heads), n_gpus) == rule


def test_rules_on_columns_agree_with_one_configuration() -> None:
    """The plan checks the same rules on numpy columns (through ``plan_space``, below); one config is
    also checkable row by row, and the codes are indices into RULES."""
    from types import SimpleNamespace

    from autotune.estimate.plan import _rule_code

    cols = SimpleNamespace(
        per_device_batch=np.array([4, 0, 1, 4, 4, 4]),
        global_batch=np.array([64, 64, 60, 64, 64, 64]),
        num_generations=np.array([8, 8, 8, 8, 8, 8]),
        use_vllm=np.array([False, False, False, True, True, True]),
        vllm_tp=np.array([1, 1, 1, 1, 3, 2]),
    )
    missing = np.array([False, False, False, True, False, False])
    server = np.array([False, False, False, False, False, True])
    # rows: valid; pdbs 0; 60 % 8; no mode; TP 3 on 4 GPUs; a server with TP 2 over 7 heads
    assert _rule_code(cols, missing, server, 7, 4).tolist() == [0, 1, 2, 3, 4, 5]


# ------------------------------------------------------------------------------ the speed key


def test_speed_key_keeps_nine_significant_digits() -> None:
    assert speed_key(1234.56789012) == 1234.56789
    assert speed_key(0.1 + 0.2) == 0.3  # 0.30000000000000004 and 0.3 tie
    assert speed_key(1.000000001) == 1.0  # 1.000000001 has 10 significant digits: ties with 1
    assert speed_key(1.00000001) == 1.00000001  # the 9th digit still ranks apart


def _space(*knobs: Knob, dropped_defaults: dict[str, Any] | None = None) -> SearchSpace:
    return SearchSpace("trl", tuple(knobs), dropped_defaults=dropped_defaults or {})


# ------------------------------------------------------------------------------ a whole plan, by hand

JOB = {"global_batch": 64, "num_generations": 8, "max_prompt_length": 512, "max_completion_length": 1024}


def _describe(params: Any, derived: Any, fixed: Any, n_gpus: int) -> JobConfig:
    """A decoder of the knobs below (what a backend's ``describe`` does, one field per knob)."""
    world, pdbs, zero = derived["world_size"], params["pdbs"], params["zero"]
    return JobConfig(
        world_size=world,
        global_batch=fixed["global_batch"],
        num_generations=fixed["num_generations"],
        per_device_batch=pdbs,
        grad_accum=max(1, fixed["global_batch"] // (pdbs * world)),
        max_prompt_length=fixed["max_prompt_length"],
        max_completion_length=fixed["max_completion_length"],
        deepspeed=zero > 0,
        zero_stage=zero,
        use_vllm=params["vllm"],
        vllm_util=params.get("util", 0.9),
        vllm_tp=params.get("tp", 1),
        vllm_mode=params.get("mode", "colocate"),
        loads_before_vllm=params.get("first", False),
    )


def _plan_space_by_hand() -> SearchSpace:
    on = {"vllm": (True,)}
    return SearchSpace(
        "trl",
        (
            Knob("pdbs", "int", default=1, choices=(1, 2, 32), label="bs"),
            Knob("zero", "int", default=0, choices=(0, 3)),
            Knob("vllm", "bool", default=False, choices=(False, True)),
            Knob("util", "float", default=0.3, choices=(0.3, 0.5), when=on, label="util"),
            Knob("tp", "int", default=1, choices=(1, 3), when=on),
            Knob("mode", "str", default="colocate", choices=("colocate", "server", None), when=on),
        ),
        dropped={"num_processes": "applies to CPU-only runs"},
    )


def _oracle(params: dict[str, Any], model: Any, gpu: Any, n: int) -> tuple[Any, Any]:
    shape = JobShape(_describe(params, {"world_size": n}, JOB, n), model, n)
    mem = estimate_memory(shape, gpu)
    return mem, estimate_step_time(shape, gpu, mem)


def test_plan_of_a_hand_made_space_counts_ranks_and_orders() -> None:
    from autotune.estimate import GIB, PeakBasis, generic_gpu, plan_space, should_prune, step_ceiling

    # 8 GiB GPUs: of the 20 valid candidates 15 fit, 3 miss by more than the margin, 2 by less
    model, gpu = find_model("Qwen2.5-0.5B"), generic_gpu("8 GiB", 8 * GIB)
    assert model is not None
    result = plan_space(
        _plan_space_by_hand(), backend="trl", describe=_describe, model=model, gpu=gpu, n_gpus=4, fixed=JOB
    )
    # 3 batches × 2 stages × (no vLLM + 2 utils × 2 TPs × 3 modes) = 78 candidates:
    # pdbs 32: 64 % (32 × 4) = 64, all 2 × 13 = 26 break the batch rule;
    # of pdbs 1 and 2 (2 × 2 = 4 groups), with vLLM: no mode: 2 × 2 = 4 each → 16;
    # colocated TP 3 (4 % 3 = 1): 2 each → 8; a server with TP 3 (Qwen2.5-0.5B: 14 heads, 14 % 3 = 2): 8;
    # valid: 4 × (1 + 2 colocated + 2 served) = 20
    assert result.invalid == {
        "global_batch_divisible": 26,
        "vllm_mode_required": 16,
        "vllm_tp_divides_world": 8,
        "vllm_tp_divides_heads": 8,
    }
    cands = result.candidates
    assert len(cands) == 20
    oracle = [(c.params, *_oracle(c.params, model, gpu, 4)) for c in cands]
    fit = [o for o in oracle if o[1].fits()]
    assert result.n_fit == len(fit) == 15
    assert result.n_pruned == sum(should_prune(m, 0.15) for _, m, _ in oracle) == int(cands.pruned.sum()) == 3
    # ranks: 1 + the number of distinct faster keys among the fitting; None / 0 where it does not fit
    keys = sorted({speed_key(t.throughput) for _, m, t in fit}, reverse=True)
    best = max(t.throughput for _, _, t in fit)
    for i, (c, (params, mem, t)) in enumerate(zip(cands, oracle, strict=True)):
        assert (c.memory, c.time) == (mem, t)
        # derived by hand: 4 ranks; 64 / (pdbs × 4) accumulation steps: 16 at pdbs 1, 8 at pdbs 2
        assert c.derived == {"world_size": 4, "gradient_accumulation_steps": {1: 16, 2: 8}[params["pdbs"]]}
        assert c.fits == bool(cands.fits[i]) == mem.fits()
        assert c.pruned == should_prune(mem, 0.15)
        assert c.relative_speed == t.throughput / best
        if mem.fits():
            assert c.speed_rank == 1 + keys.index(speed_key(t.throughput)) == cands.speed_rank[i]
        else:
            assert c.speed_rank is None and cands.speed_rank[i] == 0
        shape = JobShape(_describe(params, {"world_size": 4}, JOB, 4), model, 4)
        assert c.shape == shape
        assert c.ceiling == step_ceiling(shape, PeakBasis.from_gpu(gpu))
        assert c.ceiling_fraction == c.ceiling.step_s / t.total_s  # type: ignore[union-attr]
    assert result.basis == PeakBasis.from_gpu(gpu)
    assert result.labels == {"pdbs": "bs", "util": "util"}
    assert result.notes == ("knob num_processes dropped: applies to CPU-only runs",)
    assert (result.backend, result.n_gpus, result.fixed, result.margin) == ("trl", 4, JOB, 0.15)
    # the order: fitting first, fastest first (ties: less memory first); then the misses, nearest first
    # (by how far the worst check misses, over the capacity), ties again by less memory
    grid = [
        p
        for p in _plan_space_by_hand().grid()
        if candidate_rules(_describe(p, {"world_size": 4}, JOB, 4), model, 4) is None
    ]

    def key(p: dict[str, Any]) -> tuple[Any, ...]:
        mem, t = _oracle(p, model, gpu, 4)
        if mem.fits():
            return (0, -speed_key(t.throughput), mem.peak_bytes)
        worst = max(mem.vllm_startup_deficit_bytes, mem.kv_deficit_bytes, mem.peak_bytes - mem.capacity_bytes)
        return (1, worst / mem.capacity_bytes, mem.peak_bytes)

    assert [c.params for c in cands] == sorted(grid, key=key)
    assert [cands.params(i) for i in range(len(cands))] == [c.params for c in cands]


# 8 GiB = 2^33 B: margin × 2^33 is exact for a margin of a float's precision, so a candidate can miss by
# exactly the slack
C8 = 2**33


def _one(margin: float, capacity: int = C8, n_gpus: int = 4, **choices: Any) -> Any:
    """The plan of one candidate (each knob of the hand-made space pinned to one value)."""
    from autotune.estimate import generic_gpu, plan_space

    picked = {"pdbs": 1, "zero": 0, "vllm": False, **choices}
    knobs = [
        Knob(k, "int" if isinstance(x, int) else "float", default=x, choices=(x,)) for k, x in picked.items()
    ]
    model = find_model("Qwen2.5-0.5B")
    assert model is not None
    result = plan_space(
        SearchSpace("trl", tuple(knobs)),
        backend="trl",
        describe=_describe,
        model=model,
        gpu=generic_gpu("gpu", capacity),
        n_gpus=n_gpus,
        fixed=JOB,
        margin=margin,
    )
    assert len(result.candidates) == 1
    return result.candidates[0]


def test_a_peak_of_exactly_the_capacity_fits() -> None:
    peak = _one(0.15).memory.peak_bytes  # no vLLM: the trainer's peak does not depend on the capacity
    assert _one(0.15, capacity=peak).memory.peak_bytes == peak
    at, below = _one(0.15, capacity=peak), _one(0.15, capacity=peak - 1)
    assert at.fits and not below.fits  # the estimate's word ...
    assert at.speed_rank == 1 and below.speed_rank is None  # ... and the plan's (its rank: fitting only)
    assert at.relative_speed == 1.0 and below.relative_speed is None
    # a miss of 1 byte is far below 15 % of the capacity: not pruned
    assert not _one(0.15, capacity=peak - 1).pruned
    # a fitting candidate with no slack at all is not pruned either (nothing misses: 0 > 0 is false)
    assert not _one(0.0, capacity=peak).pruned


def test_pruned_only_past_the_slack() -> None:
    # batch 2 with vLLM at 0.3 of 8 GiB misses by its peak only (vLLM starts, KV fits)
    over = _one(0.15, pdbs=2, vllm=True, util=0.3).memory
    miss = over.peak_bytes - C8
    assert miss > 0 and over.vllm_startup_deficit_bytes == over.kv_deficit_bytes == 0
    exact = miss / C8  # slack = exact × 2^33 == miss: over by exactly the slack is not "more than"
    assert exact * C8 == miss
    assert not _one(exact, pdbs=2, vllm=True, util=0.3).pruned
    assert _one((miss - 1) / C8, pdbs=2, vllm=True, util=0.3).pruned
    # vLLM at 0.05: the peak fits but one sequence's KV cache does not; pruned past the slack only
    short = _one(0.15, vllm=True, util=0.05).memory
    assert short.peak_bytes < C8 and short.vllm_startup_deficit_bytes == 0 and short.kv_deficit_bytes > 0
    exact = short.kv_deficit_bytes / C8
    assert exact * C8 == short.kv_deficit_bytes
    assert not _one(exact, vllm=True, util=0.05).pruned
    assert _one((short.kv_deficit_bytes - 1) / C8, vllm=True, util=0.05).pruned
    assert not _one(exact, vllm=True, util=0.05).fits


def test_a_cpu_only_plan_judges_no_memory() -> None:
    # no GPU: capacity 0, every candidate fits and none is pruned, as estimate_memory says of one trial
    c = _one(0.15, n_gpus=0, pdbs=2)
    assert c.fits and not c.pruned and c.speed_rank == 1 and c.relative_speed == 1.0
    assert c.memory.capacity_bytes == 0 and not c.memory.on_gpu
    # one rank (world max(1, 0)): 64 / (2 × 1) = 32 accumulation steps
    assert c.derived == {"world_size": 1, "gradient_accumulation_steps": 32}


# ------------------------------------------------------------------------------ what a caller reads


def _hand_plan() -> Any:
    from autotune.estimate import GIB, generic_gpu, plan_space

    model = find_model("Qwen2.5-0.5B")
    assert model is not None
    gpu = generic_gpu("8 GiB", 8 * GIB)
    return plan_space(
        _plan_space_by_hand(), backend="trl", describe=_describe, model=model, gpu=gpu, n_gpus=4, fixed=JOB
    )


def test_plan_result_as_a_record() -> None:
    result = _hand_plan()
    d = result.to_dict(top=2)
    shown = d.pop("candidates")
    assert d == {
        "backend": "trl",
        "model": {"name": "Qwen2.5-0.5B", "params": 494_032_768, "hub_id": "Qwen/Qwen2.5-0.5B"},
        "gpu": {"name": "8 GiB", "memory_bytes": 8 * 2**30, "known": False},
        "n_gpus": 4,
        "fixed": JOB,
        "margin": 0.15,
        # 20 valid: 15 fit, 5 do not (3 of them by more than the margin); 26 + 16 + 8 + 8 = 58 invalid
        "counts": {"candidates": 20, "fit": 15, "do_not_fit": 5, "pruned": 3, "invalid": 58},
        "invalid": {
            "global_batch_divisible": 26,
            "vllm_mode_required": 16,
            "vllm_tp_divides_world": 8,
            "vllm_tp_divides_heads": 8,
        },
        "notes": ["knob num_processes dropped: applies to CPU-only runs"],
        "ceiling_basis": result.basis.to_dict(),
    }
    assert shown == [result.candidates[0].to_dict(), result.candidates[1].to_dict()]
    assert len(result.to_dict()["candidates"]) == 20  # no top: every candidate
    assert dataclasses.replace(result, basis=None).to_dict(top=0)["ceiling_basis"] is None


def test_candidate_as_a_record() -> None:
    c = _hand_plan().candidates[0]
    assert c.ceiling is not None
    assert c.to_dict() == {
        "params": c.params,
        "derived": c.derived,
        "fits": True,
        "pruned": False,
        "relative_speed": 1.0,
        "speed_rank": 1,
        "memory": c.memory.to_dict(),
        "time": c.time.to_dict(),
        "ceiling": c.ceiling.to_dict(),
        "ceiling_fraction": c.ceiling.step_s / c.time.total_s,
    }
    bare = dataclasses.replace(c, ceiling=None, shape_of=None)
    assert bare.to_dict()["ceiling"] is None and bare.to_dict()["ceiling_fraction"] is None
    with pytest.raises(AttributeError, match="shape"):
        _ = bare.shape
    still = dataclasses.replace(c, time=dataclasses.replace(c.time, total_s=0.0))
    assert still.ceiling_fraction is None  # no predicted time to compare with


def test_candidates_are_built_when_read_and_kept() -> None:
    cands = _hand_plan().candidates
    n = len(cands)
    assert n == 20
    first, last = cands[0], cands[n - 1]
    assert cands[0] is first  # built once
    assert cands[-1] is last and cands[-n] is first
    # the error names the index, counted from the start (-21 of 20 is -1)
    for bad, named in ((n, "20"), (-n - 1, "-1")):
        with pytest.raises(IndexError, match=rf"^{named}$"):
            cands[bad]
    assert cands[1:3] == [cands[1], cands[2]] and cands[18:] == [cands[18], last]
    assert cands[::-1][0] is last and len(cands[:]) == n
    assert list(cands) == cands[:]
    assert cands.params(5) == cands[5].params
    # the columns a table reads, in plan order: the knob values and, per candidate, their indices
    assert cands.knob_values == {
        "pdbs": [1, 2, 32],
        "zero": [0, 3],
        "vllm": [False, True],
        "util": [0.3, 0.5],
        "tp": [1, 3],
        "mode": ["colocate", "server", None],
    }
    for i in (0, 7, n - 1):
        pairs = zip(cands.knob_values.items(), cands.knob_index[i], strict=True)
        assert {k: vals[j] for (k, vals), j in pairs if j >= 0} == cands[i].params
    assert cands.fits.tolist() == [c.fits for c in cands]
    assert cands.pruned.tolist() == [c.pruned for c in cands]


# ------------------------------------------------------------------------------ edge plans


def test_a_space_without_knobs_is_one_candidate() -> None:
    from autotune.estimate import GIB, generic_gpu, plan_space

    model = find_model("Qwen2.5-0.5B")
    assert model is not None

    def describe(params: Any, derived: Any, fixed: Any, n: int) -> JobConfig:
        return _describe({"pdbs": 1, "zero": 0, "vllm": False, **params}, derived, fixed, n)

    result = plan_space(
        SearchSpace("trl", ()),
        backend="trl",
        describe=describe,
        model=model,
        gpu=generic_gpu("g", 8 * GIB),
        n_gpus=4,
        fixed=JOB,
    )
    assert len(result.candidates) == 1 and result.candidates[0].params == {} and result.n_fit == 1
    assert result.candidates.knob_index.shape == (1, 0)


def test_a_plan_where_every_candidate_breaks_a_rule_is_empty() -> None:
    from autotune.estimate import GIB, generic_gpu, plan_space

    model = find_model("Qwen2.5-0.5B")
    assert model is not None
    space = _space(
        Knob("pdbs", "int", default=32, choices=(32, 64)), Knob("zero", "int", default=0, choices=(0, 3))
    )
    result = plan_space(
        SearchSpace("trl", (*space.knobs, Knob("vllm", "bool", default=False, choices=(False,)))),
        backend="trl",
        describe=_describe,
        model=model,
        gpu=generic_gpu("g", 8 * GIB),
        n_gpus=4,
        fixed=JOB,
    )
    # 64 % (32 × 4) and 64 % (64 × 4) are 64: all 2 × 2 break the batch rule
    assert result.invalid == {"global_batch_divisible": 4}
    assert len(result.candidates) == 0 and result.n_fit == 0 and result.n_pruned == 0
    assert result.to_dict()["counts"] == {
        "candidates": 0,
        "fit": 0,
        "do_not_fit": 0,
        "pruned": 0,
        "invalid": 4,
    }


def test_when_nothing_fits_no_candidate_has_a_speed() -> None:
    # a GPU of 1 byte: everything misses by far more than 15 % of it, so everything is pruned too
    c = _one(0.15, capacity=1)
    assert not c.fits and c.pruned and c.relative_speed is None and c.speed_rank is None
    assert c.memory.capacity_bytes == 1


def test_one_gpu_is_judged() -> None:
    # one GPU is a GPU: the same candidate misses on 1 byte of it, with the trainer's whole peak
    c = _one(0.15, capacity=1, n_gpus=1)
    assert not c.fits and c.pruned and c.memory.on_gpu and c.memory.capacity_bytes == 1
    assert c.derived == {"world_size": 1, "gradient_accumulation_steps": 64}  # 64 / (1 × 1)


def test_a_deepspeed_file_of_the_users_own_is_refused() -> None:
    from autotune.errors import UsageError
    from autotune.estimate import GIB, generic_gpu, plan_space

    model = find_model("Qwen2.5-0.5B")
    assert model is not None

    def describe(params: Any, derived: Any, fixed: Any, n: int) -> JobConfig:
        config = _describe(params, derived, fixed, n)
        return dataclasses.replace(config, ds_config_path="my_zero.json") if params["zero"] == 3 else config

    space = _space(
        Knob("pdbs", "int", default=1, choices=(1,)),
        Knob("zero", "int", default=0, choices=(3,)),
        Knob("vllm", "bool", default=False, choices=(False,)),
    )
    with pytest.raises(UsageError, match="DeepSpeed config of its own"):
        plan_space(
            space,
            backend="trl",
            describe=describe,
            model=model,
            gpu=generic_gpu("g", 8 * GIB),
            n_gpus=4,
            fixed=JOB,
        )
    # the same knobs on a preset are planned
    space = _space(*space.knobs[:1], Knob("zero", "int", default=0, choices=(0,)), *space.knobs[2:])
    assert (
        len(
            plan_space(
                space,
                backend="trl",
                describe=describe,
                model=model,
                gpu=generic_gpu("g", 8 * GIB),
                n_gpus=4,
                fixed=JOB,
            ).candidates
        )
        == 1
    )


def test_misses_are_ordered_by_their_worst_check() -> None:
    """Candidates that do not fit: nearest first, by the largest of what vLLM's start-up lacks, what its
    KV cache lacks and how far the peak is over (MemoryEstimate.overflow, the per-trial answer)."""
    from autotune.estimate import GIB, generic_gpu, plan_space

    model = find_model("Qwen2.5-0.5B")
    assert model is not None
    space = _space(
        Knob("pdbs", "int", default=1, choices=(1, 2)),
        Knob("zero", "int", default=0, choices=(0,)),
        Knob("vllm", "bool", default=True, choices=(True,)),
        Knob("util", "float", default=0.3, choices=(0.02, 0.05, 0.3, 0.9)),
    )
    gpu = generic_gpu("8 GiB", 8 * GIB)
    result = plan_space(space, backend="trl", describe=_describe, model=model, gpu=gpu, n_gpus=4, fixed=JOB)
    misses = [c for c in result.candidates if not c.fits]
    causes = {
        (c.memory.vllm_startup_ok, c.memory.kv_ok, c.memory.peak_bytes <= gpu.memory_bytes) for c in misses
    }
    # KV too small with the peak inside (util 0.02, 0.05); the peak over only (util 0.3, batch 2);
    # start-up short and the peak over (util 0.9)
    assert causes == {(True, False, True), (True, True, False), (False, True, False)}
    # (the KV cache lacks as much at batch 1 as at 2: such ties go by the peak, the smaller first)
    worst = [(c.memory.overflow()[1], c.memory.peak_bytes) for c in misses]  # type: ignore[index]
    assert worst == sorted(worst) and len(set(worst)) == len(worst)
    assert len(misses) == 7 and len(result.candidates) == 8


def test_the_decoder_is_called_as_a_backend_describe_is() -> None:
    """Knobs, ``derived`` with the world size (at least 1), the fixed job facts, and the GPU count."""
    from autotune.estimate import GIB, generic_gpu, plan_space

    model = find_model("Qwen2.5-0.5B")
    assert model is not None
    for n_gpus, world in ((4, 4), (0, 1)):
        seen: list[tuple[Any, ...]] = []

        def describe(params: Any, derived: Any, fixed: Any, n: int, seen: list[Any] = seen) -> JobConfig:
            seen.append((dict(derived), dict(fixed), n))
            return _describe(params, derived, fixed, n)

        space = _space(
            Knob("pdbs", "int", default=1, choices=(1, 2)),
            Knob("zero", "int", default=0, choices=(0,)),
            Knob("vllm", "bool", default=False, choices=(False,)),
        )
        fixed = {**JOB, "beta": 0.0}
        plan_space(
            space,
            backend="trl",
            describe=describe,
            model=model,
            gpu=generic_gpu("g", 8 * GIB),
            n_gpus=n_gpus,
            fixed=fixed,
        )
        assert seen and all(s == ({"world_size": world}, fixed, n_gpus) for s in seen)
