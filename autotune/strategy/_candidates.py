"""Configurations a strategy can choose from: counting, sampling and neighbours in a conditional space.

A space with conditional knobs is a tree, so its size is a sum over the values of the knobs that
conditions name, not a product; counting it that way costs nothing, where enumerating ms-swift's
space (≈ 500k configurations on GPUs) takes seconds. Large spaces are therefore explored from a random
sample plus the neighbours of promising configurations (one knob changed at a time).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Mapping
from typing import Any

from autotune.space import SearchSpace, canonical_key

__all__ = ["count_configs", "random_config", "neighbours", "sample_configs"]


def _context(space: SearchSpace, params: Mapping[str, object]) -> dict[str, Any]:
    ctx = dict(space.dropped_defaults)
    ctx.update(params)
    return ctx


def count_configs(space: SearchSpace) -> int:
    """Distinct configurations of ``space`` (what ``len(list(space.grid()))`` gives), without enumerating."""
    referenced = {name for knob in space.knobs for name in knob.when}
    knobs = space.knobs

    def rec(i: int, acc: dict[str, Any]) -> int:
        if i == len(knobs):
            return 1
        knob = knobs[i]
        if not knob.active(_context(space, acc)):
            return rec(i + 1, acc)
        values = knob.values()
        if knob.name not in referenced:
            return len(values) * rec(i + 1, acc)
        total = 0
        for value in values:
            acc[knob.name] = value
            total += rec(i + 1, acc)
        del acc[knob.name]
        return total

    return rec(0, {})


def random_config(space: SearchSpace, rng: random.Random) -> dict[str, Any]:
    """One configuration: every active knob, in order, takes one of its values uniformly."""
    out: dict[str, Any] = {}
    for knob in space.knobs:
        if knob.active(_context(space, out)):
            out[knob.name] = rng.choice(knob.values())
    return out


def sample_configs(
    space: SearchSpace, rng: random.Random, n: int, *, max_tries_factor: int = 4
) -> list[dict[str, Any]]:
    """Up to ``n`` distinct random configurations (fewer when the space is small)."""
    seen: set[str] = set()
    out: list[dict[str, Any]] = []
    for _ in range(n * max_tries_factor):
        params = random_config(space, rng)
        key = canonical_key(params)
        if key in seen:
            continue
        seen.add(key)
        out.append(params)
        if len(out) >= n:
            break
    return out


def neighbours(space: SearchSpace, params: Mapping[str, object]) -> Iterator[dict[str, Any]]:
    """Every configuration that differs from ``params`` in the value of exactly one active knob.

    Changing a knob that a condition names re-activates or drops the knobs that depend on it; newly
    active knobs take their defaults.
    """
    for knob in space.knobs:
        if knob.name not in params:
            continue
        current = canonical_key({"v": params[knob.name]})
        for value in knob.values():
            if canonical_key({"v": value}) == current:
                continue
            yield space.active({**params, knob.name: value})
