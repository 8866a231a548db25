from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.backends._versions import installed_versions
from autotune.errors import BackendError


def test_this_interpreter_is_read_directly() -> None:
    versions = installed_versions(sys.executable, ("optuna", "no-such-dist-xyz"), framework="x", hint="h")
    assert versions == {"optuna": importlib.metadata.version("optuna"), "no-such-dist-xyz": None}


def test_another_interpreter_is_asked_with_the_names_as_an_argument(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    other = str(venv / "bin" / "python")
    versions = installed_versions(other, ("pip", "optuna"), framework="x", hint="h")
    assert versions == {"pip": None, "optuna": None}  # a fresh environment has neither


def test_an_interpreter_that_cannot_run_or_says_nothing_is_one_error(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="cannot run .* to read the verl version"):
        installed_versions(str(tmp_path / "missing"), ("verl",), framework="verl", hint="install it")
    silent = tmp_path / "python"
    silent.write_text("#!/bin/sh\necho hello\n")
    silent.chmod(0o755)
    with pytest.raises(BackendError, match="cannot read the verl version") as err:
        installed_versions(str(silent), ("verl",), framework="verl", hint="install it")
    assert "install it" in str(err.value)
