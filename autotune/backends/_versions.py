"""The versions of a framework and its companions, read in the interpreter the trials run with.

A framework may live in another environment than autotune (ms-swift pins its own TRL, verl is often in
its cluster's image): its interpreter is asked, with an argv list, never a shell.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from collections.abc import Sequence

from autotune.errors import BackendError

__all__ = ["installed_versions"]

_MARK = "AUTOTUNE_VERSIONS "
_SCRIPT = """
import importlib.metadata as m, json, sys
out = {}
for name in json.loads(sys.argv[1]):
    try:
        out[name] = m.version(name)
    except m.PackageNotFoundError:
        out[name] = None
print("AUTOTUNE_VERSIONS " + json.dumps(out))
"""


def installed_versions(
    python: str, names: Sequence[str], *, framework: str, hint: str
) -> dict[str, str | None]:
    """Each distribution's version in ``python``'s environment (None: not installed).

    Args:
        python: the interpreter (this one is read directly, another one is run).
        names: distribution names, the framework's first.
        framework: how error messages name it.
        hint: what to do when the interpreter cannot be run or read.

    Raises:
        BackendError: the interpreter cannot be run, or prints no versions.
    """
    # Not resolved through links: every venv's python links to the same base interpreter, and each
    # sees its own packages.
    if os.path.abspath(python) == os.path.abspath(sys.executable):
        out: dict[str, str | None] = {}
        for name in names:
            try:
                out[name] = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                out[name] = None
        return out
    try:
        proc = subprocess.run(
            [python, "-c", _SCRIPT, json.dumps(list(names))],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BackendError(f"cannot run {python} to read the {framework} version: {exc}", hint=hint) from None
    for line in proc.stdout.splitlines():
        if line.startswith(_MARK):
            return json.loads(line[len(_MARK) :])
    raise BackendError(f"cannot read the {framework} version with {python}", hint=hint)
