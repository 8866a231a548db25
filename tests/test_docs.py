"""The README stays a front door and the docs site builds: strict, links checked, references generated."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from importlib.resources import files
from pathlib import Path
from types import ModuleType

import pytest
import typer

from autotune.cli.app import app
from autotune.space import load_space

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 250


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "docs_reference_hook", ROOT / "docs" / "hooks" / "reference.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sections(markdown: str) -> dict[str, str]:
    parts = re.split(r"^## (.+)$", markdown, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_the_readme_is_short_and_the_test_command_has_its_own_section() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES
    tests = _sections(readme)["Tests"]
    assert "bash scripts/test.sh" in tests
    assert "bash scripts/test.sh" not in _sections(readme)["First run, on the CPU"]


def test_every_relative_link_of_the_readme_names_a_file_that_exists() -> None:
    readme = (ROOT / "README.md").read_text()
    targets = [t for t in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme) if "://" not in t]
    assert targets, "the README links to the docs"
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert missing == []


def test_the_readme_installs_torch_s_cpu_build_and_autotune_from_the_checkout() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in readme
    assert "pip install 'autotune-grpo[" not in readme  # not on PyPI: never the install line
    assert "pip install -e '.[trl]'" in readme


def test_the_knob_reference_lists_every_knob_of_every_shipped_space() -> None:
    sections = _sections(_hook().knob_reference())
    spaces = [r for r in files("autotune.search_spaces").iterdir() if r.name.endswith(".yaml")]
    assert {r.name.removesuffix(".yaml") for r in spaces} == set(sections)
    for resource in spaces:
        section = sections[resource.name.removesuffix(".yaml")]
        for knob in load_space(resource).knobs:
            assert f"| `{knob.name}` |" in section, (resource.name, knob.name)


def test_the_cli_reference_lists_every_command_and_option() -> None:
    sections = _sections(_hook().cli_reference())
    root = typer.main.get_command(app)
    assert set(sections) == {f"autotune {name}" for name in root.commands}
    for name, command in root.commands.items():
        for param in command.params:
            if param.param_type_name == "option" and not getattr(param, "hidden", False):
                assert param.opts[0] in sections[f"autotune {name}"], (name, param.opts)


def test_the_hook_fills_only_the_pages_that_hold_a_marker() -> None:
    hook = _hook()
    page = f"# Knobs\n\n{hook.KNOB_MARKER}\n"
    filled = hook.on_page_markdown(page, page=None, config=None, files=None)
    assert hook.KNOB_MARKER not in filled and "## trl" in filled
    assert hook.on_page_markdown("# Other\n", page=None, config=None, files=None) == "# Other\n"


def _build(project: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "-f",
            str(project / "mkdocs.yml"),
            "-d",
            str(site),
        ],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "HOME": str(site.parent)},
    )


@pytest.mark.infra
def test_the_docs_build_strictly_and_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
    pytest.importorskip("material", reason="the docs extra is not installed (pip install -e '.[docs]')")
    built = _build(ROOT, tmp_path / "site")
    assert built.returncode == 0, built.stdout + built.stderr
    assert (tmp_path / "site" / "reference" / "knobs" / "index.html").read_text().count("<tr>") > 10

    copy = tmp_path / "copy"
    shutil.copytree(ROOT / "docs", copy / "docs")
    shutil.copy(ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    with (copy / "docs" / "index.md").open("a") as page:
        page.write("\nSee [a page that does not exist](no-such-page.md).\n")
    broken = _build(copy, tmp_path / "site-broken")
    assert broken.returncode != 0
    assert "no-such-page.md" in broken.stdout + broken.stderr
