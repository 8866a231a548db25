"""What a study runs on: detected GPUs (NVML), GPUs the user declares, and the host.

Detection is the only hardware read here; it goes through :func:`probes.nvml.detect_gpus`. The CLI
turns every problem into one line (:class:`~autotune.errors.HardwareError`, exit code 2).
"""

from __future__ import annotations

import os
import platform
import socket
from collections.abc import Callable
from typing import Any

import psutil

from autotune.errors import HardwareError
from autotune.probes.nvml import GpuDetection, NvmlUnavailable, detect_gpus
from autotune.records import GpuInfo, Hardware, HostInfo

__all__ = ["host_info", "detect", "resolve_hardware", "visible_devices"]

GIB = 1024**3


def host_info() -> HostInfo:
    """CPU cores and RAM of this host."""
    return HostInfo(
        hostname=socket.gethostname(),
        cpu_cores_logical=os.cpu_count() or 1,
        cpu_cores_physical=psutil.cpu_count(logical=False),
        ram_total_bytes=int(psutil.virtual_memory().total),
        platform=f"{platform.system()} {platform.release()} ({platform.machine()})",
    )


def detect(detector: Callable[[], GpuDetection] = detect_gpus) -> tuple[GpuDetection | None, str | None]:
    """Detected GPUs, or None and the reason NVML is unavailable."""
    try:
        return detector(), None
    except NvmlUnavailable as exc:
        return None, str(exc)


def _declared(n: int, gpu_type: str | None, gpu_memory_gib: float | None) -> tuple[GpuInfo, ...]:
    name = gpu_type or "declared GPU"
    memory_bytes: int | None = int(gpu_memory_gib * GIB) if gpu_memory_gib else None
    if gpu_type and memory_bytes is None:
        from autotune.estimate import find_gpu, gpu_variants

        variants = gpu_variants(gpu_type)
        if variants:
            raise HardwareError(
                f"GPU type {gpu_type!r} is ambiguous: it could be {', '.join(variants)}",
                hint=f"Name one with --gpu-type (e.g. --gpu-type {variants[-1]}), or give --gpu-memory-gib",
            )
        spec = find_gpu(gpu_type)
        if spec is None:
            from autotune.estimate import known_gpus

            raise HardwareError(
                f"unknown GPU type {gpu_type!r}",
                hint=f"Use one of {', '.join(known_gpus())}, or give its memory with --gpu-memory-gib",
            )
        name, memory_bytes = spec.name, spec.memory_bytes
    assert memory_bytes is not None  # one of gpu_type / gpu_memory_gib is set by the caller
    return tuple(
        GpuInfo(index=i, name=name, memory_total_bytes=memory_bytes, declared=True) for i in range(n)
    )


def visible_devices(devices: tuple[Any, ...], cuda_visible: str | None) -> tuple[Any, ...]:
    """The detected GPUs this process may use: those ``CUDA_VISIBLE_DEVICES`` names, in its order.

    NVML lists every GPU of the host whatever ``CUDA_VISIBLE_DEVICES`` says, so a worker started on GPUs
    4–7 (by hand, by Slurm) would otherwise take GPUs 0–3. Entries are NVML indices (the numbers of
    ``nvidia-smi``) or GPU UUIDs (``GPU-…``, a prefix is enough); unset: every GPU; empty: none.

    Raises:
        HardwareError: an entry names no detected GPU.
    """
    if cuda_visible is None:
        return devices
    chosen = []
    for entry in (e.strip() for e in cuda_visible.split(",")):
        if not entry:
            continue
        if entry.isdigit():
            match = [d for d in devices if d.index == int(entry)]
        else:
            match = [d for d in devices if d.uuid and d.uuid.startswith(entry)]
        if not match:
            known = ", ".join(str(d.index) for d in devices) or "none"
            raise HardwareError(
                f"CUDA_VISIBLE_DEVICES names GPU {entry!r}, which NVML does not list (it lists {known})",
                hint="Set CUDA_VISIBLE_DEVICES to NVML indices (nvidia-smi's numbers) or GPU UUIDs, or unset it",
            )
        if match[0] not in chosen:
            chosen.append(match[0])
    return tuple(chosen)


