"""The step records carry the trial process's torch CUDA peaks, so the study can tell the caching
allocator's free cache from the memory a job needs (the first H200 run: NVML at capacity, need far less)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from autotune.probes.callback import MetricsWriter, torch_peak_memory_gib

GIB = 2**30


def test_step_records_carry_the_memory_reader_values(tmp_path: Path) -> None:
    w = MetricsWriter(
        tmp_path / "m.jsonl", 8, memory=lambda: {"memory_gib": 130.0, "memory_allocated_gib": 60.5}
    )
    w.train_begin()
    w.step_end(1)
    w.log(1, {"loss": 0.1})
    w.step_end(2)
    w.log(2, {"loss": 0.1, "memory_gib": 7.0})  # a trainer that logs its own reserve is believed
    w.close()
    lines = [json.loads(x)["values"] for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert lines[0] == {"loss": 0.1, "memory_gib": 130.0, "memory_allocated_gib": 60.5}
    assert lines[1] == {"loss": 0.1, "memory_gib": 7.0, "memory_allocated_gib": 60.5}


def test_torch_peaks_read_from_torch_cuda_only_once_cuda_started(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert torch_peak_memory_gib() == {}  # a CPU run (or CUDA never touched): nothing is claimed
    calls: list[tuple[str, int]] = []

    def peak(kind: str, value: int):  # noqa: ANN202 - a stand-in with torch's signature
        def read(device: int | None = None) -> int:
            calls.append((kind, device))
            return value

        return read

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", peak("reserved", 130 * GIB))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", peak("allocated", 60 * GIB))
    assert torch_peak_memory_gib() == {"memory_gib": 130.0, "memory_allocated_gib": 60.0}
    assert sorted(calls) == [("allocated", 3), ("reserved", 3)]  # the process's own device


def test_no_torch_no_claim(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)
    assert torch_peak_memory_gib() == {}
