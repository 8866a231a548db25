"""What every sampler (probe) must do for the runner: one suite, run against each sampler.

The runner's contract: ``start()``; ``rows()`` at any time; ``stop()`` any number of times, also
before ``start()``; rows in the timeline schema on the monotonic clock the step records use; rows
that survive ``write_timeline``/``read_timeline``; ``warnings`` a list of strings.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from autotune.probes.host import HostSampler
from autotune.probes.nvml import NvmlSampler
from autotune.probes.testing import fake_nvml, wait_until
from autotune.probes.timeline import GPU_METRICS, HOST_METRICS, KEY_COLUMNS, read_timeline, write_timeline


@pytest.fixture
def trial_process() -> Iterator[subprocess.Popen]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def _nvml(proc: subprocess.Popen) -> tuple[Any, str, tuple[str, ...]]:
    fake = fake_nvml(2)
    fake.gpus[0].processes = [(proc.pid, 1 << 30)]
    sampler = NvmlSampler(
        [0, 1], interval_s=0.02, nvml=fake.module, pids=lambda: {proc.pid}, slow_interval_s=0.04
    )
    return sampler, "gpu", GPU_METRICS


def _host(proc: subprocess.Popen) -> tuple[Any, str, tuple[str, ...]]:
    return HostSampler(proc.pid, interval_s=0.02), "host", HOST_METRICS


SAMPLERS: dict[str, Callable[[subprocess.Popen], tuple[Any, str, tuple[str, ...]]]] = {
    "nvml": _nvml,
    "host": _host,
}


@pytest.mark.parametrize("make", SAMPLERS.values(), ids=SAMPLERS.keys())
def test_sampler_contract(make, trial_process: subprocess.Popen, tmp_path: Path) -> None:
    sampler, source, metrics = make(trial_process)
    sampler.stop()  # before start: a no-op the runner may rely on in its cleanup
    fresh, _, _ = make(trial_process)
    wall0, t0 = time.time(), time.monotonic()
    fresh.start()
    try:
        assert wait_until(lambda: len(fresh.rows()) >= 6)
        mid = fresh.rows()  # readable while running
        assert len(mid) >= 6
    finally:
        fresh.stop()
    fresh.stop()
    t1, wall1 = time.monotonic(), time.time()
    rows = fresh.rows()
    assert len(rows) >= len(mid)
    assert isinstance(fresh.warnings, list) and all(isinstance(w, str) for w in fresh.warnings)
    for row in rows:
        assert set(KEY_COLUMNS) | set(metrics) <= set(row)
        assert row["source"] == source and isinstance(row["device"], int)
        # taken while the sampler ran, on the clocks the step records use (time.monotonic, time.time)
        assert t0 <= row["t_mono_s"] <= t1
        assert wall0 <= row["t_wall_s"] <= wall1
        assert all(row[m] is None or isinstance(row[m], float) for m in metrics)
    assert any(row[m] is not None for row in rows for m in metrics)
    polled = sorted(r["t_mono_s"] for r in rows)
    assert polled[-1] > polled[0]
    n = len(rows)
    time.sleep(0.1)
    assert len(fresh.rows()) == n  # nothing is sampled after stop()

    path = tmp_path / "timeline.parquet"
    assert write_timeline(path, rows) == n
    df = read_timeline(path)
    assert len(df) == n and set(df["source"]) == {source}
    assert df["t_mono_s"].is_monotonic_increasing
    with pytest.raises(RuntimeError):
        fresh.start()  # a sampler is single-use
