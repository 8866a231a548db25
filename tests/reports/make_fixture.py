"""Writes the committed fixture study ``tests/fixtures/study/`` (and smaller studies for tests).

The fixture is a ms-swift GRPO search for Qwen2-7B (LoRA) on 4 × A10 24 GB with a trial of every
status. The numbers are synthetic but shaped after real colocated GRPO runs: a baseline at vLLM
utilization 0.3 that idles in rollout with 9 GB to spare, an offload trial whose GPUs wait on PCIe,
an OOM at utilization 0.7 with micro-batch 4, a ZeRO-3 weight-sync gather that OOMs, a dataloader
stall, a hang after the second step, an unhealthy trial, and one that never launched.

Run ``python tests/reports/make_fixture.py`` to regenerate it (deterministic), then commit the output.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from autotune.records import (
    GpuInfo,
    Hardware,
    HostInfo,
    LaunchPlan,
    SteadyEstimate,
    StepMetrics,
    TrialResult,
    TrialStatus,
)

FIXTURE_DIR = Path(__file__).resolve().parents[1] / "fixtures" / "study"
ORIGINAL_ROOT = "/data/runs/qwen2-7b-a10"  # where the study "was" when written; must never leak
SECRET_TOKEN = "hf_FixtureSecretToken0123456789"
SECRET_WANDB = "0123456789abcdef0123456789abcdef01234567"
A10_BYTES = 24_146_608_128  # NVML memory.total of an A10 (23028 MiB)
A10_POWER_LIMIT_W = 150.0
GLOBAL_BATCH = 32
COMPLETION_TOKENS = 1024
T_MONO0 = 5_000.0
T_WALL0 = 1_763_700_000.0

GPU_COLUMNS = (
    "gpu_util_pct mem_util_pct mem_used_bytes mem_total_bytes power_w power_limit_w sm_clock_mhz pcie_tx_bytes_s "
    "pcie_rx_bytes_s temperature_c clock_event_reasons proc_mem_bytes gpm_sm_util_pct gpm_sm_occupancy_pct "
    "gpm_tensor_util_pct energy_mj"
).split()
HOST_COLUMNS = (
    "cpu_pct rss_bytes threads host_mem_available_bytes host_cpu_pct disk_read_bytes_s disk_write_bytes_s "
    "net_rx_bytes_s net_tx_bytes_s"
).split()


@dataclass
class Seg:
    """A stretch of a trial with one behaviour. ``phase`` None writes no marker (start-up, silence)."""

    phase: str | None
    duration_s: float
    util_pct: float = 90.0
    idle_frac: float = 0.0  # share of samples at ~0 % (the 0 <-> 90 % swings)
    mem_bytes: float = 10e9
    power_frac: float = 0.8
    pcie_bytes_s: float = 0.2e9
    host_cpu_pct: float = 12.0  # whole host, 0..100
    rss_bytes: float = 40e9
    host_available_bytes: float = 300e9
    step: int | None = None
    ends_step: bool = False  # a step record is written at the end of this segment
    mem_by_gpu: dict[int, float] = field(default_factory=dict)


def phases_of_step(
    step: int,
    *,
    rollout: Seg,
    train: Seg,
    sync: Seg | None = None,
    other: Seg | None = None,
) -> list[Seg]:
    """One step: weight sync (from step 2 on), rollout, train, then other; the record ends it."""
    segs: list[Seg] = []
    if sync is not None and step > 1:
        segs.append(_with(sync, step=step))
    segs.append(_with(rollout, step=step))
    segs.append(_with(train, step=step))
    if other is not None:
        segs.append(_with(other, step=step))
    segs[-1] = _with(segs[-1], ends_step=True)
    return segs


def _with(seg: Seg, **changes: Any) -> Seg:
    data = dict(seg.__dict__)
    data.update(changes)
    return Seg(**data)


@dataclass
class Synth:
    """Timeline rows, phase markers and step records of one synthetic trial."""

    rows: list[dict[str, Any]]
    markers: list[dict[str, Any]]
    steps: list[StepMetrics]
    end_mono_s: float


def synthesize(
    segs: list[Seg],
    *,
    n_gpus: int = 4,
    seed: int = 0,
    t0_mono_s: float = T_MONO0,
    rate_hz: float = 1.0,
    step_values: Any = None,
    cpu_cores: int = 48,
) -> Synth:
    """Sample the segments at ``rate_hz`` on every GPU and the host; write markers and step records."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    markers: list[dict[str, Any]] = []
    steps: list[StepMetrics] = []
    t = t0_mono_s
    step_start = t
    energy_mj = [0.0] * n_gpus
    for seg in segs:
        if seg.phase is not None:
            markers.append(_marker(seg.phase, "begin", t, seg.step))
        n = max(1, round(seg.duration_s * rate_hz))
        for k in range(n):
            ts = t + (k + 0.5) * seg.duration_s / n
            for g in range(n_gpus):
                idle = rng.random() < seg.idle_frac
                util = rng.uniform(0.0, 3.0) if idle else min(100.0, max(6.0, rng.gauss(seg.util_pct, 4.0)))
                power = A10_POWER_LIMIT_W * (0.2 if idle else seg.power_frac) * rng.uniform(0.95, 1.05)
                mem = seg.mem_by_gpu.get(g, seg.mem_bytes - g * 40e6) + rng.uniform(-30e6, 0)
                mem = min(mem, A10_BYTES - 1e6)
                pcie = max(0.0, seg.pcie_bytes_s * (0.3 if idle else 1.0) * rng.uniform(0.9, 1.1))
                energy_mj[g] += power * seg.duration_s / n * 1000
                rows.append(
                    {
                        "t_mono_s": ts,
                        "t_wall_s": T_WALL0 + (ts - T_MONO0),
                        "source": "gpu",
                        "device": g,
                        "gpu_util_pct": round(util, 1),
                        "mem_util_pct": round(util * 0.6, 1),
                        "mem_used_bytes": float(int(mem)),
                        "mem_total_bytes": float(A10_BYTES),
                        "power_w": round(power, 1),
                        "power_limit_w": A10_POWER_LIMIT_W,
                        "sm_clock_mhz": 1695.0 if not idle else 210.0,
                        "pcie_tx_bytes_s": round(pcie * 0.45),
                        "pcie_rx_bytes_s": round(pcie * 0.55),
                        "temperature_c": 62.0,
                        "clock_event_reasons": 0.0 if not idle else 1.0,
                        "proc_mem_bytes": float(int(mem - 420e6)),
                        "gpm_sm_util_pct": None,
                        "gpm_sm_occupancy_pct": None,
                        "gpm_tensor_util_pct": None,
                        "energy_mj": round(energy_mj[g]),
                    }
                )
            cpu = min(100.0, max(0.5, rng.gauss(seg.host_cpu_pct, 1.5)))
            rows.append(
                {
                    "t_mono_s": ts,
                    "t_wall_s": T_WALL0 + (ts - T_MONO0),
                    "source": "host",
                    "device": -1,
                    "cpu_pct": round(cpu / 100 * cpu_cores * 100 * 0.8, 1),
                    "rss_bytes": float(int(seg.rss_bytes)),
                    "threads": 212.0,
                    "host_mem_available_bytes": float(int(seg.host_available_bytes)),
                    "host_cpu_pct": round(cpu, 1),
                    "disk_read_bytes_s": 1.0e6,
                    "disk_write_bytes_s": 2.0e5,
                    "net_rx_bytes_s": 1.0e4,
                    "net_tx_bytes_s": 1.0e4,
                }
            )
        t += seg.duration_s
        if seg.phase is not None:
            markers.append(_marker(seg.phase, "end", t, seg.step))
        if seg.ends_step and seg.step is not None:
            values = step_values(seg.step) if step_values else default_values(seg.step)
            steps.append(
                StepMetrics(
                    step=seg.step,
                    t_mono_s=round(t, 3),
                    t_wall_s=round(T_WALL0 + (t - T_MONO0), 3),
                    duration_s=round(t - step_start, 3),
                    samples=GLOBAL_BATCH,
                    tokens=float(GLOBAL_BATCH * COMPLETION_TOKENS * 0.8),
                    values=values,
                )
            )
            step_start = t
        if seg.phase is None and not steps:
            step_start = t
    return Synth(rows=rows, markers=markers, steps=steps, end_mono_s=t)


