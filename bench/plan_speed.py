"""``autotune plan``'s speed: the column path against the per-candidate path, side by side in one run.

    OMP_NUM_THREADS=1 python bench/plan_speed.py [--model Qwen2-7B] [--gpus 4] [--gpu-type A100-80G]
                                                 [--sample 2000] [--rounds 3]

For the default ms-swift and TRL spaces (every configuration a plan judges, the invalid ones
included), printed per backend:

- after: ``run_plan`` end to end as the CLI calls it (space loading, decoding, the estimates, the
  sort), the median of ``--rounds`` runs; configurations per second and wall seconds;
- before: the per-candidate path ``plan`` took until now — the backend's decoder, the start-up rules,
  ``JobShape``, ``estimate_memory`` and ``estimate_step_time`` for one configuration at a time — timed
  on ``--sample`` configurations drawn from the same space, as configurations per second, and the
  whole space's seconds at that rate;
- the ratio, and how many of the sampled candidates' estimates differ between the two paths (0: the
  plan reports what the per-candidate path does).

Numbers are measured and printed, never asserted; on a machine shared with other work they vary.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from autotune.app.plan import run_plan
from autotune.backends import backend_class
from autotune.estimate import JobShape, candidate_rules, estimate_memory, estimate_step_time
from autotune.estimate.plan import _table

JOB = {"global_batch": 64, "num_generations": 8, "max_prompt_length": 512, "max_completion_length": 1024}


def _plan(backend: str, args: argparse.Namespace) -> Any:
    result, _ = run_plan(
        model=args.model,
        model_config=None,
        gpus=args.gpus,
        gpu_type=args.gpu_type,
        gpu_memory_gib=None,
        backend=backend,
        space_path=None,
        global_batch=64,
        num_generations=8,
        max_completion_length=1024,
        max_prompt_length=512,
        beta=None,
        lora_rank=0,
        vllm_max_model_len=None,
        knobs=[],
        margin=0.15,
    )
    return result


def _space(backend: str) -> Any:
    from autotune.app.plan import _load_space
    from autotune.space import Platform

    facts = backend_class(backend)
    space = (
        _load_space(backend, None).restrict(Platform.machine(gpu_present=True)).with_roles(facts.knob_roles())
    )
    # as run_plan does: the knobs the estimates do not read stay at their default
    name = space.knob_for("dataloader_num_workers")
    return space.narrow({name: [space[name].default]}) if name else space


def _bench(backend: str, args: argparse.Namespace) -> None:
    walls = []
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        result = _plan(backend, args)
        walls.append(time.perf_counter() - t0)
    wall = statistics.median(walls)
    configurations = len(result.candidates) + sum(result.invalid.values())

    # before: one configuration at a time, on a sample of the same space
    describe, n = backend_class(backend).describe, result.n_gpus
    fixed = result.fixed
    table = _table(_space(backend), lambda p: describe(p, {"world_size": n}, fixed, n))
    rng = random.Random(0)
    rows = rng.sample(range(len(table.index)), min(args.sample, len(table.index)))
    sampled = [table.params(r) for r in rows]
    t0 = time.perf_counter()
    estimates: dict[str, Any] = {}
    for params in sampled:
        config = describe(params, {"world_size": n}, fixed, n)
        if candidate_rules(config, result.model, n) is not None:
            continue
        shape = JobShape(config, result.model, n)
        mem = estimate_memory(shape, result.gpu)
        estimates[repr(params)] = (mem, estimate_step_time(shape, result.gpu, mem))
    before_s = time.perf_counter() - t0
    before_rate = len(sampled) / before_s

    # the same candidates as the plan reports them
    position = {repr(result.candidates.params(i)): i for i in range(len(result.candidates))}
    differ = sum(
        1
        for key, (mem, t) in estimates.items()
        if (result.candidates[position[key]].memory, result.candidates[position[key]].time) != (mem, t)
    )
    after_rate = configurations / wall
    print(
        f"{backend:6} {configurations:>8,} configurations ({len(result.candidates):,} valid)  "
        f"before {before_rate:>9,.0f}/s ({configurations / before_rate:7.1f} s)  "
        f"after {after_rate:>9,.0f}/s ({wall:5.2f} s, rounds {', '.join(f'{w:.2f}' for w in walls)})  "
        f"ratio {after_rate / before_rate:6.0f}x  differing estimates {differ}/{len(estimates)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="Qwen2-7B")
    parser.add_argument("--gpus", type=int, default=4)
    parser.add_argument("--gpu-type", default="A100-80G")
    parser.add_argument("--sample", type=int, default=2000, help="configurations timed one at a time")
    parser.add_argument("--rounds", type=int, default=3, help="plan runs; the median is printed")
    args = parser.parse_args()
    print(
        f"autotune plan --model {args.model} --gpus {args.gpus} --gpu-type {args.gpu_type} (default spaces)"
    )
    for backend in ("swift", "trl"):
        _bench(backend, args)


if __name__ == "__main__":
    main()
