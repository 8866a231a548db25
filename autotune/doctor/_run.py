"""The registry of checks, the run of them all (``autotune doctor``) and the quick subset ``autotune
search`` runs before its first trial."""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from autotune.doctor._base import Check, DoctorReport, Facts, Finding, Status
from autotune.doctor._frameworks import FrameworksCheck, PinsCheck
from autotune.doctor._gpu import (
    BusyGpusCheck,
    ClockEventsCheck,
    EccCheck,
    MigCheck,
    NvmlCheck,
    PersistenceCheck,
    TorchCudaCheck,
    VisibleGpusCheck,
)
from autotune.doctor._host import CacheCheck, DiskCheck, HostRamCheck, NcclEnvCheck, OpenFilesCheck, ShmCheck
from autotune.doctor._interpreter import InterpreterCheck
from autotune.errors import MachineError

__all__ = ["CHECKS", "run_checks", "preflight"]

log = logging.getLogger(__name__)

#: every check, in the order ``autotune doctor`` prints them
CHECKS: tuple[type[Check], ...] = (
    NvmlCheck,
    InterpreterCheck,
    TorchCudaCheck,
    VisibleGpusCheck,
    BusyGpusCheck,
    MigCheck,
    PersistenceCheck,
    EccCheck,
    ClockEventsCheck,
    FrameworksCheck,
    PinsCheck,
    ShmCheck,
    OpenFilesCheck,
    DiskCheck,
    CacheCheck,
    HostRamCheck,
    NcclEnvCheck,
)


def run_checks(
    facts: Facts, *, quick: bool = False, checks: tuple[type[Check], ...] = CHECKS
) -> DoctorReport:
    """Every check (or the quick subset) on ``facts``. A check that raises becomes a warning naming it:
    the doctor never stops on its own bug."""
    findings: list[Finding] = []
    for cls in checks:
        if quick and not cls.quick:
            continue
        check = cls()
        try:
            findings.extend(check.run(facts))
        except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others
            log.debug("doctor check %s failed", check.name, exc_info=True)
            findings.append(
                Finding(
                    check.name,
                    Status.WARN,
                    f"the check itself failed ({type(exc).__name__}: {exc})",
                    "Report this to autotune's issue tracker with `autotune doctor --json`",
                )
            )
    return DoctorReport(tuple(findings))


def preflight(
    out_dir: Path,
    *,
    gpu_indices: Sequence[int] | None = None,
    nvml: ModuleType | None = None,
    python: str | None = sys.executable,
    python_for: str = "autotune itself",
) -> DoctorReport:
    """The quick subset, before a search's first trial.

    Args:
        out_dir: the study directory (free disk).
        gpu_indices: the NVML indices of the GPUs the search uses (None: every visible GPU); another
            user's process on a GPU the search leaves alone is none of its business.
        nvml: the ``pynvml`` module (tests pass the autospec fake).
        python: the interpreter the trials run with (its torch, CUDA build and frameworks are judged;
            None: the trials run the user's own command).
        python_for: whose interpreter it is, for the doctor's line (``"the swift backend's trials"``).

    Raises:
        MachineError: a check failed; the message is the doctor's line for the first failure.
    """
    from autotune.doctor._facts import gather_facts

    try:
        facts = gather_facts(out_dir, nvml=nvml, python=python, python_for=python_for)
    except Exception as exc:  # noqa: BLE001 - the doctor's own bug must not stop a search
        log.debug("doctor: gathering facts failed", exc_info=True)
        return DoctorReport(
            (
                Finding(
                    "doctor",
                    Status.WARN,
                    f"the machine could not be read ({type(exc).__name__}: {exc}); the search goes on",
                    "Run `autotune doctor` to see what it cannot read",
                ),
            )
        )
    if gpu_indices is not None:
        chosen = set(gpu_indices)
        facts = dataclasses.replace(facts, gpus=tuple(g for g in facts.gpus if g.index in chosen))
    report = run_checks(facts, quick=True)
    if report.failed:
        first = report.failed[0]
        more = f" (and {len(report.failed) - 1} more failure(s))" if len(report.failed) > 1 else ""
        raise MachineError(
            f"autotune doctor: {first.check}: {first.detail}{more}",
            hint=f"{first.fix.rstrip('.')}; `autotune doctor` lists every check",
        )
    return report