def open_last(synth: Synth) -> Synth:
    """Drop the last end marker: the trial died or hung inside that phase."""
    for i in range(len(synth.markers) - 1, -1, -1):
        if synth.markers[i]["event"] == "end":
            del synth.markers[i]
            break
    return synth


def _marker(phase: str, event: str, t: float, step: int | None) -> dict[str, Any]:
    return {
        "phase": phase,
        "event": event,
        "t_mono_s": round(t, 3),
        "t_wall_s": round(T_WALL0 + (t - T_MONO0), 3),
        "step": step,
        "pid": 4242,
        "rank": 0,
    }


def default_values(step: int) -> dict[str, float]:
    return {
        "loss": 0.012 + 0.001 * step,
        "grad_norm": 0.41 + 0.02 * step,
        "learning_rate": 1e-6,
        "kl": 0.0004 * step,
        "reward": 0.31 + 0.02 * step,
        "reward_std": 0.38,
        "completions/mean_length": 702.0,
        "completions/clipped_ratio": 0.12,
    }


def summarize(
    synth: Synth, *, n_gpus: int, cpu_cores: int, idle_threshold_pct: float = 5.0
) -> dict[str, Any]:
    """The ``timeline_summary`` shape of ``probes.timeline.summarize`` (computed here to stay stable)."""
    df = pd.DataFrame(synth.rows)
    duration_s = float(df["t_mono_s"].max() - df["t_mono_s"].min()) if len(df) else 0.0
    n_steps = len(synth.steps)
    gpus = []
    spans = _spans(synth.markers, synth.end_mono_s)
    for g in range(n_gpus):
        d = df[(df["source"] == "gpu") & (df["device"] == g)]
        if not len(d):
            continue
        util = d["gpu_util_pct"]
        pcie_total = float(((d["pcie_tx_bytes_s"] + d["pcie_rx_bytes_s"]) * 1.0).sum())
        energy_j = float(d["energy_mj"].max() / 1000)
        gpus.append(
            {
                "index": g,
                "util_mean_pct": round(float(util.mean()), 2),
                "util_p50_pct": round(float(util.median()), 2),
                "util_p95_pct": round(float(util.quantile(0.95)), 2),
                "idle_share": round(float((util < idle_threshold_pct).mean()), 4),
                "peak_mem_bytes": int(d["mem_used_bytes"].max()),
                "mem_total_bytes": A10_BYTES,
                "peak_proc_mem_bytes": int(d["proc_mem_bytes"].max()),
                "power_mean_w": round(float(d["power_w"].mean()), 1),
                "energy_j": round(energy_j, 1),
                "energy_per_step_j": round(energy_j / n_steps, 1) if n_steps else None,
                "pcie_bytes_per_step": round(pcie_total / n_steps) if n_steps else None,
                "sm_util_mean_pct": None,
                "mfu": None,
            }
        )
    host = df[df["source"] == "host"]
    seconds = {p: 0.0 for p in ("rollout", "train", "weight_sync", "other")}
    idle_by_phase: dict[str, float | None] = dict.fromkeys(seconds)
    gpu = df[df["source"] == "gpu"]
    for phase in seconds:
        ph = [s for s in spans if s[0] == phase]
        seconds[phase] = round(sum(b - a for _, a, b in ph), 2)
        if ph and len(gpu):
            mask = pd.Series(False, index=gpu.index)
            for _, a, b in ph:
                mask |= (gpu["t_mono_s"] >= a) & (gpu["t_mono_s"] < b)
            sel = gpu[mask]["gpu_util_pct"]
            idle_by_phase[phase] = round(float((sel < idle_threshold_pct).mean()), 4) if len(sel) else None
    total = sum(seconds.values()) or 1.0
    return {
        "duration_s": round(duration_s, 2),
        "sample_rate_hz": 1.0,
        "steps": n_steps,
        "gpus": gpus,
        "host": {
            "cpu_mean_pct": round(float(host["cpu_pct"].mean()), 1) if len(host) else None,
            "cpu_p95_pct": round(float(host["cpu_pct"].quantile(0.95)), 1) if len(host) else None,
            "peak_rss_bytes": int(host["rss_bytes"].max()) if len(host) else None,
            "min_available_bytes": int(host["host_mem_available_bytes"].min()) if len(host) else None,
            "cpu_cores": cpu_cores,
        },
        "phases": {
            "source": "markers" if spans else "none",
            "seconds": seconds,
            "share": {k: round(v / total, 4) for k, v in seconds.items()},
            "gpu_idle_share_by_phase": idle_by_phase,
        },
    }


