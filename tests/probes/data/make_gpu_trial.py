"""Write the scripted two-GPU GRPO trial in ``gpu_trial/`` (timeline.parquet, metrics.jsonl, phases.jsonl).

There is no GPU where this project is developed, so this timeline is scripted, not measured: the shape
of a colocated GRPO step on 2 x H100 (700 W limit) with every metric the NVML sampler writes, all at
10 Hz (as ``NvmlSampler(slow_interval_s=0.1)`` would), plus host rows at 4 Hz. Values change exactly
at phase boundaries, so every summary figure has an answer derivable by hand - the numbers asserted in
``tests/probes/test_timeline.py``.

Per step (3.0 s), with TRL-like nested markers (train contains rollout, rollout contains the sync):

    0.0-0.5  other        util 0   power  80 W   (data, reward on CPU)
    0.5-0.7  weight_sync  util 3   power  90 W   PCIe rx 10 GB/s, tx 1 GB/s
    0.7-2.2  rollout      util 92  power 210 W   (decode: busy but memory-bound)
    2.2-3.0  train        util 99  power 630 W

GPU 1 runs 2 points of utilization lower, has no GPM, and 2 GiB less memory. Start-up: 4 s of model
loading (util 0, 70 W, memory ramping up); tear-down: 1 s idle after the last step. Step 1 (warm-up)
peaks 2 GiB higher than later steps.

Run: ``python tests/probes/data/make_gpu_trial.py`` (rewrites the files; deterministic).
"""

from __future__ import annotations

import json
from pathlib import Path

from autotune.probes.timeline import write_timeline

GiB = 1024**3
T0_MONO_S = 1000.0
WALL_MINUS_MONO_S = 1_763_000_000.0
STARTUP_DS = 40  # deciseconds: all times are integers in 0.1 s so phase lookups are exact
STEP_DS = 30
N_STEPS = 6
TEARDOWN_DS = 10
# (phase, start, end) within a step, deciseconds
LAYOUT = (("other", 0, 5), ("weight_sync", 5, 7), ("rollout", 7, 22), ("train", 22, 30))
UTIL = {"other": 0.0, "weight_sync": 3.0, "rollout": 92.0, "train": 99.0, "startup": 0.0, "teardown": 0.0}
POWER_W = {
    "other": 80.0,
    "weight_sync": 90.0,
    "rollout": 210.0,
    "train": 630.0,
    "startup": 70.0,
    "teardown": 70.0,
}
MEM_GIB = {"other": 40.0, "weight_sync": 41.0, "rollout": 44.0, "train": 60.0, "teardown": 30.0}
HOST_CPU_PCT = {
    "other": 100.0,
    "weight_sync": 60.0,
    "rollout": 100.0,
    "train": 150.0,
    "startup": 90.0,
    "teardown": 5.0,
}


def phase_at(ds: int) -> tuple[str, int | None, int]:
    """(phase, step number or None, decisecond within the step) at time ``ds`` after T0."""
    if ds < STARTUP_DS:
        return "startup", None, ds
    k, within = divmod(ds - STARTUP_DS, STEP_DS)
    if k >= N_STEPS:
        return "teardown", None, within
    for name, a, b in LAYOUT:
        if a <= within < b:
            return name, k + 1, within
    raise AssertionError(ds)


def t_of(ds: float) -> float:
    return T0_MONO_S + ds / 10


