"""HostSampler and process_tree_pids against real child processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections import namedtuple
from pathlib import Path

import psutil
import pytest
from autotune.probes.host import HostSampler, other_busy_cores, process_tree_pids
from autotune.probes.testing import wait_until
from autotune.probes.timeline import HOST_METRICS

# A root that starts a short-lived sleeper, then a CPU burner, and waits for both. The children
# announce themselves by writing their pid to a file.
_TREE = r"""
import subprocess, sys, time
out = sys.argv[1]
sleeper = subprocess.Popen([sys.executable, "-c",
    "import os, sys, time; open(sys.argv[1] + '.sleeper', 'w').write(str(os.getpid())); time.sleep(0.4)", out])
sleeper.wait()
burner = subprocess.Popen([sys.executable, "-c",
    "import os, sys, time\nopen(sys.argv[1] + '.burner', 'w').write(str(os.getpid()))\n"
    "t = time.process_time()\nwhile time.process_time() - t < 0.6: pass", out])
burner.wait()
time.sleep(0.3)
"""

# A root whose child forks a grandchild and exits at once: the grandchild is re-parented away from
# the root (no longer its descendant) but stays in the root's process group.
_ORPHAN = r"""
import os, sys, time
out = sys.argv[1]
pid = os.fork()
if pid == 0:
    if os.fork() == 0:
        open(out, "w").write(str(os.getpid()))
        time.sleep(3)
        os._exit(0)
    os._exit(0)
os.waitpid(pid, 0)
time.sleep(3)
"""


def _spawn(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args], start_new_session=True)


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def test_follows_children_that_appear_and_vanish(tmp_path: Path) -> None:
    out = tmp_path / "pid"
    root = _spawn(_TREE, str(out))
    sampler = HostSampler(root.pid, interval_s=0.05)
    seen: set[int] = set()
    sampler.start()
    try:
        deadline = time.monotonic() + 30
        while root.poll() is None and time.monotonic() < deadline:
            seen |= sampler.pids()
            time.sleep(0.01)
        assert wait_until(lambda: sampler.pids() == set(), 5)  # the whole tree is gone
    finally:
        sampler.stop()
        root.kill()
        root.wait()
    sleeper, burner = _read_pid(Path(f"{out}.sleeper")), _read_pid(Path(f"{out}.burner"))
    assert sleeper in seen and burner in seen and root.pid in seen
    rows = sampler.rows()
    assert sampler.warnings == []
    assert max(r["threads"] for r in rows) >= 2  # root + a child at the same time
    # the burner's CPU time is counted (a sleeping tree reads ~0; the machine may be busy, so no more)
    assert max(r["cpu_pct"] or 0.0 for r in rows) > 5
    assert rows[0]["cpu_pct"] is None  # a rate needs two samples
    assert rows[-1]["rss_bytes"] == 0.0 and rows[-1]["threads"] == 0.0
    for row in rows:
        assert row["source"] == "host" and row["device"] == -1
        assert row["host_mem_available_bytes"] > 0 and row["cpu_cores"] >= 1
        assert set(HOST_METRICS) <= set(row)


def test_a_re_parented_group_member_still_counts(tmp_path: Path) -> None:
    out = tmp_path / "orphan"
    root = _spawn(_ORPHAN, str(out))
    sampler = HostSampler(root.pid, interval_s=0.05)
    sampler.start()
    try:
        assert wait_until(lambda: _read_pid(out) is not None, 20)
        orphan = _read_pid(out)
        assert orphan is not None
        assert psutil.Process(orphan).ppid() != root.pid  # not a descendant any more
        assert wait_until(lambda: orphan in sampler.pids(), 5)
        assert orphan in process_tree_pids(root.pid)
        assert orphan not in process_tree_pids(root.pid, include_group=False)
    finally:
        sampler.stop()
        os.killpg(root.pid, 9)
        root.wait()


def test_a_root_in_our_own_group_does_not_count_us() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])  # our process group
    try:
        pids = process_tree_pids(child.pid)
        assert pids == {child.pid}
        assert os.getpid() not in pids
        with HostSampler(child.pid, interval_s=0.05) as sampler:
            assert wait_until(lambda: len(sampler.rows()) >= 2)
        assert sampler.pids() == {child.pid}
    finally:
        child.kill()
        child.wait()


def test_host_only_and_a_root_already_gone(tmp_path: Path) -> None:
    with HostSampler(None, interval_s=0.05) as host_only:
        assert wait_until(lambda: len(host_only.rows()) >= 3)
    rows = host_only.rows()
    assert all(r["cpu_pct"] is None and r["rss_bytes"] is None for r in rows)
    assert rows[-1]["host_cpu_pct"] is not None and rows[-1]["host_mem_available_bytes"] > 0

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    with HostSampler(gone.pid, interval_s=0.05) as sampler:
        assert wait_until(lambda: len(sampler.rows()) >= 3)
    assert any("already gone" in w for w in sampler.warnings)
    assert all(r["rss_bytes"] == 0.0 for r in sampler.rows())


def test_one_failing_counter_empties_its_columns_only(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("couldn't find any physical disk")

    monkeypatch.setattr(psutil, "disk_io_counters", broken)
    with HostSampler(os.getpid(), interval_s=0.05) as sampler:  # IO rates come about once a second
        assert wait_until(lambda: any(r["net_rx_bytes_s"] is not None for r in sampler.rows()))
    rows = sampler.rows()
    assert all(r["disk_read_bytes_s"] is None for r in rows)
    assert rows[-1]["rss_bytes"] > 0 and rows[-1]["host_mem_available_bytes"] > 0
    assert [w for w in sampler.warnings if w.startswith("disk")] == [
        "disk IO counters unavailable (couldn't find any physical disk); those columns stay empty"
    ]


def test_lifecycle_and_default_rate() -> None:
    sampler = HostSampler(None)
    assert 1 / sampler.interval_s >= 2  # at least 2 Hz by default
    sampler.stop()  # before start
    with pytest.raises(ValueError, match="interval_s"):
        HostSampler(None, interval_s=0)
    fresh = HostSampler(None, interval_s=0.05)
    fresh.start()
    fresh.stop()
    fresh.stop()
    with pytest.raises(RuntimeError, match="started once"):
        fresh.start()


def test_other_busy_cores_is_the_machine_less_the_trial_and_autotune() -> None:
    # 4 CPUs, 75 % busy over a 2 s interval (6 of 8 CPU-seconds): 3 cores; ours used 1.5 CPU-s = 0.75 core
    assert other_busy_cores(6.0, 8.0, 4, 1.5, 2.0) == pytest.approx(2.25)
    assert other_busy_cores(1.0, 8.0, 4, 3.0, 2.0) == 0.0  # never negative (counters read apart)
    assert other_busy_cores(1.0, 0.0, 4, 0.0, 2.0) == 0.0  # no time passed on the counters


_CpuTimes = namedtuple("_CpuTimes", "user nice system idle iowait irq softirq steal guest guest_nice")


class _Machine:
    """psutil.cpu_times() of a 4-CPU machine that other processes keep half busy: each read, 1 CPU-second
    busy and 1 idle (guest time, already inside user, is left out as psutil does)."""

    def __init__(self) -> None:
        self.reads = 0

    def __call__(self, percpu: bool = False) -> _CpuTimes:
        self.reads += 1
        n = float(self.reads)
        return _CpuTimes(n, 0.0, 0.0, n, 0.0, 0.0, 0.0, 0.0, 0.5 * n, 0.0)


class _IdleTuner:
    """autotune's own process as the sampler reads it, using no CPU (so only the trial is "ours")."""

    def cpu_times(self) -> _ProcTimes:
        return _ProcTimes(0.0, 0.0)