def _spans(markers: list[dict[str, Any]], end: float) -> list[tuple[str, float, float]]:
    out, opened = [], {}
    for m in markers:
        if m["event"] == "begin":
            opened[m["phase"]] = m["t_mono_s"]
        elif m["phase"] in opened:
            out.append((m["phase"], opened.pop(m["phase"]), m["t_mono_s"]))
    out.extend((p, a, end) for p, a in opened.items())
    return out


def steady_of(steps: list[StepMetrics], warmup: int = 1) -> SteadyEstimate | None:
    durations = [s.duration_s for s in steps[warmup:] if s.duration_s]
    if len(durations) < 2:
        return None
    mean = statistics.fmean(durations)
    sd = statistics.stdev(durations)
    t95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36}.get(len(durations) - 1, 2.2)
    return SteadyEstimate(
        step_time_s=round(mean, 4),
        rel_ci95=round(t95 * sd / math.sqrt(len(durations)) / mean, 4),
        steady_steps=len(durations),
        warmup_steps=warmup,
        throughput=round(GLOBAL_BATCH / mean, 4),
        tokens_per_s=round(GLOBAL_BATCH * COMPLETION_TOKENS * 0.8 / mean, 1),
    )


def hardware(n_gpus: int = 4) -> Hardware:
    return Hardware(
        gpus=tuple(
            GpuInfo(
                index=i,
                name="NVIDIA A10",
                memory_total_bytes=A10_BYTES,
                uuid=f"GPU-5f3c0a1e-0000-4000-8000-00000000000{i}",
                compute_capability="8.6",
            )
            for i in range(n_gpus)
        ),
        host=HostInfo(
            hostname="a10-node-1",
            cpu_cores_logical=48,
            cpu_cores_physical=24,
            ram_total_bytes=192 * 2**30,
            platform="Linux-5.15",
        ),
        driver_version="550.54.15",
        cuda_driver_version="12.4",
    )


BASE_KNOBS: dict[str, Any] = {
    "per_device_train_batch_size": 2,
    "gradient_checkpointing": True,
    "dataloader_num_workers": 1,
    "deepspeed": "zero3",
    "vllm_gpu_memory_utilization": 0.3,
    "vllm_tensor_parallel_size": 4,
    "sleep_level": 0,
    "offload_optimizer": False,
    "offload_model": False,
    "move_model_batches": None,
}


def launch_plan(number: int, knobs: dict[str, Any], root: str = ORIGINAL_ROOT) -> LaunchPlan:
    argv = [
        "swift",
        "rlhf",
        "--rlhf_type",
        "grpo",
        "--model",
        "Qwen/Qwen2-7B",
        "--tuner_type",
        "lora",
        "--lora_rank",
        "16",
    ]
    argv += [
        "--use_vllm",
        "true",
        "--vllm_mode",
        "colocate",
        "--num_generations",
        "8",
        "--max_completion_length",
        "1024",
    ]
    for k, v in knobs.items():
        if v is None:
            continue
        argv += [f"--{k}", ("true" if v else "false") if isinstance(v, bool) else str(v)]
    argv += ["--max_steps", "12", "--logging_steps", "1", "--output_dir", f"{root}/trials/{number}/output"]
    return LaunchPlan(
        argv=tuple(argv),
        env={
            "NPROC_PER_NODE": "4",
            "CUDA_VISIBLE_DEVICES": "0,1,2,3",
            "HF_TOKEN": SECRET_TOKEN,
            "WANDB_API_KEY": SECRET_WANDB,
        },
        cwd=f"{root}/trials/{number}",
        metrics_paths=(f"{root}/trials/{number}/metrics.jsonl",),
        world_size=4,
    )


def rollout(**kw: Any) -> Seg:
    base = {
        "util_pct": 88.0,
        "idle_frac": 0.12,
        "power_frac": 0.45,
        "pcie_bytes_s": 0.3e9,
        "host_cpu_pct": 14.0,
    }
    base.update(kw)
    return Seg("rollout", **base)


def train(**kw: Any) -> Seg:
    base = {
        "util_pct": 96.0,
        "idle_frac": 0.02,
        "power_frac": 0.92,
        "pcie_bytes_s": 0.6e9,
        "host_cpu_pct": 11.0,
    }
    base.update(kw)
    return Seg("train", **base)


def sync(**kw: Any) -> Seg:
    base = {"util_pct": 45.0, "idle_frac": 0.1, "power_frac": 0.35, "pcie_bytes_s": 1.2e9, "duration_s": 2.0}
    base.update(kw)
    return Seg("weight_sync", **base)


