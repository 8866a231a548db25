"""The ``autotune doctor`` job: the checks, and ``--bench`` / ``--calibrate`` when asked."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from autotune.doctor import DoctorReport
from autotune.errors import UsageError
from autotune.jsontypes import JsonObject

__all__ = ["DoctorRequest", "DoctorOutcome", "run_doctor"]


@dataclass(frozen=True)
class DoctorRequest:
    """What the user asked for (the CLI's flags as one object)."""

    out: str = "runs"
    model: str | None = None
    # whose trials' interpreter to read (torch, its CUDA build, the frameworks and their pins), and the
    # --executable that backend takes (the swift command, verl's python)
    backend: str = "trl"
    executable: str | None = None
    quick: bool = False
    bench: bool = False
    seconds: float = 3.0
    calibrate: bool = False


@dataclass(frozen=True)
class DoctorOutcome:
    """Every finding (the checks', then the benchmark's and the calibration's) and their records."""

    report: DoctorReport
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> JsonObject:
        """``autotune doctor --json``."""
        return {**self.report.to_dict(), **self.extra}


def run_doctor(req: DoctorRequest, console: Console | None = None) -> DoctorOutcome:
    """Check this machine; measure its peaks and calibrate on its GPU when asked.

    Raises:
        UsageError: ``--seconds`` not positive; an unknown ``--model``, ``--backend``; an
            ``--executable`` (or the framework's command) that is not there.
    """
    from autotune.backends import backend_class
    from autotune.doctor import gather_facts, run_checks

    if req.seconds <= 0:
        raise UsageError(f"--seconds must be positive, got {req.seconds:g}", hint="For example --seconds 3")
    cls = backend_class(req.backend)
    # a backend that runs the user's command has no interpreter of its own to read (nor a command here)
    python = None if cls.takes_command else cls.from_cli(executable=req.executable).trial_python()
    facts = gather_facts(
        Path(req.out), model=req.model, python=python, python_for=f"the {req.backend} backend's trials"
    )
    report = run_checks(facts, quick=req.quick)
    extra: dict[str, Any] = {}
    if req.bench:
        from autotune.doctor import run_bench

        measured = run_bench(facts, seconds=req.seconds)
        report = report.with_findings(measured.findings)
        extra["bench"] = measured.to_dict()
    if req.calibrate:
        from autotune.app.calibrate import run_calibration

        calibrated = run_calibration(facts, out_dir=Path(req.out), model=req.model, console=console)
        report = report.with_findings(calibrated.findings)
        extra["calibrate"] = calibrated.to_dict()
    return DoctorOutcome(report, extra)
