from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest


def autotune_exe() -> str:
    """The installed console script of the interpreter running the tests."""
    exe = Path(sys.executable).with_name("autotune")
    if exe.exists():
        return str(exe)
    found = shutil.which("autotune")
    if found is None:
        pytest.skip("the autotune console script is not installed")
    return found


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 600, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ)
    full_env.setdefault("OMP_NUM_THREADS", "1")
    if env:
        full_env.update(env)
    return subprocess.run(
        [autotune_exe(), *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, env=full_env
    )


@pytest.fixture
def cli():
    return run_cli
