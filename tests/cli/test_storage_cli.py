"""`autotune search --storage postgresql://…` through the installed CLI against a real PostgreSQL server:
a study runs there end to end and Optuna reads it back; a missing driver, a server not listening and a
wrong password each end in one line, exit 2, no traceback, the password in no output and no file."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import optuna
from sqlalchemy.engine import make_url

from tests.cli.conftest import run_cli

FAULT = str(Path(__file__).resolve().parents[1] / "fixtures" / "faults" / "fault.py")
COMMAND = (sys.executable, FAULT, "--mode", "ok", "--steps", "3", "--step-s", "0.01")
SPACE = "backend: command\nknobs:\n  bs: {type: int, choices: [1, 2, 3], default: 1}\n"
PASSWORD = "pw-n0t-th1s-4411"


def _search(tmp_path: Path, url: str, *extra: str, env: dict[str, str] | None = None):  # noqa: ANN202
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    return run_cli(
        "search", "--backend", "command", "--space", str(space), "--out", str(tmp_path / "out"),
        "--confirm-runs", "0", "--storage", url, *extra, "--", *COMMAND, env=env,
    )  # fmt: skip


def _one_line(proc) -> str:  # noqa: ANN001
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    return errors[0]


def _nowhere(secret: str, proc, out: Path) -> None:  # noqa: ANN001
    assert secret not in proc.stdout + proc.stderr
    for path in out.rglob("*") if out.exists() else ():
        assert not path.is_file() or secret.encode() not in path.read_bytes(), path


def test_a_study_runs_on_postgres_and_optuna_reads_it_back(tmp_path: Path, postgres_url: str) -> None:
    proc = _search(tmp_path, postgres_url, "--trials", "3", "--study-name", "on-pg")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    study = optuna.load_study(study_name="on-pg", storage=postgres_url)
    done = [t for t in study.trials if t.state is optuna.trial.TrialState.COMPLETE]
    assert len(done) == 3, [(t.number, t.state) for t in study.trials]
    assert {t.params["bs"] for t in done} <= {1, 2, 3}
    assert all(t.value is not None and t.value > 0 for t in done)
    # the study directory holds no Optuna database of its own: the records went to the server
    assert not list((tmp_path / "out").glob("*.db"))
    _nowhere(str(make_url(postgres_url).password), proc, tmp_path / "out")


def test_no_driver_one_line_naming_the_extra(tmp_path: Path, postgres_url: str) -> None:
    blocker = tmp_path / "site"
    blocker.mkdir()
    # imported at start-up from PYTHONPATH: both PostgreSQL drivers fail to import, as if not installed
    (blocker / "sitecustomize.py").write_text(
        "import sys\nsys.modules['psycopg'] = None\nsys.modules['psycopg2'] = None\n"
    )
    url = make_url(postgres_url).set(password=PASSWORD).render_as_string(hide_password=False)
    proc = _search(tmp_path, url, "--trials", "1", env={"PYTHONPATH": str(blocker)})
    line = _one_line(proc)
    assert "the PostgreSQL driver is not installed" in line
    assert "pip install 'autotune-grpo[postgres]'" in line
    _nowhere(PASSWORD, proc, tmp_path / "out")


def test_no_server_one_line_naming_host_and_port(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _search(tmp_path, f"postgresql://bob:{PASSWORD}@127.0.0.1:{port}/db", "--trials", "1")
    line = _one_line(proc)
    assert f"cannot reach the PostgreSQL server at 127.0.0.1:{port}" in line
    assert "postgresql://bob:***@127.0.0.1" in line
    _nowhere(PASSWORD, proc, tmp_path / "out")


def test_a_wrong_password_one_line_and_in_no_file(tmp_path: Path, postgres_url: str) -> None:
    server = make_url(postgres_url)
    url = server.set(password=PASSWORD).render_as_string(hide_password=False)
    proc = _search(tmp_path, url, "--trials", "1", "--study-name", "denied")
    line = _one_line(proc)
    assert f"the PostgreSQL server at 127.0.0.1:{server.port} refused the login" in line
    _nowhere(PASSWORD, proc, tmp_path / "out")
    _nowhere(str(server.password), proc, tmp_path / "out")
    assert "denied" not in optuna.get_all_study_names(postgres_url)
