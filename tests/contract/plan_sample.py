"""A seeded sample of a backend's plan, for the contract tests.

The candidates come from the backend's own search space and autotune's own enumeration
(:meth:`SearchSpace.grid`, the order every strategy and ``autotune plan`` walk), GPU knobs included. The
sample is shuffled with a fixed seed, so it covers the whole space rather than its first corner, and is
the same on every run. A candidate that breaks the backend's rules (:meth:`Backend.check_rules`) is
refused before launch by the study and is left out: what a contract test checks is every candidate that
*would* be launched.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.backends._base import Backend, ModelRef, TrialContext
from autotune.records import GpuInfo, TrialSpec
from autotune.space import Platform, SearchSpace, load_space

__all__ = ["SAMPLE", "Rendered", "gpu_context", "plan_sample", "plan_space"]

#: candidates per backend (all of them when the space has fewer)
SAMPLE = 200
GIB = 1 << 30


@dataclass(frozen=True)
class Rendered:
    """One sampled candidate: its knobs, the trial's spec and context."""

    params: dict[str, Any]
    spec: TrialSpec
    ctx: TrialContext


def plan_space(backend: Backend) -> SearchSpace:
    """The backend's shipped space, as a study on a GPU host loads it."""
    space = load_space(backend.default_space(), backend=backend.name, known_knobs=backend.knob_names)
    return space.with_roles(backend.knob_roles()).restrict(Platform.machine(gpu_present=True))


def gpu_context(root: Path, n: int, *, n_gpus: int = 4, fixed: dict[str, Any] | None = None) -> TrialContext:
    """A trial's context on ``n_gpus`` declared 80 GiB GPUs, in its own directory under ``root``."""
    trial_dir = root / "study" / "trials" / str(n)
    trial_dir.mkdir(parents=True, exist_ok=True)
    return TrialContext(
        study_dir=root / "study",
        trial_dir=trial_dir,
        model=ModelRef("tiny-qwen2", str(root / "model"), local=True),
        gpus=tuple(GpuInfo(index=i, name="NVIDIA H100", memory_total_bytes=80 * GIB) for i in range(n_gpus)),
        global_batch=64,
        num_generations=8,
        max_steps=5,
        max_completion_length=32,
        fixed=dict(fixed or {}),
        master_port=29555,
    )


def plan_sample(
    backend: Backend, root: Path, *, seed: int, fixed_of: Any = lambda i: {}, n_gpus: int = 4
) -> list[Rendered]:
    """Up to :data:`SAMPLE` launchable candidates of ``backend``'s plan, drawn with ``seed``.

    Args:
        backend: the backend whose plan is sampled.
        root: where each candidate's trial directory is made.
        seed: the sample's seed.
        fixed_of: the study's fixed arguments for the i-th candidate (to vary the user's job too).
        n_gpus: GPUs of each trial.
    """
    grid = list(plan_space(backend).grid())
    out: list[Rendered] = []
    for index in random.Random(seed).sample(range(len(grid)), len(grid)):
        params = grid[index]
        ctx = gpu_context(root, len(out), n_gpus=n_gpus, fixed=fixed_of(len(out)))
        derived = backend.derive(dict(params), ctx)
        if backend.check_rules(dict(params), derived, ctx):
            continue
        out.append(Rendered(params, TrialSpec(number=len(out), params=params, derived=derived), ctx))
        if len(out) == SAMPLE:
            break
    return out
