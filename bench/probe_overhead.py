"""CPU cost of the NVML sampler: 8 fake GPUs at 10 Hz, plus the host sampler at 4 Hz.

    python bench/probe_overhead.py [--gpus 8] [--interval 0.1] [--seconds 10] [--rounds 3]

The GPUs are ``probes.testing.fake_nvml`` fakes answering instantly from memory (driver sample
buffers, GPM and per-process memory all on). While a sampler runs the main thread sleeps, so the
process's CPU time over the run is the sampler's. Printed:

- CPU as % of one core with the ``create_autospec`` fake (the figure the target is about: the median
  of ``--rounds`` runs, each round running the autospec and the plain fake back to back so that both
  see the same machine load; the spread of the rounds is printed too), and the same run against the
  fake's plain behaviour functions (no signature check, no call recording): the
  difference is ``unittest.mock``'s own cost, the rest is the sampler plus the fake's behaviour
  (building the real ctypes structures). A real driver call costs CPU too, but a different amount;
- a breakdown: ``unittest.mock`` (autospec minus plain), the cost of waking on the sampler's schedule
  alone (a thread that only sleeps until each tick), and the rest (sampler plus the fake's behaviour);
- NVML calls per second, the achieved polling rate against the requested one, and the jitter of the
  tick intervals (standard deviation, 95th percentile and maximum of |interval - requested|);
- the same CPU figure for ``HostSampler`` following a process in its own session at 4 Hz.

Target: at most 1 % of one core for 8 GPUs at 10 Hz. Numbers are measured and printed, never asserted;
on a machine shared with other work they vary from run to run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

import psutil
from autotune.probes.host import HostSampler
from autotune.probes.nvml import NvmlSampler
from autotune.probes.testing import USED_FUNCTIONS, fake_nvml, plain_functions


def _fake(gpus: int):
    fake = fake_nvml(gpus)
    for k, gpu in enumerate(fake.gpus):
        gpu.processes = [(os.getpid(), 1 << 30), (10_000 + k, 1 << 29)]
    return fake


def _run(sampler: NvmlSampler, seconds: float) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of a sampler run with this thread asleep."""
    cpu0, wall0 = time.process_time(), time.monotonic()
    sampler.start()
    time.sleep(seconds)
    sampler.stop()
    return time.process_time() - cpu0, time.monotonic() - wall0


def _sampler(fake, nvml, gpus: int, interval_s: float) -> NvmlSampler:
    return NvmlSampler(range(gpus), interval_s=interval_s, nvml=nvml, pids=lambda: {os.getpid()})


def _idle_loop_pct(interval_s: float, seconds: float) -> float:
    """CPU (% of one core) of a thread that only wakes on the sampler's schedule: the wake-up floor."""
    out: list[float] = []

    def loop() -> None:
        cpu0, next_t = time.thread_time(), time.monotonic()
        end = next_t + seconds
        while next_t < end:
            next_t += interval_s
            time.sleep(max(0.0, next_t - time.monotonic()))
        out.append(time.thread_time() - cpu0)

    thread = threading.Thread(target=loop)
    thread.start()
    thread.join()
    return 100 * out[0] / seconds


def bench_nvml(gpus: int, interval_s: float, seconds: float, rounds: int) -> None:
    autospec_pct, plain_pct = [], []
    for _ in range(rounds):
        fake = _fake(gpus)
        sampler = _sampler(fake, fake.module, gpus, interval_s)
        cpu_s, wall_s = _run(sampler, seconds)
        autospec_pct.append(100 * cpu_s / wall_s)
        calls = sum(getattr(fake.module, name).call_count for name in USED_FUNCTIONS)
        plain = _fake(gpus)
        plain_cpu_s, plain_wall_s = _run(_sampler(plain, plain_functions(plain), gpus, interval_s), seconds)
        plain_pct.append(100 * plain_cpu_s / plain_wall_s)

    idle_pct = _idle_loop_pct(interval_s, min(seconds, 10.0))
    ticks = sampler.ticks  # of the last autospec round
    gaps = [b - a for a, b in zip(ticks, ticks[1:], strict=False)]
    dev = sorted(abs(g - interval_s) for g in gaps)
    rate_hz = (len(ticks) - 1) / (ticks[-1] - ticks[0])
    rows = sampler.rows()
    sub = sum(1 for r in rows if r["mem_total_bytes"] is None)
    spread = ", ".join(f"{p:.2f}" for p in autospec_pct)
    print(
        f"NVML sampler: {gpus} fake GPUs, requested {1 / interval_s:.1f} Hz, {rounds} rounds of "
        f"{wall_s:.1f} s per fake"
    )
    print(
        f"  CPU with the autospec fake: {statistics.median(autospec_pct):.2f} % of one core, median "
        f"(rounds: {spread}; target <= 1 %)"
    )
    print(
        f"  CPU with the plain fake:    {statistics.median(plain_pct):.2f} % of one core "
        "(sampler + fake behaviour, no unittest.mock)"
    )
    mock_pct = statistics.median(autospec_pct) - statistics.median(plain_pct)
    print(
        f"    of which: unittest.mock {mock_pct:.2f} % (autospec - plain), waking {1 / interval_s:.0f} times "
        f"a second {idle_pct:.2f} % (an empty loop on the same schedule), sampler + fake behaviour "
        f"{statistics.median(plain_pct) - idle_pct:.2f} %"
    )
    print(f"  NVML calls: {calls / wall_s:.0f} /s ({calls / wall_s / gpus:.1f} per GPU per second)")
    print(
        f"  achieved rate: {rate_hz:.2f} Hz over {len(ticks)} ticks ({rate_hz * interval_s:.3f} x requested)"
    )
    print(
        f"  jitter |interval - {interval_s * 1000:.0f} ms|: sd {statistics.pstdev(gaps) * 1000:.2f} ms, "
        f"p95 {dev[int(0.95 * (len(dev) - 1))] * 1000:.2f} ms, max {dev[-1] * 1000:.2f} ms"
    )
    print(
        f"  rows: {len(rows)} ({sub} from the driver's sample buffer); warnings: {sampler.warnings or 'none'}"
    )


def bench_host(interval_s: float, seconds: float) -> None:
    # a trial runs in its own session (the runner starts it so): a sleeping child stands in for it
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    try:
        sampler = HostSampler(child.pid, interval_s=interval_s)
        cpu0, wall0 = time.process_time(), time.monotonic()
        sampler.start()
        time.sleep(seconds)
        sampler.stop()
        cpu_s, wall_s = time.process_time() - cpu0, time.monotonic() - wall0
    finally:
        child.kill()
        child.wait()
    n = len(sampler.rows())
    procs = len(psutil.pids())
    print(
        f"Host sampler: a trial in its own session at {1 / interval_s:.1f} Hz, {wall_s:.1f} s, {procs} processes on the host"
    )
    print(f"  CPU: {100 * cpu_s / wall_s:.2f} % of one core; {n} rows ({n / wall_s:.2f} Hz)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--interval", type=float, default=0.1, help="GPU polling interval, seconds")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of each sampler run")
    parser.add_argument("--rounds", type=int, default=3, help="autospec + plain runs, back to back")
    parser.add_argument("--host-interval", type=float, default=0.25)
    args = parser.parse_args()
    print(f"machine load average (1 min): {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    bench_nvml(args.gpus, args.interval, args.seconds, max(1, args.rounds))
    bench_host(args.host_interval, min(args.seconds, 10.0))


if __name__ == "__main__":
    main()
