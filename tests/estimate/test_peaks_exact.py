"""Exact behaviour of the measured-peaks module, with the machine, the clock and the kernels faked.

``test_peaks.py`` measures for real and checks ranges; these pin each step to a value worked out by hand:
the machine's identity and cache file name (the SHA-256 keys come from ``sha256sum``, not from Python),
the best-of-repeats rate on a scripted clock, the work each micro-benchmark counts, what a damaged or
foreign file reads as, and every error message. None of them needs a GPU or measures anything.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import platform
import re
import socket
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from autotune.errors import UsageError
from autotune.estimate import (
    CPU_DEVICE,
    MeasuredPeaks,
    cached_peaks,
    machine_id,
    peaks_cache_dir,
    store_peaks,
)
from autotune.estimate import peaks as peaks_module

HOST_ID = "box | Fake CPU x4"
# printf 'box | Fake CPU x4\0cpu' | sha256sum          -> 5ab40b1c2fe5092a3b9b5d3c...
CPU_FILE = "box-5ab40b1c2fe5092a.json"
# printf 'box | Fake CPU x4\0NVIDIA A10' | sha256sum   -> b8e89d47073fe7ac7e039773...
A10_FILE = "box-b8e89d47073fe7ac.json"


@pytest.fixture
def box(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine is host "box" with 4 cores of a "Fake CPU"."""
    monkeypatch.setattr(socket, "gethostname", lambda: "box")
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    monkeypatch.setattr(peaks_module, "_cpu_model", lambda: "Fake CPU")


def _dict(**over: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "device": CPU_DEVICE,
        "matmul_flops_per_s": 5.0e10,
        "memory_bytes_per_s": 1.2e10,
        "host_to_device_bytes_per_s": None,
        "allreduce_bus_bytes_per_s": None,
        "n_devices": 1,
        "machine_id": HOST_ID,
        "measured_at": "2026-01-01T00:00:00+00:00",
    }
    return data | over


# ------------------------------------------------------------------------------------------ from_dict


