"""The rows, warnings and NVML calls of a scripted sampler run, tick by tick, against a recorded answer.

The sampler's tick is driven by hand on a fake clock (no thread, no timing), through a scenario that
takes every branch of a tick: a GPU with the driver's sample buffers, GPM, per-process memory, a
memory read that fails now and then and one that returns a value that is not a number; a GPU without
sample buffers (utilization and power polled every tick), without GPM, temperature or PCIe counters,
whose power read fails now and then; a GPU lost mid-run on a memory-only tick.
``data/sampler_rows.json`` holds what the sampler produced before its hot path was rewritten for
speed; the rewrite must produce the same rows (same order, same values, timestamps included), the
same warnings and the same NVML calls.

Rewrite the recorded answer (only when a change of behaviour is intended):
``python tests/probes/test_nvml_rows.py --write``.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml
from autotune.probes.nvml import NvmlSampler
from autotune.probes.testing import USED_FUNCTIONS, FakeGpu, GiB, fake_nvml

DATA = Path(__file__).parent / "data" / "sampler_rows.json"
TICKS = 40
MONO0_S = 1000.0
WALL_MINUS_MONO_S = 1_700_000_000.0


class _Clock:
    """``time.monotonic`` and ``time.time`` of the scripted run: they move only when told to."""

    def __init__(self) -> None:
        self.mono_s = MONO0_S

    def monotonic(self) -> float:
        return self.mono_s

    def time(self) -> float:
        return self.mono_s + WALL_MINUS_MONO_S


def _us(clock: _Clock, dt_s: float) -> int:
    return round((clock.time() + dt_s) * 1e6)


def scripted_run(patch: Any) -> dict[str, Any]:
    """Run the scenario; ``patch(obj, name, value)`` replaces an attribute for the run's duration."""
    clock = _Clock()
    patch(time, "monotonic", clock.monotonic)
    patch(time, "time", clock.time)
    util_buffer: list[tuple[int, int]] = []
    power_buffer: list[tuple[int, int]] = []
    gpus = [
        FakeGpu(
            gpu_util_pct=80,
            mem_util_pct=30,
            memory_used_bytes=20 * GiB,
            pcie_tx_kb_s=1000,
            pcie_rx_kb_s=3000,
            energy_mj=1_000,
            processes=[(101, 3 * GiB), (999, GiB)],
            gpm_sm_util_pct=40.0,
            gpm_sm_occupancy_pct=20.0,
            gpm_tensor_util_pct=10.0,
            sample_period_s=None,
            driver_samples={
                pynvml.NVML_GPU_UTILIZATION_SAMPLES: util_buffer,
                pynvml.NVML_TOTAL_POWER_SAMPLES: power_buffer,
            },
        ),
        FakeGpu(
            gpu_util_pct=15,
            mem_util_pct=5,
            power_mw=120_500,
            sample_period_s=None,  # no sample buffers: utilization and power polled on every tick
            gpm_supported=False,
            not_supported={"nvmlDeviceGetTemperature"},
            unsupported_fields={
                pynvml.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
                pynvml.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
            },
            pcie_tx_kb_s=7,
            processes=[(101, GiB)],
        ),
        FakeGpu(  # buffers that delivered once before start, then hold nothing new: memory-only ticks
            gpu_util_pct=50,
            sample_period_s=None,
            driver_samples={
                pynvml.NVML_GPU_UTILIZATION_SAMPLES: [(_us(clock, -0.5), 50)],
                pynvml.NVML_TOTAL_POWER_SAMPLES: [(_us(clock, -0.5), 100_000)],
            },
        ),
    ]
    # the first buffer's samples exist before start (one just inside the 2 s probe window)
    util_buffer.append((_us(clock, -1.0), 11))
    power_buffer.append((_us(clock, -1.5), 95_000))
    fake = fake_nvml(gpus)
    m = fake.module
    memory_effect = m.nvmlDeviceGetMemoryInfo.side_effect
    power_effect = m.nvmlDeviceGetPowerUsage.side_effect
    counts = {"mem": 0, "power": 0}

    def memory(handle: Any, version: Any = None) -> Any:
        if handle.index == 0:
            counts["mem"] += 1
            if counts["mem"] % 7 == 0:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)
            if counts["mem"] == 12:
                return SimpleNamespace(used="n/a", total=80 * GiB)
        return memory_effect(handle, version)

    def power(handle: Any) -> Any:
        counts["power"] += 1
        if counts["power"] % 5 == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)
        return power_effect(handle)

    m.nvmlDeviceGetMemoryInfo.side_effect = memory
    m.nvmlDeviceGetPowerUsage.side_effect = power
    sampler = NvmlSampler([0, 1, 2], interval_s=0.1, nvml=m, pids=lambda: {101}, slow_interval_s=0.3)
    patch(sampler, "_run", lambda: None)  # no thread: the ticks are driven below
    sampler.start()
    try:
        for tick in range(TICKS):
            clock.mono_s = MONO0_S + 0.05 + 0.1 * tick
            if tick % 4 == 1:  # the driver fills its buffers between polls
                util_buffer.extend((_us(clock, -0.04 + 0.01 * k), 60 + tick + k) for k in range(3))
                power_buffer.append((_us(clock, -0.02), 200_000 + 1000 * tick))
            if tick == 10:
                gpus[0].memory_used_bytes = 30 * GiB
                gpus[1].gpu_util_pct = 95
                gpus[0].processes.append((101, GiB))
            if tick == 16:  # a tick without GPU 2's slow read
                fake.lose(2)
            sampler._tick(tick)
    finally:
        sampler.stop()
    calls = Counter({name: getattr(m, name).call_count for name in USED_FUNCTIONS})
    return {
        "rows": sampler.rows(),
        "warnings": sampler.warnings,
        "calls": {name: n for name, n in sorted(calls.items()) if n},
        "ticks": sampler.ticks,
    }


def test_a_scripted_run_gives_the_recorded_rows_warnings_and_calls(monkeypatch: Any) -> None:
    got = scripted_run(monkeypatch.setattr)
    want = json.loads(DATA.read_text())
    assert got["warnings"] == want["warnings"]
    assert got["calls"] == want["calls"]
    assert got["ticks"] == want["ticks"]
    assert len(got["rows"]) == len(want["rows"])
    for k, (row, expected) in enumerate(zip(got["rows"], want["rows"], strict=True)):
        assert row == expected, k
    # the scenario reaches what it is meant to: sub-samples, a lost GPU, polled power, failed reads
    rows = got["rows"]
    assert any(r["mem_total_bytes"] is None and r["gpu_util_pct"] is not None for r in rows)
    assert all(r["mem_used_bytes"] is None for r in rows if r["device"] == 2 and r["t_mono_s"] > 1001.6)
    assert any(r["device"] == 1 and r["power_w"] == 120.5 for r in rows)
    assert any(w.startswith("mem_used_bytes: read failed on GPU 0") for w in got["warnings"])
    assert any(w.startswith("mem_used_bytes: GPU 0 returned 'n/a'") for w in got["warnings"])


def _write() -> None:
    undo: list[tuple[Any, str, Any]] = []

    def patch(obj: Any, name: str, value: Any) -> None:
        undo.append((obj, name, obj.__dict__.get(name, getattr(obj, name))))
        setattr(obj, name, value)

    try:
        got = scripted_run(patch)
    finally:
        for obj, name, value in reversed(undo):
            setattr(obj, name, value)
    DATA.write_text(json.dumps(got, indent=None, separators=(",", ":")) + "\n")
    print(f"wrote {DATA}: {len(got['rows'])} rows, {len(got['warnings'])} warnings")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    _write()
