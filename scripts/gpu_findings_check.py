"""Re-check on one real GPU what the framework-source review (gpu-path-review.md) could only read.

Needs torch (CUDA build), transformers is not used, nvidia-ml-py; not autotune, vLLM or a network.
About a minute on an H100. Prints one JSON object and writes it to ``--out`` (default
``gpu_findings_check.json``); each check says what it measured and what autotune assumes.

    python scripts/gpu_findings_check.py --out docs/gpu/findings_check.json

Checks (review item → what is measured):
- #4 failure text: the exact text this torch prints for a CUDA OOM and, on a single-rank NCCL group
  started with almost no free memory, what NCCL prints (autotune classes ``(?i:CUDA out of memory)``,
  ``(?i:CUDA error: out of memory)`` and ``(?i:Cuda failure \\d* ?'out of memory')`` as OOM); each text
  is matched here against those regexes (copied from autotune/trial/evidence.py).
- #8 vLLM's token-budget default: the device name and total memory vLLM's ``get_batch_defaults`` reads
  (``torch.cuda.mem_get_info`` total ≥ 70 GiB and "a100" not in the lower-cased name → 16384, else
  8192), and what autotune's estimator picks for the same GPU.
- #20 vLLM's budget total: ``cudaMemGetInfo`` total against NVML's total (v1) and v2's ``reserved``.
- #7 per-process overhead: NVML used memory of a process that only made a CUDA context and a cuBLAS
  handle (the estimator counts 0.5 GiB), and of a second such process beside it.
- #14 container PIDs: whether NVML's process list holds this process's PID.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from typing import Any

GIB = 2**30
OOM_PATTERNS = (
    r"(?i:CUDA out of memory)",
    r"(?i:CUDA error: out of memory)",
    r"(?i:Cuda failure \d* ?'out of memory')",
)

_CONTEXT_CHILD = r"""
import time, torch
torch.cuda.init(); a = torch.ones(1024, 1024, device="cuda"); (a @ a).sum().item()
print("ready", flush=True); time.sleep(30)
"""

_NCCL_CHILD = r"""
import os, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517", RANK="0", WORLD_SIZE="1")
torch.cuda.set_device(0)
free, _ = torch.cuda.mem_get_info()
hog = torch.empty(max(0, free - 8 * 2**20), dtype=torch.uint8, device="cuda")  # leave ~8 MiB
dist.init_process_group("nccl", device_id=torch.device("cuda:0"))
x = torch.ones(1 << 20, device="cuda")
dist.all_reduce(x); torch.cuda.synchronize()
print("all_reduce succeeded with ~8 MiB free", flush=True)
"""


def _classified(text: str) -> list[str]:
    return [p for p in OOM_PATTERNS if any(re.search(p, line) for line in text.splitlines())]


def _nvml() -> Any:
    import pynvml

    pynvml.nvmlInit()
    return pynvml


def check_oom_text() -> dict[str, Any]:
    import torch

    try:
        torch.empty(
            int(4 * torch.cuda.get_device_properties(0).total_memory), dtype=torch.uint8, device="cuda"
        )
        text = "no error"
    except torch.OutOfMemoryError as exc:
        text = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
    torch.cuda.empty_cache()
    return {"text": text.splitlines()[0][:300], "matched": _classified(text)}


def check_nccl_oom() -> dict[str, Any]:
    env = {**os.environ, "NCCL_DEBUG": "WARN"}
    proc = subprocess.run(
        [sys.executable, "-c", _NCCL_CHILD], capture_output=True, text=True, timeout=180, env=env
    )
    text = proc.stdout + proc.stderr
    lines = [ln for ln in text.splitlines() if "memory" in ln.lower() or "Error" in ln][-6:]
    return {"exit_code": proc.returncode, "lines": lines, "matched": _classified(text)}


def check_totals() -> dict[str, Any]:
    import torch

    nvml = _nvml()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    v1 = nvml.nvmlDeviceGetMemoryInfo(h)
    out: dict[str, Any] = {"nvml_total_bytes": int(v1.total), "nvml_used_bytes": int(v1.used)}
    try:
        v2 = nvml.nvmlDeviceGetMemoryInfo(h, version=nvml.nvmlMemory_v2)
        out["nvml_v2_reserved_bytes"] = int(v2.reserved)
    except Exception as exc:  # noqa: BLE001 - a driver without v2: say so
        out["nvml_v2"] = f"unavailable: {exc}"
    free, total = torch.cuda.mem_get_info(0)
    name = torch.cuda.get_device_properties(0).name
    out.update(cuda_total_bytes=int(total), cuda_free_bytes=int(free), device_name=name)
    out["nvml_minus_cuda_total_gib"] = round((int(v1.total) - int(total)) / GIB, 3)
    # vLLM engine/arg_utils.py get_batch_defaults (LLM class): what autotune's estimator copies
    large = total >= 70 * GIB and "a100" not in name.lower()
    out["vllm_default_batched_tokens"] = 16384 if total >= 160 * GIB or large else 8192
    return out


def check_contexts() -> dict[str, Any]:
    nvml = _nvml()
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    children = []
    used: list[int] = [int(nvml.nvmlDeviceGetMemoryInfo(h).used)]
    try:
        for _ in range(2):
            child = subprocess.Popen(
                [sys.executable, "-c", _CONTEXT_CHILD], stdout=subprocess.PIPE, text=True
            )
            children.append(child)
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            used.append(int(nvml.nvmlDeviceGetMemoryInfo(h).used))
        procs = nvml.nvmlDeviceGetComputeRunningProcesses(h)
        pids = {int(p.pid) for p in procs}
        per_process = {int(p.pid): int(p.usedGpuMemory or 0) for p in procs}
    finally:
        for child in children:
            child.kill()
            child.wait()
    return {
        "used_bytes_before_one_two": used,
        "context_gib_each": [round((b - a) / GIB, 3) for a, b in zip(used, used[1:], strict=False)],
        "estimator_context_gib": 0.5,
        "nvml_lists_child_pids": sorted(c.pid for c in children if c.pid in pids),
        "nvml_process_memory": per_process,
        "child_pids": [c.pid for c in children],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_findings_check.json")
    args = ap.parse_args()
    report: dict[str, Any] = {}
    for name, check in (
        ("totals_#8_#20", check_totals),
        ("contexts_#7_#14", check_contexts),
        ("oom_text_#4", check_oom_text),
        ("nccl_oom_#4", check_nccl_oom),
    ):
        try:
            report[name] = check()
        except Exception as exc:  # noqa: BLE001 - one failed check must not hide the others
            report[name] = {"error": f"{type(exc).__name__}: {exc}"}
    text = json.dumps(report, indent=2, default=str)
    print(text)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text + "\n")


if __name__ == "__main__":
    main()
