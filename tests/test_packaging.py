"""What ``pip install`` puts on a user's machine: one ``autotune`` namespace, typed, complete."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_package_folder_is_declared() -> None:
    """The package list is explicit (the mapped folders need it): a new subpackage must be in it."""
    setuptools = _pyproject()["tool"]["setuptools"]
    found = {"autotune"}
    for init in (ROOT / "autotune").rglob("*/__init__.py"):
        found.add(".".join(["autotune", *init.parent.relative_to(ROOT / "autotune").parts]))
    for name, folder in setuptools["package-dir"].items():
        assert (ROOT / folder / "__init__.py").is_file(), folder
        found.add(name)
    assert set(setuptools["packages"]) == found


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``pip install --no-deps .`` into a folder of its own (the dependencies come from this venv)."""
    target = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(ROOT),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if proc.returncode != 0:
        pytest.fail(f"pip install failed:\n{proc.stderr[-2000:]}")
    return target


def _python(site: Path, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(cwd)}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, env=env, timeout=120
    )


@pytest.mark.infra
def test_installs_one_namespace(installed: Path, tmp_path: Path) -> None:
    skip = (".dist-info", "__pycache__", "bin")  # bin: the console script pip writes beside the packages
    tops = sorted(p.name for p in installed.iterdir() if p.is_dir() and not p.name.endswith(skip))
    assert tops == ["autotune"]
    for name in ("reports", "probes", "search_spaces"):
        proc = _python(installed, f"import {name}", tmp_path)
        assert proc.returncode != 0 and "ModuleNotFoundError" in proc.stderr, name
    proc = _python(
        installed,
        "import autotune, autotune.reports, autotune.probes.phases, autotune.search_spaces; print(autotune.__file__)",
        tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().startswith(str(installed))


@pytest.mark.infra
def test_ships_types_spaces_and_templates(installed: Path) -> None:
    pkg = installed / "autotune"
    assert (pkg / "py.typed").is_file()
    assert {p.name for p in (pkg / "search_spaces").glob("*.yaml")} >= {"swift.yaml", "trl.yaml"}
    assert any((pkg / "reports" / "templates").iterdir())
    assert (pkg / "assets" / "swift_reward_plugin.py").is_file()


def _floor(requirement: str) -> tuple[int, ...]:
    from packaging.requirements import Requirement

    (spec,) = [s for s in Requirement(requirement).specifier if s.operator == ">="]
    return tuple(int(x) for x in spec.version.split("."))


def _extra(name: str, dist: str) -> str:
    from packaging.requirements import Requirement

    extras = _pyproject()["project"]["optional-dependencies"]
    return next(r for r in extras[name] if Requirement(r).name == dist)


def test_extras_pin_the_versions_the_backends_check() -> None:
    """``pip install autotune-grpo[trl]`` cannot bring a TRL (or ms-swift) the backend then refuses."""
    from autotune.backends.swift._args import MIN_VERSION
    from autotune.backends.trl.backend import MIN_TRL_VERSION

    assert _floor(_extra("trl", "trl")) == MIN_TRL_VERSION
    assert _floor(_extra("vllm", "trl")) == MIN_TRL_VERSION
    swift = _floor(_extra("swift", "ms-swift"))
    assert swift + (0,) * (len(MIN_VERSION) - len(swift)) == MIN_VERSION
    # verl: the version the export's hydra overrides are checked against, as its docstring names it
    from autotune.backends.verl import export as verl_export

    verl = ".".join(map(str, _floor(_extra("verl", "verl"))))
    assert f"verl {verl}'s" in (verl_export.__doc__ or "")
    assert _floor(_extra("deepspeed", "deepspeed")) >= (0, 9, 3)
