"""Shared helpers for the search tests: random conditional spaces, and a study with fakes."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from autotune.space import SearchSpace, load_space


def make_random_space(rng: random.Random, tmp_path: Path, name: str = "space") -> SearchSpace:
    """A random space: 3–6 knobs of every type, some with memory orders, some conditional."""
    knobs: dict[str, dict[str, Any]] = {}
    for i in range(rng.randint(3, 6)):
        kind = rng.choice(["int", "bool", "str", "float"])
        spec: dict[str, Any] = {}
        if kind == "int":
            choices = sorted(rng.sample([1, 2, 4, 8, 16, 32], rng.randint(2, 4)))
            spec = {"type": "int", "choices": choices, "default": choices[0]}
        elif kind == "bool":
            spec = {"type": "bool", "default": rng.random() < 0.5}
        elif kind == "str":
            choices = rng.sample(["a", "b", "c", "d"], rng.randint(2, 3))
            spec = {"type": "str", "choices": choices, "default": choices[0]}
        else:
            spec = {
                "type": "float",
                "low": 0.3,
                "high": 0.9,
                "step": rng.choice([0.1, 0.2, 0.3]),
                "default": 0.3,
            }
        if kind in ("int", "bool", "float") and rng.random() < 0.7:
            spec["memory"] = rng.choice(["increasing", "decreasing"])
        earlier = list(knobs)
        if earlier and rng.random() < 0.35:
            parent = rng.choice(earlier)
            pspec = knobs[parent]
            if pspec["type"] == "bool":
                spec["when"] = {parent: [True]}
            elif "choices" in pspec:
                spec["when"] = {parent: pspec["choices"][: max(1, len(pspec["choices"]) - 1)]}
        knobs[f"k{i}_{kind}"] = spec
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"knobs": knobs}, sort_keys=False))
    return load_space(path)


@pytest.fixture
def random_space(tmp_path: Path) -> Callable[[int], SearchSpace]:
    """``random_space(seed)`` builds a random conditional space."""

    def build(seed: int) -> SearchSpace:
        return make_random_space(random.Random(seed), tmp_path, f"space{seed}")

    return build