def other(**kw: Any) -> Seg:
    base = {"util_pct": 8.0, "idle_frac": 0.9, "power_frac": 0.22, "pcie_bytes_s": 0.05e9, "duration_s": 1.0}
    base.update(kw)
    return Seg("other", **base)


def startup(duration_s: float = 40.0, mem_bytes: float = 8e9, **kw: Any) -> Seg:
    base = {
        "util_pct": 10.0,
        "idle_frac": 0.85,
        "power_frac": 0.2,
        "pcie_bytes_s": 2.5e9,
        "host_cpu_pct": 35.0,
    }
    base.update(kw)
    return Seg(None, duration_s, mem_bytes=mem_bytes, **base)


def steps_of(n: int, first: int = 1, warm_s: float = 6.0, **parts: Seg) -> list[Seg]:
    segs: list[Seg] = []
    for step in range(first, first + n):
        r = parts["rollout"]
        # Deterministic jitter so step times vary like real ones (and the interval is not zero).
        r = _with(
            r, duration_s=round(r.duration_s + 0.6 * math.sin(1.7 * step) + (warm_s if step == 1 else 0.0), 3)
        )
        segs += phases_of_step(
            step, rollout=r, train=parts["train"], sync=parts.get("sync"), other=parts.get("other")
        )
    return segs


@dataclass
class TrialSpecFixture:
    number: int
    knobs: dict[str, Any]
    status: TrialStatus
    reason: str
    segs: list[Seg] = field(default_factory=list)
    evidence: str | None = None
    exit_code: int | None = 0
    signal: int | None = None
    stderr: str = ""
    stdout_extra: str = ""
    health: list[str] = field(default_factory=list)
    open_end: bool = False
    is_baseline: bool = False
    estimate_peak_bytes: float | None = None
    step_values: Any = None
    launched: bool = True
    steady: bool = True


OOM_TEXT_T2 = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.32 GiB. GPU 2 has a total capacity of 22.49 GiB "
    "of which 1.02 GiB is free. Including non-PyTorch memory, this process has 21.46 GiB memory in use. Of the "
    "allocated memory 9.87 GiB is allocated by PyTorch, and 1.12 GiB is reserved by PyTorch but unallocated."
)
OOM_TEXT_T5 = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.02 GiB. GPU 0 has a total capacity of 22.49 GiB "
    "of which 198.00 MiB is free. Including non-PyTorch memory, this process has 22.29 GiB memory in use. Of the "
    "allocated memory 11.64 GiB is allocated by PyTorch, and 402.13 MiB is reserved by PyTorch but unallocated."
)
VLLM_TEXT = (
    "ValueError: Free memory on device (12.31/22.49 GiB) on startup is less than desired GPU memory utilization "
    "(0.9, 20.24 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."
)
CRASH_TEXT = (
    "RuntimeError: reward server returned 401 for https://hub.example.org/api?token="
    + SECRET_TOKEN
    + " on completion \"<script>alert('xss')</script>\""
)


def knobs(**changes: Any) -> dict[str, Any]:
    out = dict(BASE_KNOBS)
    out.update(changes)
    return out


def unhealthy_values(step: int) -> dict[str, float]:
    values = default_values(step)
    values.update(
        {
            "reward": 0.0,
            "reward_std": 0.0,
            "completions/mean_length": 1024.0,
            "completions/clipped_ratio": 1.0,
        }
    )
    return values