def resolve_hardware(
    gpus: int | None,
    *,
    gpu_type: str | None = None,
    gpu_memory_gib: float | None = None,
    detector: Callable[[], GpuDetection] = detect_gpus,
    allow_cpu: bool = True,
    runs_trials: bool = False,
) -> Hardware:
    """Select the GPUs a command uses.

    Args:
        gpus: how many GPUs; None takes every detected GPU (none → a CPU-only run when ``allow_cpu``).
        gpu_type: declare GPUs this host cannot see (a launch node, or planning ahead).
        gpu_memory_gib: declare GPU memory directly (for GPU types not in the catalog).
        detector: NVML detection (tests pass a fake).
        allow_cpu: whether a run without GPUs is acceptable.
        runs_trials: the command runs trials here (``search``): a hint never sends it to declare GPUs
            this host lacks, since its trials would then fail.

    Raises:
        HardwareError: ``--gpus 0``, more GPUs than detected without a declaration, an unknown type.
    """
    if gpus is not None and gpus < 1:
        raise HardwareError(
            f"--gpus must be at least 1, got {gpus}",
            hint="Omit --gpus to use every detected GPU (or the CPU when there is none)",
        )
    if gpu_memory_gib is not None and gpu_memory_gib <= 0:
        raise HardwareError(
            f"--gpu-memory-gib must be positive, got {gpu_memory_gib}", hint="Give the memory per GPU in GiB"
        )
    detection, note = detect(detector)
    detected = visible_devices(detection.devices, os.environ.get("CUDA_VISIBLE_DEVICES")) if detection else ()
    host = host_info()
    declared = gpu_type is not None or gpu_memory_gib is not None
    if gpus is None and not declared:
        if not detected and not allow_cpu:
            raise HardwareError(
                f"no GPU detected ({note or 'NVML lists none'})",
                hint="Declare the GPUs with --gpus N --gpu-type A10 (or --gpu-memory-gib 24)",
            )
        chosen = detected
    elif gpus is not None and gpus <= len(detected):
        chosen = detected[:gpus]
    elif declared:
        n = gpus if gpus is not None else 1
        return Hardware(
            gpus=_declared(n, gpu_type, gpu_memory_gib),
            host=host,
            driver_version=detection.driver_version if detection else None,
            cuda_driver_version=detection.cuda_driver_version if detection else None,
            nvml_note=note or f"{n} GPU(s) declared; {len(detected)} visible to NVML on this host",
        )
    else:
        seen = f"NVML sees {len(detected)}" if detection else f"NVML is unavailable: {note}"
        if not runs_trials:
            hint = "Use fewer --gpus, or declare GPUs this host cannot see with --gpu-type A10 or --gpu-memory-gib 24"
        elif detected:
            hint = f"Use --gpus {len(detected)} or fewer: trials run on the GPUs this host has"
        else:
            hint = (
                "Run the search on the host with the GPUs (trials run here), or drop --gpus to tune on the CPU; "
                f"`autotune plan --gpus {gpus} --gpu-type A10` plans for GPUs this host lacks"
            )
        raise HardwareError(f"asked for {gpus} GPU(s) but {seen}", hint=hint)
    gpu_infos = tuple(
        GpuInfo(
            index=d.index,
            name=d.name,
            memory_total_bytes=d.memory_total_bytes,
            uuid=d.uuid,
            compute_capability=d.compute_capability,
        )
        for d in chosen
    )
    return Hardware(
        gpus=gpu_infos,
        host=host,
        driver_version=detection.driver_version if detection else None,
        cuda_driver_version=detection.cuda_driver_version if detection else None,
        nvml_note=note,
    )
