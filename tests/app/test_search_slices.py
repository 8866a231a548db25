from __future__ import annotations

import pytest

from autotune.app.search import gpu_slices
from autotune.errors import UsageError


def test_gpus_split_into_consecutive_disjoint_sets() -> None:
    gpus = tuple(range(8))
    assert gpu_slices(gpus, 4) == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert gpu_slices(gpus, 3) == [(0, 1, 2), (3, 4, 5)]  # GPUs 6 and 7 are left idle
    assert gpu_slices(gpus, None) == [gpus]
    assert gpu_slices(gpus, 8) == [gpus]


def test_more_gpus_per_trial_than_the_host_has_or_none_at_all_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="more than the 2 GPU"):
        gpu_slices((0, 1), 4)
    with pytest.raises(UsageError, match="needs GPUs"):
        gpu_slices((), 1)
