from __future__ import annotations

import random

import pytest

from autotune.space import canonical_key
from autotune.strategy._candidates import count_configs, neighbours, random_config, sample_configs


@pytest.mark.parametrize("seed", range(25))
def test_count_matches_the_enumerated_grid(seed: int, random_space) -> None:
    s = random_space(seed)
    assert count_configs(s) == len(list(s.grid())) == s.size()


@pytest.mark.parametrize("seed", range(10))
def test_random_configs_are_configurations_of_the_space(seed: int, random_space) -> None:
    s = random_space(seed)
    grid = {canonical_key(p) for p in s.grid()}
    rng = random.Random(seed)
    for _ in range(50):
        params = random_config(s, rng)
        assert canonical_key(params) in grid
    sample = sample_configs(s, rng, 30)
    keys = [canonical_key(p) for p in sample]
    assert len(keys) == len(set(keys)) <= 30  # distinct; a small space may not be covered in full
    assert set(keys) <= grid
    assert len(keys) >= min(30, len(grid)) // 2


@pytest.mark.parametrize("seed", range(10))
def test_neighbours_change_exactly_one_knob(seed: int, random_space) -> None:
    s = random_space(seed)
    grid = {canonical_key(p) for p in s.grid()}
    params = random_config(s, random.Random(seed))
    found = list(neighbours(s, params))
    assert found
    for nb in found:
        assert canonical_key(nb) in grid and canonical_key(nb) != canonical_key(params)
        shared = set(nb) & set(params)
        changed = [k for k in shared if canonical_key({"v": nb[k]}) != canonical_key({"v": params[k]})]
        assert len(changed) == 1  # children that appear or vanish follow that one change
    # every value of every active knob is reachable in one step
    for name in params:
        reached = {canonical_key({"v": nb[name]}) for nb in found if name in nb} | {
            canonical_key({"v": params[name]})
        }
        assert reached >= {canonical_key({"v": v}) for v in s[name].values()}
