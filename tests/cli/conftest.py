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
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    """``autotune ARGS`` called in-process (hatch's way: no cold interpreter per call), answered as
    :func:`run_cli` answers: a ``CompletedProcess`` with the exit code, stdout and stderr. A test that
    needs a process of its own (signals, a second tuner, the console script) calls :func:`run_cli`."""
    from autotune.cli.app import main

    def invoke(
        *args: str, cwd: Path | None = None, timeout: float = 600, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        del timeout  # an in-process call has no child to time out
        saved = dict(os.environ)
        with monkeypatch.context() as m:
            m.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
            for key, value in (env or {}).items():
                m.setenv(key, value)
            if cwd is not None:
                m.chdir(cwd)
            capsys.readouterr()
            try:
                main(list(args))
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if isinstance(exc.code, str):
                    print(exc.code, file=sys.stderr)
            out, err = capsys.readouterr()
        os.environ.clear()  # what the command itself set in the environment ends with it, as a child's would
        os.environ.update(saved)
        return subprocess.CompletedProcess(["autotune", *args], code, out, err)

    return invoke