def fixture_trials() -> list[TrialSpecFixture]:
    """The 16 trials of the committed fixture (one of every status)."""
    gb = 1e9
    t: list[TrialSpecFixture] = []
    # 0 baseline: utilization 0.3, rollout dominated, idle GPUs in rollout, 9 GB headroom.
    t.append(
        TrialSpecFixture(
            0,
            knobs(),
            TrialStatus.COMPLETE,
            "completed 6 steps; steady after 1 warm-up step",
            is_baseline=True,
            segs=[startup(mem_bytes=14.2 * gb)]
            + steps_of(
                6,
                rollout=rollout(duration_s=17, idle_frac=0.55, util_pct=90, mem_bytes=15.1 * gb),
                train=train(duration_s=9, mem_bytes=14.9 * gb),
                sync=sync(duration_s=1.5, mem_bytes=14.8 * gb),
                other=other(mem_bytes=14.6 * gb),
            ),
            estimate_peak_bytes=14.2 * gb,
        )
    )
    # 1 ZeRO-3 with offload: PCIe traffic during training, GPUs waiting.
    t.append(
        TrialSpecFixture(
            1,
            knobs(deepspeed="zero3_offload", vllm_gpu_memory_utilization=0.5),
            TrialStatus.COMPLETE,
            "completed 6 steps; steady after 1 warm-up step",
            segs=[startup(mem_bytes=13.0 * gb)]
            + steps_of(
                6,
                rollout=rollout(duration_s=12, idle_frac=0.18, mem_bytes=18.8 * gb),
                train=train(
                    duration_s=30,
                    idle_frac=0.5,
                    util_pct=85,
                    pcie_bytes_s=9.2e9,
                    mem_bytes=17.9 * gb,
                    host_cpu_pct=38,
                ),
                sync=sync(duration_s=3, mem_bytes=17.6 * gb, pcie_bytes_s=6e9),
                other=other(mem_bytes=17.5 * gb),
            ),
            estimate_peak_bytes=17.1 * gb,
        )
    )
    # 2 OOM: utilization 0.7 with micro-batch 4, in training (logits) on GPU 2.
    segs2 = [startup(mem_bytes=18.5 * gb)] + steps_of(
        1,
        rollout=rollout(duration_s=8, mem_bytes=21.2 * gb),
        train=train(duration_s=11, mem_bytes=22.9 * gb),
        sync=sync(mem_bytes=21.0 * gb),
        other=other(mem_bytes=21.0 * gb),
    )
    segs2 += [
        sync(duration_s=1.5, step=2, mem_bytes=21.1 * gb),
        rollout(duration_s=8, step=2, mem_bytes=21.3 * gb),
        train(
            duration_s=4,
            step=2,
            mem_bytes=22.9 * gb,
            mem_by_gpu={0: 22.9 * gb, 1: 22.9 * gb, 2: 24.0 * gb, 3: 22.8 * gb},
        ),
    ]
    t.append(
        TrialSpecFixture(
            2,
            knobs(vllm_gpu_memory_utilization=0.7, per_device_train_batch_size=4),
            TrialStatus.OOM,
            "CUDA out of memory on GPU 2 at step 2",
            evidence=OOM_TEXT_T2,
            exit_code=1,
            stderr=OOM_TEXT_T2,
            segs=segs2,
            open_end=True,
            estimate_peak_bytes=22.1 * gb,
        )
    )
    # 3 the winner: utilization 0.5, micro-batch 4.
    t.append(
        TrialSpecFixture(
            3,
            knobs(vllm_gpu_memory_utilization=0.5, per_device_train_batch_size=4),
            TrialStatus.COMPLETE,
            "completed 6 steps; steady after 1 warm-up step",
            segs=[startup(mem_bytes=16.0 * gb)]
            + steps_of(
                6,
                rollout=rollout(duration_s=8, idle_frac=0.12, mem_bytes=21.2 * gb),
                train=train(duration_s=8.5, mem_bytes=21.8 * gb),
                sync=sync(duration_s=1.5, mem_bytes=21.5 * gb),
                other=other(duration_s=0.8, mem_bytes=21.0 * gb),
            ),
            estimate_peak_bytes=20.9 * gb,
        )
    )
    # 4 dataloader stall: no workers, host CPU saturated while the GPUs wait between steps.
    t.append(
        TrialSpecFixture(
            4,
            knobs(vllm_gpu_memory_utilization=0.5, dataloader_num_workers=0),
            TrialStatus.COMPLETE,
            "completed 6 steps; steady after 1 warm-up step",
            segs=[startup(mem_bytes=15.0 * gb)]
            + steps_of(
                6,
                rollout=rollout(duration_s=10, idle_frac=0.12, mem_bytes=19.6 * gb),
                train=train(duration_s=8, mem_bytes=19.2 * gb),
                sync=sync(duration_s=1.5, mem_bytes=19.0 * gb),
                other=other(duration_s=7, host_cpu_pct=97.0, idle_frac=0.97, mem_bytes=18.9 * gb),
            ),
            estimate_peak_bytes=18.8 * gb,
        )
    )
    # 5 OOM at the weight sync: the ZeRO-3 gather on top of vLLM at utilization 0.6.
    sync_gather = sync(duration_s=2.5, mem_bytes=23.4 * gb)
    segs5 = [startup(mem_bytes=15.5 * gb)] + steps_of(
        2,
        rollout=rollout(duration_s=9, mem_bytes=20.1 * gb),
        train=train(duration_s=8, mem_bytes=20.4 * gb),
        sync=sync_gather,
        other=other(mem_bytes=19.8 * gb),
    )
    segs5.append(sync(duration_s=2.0, step=3, mem_bytes=24.1 * gb))
    t.append(
        TrialSpecFixture(
            5,
            knobs(vllm_gpu_memory_utilization=0.6),
            TrialStatus.OOM,
            "CUDA out of memory on GPU 0 at step 3",
            evidence=OOM_TEXT_T5,
            exit_code=1,
            stderr=OOM_TEXT_T5,
            segs=segs5,
            open_end=True,
            estimate_peak_bytes=20.6 * gb,
        )
    )
    # 6 utilization 0.7 fits with micro-batch 1.
    t.append(
        TrialSpecFixture(
            6,
            knobs(vllm_gpu_memory_utilization=0.7, per_device_train_batch_size=1),
            TrialStatus.COMPLETE,
            "completed 6 steps; steady after 1 warm-up step",
            segs=[startup(mem_bytes=17.0 * gb)]
            + steps_of(
                6,
                rollout=rollout(duration_s=7, idle_frac=0.1, mem_bytes=20.6 * gb),
                train=train(duration_s=12, mem_bytes=20.3 * gb),
                sync=sync(duration_s=1.5, mem_bytes=20.2 * gb),
                other=other(duration_s=0.8, mem_bytes=20.0 * gb),
            ),
            estimate_peak_bytes=19.9 * gb,
        )
    )
    # 7 HANG after step 2 at the weight sync (TP 2): GPUs busy-spin at low power.
    segs7 = [startup(mem_bytes=14.0 * gb)] + steps_of(
        2,
        rollout=rollout(duration_s=11, mem_bytes=19.3 * gb),
        train=train(duration_s=8, mem_bytes=19.1 * gb),
        sync=sync(duration_s=1.5, mem_bytes=19.0 * gb),
        other=other(mem_bytes=18.9 * gb),
    )
    segs7.append(
        Seg(
            "weight_sync",
            130,
            util_pct=100,
            idle_frac=0.0,
            power_frac=0.41,
            pcie_bytes_s=0.0,
            mem_bytes=19.0 * gb,
            step=3,
        )
    )
    t.append(
        TrialSpecFixture(
            7,
            knobs(vllm_gpu_memory_utilization=0.5, vllm_tensor_parallel_size=2),
            TrialStatus.HANG,
            "no step for 130 s after step 2 (limit max(5 x 21.5 s, 60 s) = 108 s); killed by the watchdog",
            evidence=None,
            exit_code=None,
            signal=15,
            segs=segs7,
            open_end=True,
            steady=False,
        )
    )
    # 8 UNHEALTHY: sleep level 2 rollouts degenerate.
    t.append(
        TrialSpecFixture(
            8,
            knobs(vllm_gpu_memory_utilization=0.5, sleep_level=2),
            TrialStatus.UNHEALTHY,
            "does not learn: every completion clipped at max_completion_length; reward_std 0",
            health=[
                "every completion clipped at max_completion_length (1024) on all 5 steps (baseline: 12 %)",
                "reward_std 0 on all 5 steps: every group of 8 completions got the same reward",
            ],
            segs=[startup(mem_bytes=12.0 * gb)]
            + steps_of(
                5,
                rollout=rollout(duration_s=13, mem_bytes=19.4 * gb),
                train=train(duration_s=8, mem_bytes=19.0 * gb),
                sync=sync(duration_s=3.5, mem_bytes=18.8 * gb, pcie_bytes_s=7e9),
                other=other(mem_bytes=18.6 * gb),
            ),
            step_values=unhealthy_values,
        )
    )
    # 9 PRUNED before launch by the memory estimate.
    t.append(
        TrialSpecFixture(
            9,
            knobs(deepspeed="zero2", vllm_gpu_memory_utilization=0.5, per_device_train_batch_size=4),
            TrialStatus.PRUNED,
            "predicted 31.8 GiB of 22.5 GiB per GPU: policy_weights 14.2 GiB, vllm_reserved 11.2 GiB, activations 3.1 GiB",
            launched=False,
            exit_code=None,
            estimate_peak_bytes=31.8 * 2**30,
        )
    )
    # 10 VLLM_INIT at utilization 0.9.
    t.append(
        TrialSpecFixture(
            10,
            knobs(vllm_gpu_memory_utilization=0.9),
            TrialStatus.VLLM_INIT,
            "vLLM refused to start: free memory below the requested utilization",
            evidence=VLLM_TEXT,
            exit_code=1,
            stderr=VLLM_TEXT,
            segs=[startup(duration_s=45, mem_bytes=10.2 * gb)],
            steady=False,
        )
    )
    # 11 HOST_OOM with sleep level 1 and full offload.
    segs11 = [startup(mem_bytes=9.0 * gb, rss_bytes=120e9, host_available_bytes=60e9)] + steps_of(
        1,
        rollout=rollout(duration_s=14, mem_bytes=13.0 * gb, rss_bytes=160e9, host_available_bytes=20e9),
        train=train(
            duration_s=25, mem_bytes=12.0 * gb, pcie_bytes_s=8e9, rss_bytes=185e9, host_available_bytes=0.4e9
        ),
    )
    t.append(
        TrialSpecFixture(
            11,
            knobs(deepspeed="zero3_offload", sleep_level=1, offload_model=True, offload_optimizer=True),
            TrialStatus.HOST_OOM,
            "killed by SIGKILL, not by autotune: the host ran out of memory",
            evidence="torch.distributed.elastic.multiprocessing.api:failed (exitcode: -9) local_rank: 1 (pid: 31337) of binary: /usr/bin/python3",
            exit_code=-9,
            signal=9,
            segs=segs11,
            steady=False,
        )
    )
    # 12 TIMEOUT: the trial budget ran out while it still made steps (no checkpointing, micro-batch 1).
    t.append(
        TrialSpecFixture(
            12,
            knobs(
                vllm_gpu_memory_utilization=0.4, per_device_train_batch_size=1, gradient_checkpointing=False
            ),
            TrialStatus.TIMEOUT,
            "trial budget of 150 s ran out after 3 steps",
            exit_code=None,
            signal=15,
            segs=[startup(mem_bytes=15.0 * gb)]
            + steps_of(
                3,
                rollout=rollout(duration_s=12, mem_bytes=18.0 * gb),
                train=train(duration_s=20, mem_bytes=19.5 * gb),
                other=other(mem_bytes=17.9 * gb),
            ),
            steady=False,
        )
    )
    # 13 INVALID: rejected at start-up.
    t.append(
        TrialSpecFixture(
            13,
            knobs(per_device_train_batch_size=3),
            TrialStatus.INVALID,
            "ms-swift rejected the arguments at start-up",
            evidence="ValueError: generation_batch_size (32) must be divisible by per_device_train_batch_size * world_size (12)",
            exit_code=1,
            stderr="Traceback (most recent call last):\n  ...\nValueError: generation_batch_size (32) must be divisible by per_device_train_batch_size * world_size (12)",
            steady=False,
        )
    )
    # 14 CRASH: the log line carries markup and a token; both must be neutralised in the report.
    t.append(
        TrialSpecFixture(
            14,
            knobs(vllm_gpu_memory_utilization=0.4, dataloader_num_workers=4),
            TrialStatus.CRASH,
            "exited with code 1 after step 1",
            evidence=CRASH_TEXT,
            exit_code=1,
            stderr=CRASH_TEXT,
            segs=[startup(mem_bytes=14.0 * gb)]
            + steps_of(
                1,
                rollout=rollout(duration_s=9, mem_bytes=17.0 * gb),
                train=train(duration_s=8, mem_bytes=17.2 * gb),
            ),
            steady=False,
        )
    )
    # 15 INTERRUPTED by the user.
    t.append(
        TrialSpecFixture(
            15,
            knobs(vllm_gpu_memory_utilization=0.4, per_device_train_batch_size=4),
            TrialStatus.INTERRUPTED,
            "stopped by the user during trial 15",
            exit_code=None,
            signal=2,
            segs=[startup(duration_s=20, mem_bytes=12.0 * gb)],
            steady=False,
        )
    )
    return t