def main(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    total_ds = STARTUP_DS + N_STEPS * STEP_DS + TEARDOWN_DS
    rows = []
    energy_mj = [5_000_000.0, 7_000_000.0]  # counters since driver load
    for ds in range(total_ds + 1):
        phase, step, _ = phase_at(ds)
        t = t_of(ds)
        for gpu in (0, 1):
            util = max(0.0, UTIL[phase] - (2.0 if gpu == 1 and UTIL[phase] > 0 else 0.0))
            power = POWER_W[phase]
            if phase == "startup":
                mem = 1.0 + 29.0 * ds / STARTUP_DS
            else:
                mem = MEM_GIB[phase] + (2.0 if step == 1 and phase == "train" else 0.0)
            mem -= 2.0 * gpu
            rows.append(
                {
                    "t_mono_s": t,
                    "t_wall_s": t + WALL_MINUS_MONO_S,
                    "source": "gpu",
                    "device": gpu,
                    "gpu_util_pct": util,
                    "mem_util_pct": util / 2,
                    "mem_used_bytes": mem * GiB,
                    "mem_total_bytes": 80.0 * GiB,
                    "power_w": power,
                    "power_limit_w": 700.0,
                    "sm_clock_mhz": 1980.0 if util > 0 else 345.0,
                    "pcie_tx_bytes_s": 1e9 if phase == "weight_sync" else 0.0,
                    "pcie_rx_bytes_s": 1e10 if phase == "weight_sync" else 0.0,
                    "temperature_c": 40.0 + util / 5,
                    "clock_event_reasons": 1.0 if util == 0 else 0.0,
                    "proc_mem_bytes": (mem - 0.5) * GiB,
                    "gpm_sm_util_pct": 0.6 * util if gpu == 0 else None,
                    "gpm_sm_occupancy_pct": 0.3 * util if gpu == 0 else None,
                    "gpm_tensor_util_pct": (0.5 * util if phase == "train" else 0.05 * util)
                    if gpu == 0
                    else None,
                    "energy_mj": energy_mj[gpu],
                }
            )
            energy_mj[gpu] += power * 0.1 * 1000.0  # the power held over the next 0.1 s, in mJ
    for q in range(0, total_ds * 4 // 10 + 1):  # host rows every 0.25 s
        ds_f = q * 2.5
        phase, _, _ = phase_at(int(ds_f))
        t = t_of(ds_f)
        rows.append(
            {
                "t_mono_s": t,
                "t_wall_s": t + WALL_MINUS_MONO_S,
                "source": "host",
                "device": -1,
                "cpu_pct": HOST_CPU_PCT[phase],
                "rss_bytes": (6.0 + (2.0 if phase == "train" else 0.0)) * GiB,
                "threads": 48.0,
                "host_mem_available_bytes": (100.0 - (10.0 if phase == "train" else 0.0)) * GiB,
                "host_cpu_pct": HOST_CPU_PCT[phase] / 32,
                "disk_read_bytes_s": 0.0,
                "disk_write_bytes_s": 0.0,
                "net_rx_bytes_s": 1e3,
                "net_tx_bytes_s": 1e3,
                "cpu_cores": 32.0,
            }
        )
    write_timeline(out_dir / "timeline.parquet", rows)

    with open(out_dir / "metrics.jsonl", "w", encoding="utf-8") as fh:
        for k in range(1, N_STEPS + 1):
            t_end = t_of(STARTUP_DS + k * STEP_DS)
            record = {
                "step": k,
                "t_mono_s": t_end,
                "t_wall_s": t_end + WALL_MINUS_MONO_S,
                "duration_s": None,
                "samples": 64,
                "tokens": 32768.0,
                "values": {"loss": 0.01 * k, "grad_norm": 0.5, "reward_std": 0.3},
            }
            fh.write(json.dumps(record) + "\n")

    with open(out_dir / "phases.jsonl", "w", encoding="utf-8") as fh:
        for k in range(1, N_STEPS + 1):
            s = STARTUP_DS + (k - 1) * STEP_DS
            events = (
                ("train", "begin", s + 5),
                ("rollout", "begin", s + 5),
                ("weight_sync", "begin", s + 5),
                ("weight_sync", "end", s + 7),
                ("rollout", "end", s + 22),
                ("train", "end", s + 30),
            )
            for phase, event, ds in events:
                t = t_of(ds)
                marker = {
                    "phase": phase,
                    "event": event,
                    "t_mono_s": t,
                    "t_wall_s": t + WALL_MINUS_MONO_S,
                    "step": k,
                    "pid": 4242,
                    "rank": 0,
                }
                fh.write(json.dumps(marker) + "\n")


if __name__ == "__main__":
    main(Path(__file__).resolve().parent / "gpu_trial")
