"""``scripts/wheelhouse.sh``: a wheelhouse of autotune's core, installed into a fresh virtual environment
with ``--no-index`` (as on a GPU node without internet) and run from there.

The download reuses pip's cache; the fresh environment has no pip of its own (this one's installs into
it with ``--python``) and reads no pip configuration, so every wheel comes from the wheelhouse.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.infra
def test_a_wheelhouse_installs_autotune_without_an_index(tmp_path: Path) -> None:
    house = tmp_path / "wheelhouse"
    have_build = all(importlib.util.find_spec(m) for m in ("setuptools", "wheel"))
    built = subprocess.run(
        ["bash", str(ROOT / "scripts" / "wheelhouse.sh"), str(house)]
        + (["--no-build-isolation"] if have_build else []),
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    assert f"pip install --no-index --find-links {house} 'autotune-grpo'" in built.stdout
    assert any(p.name.startswith("autotune_grpo-") for p in house.iterdir())

    node = tmp_path / "node"
    venv.EnvBuilder(with_pip=False).create(node)
    python = node / "bin" / "python"
    offline = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    offline["PIP_CONFIG_FILE"] = os.devnull
    installed = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "-q",
            "--no-compile",
            "--no-index",
            "--find-links",
            str(house),
            "autotune-grpo",
        ],
        env=offline,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    ran = subprocess.run(
        [str(python), "-m", "autotune", "doctor", "--quick", "--json", "--out", str(tmp_path / "runs")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert '"findings"' in ran.stdout, ran.stderr[-2000:]
    where = subprocess.run(
        [str(python), "-c", "import autotune, optuna; print(autotune.__file__); print(optuna.__file__)"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert where.returncode == 0, where.stderr
    assert all(line.startswith(str(node)) for line in where.stdout.split()), where.stdout