def write_trial(
    root: Path, spec: TrialSpecFixture, *, original_root: str, n_gpus: int = 4, seed: int = 0
) -> TrialResult:
    """Write one trial directory and return its result."""
    d = root / "trials" / str(spec.number)
    d.mkdir(parents=True, exist_ok=True)
    plan = launch_plan(spec.number, spec.knobs, original_root)
    derived = {
        "world_size": 4,
        "gradient_accumulation_steps": max(
            1, GLOBAL_BATCH // (spec.knobs["per_device_train_batch_size"] * 4)
        ),
    }
    started = T_WALL0 + spec.number * 600.0
    estimate = None
    if spec.estimate_peak_bytes is not None:
        peak = int(spec.estimate_peak_bytes)
        estimate = {
            "components_bytes": {
                "policy_weights": int(peak * 0.2),
                "vllm_reserved": int(A10_BYTES * spec.knobs["vllm_gpu_memory_utilization"]),
                "activations": int(peak * 0.1),
            },
            "peak_bytes": peak,
            "capacity_bytes": A10_BYTES,
        }
    if not spec.launched:
        result = TrialResult(
            number=spec.number,
            params=spec.knobs,
            derived=derived,
            status=spec.status,
            reason=spec.reason,
            estimate=estimate,
        )
        (d / "result.json").write_text(json.dumps(result.model_dump(mode="json"), indent=2) + "\n")
        return result
    (d / "launch.json").write_text(json.dumps(plan.model_dump(mode="json"), indent=2) + "\n")
    (d / "command.sh").write_text(plan.to_shell())
    stdout = f"run sh: `/usr/bin/python3 -m torch.distributed.run --nproc_per_node 4 swift/cli/rlhf.py` (cwd {original_root}/trials/{spec.number})\n"
    stdout += f"wandb: Using WANDB_API_KEY={SECRET_WANDB}\n" + spec.stdout_extra
    synth = None
    if spec.segs:
        synth = synthesize(
            spec.segs,
            n_gpus=n_gpus,
            seed=seed + spec.number,
            t0_mono_s=T_MONO0 + spec.number * 600.0,
            step_values=spec.step_values,
        )
        if spec.open_end:
            open_last(synth)
        pd.DataFrame(synth.rows).to_parquet(d / "timeline.parquet", index=False)
        (d / "phases.jsonl").write_text("".join(json.dumps(m) + "\n" for m in synth.markers))
        (d / "metrics.jsonl").write_text("".join(s.model_dump_json() + "\n" for s in synth.steps))
        for s in synth.steps:
            stdout += json.dumps({"step": s.step, **s.values}) + "\n"
    (d / "stdout.log").write_text(stdout)
    (d / "stderr.log").write_text(spec.stderr + ("\n" if spec.stderr else ""))
    steps = synth.steps if synth else []
    summary = summarize(synth, n_gpus=n_gpus, cpu_cores=48) if synth else None
    peaks = [g["peak_mem_bytes"] for g in summary["gpus"]] if summary else []
    duration = (synth.end_mono_s - (T_MONO0 + spec.number * 600.0)) if synth else 2.0
    result = TrialResult(
        number=spec.number,
        params=spec.knobs,
        derived=derived,
        is_baseline=spec.is_baseline,
        status=spec.status,
        reason=spec.reason,
        evidence=spec.evidence,
        exit_code=spec.exit_code,
        signal=spec.signal,
        steps=len(steps),
        steady=steady_of(steps) if spec.steady else None,
        health=spec.health,
        peak_mem_bytes=peaks,
        framework_peak_mem_bytes=int(max(peaks) * 0.62) if peaks else None,
        host_peak_rss_bytes=summary["host"]["peak_rss_bytes"] if summary else None,
        timeline_summary=summary,
        estimate=estimate,
        started_wall_s=started,
        duration_s=round(duration, 2),
        startup_s=40.0 if steps else None,
        gpu_seconds=round(duration * n_gpus, 2),
        choice={"mode": "baseline"}
        if spec.is_baseline
        else {
            "mode": "refine" if spec.number % 2 == 0 else "explore",
            "predicted_throughput": 1.2 + 0.05 * spec.number,
            "expected_gain_frac": 0.04,
            "failure_risk": 0.08,
            "incumbent": 0,
            "move": {k: [None, v] for k, v in list(spec.knobs.items())[:2]},
        },
    )
    (d / "result.json").write_text(json.dumps(result.model_dump(mode="json"), indent=2) + "\n")
    return result


