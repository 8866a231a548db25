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
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cli.app import main
from autotune.errors import EXIT_NOTHING_TO_RECOMMEND, EXIT_OK, EXIT_USAGE, NothingToRecommend, UsageError
from autotune.studydir import StudyDir

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


def test_a_damaged_study_db_is_named_never_blamed_on_storage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "study"
    out.mkdir()
    (out / "study.db").write_bytes(b"not a database, " * 64)
    space = tmp_path / "s.yaml"
    space.write_text("backend: command\nknobs:\n  mode: {type: str, choices: [a, b], default: a}\n")
    code, err = cli(
        capsys, "search", "--backend", "command", "--space", str(space), "--out", str(out),
        "--trials", "1", "--confirm-runs", "0", "--", sys.executable, "-c", "pass",
    )  # fmt: skip
    assert code == EXIT_USAGE and "study.db" in err and "--storage" not in err, err


@pytest.mark.parametrize(("out", "says"), [("", "--out is empty"), ("/proc/autotune-x", "--out /proc")])
def test_an_out_that_cannot_hold_a_study_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, out: str, says: str
) -> None:
    monkeypatch.chdir(tmp_path)
    space = tmp_path / "s.yaml"
    space.write_text("backend: command\nknobs:\n  mode: {type: str, choices: [a, b], default: a}\n")
    code, err = cli(
        capsys, "search", "--backend", "command", "--space", str(space), "--out", out,
        "--trials", "1", "--confirm-runs", "0", "--", sys.executable, "-c", "pass",
    )  # fmt: skip
    assert code == EXIT_USAGE and says in err and "free" not in err, err
    assert not (tmp_path / "runs").exists()  # no default folder made instead


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
HOSTILE_JSON = {"deep": DEEP, "deep-in-object": '{"a": ' + DEEP + "}", "nan": "NaN", "inf": "1e999"}


def _write_hostile_json(path: Path, content: str) -> None:
    if content in ("NaN", "1e999"):  # a number of the record made not finite
        data = json.loads(path.read_text())
        data["throughput" if path.name == "result.json" else "global_batch"] = "@NUM@"
        path.write_text(json.dumps(data).replace('"@NUM@"', content))
    else:
        path.write_text(content)


@pytest.mark.parametrize("content", list(HOSTILE_JSON))
@pytest.mark.parametrize("target", ["study.json", "trials/3/result.json"])
def test_hostile_json_is_one_line_in_report(
    base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, target: str
) -> None:
    study = copy(base, tmp_path)
    _write_hostile_json(study / target, HOSTILE_JSON[content])
    cli(capsys, "report", str(study), "--no-png")


@pytest.mark.parametrize("content", list(HOSTILE_JSON))
@pytest.mark.parametrize("target", ["study.json", "trials/3/result.json", "trials/3/launch.json"])
def test_hostile_json_is_one_line_in_export(
    base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, target: str
) -> None:
    study = copy(base, tmp_path)
    _write_hostile_json(study / target, HOSTILE_JSON[content])
    for fmt in ("json", "command"):
        cli(capsys, "export", str(study), "--format", fmt, "--out", str(study / "exported" / fmt))


KINDS = ("fifo", "dev-zero", "dev-urandom", "outside-link", "bytes", "deep", "directory")


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "outside-link"])
@pytest.mark.parametrize("target", ["study.json", "trials/3/result.json", "trials/3/metrics.jsonl"])
def test_special_files_are_refused_unopened(
    base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str, target: str
) -> None:
    study = copy(base, tmp_path)
    plant(study / target, kind, tmp_path)
    cli(capsys, "export", str(study), "--format", "json", "--out", str(study / "knobs.json"))
    if target != "study.json" or kind == "fifo":
        cli(capsys, "report", str(study), "--no-png")


def plant(path: Path, kind: str, tmp_path: Path) -> None:
    """Replace ``path`` (a file or folder of the study) by a hostile one of ``kind``."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind.startswith("dev-"):
        path.symlink_to("/dev/" + kind[4:])
    elif kind == "outside-link":
        victim = tmp_path / "victim"
        victim.mkdir(exist_ok=True)
        (victim / "user.json").write_text('{"user": "data"}')
        path.symlink_to(victim / "user.json")
    elif kind == "deep":
        path.write_text(DEEP)
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(random.Random(str(path)).randbytes(4096))


def _outside(tmp_path: Path, study: Path) -> dict[str, bytes]:
    """Every file under ``tmp_path`` but the study's, with its bytes (what must never change)."""
    return {
        str(p): p.read_bytes()
        for p in tmp_path.rglob("*")
        if p.is_file() and not p.is_symlink() and study not in p.parents
    }


