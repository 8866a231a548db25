"""``autotune doctor --bench``: the host's peaks measured and cached on a machine without GPU (read back
by ``cached_peaks``), the GPUs' numbers (faked: there is no GPU here) stored under this machine and the
GPU's NVML name, where ``plan`` reads them as its ceilings' basis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune.doctor import GpuPeakNumbers, Status, run_bench
from autotune.estimate import CPU_DEVICE, cached_peaks
from tests.cli.conftest import run_cli
from tests.doctor.conftest import gpu_facts

H100 = "NVIDIA H100 80GB HBM3"


def test_cli_bench_on_the_cpu_caches_the_hosts_peaks(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    proc = run_cli(
        "doctor",
        "--quick",
        "--bench",
        "--seconds",
        "0.2",
        "--json",
        "--out",
        str(tmp_path),
        env={"AUTOTUNE_CACHE_DIR": str(cache)},
    )
    data = json.loads(proc.stdout)
    bench = [f for f in data["findings"] if f["check"] == "bench"]
    if any(f["check"] == "gpus" for f in data["findings"]):
        pytest.skip("this machine has GPUs: the CPU path is not the one taken")
    assert bench[0]["status"] == "ok", bench
    assert data["bench"]["peaks"]["device"] == CPU_DEVICE
    stored = cached_peaks(CPU_DEVICE, cache)
    assert stored is not None and Path(data["bench"]["cache_path"]).is_file()
    assert stored.matmul_flops_per_s == data["bench"]["peaks"]["matmul_flops_per_s"] > 0
    assert stored.memory_bytes_per_s > 0 and stored.n_devices == 1


def test_gpu_peaks_are_stored_for_this_machine_and_read_back_by_plan(tmp_path: Path) -> None:
    facts = gpu_facts(2)  # two H100s through the NVML fake
    numbers = GpuPeakNumbers(
        device=H100,
        n_devices=2,
        matmul_flops_per_s=700e12,
        memory_bytes_per_s=2.9e12,
        host_to_device_bytes_per_s=50e9,
        allreduce_bus_bytes_per_s=350e9,
    )
    asked: list[tuple[int, float]] = []

    def gpu(n: int, seconds: float) -> GpuPeakNumbers:
        asked.append((n, seconds))
        return numbers

    def host(seconds: float):  # noqa: ANN202
        raise AssertionError("the host is not measured on a GPU machine")

    outcome = run_bench(facts, seconds=0.5, cache_dir=tmp_path, host=host, gpu=gpu)
    assert asked == [(2, 0.5)]
    assert outcome.findings[0].status is Status.OK and "700.0 TFLOP/s" in outcome.findings[0].detail
    stored = cached_peaks(H100, tmp_path)
    assert stored is not None and stored == outcome.peaks
    assert (stored.allreduce_bus_bytes_per_s, stored.n_devices) == (350e9, 2)

    proc = run_cli(
        "plan",
        "--model",
        "Qwen2-7B",
        "--gpus",
        "2",
        "--gpu-type",
        "H100",
        "--json",
        env={"AUTOTUNE_CACHE_DIR": str(tmp_path)},
    )
    assert proc.returncode == 0, proc.stderr
    basis = json.loads(proc.stdout)["ceiling_basis"]
    assert basis["source"] == "measured" and basis["flops_per_s"] == 700e12


def test_a_benchmark_that_breaks_is_a_fail_line_and_the_cache_is_untouched(tmp_path: Path) -> None:
    def gpu(n: int, seconds: float) -> GpuPeakNumbers:
        raise RuntimeError("CUDA error: no kernel image is available")

    outcome = run_bench(gpu_facts(1), seconds=0.1, cache_dir=tmp_path, gpu=gpu)
    (finding,) = outcome.findings
    assert finding.status is Status.FAIL and "no kernel image" in finding.detail
    assert "catalog's peaks" in finding.fix
    assert outcome.peaks is None and cached_peaks(None, tmp_path) is None


def test_peaks_measured_but_not_cacheable_blame_the_cache_not_the_machine(tmp_path: Path) -> None:
    """Issue 41, defect 9: a cache that cannot be written was "the host benchmark failed … Fix: Run
    `autotune doctor` without --bench"; the measurement worked, the folder is what to fix."""
    (tmp_path / "file").write_text("not a folder")
    numbers = GpuPeakNumbers(
        device=H100,
        n_devices=1,
        matmul_flops_per_s=700e12,
        memory_bytes_per_s=2.9e12,
        host_to_device_bytes_per_s=50e9,
        allreduce_bus_bytes_per_s=None,
    )
    outcome = run_bench(gpu_facts(1), seconds=0.1, cache_dir=tmp_path / "file", gpu=lambda n, s: numbers)
    (finding,) = outcome.findings
    assert finding.status is Status.FAIL
    assert finding.detail.startswith(
        f"measured, but the peaks cannot be cached: cannot write {tmp_path / 'file'}"
    )
    assert "benchmark failed" not in finding.detail
    assert finding.fix.startswith("Set AUTOTUNE_CACHE_DIR to a folder this user can write")
    assert outcome.cache_path is None
