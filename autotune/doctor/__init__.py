"""``autotune doctor``: know the machine before tuning it.

Checks (one class each behind :class:`Check`, listed in :data:`CHECKS`) read :class:`Facts` gathered
once (:func:`gather_facts`: NVML through the probes' gate, package metadata, the host) and say ok / warn
/ fail with the fix. :func:`preflight` is the quick subset ``autotune search`` runs before its first
trial. :func:`run_bench` is ``--bench`` (torch is imported only when a GPU is measured).
"""

from __future__ import annotations

from autotune.doctor._base import Check, DoctorReport, Facts, Finding, HostFacts, InterpreterFacts, Status
from autotune.doctor._bench import BenchOutcome, GpuPeakNumbers, measure_gpu_peaks, run_bench
from autotune.doctor._facts import gather_facts, host_facts, offload_need_bytes
from autotune.doctor._frameworks import Conflict, conflicts
from autotune.doctor._gpu import torch_cuda_version
from autotune.doctor._interpreter import read_interpreter
from autotune.doctor._run import CHECKS, preflight, run_checks

__all__ = [
    "CHECKS",
    "BenchOutcome",
    "GpuPeakNumbers",
    "Check",
    "Conflict",
    "DoctorReport",
    "Facts",
    "Finding",
    "HostFacts",
    "Status",
    "conflicts",
    "gather_facts",
    "host_facts",
    "InterpreterFacts",
    "read_interpreter",
    "measure_gpu_peaks",
    "offload_need_bytes",
    "preflight",
    "run_bench",
    "run_checks",
    "torch_cuda_version",
]
