"""Facts about the winner's job that every format needs: data, rewards, precision, a header."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from autotune.export._common import MARKER
from autotune.export._winner import Winner
from autotune.values import as_bool

__all__ = [
    "DEMO_PROMPTS",
    "demo_prompts",
    "KEPT_ENV",
    "header",
    "precision",
    "trial_environment",
    "user_dataset",
    "uses_demo_reward",
]

DEMO_PROMPTS = "prompts.jsonl"


def user_dataset(w: Winner, fixed: dict[str, Any]) -> Any:
    """The dataset the user named (``--dataset`` or a fixed ``dataset``), or None for autotune's prompts."""
    return fixed.get("dataset") or w.settings.dataset or None


def demo_prompts(w: Winner, fixed: dict[str, Any]) -> Path | None:
    """autotune's generated prompts the trial trained on (in its directory), or None when the user gave data."""
    if user_dataset(w, fixed) is not None:
        return None
    return w.trial_dir / DEMO_PROMPTS


def uses_demo_reward(w: Winner, fixed: dict[str, Any]) -> bool:
    """True when the trial scored completions with autotune's demo reward."""
    return w.backend_class.uses_demo_reward(fixed)


def precision(w: Winner, fixed: dict[str, Any]) -> tuple[bool, bool]:
    """``(bf16, fp16)`` of the job: off on a CPU-only study; else the user's choice; else bf16 where
    every GPU supports it (compute capability ≥ 8.0) and fp16 otherwise, as ms-swift's ``auto`` does."""
    if w.cpu_only:
        return False, False
    if "bf16" in fixed or "fp16" in fixed:
        return as_bool(fixed.get("bf16", False)), as_bool(fixed.get("fp16", False))
    dtype = str(fixed.get("torch_dtype") or fixed.get("dtype") or "").lower()
    if dtype in ("bfloat16", "bf16"):
        return True, False
    if dtype in ("float16", "fp16", "half"):
        return False, True
    caps = [g.compute_capability for g in w.hardware.gpus] if w.hardware is not None else []
    old = [c for c in caps if c and _major(c) is not None and (_major(c) or 0) < 8]
    return (False, True) if old else (True, False)


def _major(capability: str) -> int | None:
    try:
        return int(capability.split(".")[0])
    except ValueError:
        return None


#: variables of a trial's environment that change its speed or its devices: an export that runs the
#: winner keeps the values the trial ran with (thread counts differ from one host to the next)
KEPT_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")


def trial_environment(w: Winner) -> dict[str, str]:
    """The variables of :data:`KEPT_ENV` the winning trial was launched with (none it inherited)."""
    env = w.launch.env if w.launch is not None else {}
    return {name: env[name] for name in KEPT_ENV if name in env}


def header(w: Winner, fmt: str) -> list[str]:
    """Comment lines that open every exported text file: the marker, the trial, what was measured."""
    name = w.study_name
    lines = [f"{MARKER} (--format {fmt}) from study {name}, trial {w.number}: {w.why}."]
    r = w.result
    measured = []
    if r.throughput:
        measured.append(f"{r.throughput:.3g} completions/s")
    if r.steady is not None and r.steady.tokens_per_s:
        measured.append(f"{r.steady.tokens_per_s:.4g} tokens/s")
    peaks = [p for p in r.peak_mem_bytes if p is not None]
    if peaks:
        measured.append(f"peak GPU memory {max(peaks) / 2**30:.1f} GiB")
    where = "CPU only"
    if w.hardware is not None and w.hardware.gpus:
        names = sorted({g.name for g in w.hardware.gpus})
        where = f"{len(w.hardware.gpus)}x {' / '.join(names)}"
    gb = w.settings.global_batch
    g = w.settings.num_generations
    version = w.settings.backend_version
    label = w.backend_class.display_name
    ran = f"{label} {version}" if version else label
    lines.append(
        f"Measured {', '.join(measured) or 'no throughput'} at a global batch of {gb} completions "
        f"({g} per prompt) on {where}, with {ran}."
    )
    if w.recommended and w.recommendation is not None:
        from autotune.recommend import headline

        lines.append(f"Verdict: {headline(w.recommendation)}.")
    return lines