def space_describe() -> list[dict[str, Any]]:
    def knob(name: str, typ: str, values: list[Any], default: Any, memory: bool = True) -> dict[str, Any]:
        return {
            "name": name,
            "type": typ,
            "values": values,
            "default": default,
            "when": {},
            "applies": "gpu",
            "memory": memory,
            "help": "",
        }

    return [
        knob("per_device_train_batch_size", "int", [1, 2, 3, 4], 2),
        knob("gradient_checkpointing", "bool", [True, False], True),
        knob("dataloader_num_workers", "int", [0, 1, 2, 4], 1, memory=False),
        knob("deepspeed", "str", ["zero2", "zero3", "zero3_offload"], "zero3"),
        knob("vllm_gpu_memory_utilization", "float", [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9], 0.3),
        knob("vllm_tensor_parallel_size", "int", [1, 2, 4], 4),
        knob("sleep_level", "int", [0, 1, 2], 0),
        knob("offload_optimizer", "bool", [False, True], False),
        knob("offload_model", "bool", [False, True], False),
        knob("move_model_batches", "int", [None, 4, 8, 16], None),
    ]


def study_settings(
    results: list[TrialResult], *, original_root: str = ORIGINAL_ROOT, n_gpus: int = 4
) -> dict[str, Any]:
    """``study.json`` of the fixture search."""
    return {
        "name": "qwen2-7b-a10",
        "created_wall_s": T_WALL0 - 60,
        "finished_wall_s": T_WALL0 + 16 * 600.0,
        "backend": "swift",
        "backend_version": "4.6.0",
        "command": f"autotune search --backend swift --gpus 4 --model Qwen/Qwen2-7B --trials 16 --out {original_root} -- --hub_token {SECRET_TOKEN}",
        "model": {
            "name": "Qwen2-7B",
            "path_or_id": "Qwen/Qwen2-7B",
            "local": False,
            "facts": {"params": 7615616512, "layers": 28, "hidden": 3584, "vocab": 152064},
        },
        "hardware": hardware(n_gpus).model_dump(mode="json"),
        "global_batch": GLOBAL_BATCH,
        "num_generations": 8,
        "max_steps": 12,
        "max_completion_length": COMPLETION_TOKENS,
        "fixed": {
            "tuner_type": "lora",
            "lora_rank": 16,
            "beta": 0.04,
            "use_vllm": True,
            "vllm_mode": "colocate",
            "max_prompt_length": 512,
            "hub_token": SECRET_TOKEN,  # given after --, as the search job reads it
        },
        "dataset": f"{original_root}/../data/math.jsonl",
        "seed": 0,
        "space": space_describe(),
        "dropped_knobs": {"num_processes": "CPU-only knob; this study runs on GPUs"},
        "versions": {
            "autotune": "0.1.0",
            "python": "3.11.9",
            "torch": "2.5.1+cu124",
            "ms-swift": "4.6.0",
            "trl": "0.29.1",
            "transformers": "5.19.0",
            "deepspeed": "0.16.4",
            "vllm": "0.8.5",
        },
        "search": "auto",
        "budget": {"trials": 16, "time_s": None},
        "storage": "sqlite:///study.db",
        "outcome": {
            "stopped": "budget",
            "detail": f"{len(results)} trials run",
            "trials_run": sum(1 for r in results if r.status is not TrialStatus.PRUNED),
            "gpu_seconds": round(sum(r.gpu_seconds for r in results), 1),
        },
    }


