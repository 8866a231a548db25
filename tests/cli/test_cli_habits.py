"""The habits users bring from other CLIs: ``--version``, ``-h``, ``python -m autotune``."""

from __future__ import annotations

import subprocess
import sys

import pytest

from autotune import __version__


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "autotune", *args], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(flag: str) -> None:
    out = _run(flag)
    assert out.returncode == 0
    assert out.stdout.strip() == f"autotune {__version__}"


@pytest.mark.parametrize(
    "command", [[], ["search"], ["plan"], ["profile"], ["export"], ["report"], ["gpus"], ["doctor"]]
)
def test_short_help_everywhere(command: list[str]) -> None:
    out = _run(*command, "-h")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"Usage: autotune {' '.join(command)}".rstrip())
    assert "-h, --help" in out.stdout


def test_python_dash_m_reports_usage_errors_like_the_console_script() -> None:
    out = _run("plan", "--no-such-flag")
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "no-such-flag" in out.stderr