#: seeded cases of the property test: each plants hostile entries in random files of the study
PROPERTY_CASES = 6


@pytest.mark.parametrize("seed", range(PROPERTY_CASES))
def test_any_damage_to_any_file_is_one_line_and_nothing_outside_changes(
    base: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], seed: int
) -> None:
    rng = random.Random(seed)
    study = copy(base, tmp_path)
    entries = sorted(p for p in study.rglob("*") if p.name != "study.db")
    for path in rng.sample(entries, 3):
        if os.path.lexists(path):
            plant(path, rng.choice(KINDS), tmp_path)
    before = _outside(tmp_path, study)
    signal.alarm(120)  # a hang fails the test instead of blocking the suite
    try:
        cli(capsys, "report", str(study), "--no-png")
        cli(capsys, "export", str(study), "--format", "json", "--out", str(study / "knobs.json"))
        resume_reads(study)
    finally:
        signal.alarm(0)
    assert _outside(tmp_path, study) == before


def resume_reads(study: Path) -> None:
    """What a resume reads of the directory before it runs anything (settings, every result, the
    stored recommendation): a value, or one UsageError line; never another exception."""
    sd = StudyDir(study)
    try:
        settings = sd.read_settings()
        sd.recommendation(settings, sd.results())
    except UsageError as exc:
        assert "\n" not in exc.one_line()
    except NothingToRecommend:
        pass


# -- resume through the CLI ------------------------------------------------------------------------

FAULT = Path(__file__).resolve().parent / "fixtures" / "faults" / "fault.py"
RESUME_BOUND_S = 240  # a resume that has not ended by then hung


def _search_args(space: Path, out: Path) -> list[str]:
    from tests.cli.conftest import autotune_exe

    return [
        autotune_exe(), "search", "--backend", "command", "--space", str(space), "--out", str(out),
        "--search", "grid", "--trials", "2", "--confirm-runs", "0", "--startup-timeout", "60s",
        "--", sys.executable, str(FAULT), "--mode", "ok", "--steps", "3", "--step-s", "0.01",
    ]  # fmt: skip


def _run(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=RESUME_BOUND_S)


@pytest.fixture(scope="module")
def ran(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A study the command backend ran to its budget of 2 trials (the space file beside it)."""
    where = tmp_path_factory.mktemp("ran")
    space = where / "s.yaml"
    space.write_text("backend: command\nknobs:\n  bs: {type: int, choices: [1, 2], default: 1}\n")
    done = _run(_search_args(space, where / "demo"))
    assert done.returncode == EXIT_OK, done.stdout + done.stderr
    return space, where / "demo"


#: what a resume reads before it runs anything: each case damages one of them, and two files at random
RESUME_READS = ("study.db", "study.json", "trials/0/result.json", "trials/1/proc.json", "trials/1")


@pytest.mark.parametrize("seed", range(len(RESUME_READS)))
def test_any_damage_to_any_file_then_resume_through_the_cli_is_one_line_and_nothing_outside_changes(
    ran: tuple[Path, Path], tmp_path: Path, seed: int
) -> None:
    """Issue 41: resume is the same ``autotune search`` command on the damaged study, run as the user
    runs it: it ends within a bound with a documented exit code, at most one error line and no
    traceback, and writes nothing outside the study (study.db is among the files damaged)."""
    space, base_study = ran
    rng = random.Random(1000 + seed)
    study = tmp_path / "demo"
    shutil.copytree(base_study, study, symlinks=True)
    entries = sorted(p for p in study.rglob("*") if p.name != "study.lock")
    for path in [study / RESUME_READS[seed], *rng.sample(entries, 2)]:
        if os.path.lexists(path):
            plant(path, rng.choice(KINDS), tmp_path)
    before = _outside(tmp_path, study)
    try:
        proc = _run(_search_args(space, study))
    except subprocess.TimeoutExpired:
        pytest.fail(f"resume did not end within {RESUME_BOUND_S} s")
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert proc.returncode in DOCUMENTED, (proc.returncode, proc.stderr)
    if proc.returncode not in (EXIT_OK, EXIT_NOTHING_TO_RECOMMEND):
        assert len([line for line in proc.stderr.splitlines() if line.strip()]) == 1, proc.stderr
    assert _outside(tmp_path, study) == before
