"""Issue 41: every file of a study is read and written one way (:mod:`autotune.studydir`).

No link is followed out of the study (``study.db`` linked to another application's SQLite file,
``charts/`` linked to a user's folder), special files (FIFO, device) are refused unopened, and JSON is
bounded in size, depth and numbers before it is parsed: ``report`` and ``export`` end with one line and
a documented exit code, never a traceback, never a hang. The base study is the recorded fixture
(tests/fixtures/recorded_trl_study), copied, never run.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sqlite3
import sys
from pathlib import Path

import pytest

from autotune.cli.app import main
from autotune.errors import EXIT_NOTHING_TO_RECOMMEND, EXIT_OK, EXIT_USAGE

RECORDED = Path(__file__).resolve().parent / "fixtures" / "recorded_trl_study" / "study"
EX_IOERR = 74
DOCUMENTED = {EXIT_OK, 1, EXIT_USAGE, EXIT_NOTHING_TO_RECOMMEND, EX_IOERR}


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The recorded study, copied once for the module (each test copies it again before changing it)."""
    dest = tmp_path_factory.mktemp("recorded") / "demo"
    shutil.copytree(RECORDED, dest)
    return dest


def copy(base: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "demo"
    shutil.copytree(base, dest, symlinks=True)
    return dest


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """Run autotune in-process; the exit code and stderr, checked to be one line and no traceback."""
    try:
        main(list(argv))
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert code in DOCUMENTED, (code, err)
    if code not in (EXIT_OK, EXIT_NOTHING_TO_RECOMMEND):
        assert len([line for line in err.splitlines() if line.strip()]) == 1, err
    return code, err


def test_study_db_linked_to_another_database_is_refused_and_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "app.db"
    with sqlite3.connect(other) as db:
        db.execute("create table users (name text)")
    before = other.read_bytes()
    out = tmp_path / "study"
    out.mkdir()
    (out / "study.db").symlink_to(other)
    space = tmp_path / "s.yaml"
    space.write_text("backend: command\nknobs:\n  mode: {type: str, choices: [a, b], default: a}\n")
    code, err = cli(
        capsys, "search", "--backend", "command", "--space", str(space), "--out", str(out),
        "--trials", "1", "--confirm-runs", "0", "--", sys.executable, "-c", "pass",
    )  # fmt: skip
    assert code == EX_IOERR and "study.db: it is a symbolic link" in err
    assert other.read_bytes() == before  # no Optuna table added to the other application's database
    assert not (out / "trials").exists() or not any((out / "trials").iterdir())


def test_charts_linked_to_a_users_folder_is_never_written_through(
    base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    study = copy(base, tmp_path)
    users = tmp_path / "pictures"
    users.mkdir()
    (users / "throughput.png").write_bytes(b"the user's picture")
    shutil.rmtree(study / "charts", ignore_errors=True)
    (study / "charts").symlink_to(users, target_is_directory=True)
    code, err = cli(capsys, "report", str(study))
    assert code == EX_IOERR and "charts" in err
    assert sorted(p.name for p in users.iterdir()) == ["throughput.png"]
    assert (users / "throughput.png").read_bytes() == b"the user's picture"


DEEP = "[" * 10_000 + "]" * 10_000


@pytest.mark.parametrize(
    "content",
    [DEEP, '{"a": ' + DEEP + "}", "NaN", "1e999"],
    ids=["deep", "deep-in-object", "nan", "inf"],
)
@pytest.mark.parametrize("target", ["study.json", "trials/3/result.json", "trials/3/launch.json"])
@pytest.mark.parametrize("command", ["report", "export"])
def test_hostile_json_is_one_line(
    base: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    content: str,
    target: str,
    command: str,
) -> None:
    study = copy(base, tmp_path)
    path = study / target
    if content in ("NaN", "1e999"):
        data = json.loads(path.read_text())
        data["throughput" if "result" in target else "global_batch"] = "@NUM@"
        path.write_text(json.dumps(data).replace('"@NUM@"', content))
    else:
        path.write_text(content)
    argv = [command, str(study)] + (["--no-png"] if command == "report" else ["--format", "json"])
    cli(capsys, *argv)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "dev-urandom", "outside-link"])
@pytest.mark.parametrize("target", ["study.json", "trials/3/result.json", "trials/3/metrics.jsonl"])
def test_special_files_are_refused_unopened(
    base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, target: str
) -> None:
    study = copy(base, tmp_path)
    path = study / target
    path.unlink()
    plant(path, kind, tmp_path)
    cli(capsys, "report", str(study), "--no-png")
    cli(capsys, "export", str(study), "--format", "json", "--out", str(tmp_path / "knobs.json"))


def plant(path: Path, kind: str, tmp_path: Path) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind.startswith("dev-"):
        path.symlink_to("/dev/" + kind[4:])
    elif kind == "outside-link":
        victim = tmp_path / "victim.json"
        victim.write_text('{"user": "data"}')
        path.symlink_to(victim)
    else:
        path.write_bytes(random.Random(kind).randbytes(64))
