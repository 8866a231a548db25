"""What the doctor reads in an interpreter, written for any Python 3.8+ with nothing but the standard
library: its source is what :mod:`autotune.doctor._interpreter` runs with ``python -c`` in the trials'
interpreter (which need not have autotune), and autotune's own interpreter calls :func:`collect` directly.

Nothing is imported of the packages read: versions and ``Requires-Dist`` come from their metadata, an
import package is only found (``find_spec``), and torch's CUDA build is read from the text of its
``torch/version.py`` (the ``cuda = '12.4'`` line torch's build writes; ``None`` in a CPU build).
"""

from __future__ import annotations

import ast
import json
import os
import platform
import sys
from importlib import metadata
from importlib.util import find_spec

MARK = "AUTOTUNE_INTERPRETER "


def _torch_cuda() -> tuple[bool, str | None]:
    """(whether torch/version.py was read, the CUDA version it names or None)."""
    try:
        spec = find_spec("torch")
    except (ImportError, ValueError):
        return False, None
    if spec is None or not spec.submodule_search_locations:
        return False, None
    for folder in spec.submodule_search_locations:
        path = os.path.join(folder, "version.py")
        try:
            with open(path, encoding="utf-8") as fh:
                tree = ast.parse(fh.read(200_000))
        except (OSError, SyntaxError, ValueError):
            continue
        for node in tree.body:
            assigned: ast.expr | None
            if isinstance(node, ast.Assign) and node.targets:
                target, assigned = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign):
                target, assigned = node.target, node.value
            else:
                continue
            if isinstance(target, ast.Name) and target.id == "cuda" and isinstance(assigned, ast.Constant):
                value = assigned.value
                return True, value if isinstance(value, str) else None
        return True, None
    return False, None


def collect(dists: list[str], watched: list[str], modules: dict[str, str]) -> dict[str, object]:
    """The record: this interpreter, the versions of ``dists``, the ``Requires-Dist`` lines of those in
    ``watched``, whether each installed one of ``modules`` (distribution → import package) is found,
    and torch's CUDA build."""
    packages: dict[str, str] = {}
    requirements: dict[str, list[str]] = {}
    for dist in dists:
        try:
            found = metadata.distribution(dist)
        except metadata.PackageNotFoundError:
            continue
        packages[dist] = found.version
        if dist in watched:
            requirements[dist] = list(found.requires or ())
    importable: dict[str, bool] = {}
    for dist, module in modules.items():
        if dist in packages:
            try:
                importable[dist] = find_spec(module) is not None
            except (ImportError, ValueError):
                importable[dist] = False
    read, cuda = _torch_cuda()
    return {
        "python": sys.executable,
        "python_version": platform.python_version(),
        "packages": packages,
        "requirements": requirements,
        "importable": importable,
        "torch_version_read": read,
        "torch_cuda": cuda,
    }


if __name__ == "__main__":
    print(MARK + json.dumps(collect(*(json.loads(a) for a in sys.argv[1:4]))))