def write_study(
    root: Path, specs: list[TrialSpecFixture], *, original_root: str = ORIGINAL_ROOT, n_gpus: int = 4
) -> list[TrialResult]:
    """Write a study of the given trials (and its ``study.json``) into ``root`` (emptied first)."""
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    results = [write_trial(root, spec, original_root=original_root, n_gpus=n_gpus) for spec in specs]
    (root / "study.json").write_text(
        json.dumps(study_settings(results, original_root=original_root, n_gpus=n_gpus), indent=2) + "\n"
    )
    return results


def spec(number: int) -> TrialSpecFixture:
    """One trial of the fixture by number (for tests that build smaller studies)."""
    return next(s for s in fixture_trials() if s.number == number)


def build_study(root: Path, *, original_root: str = ORIGINAL_ROOT) -> list[TrialResult]:
    """Write the full fixture study into ``root`` (emptied first), with the exported winner in best/."""
    results = write_study(root, fixture_trials(), original_root=original_root)
    best = root / "best"
    best.mkdir()
    winner = spec(3)
    plan = launch_plan(3, winner.knobs, original_root)
    plan = plan.model_copy(
        update={"cwd": original_root, "argv": tuple(a if a != "12" else "1000" for a in plan.argv)}
    )
    (best / "command.sh").write_text(plan.to_shell())
    (best / "knobs.json").write_text(json.dumps(winner.knobs, indent=2) + "\n")
    return results


def build_cpu_study(root: Path) -> None:
    """A small CPU-only study (no GPU rows, host samples and markers only) for tolerance tests."""
    if root.exists():
        shutil.rmtree(root)
    (root / "trials").mkdir(parents=True)
    hw = Hardware(
        host=HostInfo(
            hostname="ci",
            cpu_cores_logical=2,
            cpu_cores_physical=1,
            ram_total_bytes=24 * 2**30,
            platform="Linux",
        )
    )
    for number, bs in enumerate((4, 16, 8)):
        d = root / "trials" / str(number)
        d.mkdir()
        segs = [Seg(None, 4, host_cpu_pct=60, rss_bytes=0.5e9)]
        for step in range(1, 6):
            segs.append(Seg("rollout", 2.0 / (1 + number), host_cpu_pct=95, rss_bytes=0.55e9, step=step))
            segs.append(Seg("train", 1.0, host_cpu_pct=99, rss_bytes=0.6e9, step=step, ends_step=True))
        synth = synthesize(
            segs, n_gpus=0, seed=number, t0_mono_s=100.0 + 100 * number, rate_hz=2.0, cpu_cores=2
        )
        pd.DataFrame(synth.rows).to_parquet(d / "timeline.parquet", index=False)
        (d / "phases.jsonl").write_text("".join(json.dumps(m) + "\n" for m in synth.markers))
        (d / "metrics.jsonl").write_text("".join(s.model_dump_json() + "\n" for s in synth.steps))
        summary = summarize(synth, n_gpus=0, cpu_cores=2)
        result = TrialResult(
            number=number,
            params={"per_device_train_batch_size": bs, "gradient_checkpointing": number == 2},
            is_baseline=number == 0,
            status=TrialStatus.COMPLETE,
            reason="completed 5 steps",
            exit_code=0,
            steps=5,
            steady=steady_of(synth.steps),
            timeline_summary=summary,
            host_peak_rss_bytes=summary["host"]["peak_rss_bytes"],
            duration_s=synth.end_mono_s - (100.0 + 100 * number),
            gpu_seconds=synth.end_mono_s - (100.0 + 100 * number),
        )
        (d / "result.json").write_text(json.dumps(result.model_dump(mode="json"), indent=2) + "\n")
    settings = {
        "name": "cpu-tiny",
        "backend": "trl",
        "command": "autotune search --backend trl --model tiny",
        "model": {"name": "tiny-qwen2", "path_or_id": "tiny", "facts": {}},
        "hardware": hw.model_dump(mode="json"),
        "global_batch": GLOBAL_BATCH,
        "num_generations": 4,
        "versions": {"autotune": "0.1.0"},
        "outcome": {"stopped": "budget", "detail": "", "trials_run": 3, "gpu_seconds": 40.0},
    }
    (root / "study.json").write_text(json.dumps(settings, indent=2) + "\n")


def main(argv: list[str]) -> int:
    target = Path(argv[1]) if len(argv) > 1 else FIXTURE_DIR
    results = build_study(target)
    print(f"wrote {len(results)} trials to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
