"""The interpreter the trials run with, read once: torch and its CUDA build, the frameworks' versions and
their pins, as that interpreter sees them (not as autotune's own environment does).

A framework often lives in another environment than autotune (ms-swift pins its own TRL, verl is in its
cluster's image): one subprocess runs :mod:`autotune.doctor._interpreter_probe` there, with an argv list,
and prints one typed record (:class:`InterpreterFacts`) read back once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pydantic import ValidationError

from autotune.doctor import _interpreter_probe as probe
from autotune.doctor._base import Check, Facts, Finding, InterpreterFacts
from autotune.doctor._frameworks import FRAMEWORKS, WATCHED
from autotune.doctor._gpu import CUDA_RUNTIME_DISTS
from autotune.errors import MachineError

__all__ = ["InterpreterCheck", "read_interpreter", "READ_TIMEOUT_S"]

#: how long an interpreter may take to print its record (it imports nothing but the standard library)
READ_TIMEOUT_S = 60.0


def _args() -> tuple[list[str], list[str], dict[str, str]]:
    return [*WATCHED, *CUDA_RUNTIME_DISTS], list(WATCHED), dict(FRAMEWORKS)


def _own(python: str) -> bool:
    # not resolved through links: every venv's python links to the same base interpreter
    return os.path.abspath(python) == os.path.abspath(sys.executable)


def read_interpreter(python: str) -> InterpreterFacts:
    """Read ``python``'s installed packages and torch's CUDA build (autotune's own interpreter in this
    process, another one in one subprocess).

    Raises:
        MachineError: the interpreter cannot be run, or prints no record.
    """
    dists, watched, modules = _args()
    if _own(python):
        return InterpreterFacts.model_validate({**probe.collect(dists, watched, modules), "python": python})
    source = Path(probe.__file__).read_text(encoding="utf-8")
    argv = [python, "-c", source, json.dumps(dists), json.dumps(watched), json.dumps(modules)]
    fix = "Check the interpreter with --executable (or the framework's command on PATH)"
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=READ_TIMEOUT_S,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MachineError(f"cannot run the trials' interpreter {python}: {exc}", hint=fix) from None
    for line in proc.stdout.splitlines():
        if line.startswith(probe.MARK):
            try:
                record = InterpreterFacts.model_validate_json(line[len(probe.MARK) :])
            except ValidationError as exc:
                raise MachineError(
                    f"the trials' interpreter {python} printed a record autotune cannot read "
                    f"({exc.error_count()} error(s))",
                    hint=fix,
                ) from None
            return record.model_copy(update={"python": python})
    said = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
    raise MachineError(f"cannot read the trials' interpreter {python} ({said[:200]})", hint=fix)


class InterpreterCheck(Check):
    """Which interpreter the torch, CUDA-build, framework and pin checks read: the one the trials run with
    (``--executable``, the ``swift`` command's own interpreter), not necessarily autotune's."""

    name = "interpreter"
    quick = True

    def run(self, facts: Facts) -> list[Finding]:
        if facts.interpreter_error is not None:
            return [
                self.fail(
                    f"{facts.interpreter_error}: torch and the frameworks of {facts.interpreter_for} "
                    "cannot be checked",
                    "Point --executable at the trials' interpreter (or the framework's command) and check it runs",
                )
            ]
        read = facts.interpreter
        if read is None:
            return [self.ok(f"no Python interpreter to read: {facts.interpreter_for} run your own command")]
        return [
            self.ok(
                f"read {read.python} (Python {read.python_version}), the interpreter of {facts.interpreter_for}"
            )
        ]