def test_from_dict_reads_ints_as_floats_and_keeps_optional_rates() -> None:
    peaks = MeasuredPeaks.from_dict(
        _dict(matmul_flops_per_s=3, memory_bytes_per_s=0.5, host_to_device_bytes_per_s=7, n_devices=2)
    )
    assert peaks == MeasuredPeaks(
        device=CPU_DEVICE,
        matmul_flops_per_s=3.0,
        memory_bytes_per_s=0.5,  # any number above 0 is a rate, even under 1 B/s
        host_to_device_bytes_per_s=7.0,
        allreduce_bus_bytes_per_s=None,
        n_devices=2,
        machine_id=HOST_ID,
        measured_at="2026-01-01T00:00:00+00:00",
    )
    assert type(peaks.matmul_flops_per_s) is float and type(peaks.host_to_device_bytes_per_s) is float
    assert MeasuredPeaks.from_dict(peaks.to_dict()) == peaks
    both = MeasuredPeaks.from_dict(_dict(allreduce_bus_bytes_per_s=4, host_to_device_bytes_per_s=None))
    assert both.allreduce_bus_bytes_per_s == 4.0 and type(both.allreduce_bus_bytes_per_s) is float
    assert both.host_to_device_bytes_per_s is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "not a JSON object"),
        (None, "not a JSON object"),
        # the missing fields in the dataclass's order, comma-separated
        ({k: v for k, v in _dict().items() if k not in ("n_devices", "device")}, "missing device, n_devices"),
        (_dict(device=""), "device is not a non-empty string"),
        (_dict(machine_id=3), "machine_id is not a non-empty string"),
        (_dict(measured_at=None), "measured_at is not a non-empty string"),
        (_dict(n_devices=0), "n_devices is not a positive integer"),
        (_dict(n_devices=True), "n_devices is not a positive integer"),
        (_dict(n_devices=2.0), "n_devices is not a positive integer"),
    ],
)
def test_from_dict_refuses_with_the_field_named(data: Any, message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        MeasuredPeaks.from_dict(data)


@pytest.mark.parametrize(
    "name",
    ["matmul_flops_per_s", "memory_bytes_per_s", "host_to_device_bytes_per_s", "allreduce_bus_bytes_per_s"],
)
@pytest.mark.parametrize("bad", [0, 0.0, -1.0, math.inf, -math.inf, math.nan, True, "5", [1.0]])
def test_a_rate_must_be_a_finite_number_above_zero(name: str, bad: Any) -> None:
    with pytest.raises(ValueError, match=f"^{name} is not a positive number$"):
        MeasuredPeaks.from_dict(_dict(**{name: bad}))


@pytest.mark.parametrize("name", ["matmul_flops_per_s", "memory_bytes_per_s"])
def test_the_two_measured_rates_are_never_optional(name: str) -> None:
    with pytest.raises(ValueError, match=f"^{name} is not a positive number$"):
        MeasuredPeaks.from_dict(_dict(**{name: None}))


# ------------------------------------------------------------------------------------------ identity


@pytest.fixture
def platform_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(platform, "processor", lambda: "fakeproc")
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")


XEON = (
    "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz  \n\n"
    "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\n"
)


@pytest.mark.parametrize(
    ("cpuinfo", "expected"),
    [
        (XEON.encode(), "Intel(R) Xeon(R) CPU @ 2.20GHz"),  # the first "model name", trailing blanks dropped
        (b"processor\t: 0\nBogoMIPS\t: 50.00\n", "fakeproc"),  # no model name (ARM): the platform's
        (None, "fakeproc"),  # no /proc/cpuinfo at all
        (b"model name\t: Caf\xe9 CPU\n", "Caf\ufffd CPU"),  # bytes that are not UTF-8 are replaced
        (b"model name\t: \n", "aarch64"),  # an empty model name: the machine type, not the processor
    ],
)
def test_cpu_model(cpuinfo: bytes | None, expected: str, tmp_path: Path, platform_names: None) -> None:
    path = tmp_path / "cpuinfo"
    if cpuinfo is not None:
        path.write_bytes(cpuinfo)
    assert peaks_module._cpu_model(path) == expected


@pytest.mark.parametrize(("processor", "machine", "expected"), [("", "aarch64", "aarch64"), ("", "", "cpu")])
def test_cpu_model_falls_back_to_the_machine_type_then_cpu(
    processor: str, machine: str, expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(platform, "processor", lambda: processor)
    monkeypatch.setattr(platform, "machine", lambda: machine)
    assert peaks_module._cpu_model(tmp_path / "absent") == expected


@pytest.fixture
def latin1_locale(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files opened without an encoding are read as Latin-1, as under a Latin-1 locale (``open`` asks
    ``io.text_encoding`` for the default)."""
    real = io.text_encoding
    monkeypatch.setattr(
        io, "text_encoding", lambda encoding, *a: "latin-1" if encoding is None else real(encoding)
    )


def test_cpuinfo_is_read_as_utf8_whatever_the_locale(tmp_path: Path, latin1_locale: None) -> None:
    path = tmp_path / "cpuinfo"
    path.write_bytes("model name\t: Caf\u00e9 CPU\n".encode())  # b"Caf\xc3\xa9": "CafÃ©" in Latin-1
    assert peaks_module._cpu_model(path) == "Caf\u00e9 CPU"


def test_machine_id(box: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert machine_id() == HOST_ID
    # GPUs: how many, then each name once, sorted, joined by "+"
    gpus = ("NVIDIA H100 80GB HBM3", "NVIDIA A10", "NVIDIA H100 80GB HBM3")
    assert machine_id(gpus) == "box | Fake CPU x4 | 3x NVIDIA A10+NVIDIA H100 80GB HBM3"
    monkeypatch.setattr(socket, "gethostname", lambda: "")
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert machine_id() == "localhost | Fake CPU x1"


def test_the_cache_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert peaks_cache_dir(tmp_path) == tmp_path / "peaks"
    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path / "env"))
    assert peaks_cache_dir() == tmp_path / "env" / "peaks"


def test_file_name_is_the_host_and_a_key_of_machine_and_device(box: None) -> None:
    assert peaks_module._file_name(CPU_DEVICE) == CPU_FILE
    assert peaks_module._file_name("NVIDIA A10") == A10_FILE


@pytest.mark.parametrize(
    ("hostname", "prefix"),
    [
        ("--My_host  name.lab--", "My-host-name.lab"),  # each run of other characters is one "-"
        ("Xeon-7X-", "Xeon-7X"),  # only dashes are stripped from the ends
        ("a" * 50, "a" * 40),  # at most 40 characters
        ("___", "host"),  # nothing left
        ("", "localhost"),  # no hostname
    ],
)
def test_file_name_keeps_a_safe_part_of_the_hostname(
    hostname: str, prefix: str, box: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: hostname)
    monkeypatch.setattr(peaks_module, "machine_id", lambda: HOST_ID)  # the key stays the one above
    assert peaks_module._file_name(CPU_DEVICE) == f"{prefix}-5ab40b1c2fe5092a.json"


# ------------------------------------------------------------------------------------------ measuring


class _Script:
    """A clock that only the runs advance: each ``run()`` takes the next of ``durations_s``."""

    def __init__(self, durations_s: list[float], start_s: float = 100.0) -> None:
        self.durations_s = list(durations_s)
        self.now_s = start_s
        self.runs = 0

    def clock(self) -> float:
        return self.now_s

    def run(self) -> None:
        self.now_s += self.durations_s[self.runs]
        self.runs += 1


def test_best_rate_times_three_runs_after_a_warm_up() -> None:
    # warm-up 10 s (not timed), then 4, 3, 2 s: best 2 s; a 4th run (1 s) is never made when the time
    # is up (0 s asked for): 8 units / 2 s = 4 per second
    script = _Script([10.0, 4.0, 3.0, 2.0, 1.0])
    assert peaks_module._best_rate(8.0, script.run, 0.0, script.clock) == 4.0
    assert script.runs == 4
    # a negative time asks for nothing more than 0 s
    script = _Script([10.0, 4.0, 3.0, 2.0, 1.0])
    assert peaks_module._best_rate(8.0, script.run, -5.0, script.clock) == 4.0
    assert script.runs == 4


def test_best_rate_repeats_until_the_time_is_up() -> None:
    # warm-up ends at t = 101; deadline 101 + 10 = 111. Runs: 3 s (104), 3 s (107), 3 s (110); 110 < 111:
    # 0.5 s (110.5); 110.5 < 111: 0.5 s (111.0); 111.0 is not before 111: stop, the 0.25 s run not made.
    # best 0.5 s: 1 unit / 0.5 s = 2 per second
    script = _Script([1.0, 3.0, 3.0, 3.0, 0.5, 0.5, 0.25])
    assert peaks_module._best_rate(1.0, script.run, 10.0, script.clock) == 2.0
    assert script.runs == 6


def test_best_rate_of_runs_too_fast_to_time_is_work_per_nanosecond() -> None:
    script = _Script([0.0] * 4)
    assert peaks_module._best_rate(3.0, script.run, 0.0, script.clock) == 3.0 / 1e-9


def test_usable_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[int] = []

    def affinity(pid: int) -> set[int]:
        asked.append(pid)
        return {0, 2, 5}

    monkeypatch.setattr(os, "sched_getaffinity", affinity, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    assert peaks_module._usable_cores() == 3 and asked == [0]  # this process's mask, not the machine's
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set())
    assert peaks_module._usable_cores() == 1

    def refused(pid: int) -> set[int]:
        raise OSError("no")

    monkeypatch.setattr(os, "sched_getaffinity", refused)
    assert peaks_module._usable_cores() == 8
    monkeypatch.delattr(os, "sched_getaffinity")  # macOS, Windows
    assert peaks_module._usable_cores() == 8
    monkeypatch.setattr(os, "cpu_count", lambda: None)
    assert peaks_module._usable_cores() == 1


def test_without_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    assert peaks_module._torch_threads() is None
    assert peaks_module._torch_runs(4, 8) is None
    peaks_module._set_torch_threads(None)  # nothing to restore, torch not imported


def test_torch_threads_read_set_and_left_alone() -> None:
    torch = pytest.importorskip("torch")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        assert peaks_module._torch_threads() == 3
        peaks_module._set_torch_threads(2)
        assert torch.get_num_threads() == 2
        peaks_module._set_torch_threads(None)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def _check_kernels(kernels: Any, n: int, elems: int, dtype: Any, to_numpy: Any) -> None:
    a, b, out, src, dst = (to_numpy(getattr(kernels, k)) for k in ("a", "b", "out", "src", "dst"))
    assert [x.shape for x in (a, b, out, src, dst)] == [(n, n), (n, n), (n, n), (elems,), (elems,)]
    assert {getattr(kernels, k).dtype for k in ("a", "b", "out", "src", "dst")} == {dtype}
    kernels.matmul()
    np.testing.assert_allclose(to_numpy(kernels.out), a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5)
    kernels.copy()
    assert np.array_equal(to_numpy(kernels.dst), src)


def test_torch_kernels_are_fp32_on_every_usable_core(monkeypatch: pytest.MonkeyPatch) -> None:
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(peaks_module, "_usable_cores", lambda: 2)
    threads, default = torch.get_num_threads(), torch.get_default_dtype()
    try:
        torch.set_num_threads(1)
        torch.set_default_dtype(torch.float64)  # fp32 is asked for, not taken from the default
        kernels = peaks_module._torch_runs(3, 5)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
        torch.set_default_dtype(default)
    _check_kernels(kernels, 3, 5, torch.float32, lambda t: t.numpy())


def test_numpy_kernels_are_fp32() -> None:
    _check_kernels(peaks_module._NumpyKernels(3, 5), 3, 5, np.dtype(np.float32), np.asarray)


class _FakeKernels:
    def matmul(self) -> None:
        raise AssertionError("not run: _best_rate is faked")

    def copy(self) -> None:
        raise AssertionError("not run: _best_rate is faked")


@pytest.fixture
def bench(box: None, monkeypatch: pytest.MonkeyPatch) -> dict[str, list[Any]]:
    """Fakes for what measure_host_peaks calls; what they were called with, by name."""
    calls: dict[str, list[Any]] = {"torch_runs": [], "numpy": [], "best_rate": [], "set_threads": []}
    rates = iter([1.0e11, 2.0e10])  # matmul FLOP/s, then copy B/s

    def best_rate(work: float, run: Any, seconds: float) -> float:
        calls["best_rate"].append((work, run, seconds))
        return next(rates)

    class Numpy(_FakeKernels):
        def __init__(self, n: int, elems: int) -> None:
            calls["numpy"].append((n, elems))

    torch_kernels = _FakeKernels()
    calls["torch_kernels"] = [torch_kernels]
    monkeypatch.setattr(
        peaks_module, "_torch_runs", lambda n, e: calls["torch_runs"].append((n, e)) or torch_kernels
    )
    monkeypatch.setattr(peaks_module, "_NumpyKernels", Numpy)
    monkeypatch.setattr(peaks_module, "_best_rate", best_rate)
    monkeypatch.setattr(peaks_module, "_torch_threads", lambda: 7)
    monkeypatch.setattr(peaks_module, "_set_torch_threads", calls["set_threads"].append)
    return calls


def test_measure_host_peaks_counts_the_work_of_each_kernel(bench: dict[str, list[Any]]) -> None:
    peaks = peaks_module.measure_host_peaks(seconds=3.0)
    kernels = bench["torch_kernels"][0]
    # 512×512 fp32 operands; a 64 MiB copy is 64·1024·1024 / 4 = 16,777,216 fp32 elements
    assert bench["torch_runs"] == [(512, 16_777_216)] and bench["numpy"] == []
    assert bench["best_rate"] == [
        (268_435_456.0, kernels.matmul, 1.5),  # 2·512³ = 2·134,217,728 FLOPs; half of the 3 s each
        (134_217_728.0, kernels.copy, 1.5),  # 64 MiB read + 64 MiB written = 2·67,108,864 B
    ]
    assert bench["set_threads"] == [7]  # torch's thread count put back
    assert replace(peaks, measured_at="") == MeasuredPeaks(
        device=CPU_DEVICE,
        matmul_flops_per_s=1.0e11,
        memory_bytes_per_s=2.0e10,
        host_to_device_bytes_per_s=None,
        allreduce_bus_bytes_per_s=None,
        n_devices=1,
        machine_id=HOST_ID,
        measured_at="",
    )
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", peaks.measured_at)  # UTC, to the second


def test_measure_host_peaks_takes_3_s_unless_told(bench: dict[str, list[Any]]) -> None:
    peaks_module.measure_host_peaks()
    assert [s for _, _, s in bench["best_rate"]] == [1.5, 1.5]


def test_measure_host_peaks_uses_numpy_without_torch(
    bench: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peaks_module, "_torch_runs", lambda n, e: None)
    peaks_module.measure_host_peaks(seconds=0.5)
    assert bench["numpy"] == [(512, 16_777_216)]
    assert [(w, s) for w, _, s in bench["best_rate"]] == [(268_435_456.0, 0.25), (134_217_728.0, 0.25)]


def test_measuring_puts_torch_threads_back_when_a_kernel_fails(
    bench: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(work: float, run: Any, seconds: float) -> float:
        raise RuntimeError("out of memory")

    monkeypatch.setattr(peaks_module, "_best_rate", broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        peaks_module.measure_host_peaks(seconds=0.1)
    assert bench["set_threads"] == [7]


# ------------------------------------------------------------------------------------------ the cache


def _peaks(**over: Any) -> MeasuredPeaks:
    return MeasuredPeaks.from_dict(_dict(**over))


def test_store_writes_one_versioned_file_per_device(box: None, tmp_path: Path) -> None:
    path = store_peaks(_peaks(), tmp_path)
    assert path == tmp_path / "peaks" / CPU_FILE
    assert json.loads(path.read_text(encoding="utf-8")) == {"version": 1, "peaks": _dict()}
    gpu = _peaks(device="NVIDIA A10", machine_id=f"{HOST_ID} | 1x NVIDIA A10")  # machine_id(gpus) extends it
    assert store_peaks(gpu, tmp_path) == tmp_path / "peaks" / A10_FILE


def test_store_refuses_another_machines_peaks(box: None, tmp_path: Path) -> None:
    with pytest.raises(UsageError) as caught:
        store_peaks(_peaks(machine_id="elsewhere | Fake CPU x4"), tmp_path)
    assert caught.value.message == (
        "peaks of 'elsewhere | Fake CPU x4' are not this machine's ('box | Fake CPU x4')"
    )
    assert caught.value.hint == "Measure on this machine; give GPU peaks machine_id(gpu_names)"
    assert not (tmp_path / "peaks").exists()


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ({"peaks": _dict()}, "not a version-1 peaks file"),
        ({"version": 2, "peaks": _dict()}, "not a version-1 peaks file"),
        ([1, {"version": 1}], "not a version-1 peaks file"),
        ({"version": 1}, "not a JSON object"),
        ({"version": 1, "peaks": _dict(n_devices=0)}, "n_devices is not a positive integer"),
    ],
)
def test_a_damaged_file_is_named_with_what_is_wrong(
    content: Any, why: str, box: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "peaks" / CPU_FILE
    path.parent.mkdir()
    path.write_text(json.dumps(content), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="autotune.estimate.peaks"):
        assert cached_peaks(CPU_DEVICE, tmp_path) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"ignoring the damaged peaks cache {path} ({why}); measure again to replace it"
    ]


def test_a_hand_edited_file_is_read_as_utf8_whatever_the_locale(
    box: None, tmp_path: Path, latin1_locale: None
) -> None:
    path = tmp_path / "peaks" / A10_FILE
    path.parent.mkdir()
    # store_peaks writes ASCII (json escapes "é"); a hand-edited file may hold it as UTF-8 bytes
    text = json.dumps({"version": 1, "peaks": _dict(device="Caf\u00e9 GPU")}, ensure_ascii=False)
    path.write_bytes(text.encode())
    found = cached_peaks(None, tmp_path)
    assert found is not None and found.device == "Caf\u00e9 GPU"


def test_only_files_of_this_device_and_machine_are_read(
    box: None, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "peaks"
    folder.mkdir()
    # the cpu's file holding another device's peaks (renamed by hand): not the cpu's
    (folder / CPU_FILE).write_text(json.dumps({"version": 1, "peaks": _dict(device="NVIDIA A10")}))
    # not peaks files: another suffix, and a folder
    (folder / "notes.txt").write_text("{not json")
    (folder / "old.json").mkdir()
    with caplog.at_level(logging.WARNING, logger="autotune.estimate.peaks"):
        assert cached_peaks(CPU_DEVICE, tmp_path) is None
        assert cached_peaks(None, tmp_path) == _peaks(device="NVIDIA A10")
    assert caplog.records == []
    (folder / CPU_FILE).unlink()
    (folder / CPU_FILE).mkdir()  # a folder where the cpu's file goes
    with caplog.at_level(logging.WARNING, logger="autotune.estimate.peaks"):
        assert cached_peaks(CPU_DEVICE, tmp_path) is None
    assert caplog.records == []


def test_none_picks_the_newest_of_this_machines_devices(box: None, tmp_path: Path) -> None:
    store_peaks(_peaks(measured_at="2026-03-01T00:00:00+00:00"), tmp_path)
    gpu = _peaks(
        device="NVIDIA A10", machine_id=f"{HOST_ID} | 1x NVIDIA A10", measured_at="2026-02-01T00:00:00+00:00"
    )
    store_peaks(gpu, tmp_path)
    newest = cached_peaks(None, tmp_path)
    assert newest is not None and newest.device == CPU_DEVICE
    store_peaks(replace(gpu, measured_at="2026-04-01T00:00:00+00:00"), tmp_path)
    newest = cached_peaks(None, tmp_path)
    assert newest is not None and newest.device == "NVIDIA A10"
