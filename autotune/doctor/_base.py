"""The doctor's contract: a check reads :class:`Facts` (gathered once) and says ok / warn / fail, with
the fix; the report is every check's findings and the exit code."""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from autotune.probes.gpu_health import GpuHealth

__all__ = ["Status", "Finding", "Check", "Facts", "HostFacts", "InterpreterFacts", "DoctorReport"]


class Status(str, enum.Enum):
    """How a check came out. Only ``FAIL`` makes ``autotune doctor`` exit non-zero and stops a search."""

    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Finding:
    """One line of the doctor: what was checked, how it came out, and what to do (empty when ok)."""

    check: str
    status: Status
    detail: str
    fix: str = ""

    def line(self) -> str:
        """``ok   name: detail`` (and ``; fix`` when there is one)."""
        fix = f". Fix: {self.fix}" if self.fix else ""
        return f"{self.status.value:<4} {self.check}: {self.detail}{fix}"

    def to_dict(self) -> dict[str, str]:
        return {"check": self.check, "status": self.status.value, "detail": self.detail, "fix": self.fix}


@dataclass(frozen=True)
class HostFacts:
    """The host, as read once. None: could not be read here.

    Attributes:
        shm_total_bytes: size of ``/dev/shm``.
        open_files_soft: the soft ``RLIMIT_NOFILE``.
        open_files_hard: the hard ``RLIMIT_NOFILE``.
        out_dir: the directory studies are written under (``--out``).
        disk_free_bytes: free bytes on the file system holding ``out_dir``.
        ram_total_bytes: host RAM.
        ram_available_bytes: RAM available without swapping.
        offload_need_bytes: host RAM a fully offloaded ZeRO-3 run of ``--model`` needs (None: no model).
        model: the ``--model`` that need is for.
        out_problem: why ``out_dir`` cannot be made or written here (the folder that stops it and the
            system's words), None when it can.
        cache_dir: autotune's cache (``$AUTOTUNE_CACHE_DIR``, else ``~/.cache/autotune``): the built-in
            models, ``--bench``'s peaks, ``--calibrate``'s table.
        cache_problem: why ``cache_dir`` cannot be made or written here, None when it can.
    """

    shm_total_bytes: int | None
    open_files_soft: int | None
    open_files_hard: int | None
    out_dir: Path
    disk_free_bytes: int | None
    ram_total_bytes: int
    ram_available_bytes: int
    offload_need_bytes: int | None = None
    model: str | None = None
    out_problem: str | None = None
    cache_dir: Path | None = None
    cache_problem: str | None = None


class InterpreterFacts(BaseModel):
    """What one interpreter has installed, as its own ``importlib.metadata`` reads it.

    Attributes:
        python: the interpreter read (its ``sys.executable``).
        python_version: ``"3.11.7"``.
        packages: installed distribution → version (only those installed).
        requirements: installed watched distribution → its ``Requires-Dist`` lines.
        importable: installed framework → whether its import package is found.
        torch_version_read: torch's ``torch/version.py`` was found and read.
        torch_cuda: the CUDA torch was built for, from that file (None: a CPU build, or not read).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    python: str
    python_version: str
    packages: dict[str, str] = {}
    requirements: dict[str, tuple[str, ...]] = {}
    importable: dict[str, bool] = {}
    torch_version_read: bool = False
    torch_cuda: str | None = None

    def torch_cuda_build(self) -> tuple[str | None, bool] | None:
        """``(cuda, cpu_only)`` as torch's own version file says, or None when it was not read."""
        if not self.torch_version_read:
            return None
        return self.torch_cuda, self.torch_cuda is None


@dataclass(frozen=True)
class Facts:
    """Everything the checks read, gathered once (``gather_facts``; tests build it from fakes).

    Attributes:
        driver_version: the NVIDIA driver (None: no NVML).
        cuda_driver_version: the newest CUDA the driver supports, ``"12.4"``.
        nvml_error: why NVML is unavailable (None when it answered).
        gpus: the GPUs this process may use (``CUDA_VISIBLE_DEVICES`` applied).
        gpus_listed: how many GPUs NVML lists on the host.
        visible_error: ``CUDA_VISIBLE_DEVICES`` names a GPU NVML does not list.
        nvml_warnings: queries the driver refused.
        own_pids: this process and its parents (their GPU memory is not "another process").
        packages: installed distribution → version (only those installed), in the trials' interpreter.
        requirements: installed distribution → its ``Requires-Dist`` lines, in the same interpreter.
        importable: distribution → whether its import package is found there (without importing it).
        interpreter: the trials' interpreter as read (None: not read, see ``interpreter_error``).
        interpreter_for: whose interpreter it is (``"the swift backend's trials"``).
        interpreter_error: why it could not be read; None when it was, or when there is none to read
            (the command backend's trials run the user's own command).
        env: the environment variables that matter (NCCL and friends), as set.
        host: the host's facts.
    """

    driver_version: str | None
    cuda_driver_version: str | None
    nvml_error: str | None
    gpus: tuple[GpuHealth, ...]
    gpus_listed: int = 0
    visible_error: str | None = None
    nvml_warnings: tuple[str, ...] = ()
    own_pids: frozenset[int] = frozenset()
    packages: Mapping[str, str] = field(default_factory=dict)
    requirements: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    importable: Mapping[str, bool] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    host: HostFacts | None = None
    interpreter: InterpreterFacts | None = None
    interpreter_for: str = "autotune itself"
    interpreter_error: str | None = None


class Check(ABC):
    """One thing the doctor checks. Subclasses are listed in ``CHECKS`` (the registry); the runner calls
    :meth:`run` once per ``autotune doctor`` with the facts gathered for it, and never lets a check's
    exception escape (it becomes a ``warn`` naming the check).

    Attributes:
        name: short, stable (the JSON key and the line's label).
        quick: part of the subset ``autotune search`` runs before its first trial.
    """

    name: str = ""
    quick: bool = False

    @abstractmethod
    def run(self, facts: Facts) -> list[Finding]:
        """The findings (at least one) for these facts."""

    def ok(self, detail: str) -> Finding:
        return Finding(self.name, Status.OK, detail)

    def warn(self, detail: str, fix: str) -> Finding:
        return Finding(self.name, Status.WARN, detail, fix)

    def fail(self, detail: str, fix: str) -> Finding:
        return Finding(self.name, Status.FAIL, detail, fix)


@dataclass(frozen=True)
class DoctorReport:
    """Every finding of one run, in the registry's order."""

    findings: tuple[Finding, ...]

    def with_findings(self, more: tuple[Finding, ...]) -> DoctorReport:
        """This report with ``more`` findings after its own (``--bench``, ``--calibrate``)."""
        return DoctorReport((*self.findings, *more))

    @property
    def failed(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.status is Status.FAIL)

    @property
    def exit_code(self) -> int:
        """0 when nothing failed, 1 otherwise."""
        return 1 if self.failed else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "counts": {s.value: sum(f.status is s for f in self.findings) for s in Status},
            "findings": [f.to_dict() for f in self.findings],
        }
