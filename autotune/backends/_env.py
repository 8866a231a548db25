"""The environment every GPU trial gets, whatever its framework: one place, read from the trial's meaning.

A backend calls :func:`gpu_trial_env` with the trial's :class:`~autotune.jobconfig.JobConfig` (what
:meth:`Backend.describe` says it means) and merges the result into its launch plan; nothing here knows a
framework's knob names.

- ``CUDA_VISIBLE_DEVICES`` lists NVML indices, so ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes CUDA number
  the GPUs the same way (CUDA's default, FASTEST_FIRST, differs on mixed-GPU hosts: the trial would run
  on other GPUs than the ones autotune samples).
- A trial whose DeepSpeed optimizer or parameters live on the CPU (CPU Adam) gets
  ``OMP_NUM_THREADS = max(1, usable cores // processes)``: torchrun sets 1 when it is unset, and CPU
  Adam then runs one thread per rank. A value the user exported holds; either way the plan records it,
  so the exported job runs what was measured.
- A trial whose vLLM sleeps between rollouts runs without ``expandable_segments:True`` in
  ``PYTORCH_CUDA_ALLOC_CONF``: vLLM's ``CuMemAllocator`` refuses it (an assert up to vLLM 0.2x; later
  releases switch it off around their own allocations). The user's other allocator settings are kept.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from autotune import affinity
from autotune.jobconfig import JobConfig

__all__ = ["ALLOC_CONF", "TrialEnv", "gpu_trial_env", "usable_cores", "without_expandable_segments"]

#: PyTorch's caching-allocator settings (``key:value`` items, comma separated).
ALLOC_CONF = "PYTORCH_CUDA_ALLOC_CONF"
_EXPANDABLE = "expandable_segments:true"


@dataclass(frozen=True)
class TrialEnv:
    """Variables a trial sets on top of the inherited environment, and the ones it removes."""

    env: dict[str, str] = field(default_factory=dict)
    unset: tuple[str, ...] = ()


def usable_cores() -> int:
    """How many CPU cores this process may run on (its affinity: :func:`autotune.affinity.usable_cores`)."""
    return len(affinity.usable_cores())


def without_expandable_segments(conf: str) -> str:
    """``conf`` (a ``PYTORCH_CUDA_ALLOC_CONF`` value) without its ``expandable_segments:True`` item."""
    items = [item.strip() for item in conf.split(",")]
    return ",".join(item for item in items if item and item.replace(" ", "").lower() != _EXPANDABLE)


def _cpu_adam(job: JobConfig) -> bool:
    return job.deepspeed and (job.ds_offload_optimizer or job.ds_offload_param)


def _vllm_sleeps(job: JobConfig) -> bool:
    return job.use_vllm and job.sleep_level > 0


def gpu_trial_env(
    gpu_indices: str, job: JobConfig | None, environ: Mapping[str, str] | None = None
) -> TrialEnv:
    """The environment of a GPU trial of ``job`` on the GPUs ``gpu_indices`` (NVML indices, comma separated).

    Args:
        gpu_indices: ``TrialContext.cuda_visible_devices``.
        job: what the trial means (:meth:`Backend.describe`); None where it cannot be told (a user's own
            command whose knobs mean nothing to autotune): the GPUs and their numbering only.
        environ: the environment the trial inherits; default ``os.environ``.
    """
    environ = os.environ if environ is None else environ
    env = {"CUDA_VISIBLE_DEVICES": gpu_indices, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    unset: tuple[str, ...] = ()
    if job is None:
        return TrialEnv(env, unset)
    if _cpu_adam(job):
        env["OMP_NUM_THREADS"] = environ.get("OMP_NUM_THREADS") or str(
            max(1, usable_cores() // max(1, job.world_size))
        )
    conf = environ.get(ALLOC_CONF)
    if _vllm_sleeps(job) and conf is not None:
        kept = without_expandable_segments(conf)
        if kept != conf:
            if kept:
                env[ALLOC_CONF] = kept
            else:
                unset = (ALLOC_CONF,)
    return TrialEnv(env, unset)
