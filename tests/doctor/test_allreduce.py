"""The all-reduce benchmark's processes: real ranks over gloo on the CPU (NCCL takes the same path on
GPUs), rank 0's number read back; a rank that fails is one error naming it."""

from __future__ import annotations

import importlib.util

import pytest

from autotune.doctor._allreduce import bus_bandwidth, measure_allreduce

pytestmark = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")


def test_bus_bandwidth_follows_nccl_tests() -> None:
    assert bus_bandwidth(8_000, 1.0, 8) == pytest.approx(8_000 * 2 * 7 / 8)
    assert bus_bandwidth(1_000, 1.0, 2) == pytest.approx(1_000)
    assert bus_bandwidth(1_000, 0.0, 2) == 0.0 and bus_bandwidth(1_000, 1.0, 1) == 0.0


def test_two_gloo_ranks_measure_a_bus_bandwidth() -> None:
    rate = measure_allreduce(2, backend="gloo", nbytes=1 << 20, seconds=0.2, timeout_s=120)
    assert rate > 1e6  # a megabyte between two local processes takes well under a second


def test_a_failing_rank_is_one_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from autotune.doctor import _allreduce

    monkeypatch.setattr(_allreduce.sys, "executable", "/bin/false")  # every rank exits 1 at once
    with pytest.raises(RuntimeError, match="an all-reduce rank exited with 1"):
        measure_allreduce(2, backend="gloo", nbytes=1024, seconds=0.1, timeout_s=60)
