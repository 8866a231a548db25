"""Bad storage URLs, report paths and YAML bombs: one line, exit 2, no traceback, no password printed,
nothing the study directory held changed (through the installed CLI)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import run_cli

FAULT = str(Path(__file__).resolve().parents[1] / "fixtures" / "faults" / "fault.py")
PASSWORD = "pw-s3cr3t-991"
COMMAND = (sys.executable, FAULT, "--mode", "ok", "--steps", "3", "--step-s", "0.01")  # the study's own
SPACE = "backend: command\nknobs:\n  bs: {type: int, choices: [1, 2], default: 1}\n"


def snapshot(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def one_line(proc, code: int = 2) -> str:  # noqa: ANN001
    assert proc.returncode == code, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    return errors[0]


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A study with one finished trial (shared: every test checks it is left as it was)."""
    root = tmp_path_factory.mktemp("finished")
    space = root / "s.yaml"
    space.write_text(SPACE)
    out = root / "study"
    proc = run_cli(
        "search", "--backend", "command", "--space", str(space), "--out", str(out), "--trials", "1",
        "--confirm-runs", "0", "--", *COMMAND,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out


STORAGES = {
    "unknown scheme": ("bogus://x", "Can't load plugin: sqlalchemy.dialects:bogus"),
    "missing directory": ("sqlite:////missing/dir/x.db", "unable to open database file"),
    "unparsable": ("://", "Could not parse"),
    "driver missing": (f"postgresql+nosuchdriver://u:{PASSWORD}@127.0.0.1:1/db", "Can't load plugin"),
}
if importlib.util.find_spec("psycopg2") is not None:
    STORAGES["server unreachable"] = (
        f"postgresql+psycopg2://u:{PASSWORD}@127.0.0.1:1/db",
        "Connection refused",
    )


@pytest.mark.parametrize("case", sorted(STORAGES))
def test_a_storage_that_cannot_be_opened(cli, study: Path, tmp_path: Path, case: str) -> None:
    url, needle = STORAGES[case]
    (tmp_path / "s.yaml").write_text(SPACE)
    before = snapshot(study)
    proc = cli(
        "search", "--backend", "command", "--space", str(tmp_path / "s.yaml"), "--out", str(study),
        "--trials", "2", "--storage", url, "--", *COMMAND,
    )  # fmt: skip
    line = one_line(proc)
    assert "cannot open study storage" in line and needle in line and "--storage" in line
    assert PASSWORD not in proc.stdout + proc.stderr
    assert snapshot(study) == before  # the finished trial and study.json are as they were
    fresh = tmp_path / "fresh"
    proc = cli(
        "search", "--backend", "command", "--space", str(tmp_path / "s.yaml"), "--out", str(fresh),
        "--storage", url, "--", sys.executable, FAULT,
    )  # fmt: skip
    one_line(proc)
    assert not (fresh / "study.json").exists()


@pytest.mark.parametrize("where", ["/proc/x", "file"])
def test_an_unwritable_report_path(cli, study: Path, tmp_path: Path, where: str) -> None:
    (tmp_path / "s.yaml").write_text(SPACE)
    target = Path(where) if where.startswith("/") else tmp_path / "s.yaml"  # an existing file
    before = snapshot(study)
    proc = cli("report", str(study), "--out", str(target), "--no-png")
    assert f"cannot write to --out {target}" in one_line(proc)
    assert snapshot(study) == before
    assert (tmp_path / "s.yaml").read_text() == SPACE


def _bomb() -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 12)]
    return (
        "backend: command\n" + "\n".join(lines) + "\nknobs:\n  bs: {type: int, choices: [1, 2], default: 1}\n"
    )


@pytest.mark.parametrize("flag", ["--space", "--fixed", "--baseline"])
def test_a_yaml_alias_bomb_is_refused(cli, study: Path, tmp_path: Path, flag: str) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_bomb())
    (tmp_path / "s.yaml").write_text(SPACE)
    before = snapshot(study)
    space = ["--space", str(tmp_path / "s.yaml")] if flag != "--space" else []
    proc = cli(
        "search", "--backend", "command", *space, flag, str(bomb), "--out", str(study), "--trials", "2",
        "--", sys.executable, FAULT, "--mode", "ok",
    )  # fmt: skip
    assert "expands to more than 100000 values through its aliases" in one_line(proc)
    assert snapshot(study) == before
    assert json.loads((study / "study.json").read_text())["outcome"]["stopped"] == "budget"