_ProcTimes = namedtuple("_ProcTimes", "user system")


def _sampler_beside_an_idle_tuner(pid: int) -> HostSampler:
    sampler = HostSampler(pid, interval_s=0.05)
    sampler._self = _IdleTuner()  # type: ignore[assignment]
    return sampler


def test_the_load_of_other_processes_is_recorded_beside_the_trial(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = _Machine()
    monkeypatch.setattr(psutil, "cpu_times", machine)
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 4)
    sleeper = _spawn("import time; time.sleep(30)")
    try:
        with _sampler_beside_an_idle_tuner(sleeper.pid) as sampler:
            # once asleep, the trial uses no CPU in an interval: the machine's load is all others'
            assert wait_until(lambda: any(r["cpu_pct"] == 0.0 for r in sampler.rows()[1:]))
    finally:
        sleeper.kill()
        sleeper.wait()
    rows = sampler.rows()
    assert rows[0]["other_cpu_cores"] is None  # a rate needs two samples
    # the machine: half of 4 CPUs busy = 2 cores; the trial's share (its cpu_pct, read over the same
    # interval) comes off them, and nothing else does
    for r in rows[1:]:
        assert r["other_cpu_cores"] == pytest.approx(max(0.0, 2.0 - r["cpu_pct"] / 100), abs=1e-9)
    assert 2.0 in [r["other_cpu_cores"] for r in rows[1:] if r["cpu_pct"] == 0.0]
    assert all(r["host_cpu_count"] == 4 and r["load_avg_1m"] is not None for r in rows)
    assert rows[-1]["host_cpu_pct"] == pytest.approx(50.0)


def test_the_trial_s_own_cpu_is_not_counted_as_other_load(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(psutil, "cpu_times", _Machine())
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 4)
    burner = _spawn(
        "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass\ntime.sleep(5)"
    )
    try:
        with _sampler_beside_an_idle_tuner(burner.pid) as sampler:
            assert wait_until(lambda: sum(1 for r in sampler.rows() if (r["cpu_pct"] or 0) > 5) >= 3, 30)
    finally:
        burner.kill()
        burner.wait()
    rows = [r for r in sampler.rows()[1:] if r["cpu_pct"] is not None]
    # whatever share of a core the burner got on this machine, it comes off the 2 busy cores
    for r in rows:
        assert r["other_cpu_cores"] == pytest.approx(max(0.0, 2.0 - r["cpu_pct"] / 100), abs=1e-9)
    assert any(r["other_cpu_cores"] < 2.0 for r in rows if r["cpu_pct"] > 5)
