"""Measured host peaks: the micro-benchmark, and the per-machine cache that survives damage."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path

import pytest

from autotune.estimate import (
    CPU_DEVICE,
    MeasuredPeaks,
    cached_peaks,
    machine_id,
    measure_host_peaks,
    store_peaks,
)
from autotune.estimate import peaks as peaks_module


@pytest.fixture
def one_core(monkeypatch: pytest.MonkeyPatch) -> None:
    """Measure on one core: libgomp (torch's OpenMP) hangs in a forked process (mutmut runs each mutant in
    a fork of the process that ran these tests) at the first multi-threaded matmul after one before the
    fork. That measuring uses every usable core is checked in ``test_peaks_exact.py``."""
    monkeypatch.setattr(peaks_module, "_usable_cores", lambda: 1)


def _peaks(**over: object) -> MeasuredPeaks:
    base = MeasuredPeaks(
        device=CPU_DEVICE,
        matmul_flops_per_s=5.0e10,
        memory_bytes_per_s=1.2e10,
        host_to_device_bytes_per_s=None,
        allreduce_bus_bytes_per_s=None,
        n_devices=1,
        machine_id=machine_id(),
        measured_at="2026-01-01T00:00:00+00:00",
    )
    return replace(base, **over)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["torch", "numpy"])
def test_measure_host_peaks_gives_positive_rates(
    backend: str, monkeypatch: pytest.MonkeyPatch, one_core: None
) -> None:
    if backend == "numpy":
        monkeypatch.setattr(peaks_module, "_torch_runs", lambda n, elems: None)
    else:
        pytest.importorskip("torch")
    peaks = measure_host_peaks(seconds=0.2)
    assert peaks.device == CPU_DEVICE
    # a CPU core does between 1 GFLOP/s and 100 TFLOP/s fp32, and copies between 0.1 and 10,000 GB/s
    assert 1e9 < peaks.matmul_flops_per_s < 1e14
    assert 1e8 < peaks.memory_bytes_per_s < 1e13
    assert peaks.host_to_device_bytes_per_s is None and peaks.allreduce_bus_bytes_per_s is None
    assert peaks.machine_id == machine_id()


def test_measuring_restores_torch_threads(one_core: None) -> None:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    torch.set_num_threads(3)  # measuring uses 1 (one_core), then puts 3 back
    try:
        measure_host_peaks(seconds=0.05)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


def test_store_then_read_back(tmp_path: Path) -> None:
    stored = _peaks()
    path = store_peaks(stored, tmp_path)
    assert path.parent == tmp_path / "peaks"
    assert cached_peaks(CPU_DEVICE, tmp_path) == stored
    assert cached_peaks(None, tmp_path) == stored
    assert cached_peaks("NVIDIA H100 80GB HBM3", tmp_path) is None


def test_cache_dir_from_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    path = store_peaks(_peaks())
    assert path.is_relative_to(tmp_path)
    assert cached_peaks(CPU_DEVICE) is not None


def test_a_new_measurement_replaces_the_old_and_none_picks_the_newest(tmp_path: Path) -> None:
    store_peaks(_peaks(matmul_flops_per_s=1e10), tmp_path)
    store_peaks(_peaks(matmul_flops_per_s=2e10, measured_at="2026-02-01T00:00:00+00:00"), tmp_path)
    gpu = _peaks(
        device="NVIDIA A10",
        machine_id=machine_id(("NVIDIA A10",)),
        host_to_device_bytes_per_s=2.4e10,
        measured_at="2026-03-01T00:00:00+00:00",
    )
    store_peaks(gpu, tmp_path)
    assert len(list((tmp_path / "peaks").glob("*.json"))) == 2
    cpu = cached_peaks(CPU_DEVICE, tmp_path)
    assert cpu is not None and cpu.matmul_flops_per_s == 2e10
    assert cached_peaks("NVIDIA A10", tmp_path) == gpu
    assert cached_peaks(None, tmp_path) == gpu


def test_peaks_of_another_machine_are_not_used(tmp_path: Path) -> None:
    path = store_peaks(_peaks(), tmp_path)
    data = json.loads(path.read_text())
    data["peaks"]["machine_id"] = "elsewhere | Some CPU x64"
    path.write_text(json.dumps(data))
    assert cached_peaks(CPU_DEVICE, tmp_path) is None


@pytest.mark.parametrize(
    "damage",
    [
        "{not json",
        "[]",
        json.dumps({"version": 99, "peaks": {}}),
        json.dumps({"version": 1, "peaks": {"device": "cpu"}}),
        "negative",
        b"\xff\xfe\x00",
    ],
)
def test_a_damaged_cache_file_is_ignored_with_a_note(
    damage: str | bytes, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = store_peaks(_peaks(), tmp_path)
    if damage == "negative":
        data = json.loads(path.read_text())
        data["peaks"]["matmul_flops_per_s"] = -1.0
        damage = json.dumps(data)
    if isinstance(damage, bytes):
        path.write_bytes(damage)
    else:
        path.write_text(damage)
    with caplog.at_level(logging.WARNING, logger="autotune.estimate.peaks"):
        assert cached_peaks(CPU_DEVICE, tmp_path) is None
        assert cached_peaks(None, tmp_path) is None
    assert "damaged peaks cache" in caplog.text and path.name in caplog.text
    # measuring again replaces the damaged file
    store_peaks(_peaks(), tmp_path)
    assert cached_peaks(CPU_DEVICE, tmp_path) == _peaks()


def test_no_cache_yet(tmp_path: Path) -> None:
    assert cached_peaks(CPU_DEVICE, tmp_path / "absent") is None
    assert cached_peaks(None, tmp_path / "absent") is None


def test_peaks_of_another_machine_are_refused_when_stored(tmp_path: Path) -> None:
    from autotune.errors import UsageError

    with pytest.raises(UsageError, match="not this machine's"):
        store_peaks(_peaks(machine_id="elsewhere | Some CPU x64"), tmp_path)
