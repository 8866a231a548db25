"""The samplers' live view: rows read while the sampler runs (what the trial runner's hang rule reads)."""

from __future__ import annotations

import math
import threading

import pytest
from autotune.probes.nvml import NvmlSampler
from autotune.probes.testing import FakeGpu, fake_nvml, wait_until
from autotune.probes.timeline import GPU_METRICS, RowBuffer


def test_since_returns_only_new_rows_with_the_columns_asked() -> None:
    buf = RowBuffer("gpu", GPU_METRICS)
    util, power = GPU_METRICS.index("gpu_util_pct") + 3, GPU_METRICS.index("power_w") + 3
    for t in range(3):
        row = buf.blank(float(t), 100.0 + t, device=t % 2)
        row[util] = 50.0 + t
        buf.append(row)
    rows, cursor = buf.since(0, ("t_mono_s", "device", "gpu_util_pct", "power_w"))
    assert cursor == 3
    assert [r[:3] for r in rows] == [(0.0, 0.0, 50.0), (1.0, 1.0, 51.0), (2.0, 0.0, 52.0)]
    assert all(math.isnan(r[3]) for r in rows)  # never measured: NaN, not 0

    row = buf.blank(3.0, 103.0, device=1)
    row[power] = 95.0
    buf.append(row)
    rows, cursor = buf.since(cursor, ("power_w", "device"))
    assert (rows, cursor) == ([(95.0, 1.0)], 4)
    assert buf.since(cursor, ("power_w",)) == ([], 4)


def test_since_rejects_a_column_the_timeline_does_not_have() -> None:
    buf = RowBuffer("gpu", GPU_METRICS)
    with pytest.raises(KeyError, match="power_watts"):
        buf.since(0, ("t_mono_s", "power_watts"))


def test_since_is_consistent_while_another_thread_appends() -> None:
    buf = RowBuffer("gpu", GPU_METRICS)
    done = threading.Event()

    def writer() -> None:
        for i in range(5000):
            buf.append(buf.blank(float(i), float(i), device=0))
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    seen: list[float] = []
    cursor = 0
    while not done.is_set() or cursor < len(buf):
        rows, cursor = buf.since(cursor, ("t_mono_s",))
        seen.extend(r[0] for r in rows)
    thread.join()
    assert seen == [float(i) for i in range(5000)]  # every row once, in order, none torn


def test_nvml_sampler_live_rows_are_the_rows_it_keeps() -> None:
    fake = fake_nvml([FakeGpu(gpu_util_pct=100, power_mw=95_000), FakeGpu(gpu_util_pct=100, power_mw=96_000)])
    sampler = NvmlSampler([0, 1], nvml=fake.module, interval_s=0.02, slow_interval_s=0.1, gpm=False)
    sampler.start()
    try:
        live: list[tuple[float, ...]] = []
        cursor = 0

        def read() -> bool:
            nonlocal cursor
            rows, cursor = sampler.samples_since(cursor, ("t_mono_s", "device", "gpu_util_pct", "power_w"))
            live.extend(rows)
            return any(r[2] == 100.0 for r in live) and {r[3] for r in live} >= {95.0, 96.0}

        assert wait_until(read, timeout_s=10)
    finally:
        sampler.stop()
    rows, _ = sampler.samples_since(cursor, ("t_mono_s", "device", "gpu_util_pct", "power_w"))
    live.extend(rows)
    kept = sampler.rows()

    def same(value: float, kept_value: float | None) -> bool:
        return kept_value is None if math.isnan(value) else value == kept_value

    assert len(live) == len(kept)
    for row, full in zip(live, kept, strict=True):
        assert row[0] == full["t_mono_s"] and int(row[1]) == full["device"]
        assert same(row[2], full["gpu_util_pct"]) and same(row[3], full["power_w"])
    assert {r[3] for r in live if r[1] == 1.0 and not math.isnan(r[3])} == {96.0}  # 96 000 mW → W
