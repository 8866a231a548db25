"""The job's training semantics — global batch, completions per prompt, completion length — and where
each value came from.

GRPO's step time is dominated by rollout, which scales with the completion length and the completions
per prompt: a configuration tuned on another job's values says little about the user's. So ``search``
and ``plan`` resolve these three settings by one rule, the same for every backend:

1. A value given in one place — an autotune option (``--global-batch``, ``--num-generations``,
   ``--max-completion-length``), the ``--fixed`` file, or the job's own arguments after ``--`` (each in
   the framework's own names, read by its backend: :meth:`Backend.job_semantics`) — is the study's value.
2. The same setting given in two places with different values is an error naming both places
   (:class:`~autotune.errors.UsageError`, exit 2): never a silent choice.
3. A setting given nowhere takes the framework's default for the job
   (:class:`FrameworkJobDefaults`, a backend's class fact, written from the framework's source): the
   global batch is the framework's default batch on the study's GPUs (per-device batch × GPUs ×
   gradient accumulation, or verl's prompts per step × completions), raised to the smallest multiple
   of the completions per prompt when the framework would refuse it.
4. The built-in tiny models (``tiny-qwen2``, ``small-qwen2``) keep small demo values: they exist to run
   a real study on a CPU in minutes.

A value resolved here stays fixed in every trial; ``study.json`` (``semantics``), the summary and the
report say where each came from.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from autotune.errors import UsageError
from autotune.jsontypes import JsonObject

__all__ = [
    "DEMO_SEMANTICS",
    "FIELDS",
    "FrameworkJobDefaults",
    "JobSemantics",
    "Place",
    "SemanticValue",
    "Source",
    "resolve_semantics",
]

#: the three settings, with the autotune option that sets each.
FIELDS: dict[str, str] = {
    "global_batch": "--global-batch",
    "num_generations": "--num-generations",
    "max_completion_length": "--max-completion-length",
}

#: the built-in tiny models' demo values (a real study on a CPU in minutes).
DEMO_SEMANTICS: dict[str, int] = {"global_batch": 16, "num_generations": 4, "max_completion_length": 16}


class Source(str, Enum):
    """Where a training-semantics value came from, strongest first."""

    OPTION = "option"
    FIXED = "fixed"
    JOB = "job"
    FRAMEWORK = "framework"
    DEMO = "demo"


@dataclass(frozen=True)
class SemanticValue:
    """One resolved setting: its value, its source, and the place in words (``--fixed job.yaml
    (max_completion_length)``, ``TRL's GRPOConfig default``)."""

    value: int
    source: Source
    where: str

    def to_json(self) -> JsonObject:
        return {"value": self.value, "source": self.source.value, "where": self.where}


@dataclass(frozen=True)
class Place:
    """A place the user may set the job's semantics in, with what it set (field → (value, the
    argument's name there)). ``label`` names the place in messages: ``--fixed job.yaml``, ``your
    arguments after --``, ``autotune's options``."""

    source: Source
    label: str
    values: Mapping[str, tuple[int, str]]


@dataclass(frozen=True)
class FrameworkJobDefaults:
    """A framework's own defaults for the job's semantics (a backend's class fact).

    Attributes:
        framework: how the source is named in words (``TRL's GRPOConfig``).
        num_generations: completions per prompt when the job sets none.
        max_completion_length: completion tokens when the job sets none.
        per_device_batch: completions per device per micro-step by default (ms-swift 1, TRL 8).
        gradient_accumulation: micro-steps per optimizer step by default.
        prompts_per_step: prompts per optimizer step by default, for a framework that counts its batch
            in prompts on the whole job (verl's ``data.train_batch_size``); None for per-device batches.
        note: what the numbers are where the framework has no GRPO default of its own, or None.
    """

    framework: str
    num_generations: int
    max_completion_length: int
    per_device_batch: int = 1
    gradient_accumulation: int = 1
    prompts_per_step: int | None = None
    note: str | None = None

    def global_batch(self, n_gpus: int, num_generations: int) -> tuple[int, str]:
        """The framework's default completions per optimizer step on ``n_gpus`` GPUs (0: the CPU), in
        words too; raised to a multiple of ``num_generations`` when the framework would refuse it."""
        if self.prompts_per_step is not None:
            return self.prompts_per_step * num_generations, (
                f"{self.framework} default: {self.prompts_per_step} prompts × {num_generations} completions"
            )
        world = max(1, n_gpus)
        batch = self.per_device_batch * world * self.gradient_accumulation
        where = f"{self.framework} default: {self.per_device_batch} per device × {world} device(s)"
        if self.gradient_accumulation != 1:
            where += f" × {self.gradient_accumulation} accumulation steps"
        return _multiple_of(batch, num_generations, where)


@dataclass(frozen=True)
class JobSemantics:
    """The study's resolved training semantics (see the module docstring for the rule)."""

    global_batch: SemanticValue
    num_generations: SemanticValue
    max_completion_length: SemanticValue

    def values(self) -> dict[str, int]:
        return {name: getattr(self, name).value for name in FIELDS}

    def provenance(self) -> dict[str, dict[str, Any]]:
        """Name → value, source and place, for ``study.json``'s ``semantics``."""
        return {name: getattr(self, name).to_json() for name in FIELDS}

    def line(self) -> str:
        """One line for the console: each value with where it came from."""
        parts = [f"{name} {getattr(self, name).value} ({getattr(self, name).where})" for name in FIELDS]
        return "job: " + "; ".join(parts)


def resolve_semantics(
    places: list[Place], defaults: FrameworkJobDefaults | None, n_gpus: int, *, demo: bool
) -> JobSemantics:
    """Resolve the three settings from the places the user set them in, by the module's rule.

    Args:
        places: the user's places (options, the ``--fixed`` file, the job's arguments), any order.
        defaults: the framework's defaults, or None for a backend without a framework (the user's own
            command: the demo values are then passed to it, as before).
        n_gpus: the GPUs of one trial (0 on the CPU).
        demo: a built-in tiny model: unset values take the demo values.

    Raises:
        UsageError: one setting given two different values in two places, or a value below its minimum.
    """
    given: dict[str, SemanticValue] = {}
    for place in places:
        for name, (value, arg) in place.values.items():
            where = place.label if place.source is Source.OPTION else f"{place.label} ({arg})"
            mine = SemanticValue(int(value), place.source, where)
            other = given.get(name)
            if other is not None and other.value != mine.value:
                raise UsageError(
                    f"{name} is {other.value} in {other.where} but {mine.value} in {mine.where}",
                    hint="Give each training setting in one place (or the same value in both)",
                )
            given.setdefault(name, mine)
    resolved: dict[str, SemanticValue] = dict(given)
    for name in ("num_generations", "max_completion_length"):
        if name not in resolved:
            resolved[name] = _default(name, defaults, demo)
    if "global_batch" not in resolved:
        g = resolved["num_generations"].value
        if demo or defaults is None:
            fallback = _default("global_batch", defaults, demo)
            value, where = _multiple_of(fallback.value, g, fallback.where)
            resolved["global_batch"] = SemanticValue(value, fallback.source, where)
        else:
            value, where = defaults.global_batch(n_gpus, g)
            resolved["global_batch"] = SemanticValue(value, Source.FRAMEWORK, where)
    out = JobSemantics(**resolved)
    _check(out)
    return out


def _multiple_of(batch: int, num_generations: int, where: str) -> tuple[int, str]:
    """``batch`` raised to the smallest multiple of ``num_generations`` (every prompt needs all its
    completions in one batch), with ``where`` saying so when it was raised."""
    if batch % num_generations == 0:
        return batch, where
    raised = math.ceil(batch / num_generations) * num_generations
    return (
        raised,
        f"{where} = {batch}, raised to {raised}, the smallest multiple of {num_generations}",
    )


def _default(name: str, defaults: FrameworkJobDefaults | None, demo: bool) -> SemanticValue:
    if demo:
        return SemanticValue(DEMO_SEMANTICS[name], Source.DEMO, "the built-in tiny model's demo value")
    if defaults is None:
        return SemanticValue(DEMO_SEMANTICS[name], Source.DEMO, "autotune's value for your own command")
    where = f"{defaults.framework} default" + (f" ({defaults.note})" if defaults.note else "")
    return SemanticValue(int(getattr(defaults, name)), Source.FRAMEWORK, where)


def _check(sem: JobSemantics) -> None:
    for name, flag in FIELDS.items():
        v = getattr(sem, name)
        if v.value < 1:
            raise UsageError(
                f"{name} must be positive, got {v.value} from {v.where}", hint=f"For example {flag} 8"
            )
    g = sem.num_generations
    if g.value < 2:
        raise UsageError(
            f"num_generations must be at least 2 for GRPO, got {g.value} from {g.where}",
            hint="GRPO compares completions of one prompt: use 4 or 8",
        )
    b = sem.global_batch
    if b.value % g.value:
        raise UsageError(
            f"the global batch {b.value} ({b.where}) is not a multiple of num_generations {g.value} ({g.where})",
            hint="Every prompt needs all its completions in one batch: pick a multiple",
        )
