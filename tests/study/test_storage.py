"""Opening a study's storage on a real PostgreSQL server, and the one-line errors when it cannot be:
no driver, no server at host:port, a password the server refuses, no such database (the password
masked in every message)."""

from __future__ import annotations

import socket
import sys

import optuna
import pytest
from sqlalchemy.engine import make_url

from autotune.errors import EXIT_USAGE, UsageError
from autotune.secrets import MASK, SecretRule
from autotune.study.storage import open_storage

PASSWORD = "pw-wr0ng-7731"


def _refused(url: str) -> UsageError:
    with pytest.raises(UsageError) as caught:
        open_storage(url, SecretRule())
    err = caught.value
    assert err.exit_code == EXIT_USAGE
    assert "\n" not in err.one_line()
    return err


def _closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then let go)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_database_of_its_own_holds_a_study(postgres_url: str) -> None:
    storage = open_storage(postgres_url, SecretRule())
    assert isinstance(storage, optuna.storages.RDBStorage)
    assert optuna.get_all_study_names(storage) == []  # fresh: no other test's studies
    study = optuna.create_study(storage=storage, study_name="s")
    study.optimize(lambda t: t.suggest_int("x", 0, 3), n_trials=2)
    assert len(optuna.load_study(study_name="s", storage=postgres_url).trials) == 2


def test_no_server_at_the_port_names_host_and_port(postgres_url: str) -> None:
    port = _closed_port()
    url = f"postgresql://bob:{PASSWORD}@127.0.0.1:{port}/db"
    err = _refused(url)
    line = err.one_line()
    assert f"cannot reach the PostgreSQL server at 127.0.0.1:{port}" in line
    assert "Connection refused" in line and "--storage" in line
    assert PASSWORD not in line and f"bob:{MASK}@" in line


def test_a_wrong_password_is_refused_and_never_shown(postgres_url: str) -> None:
    server = make_url(postgres_url)
    url = server.set(password=PASSWORD).render_as_string(hide_password=False)
    line = _refused(url).one_line()
    assert f"the PostgreSQL server at 127.0.0.1:{server.port} refused the login" in line
    assert "password authentication failed" in line and "Check the user name and password" in line
    assert PASSWORD not in line and str(server.password) not in line


def test_a_database_that_does_not_exist(postgres_url: str) -> None:
    url = make_url(postgres_url).set(database="no_such_db").render_as_string(hide_password=False)
    line = _refused(url).one_line()
    assert "has no such database" in line and '"no_such_db" does not exist' in line
    assert "createdb" in line


def test_no_driver_says_which_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in ("psycopg", "psycopg2"):  # SQLAlchemy's default for postgresql:// is one of them
        monkeypatch.setitem(sys.modules, module, None)  # `import` fails as if not installed
    line = _refused(f"postgresql://bob:{PASSWORD}@127.0.0.1:{_closed_port()}/db").one_line()
    assert "the PostgreSQL driver is not installed (no module psycopg" in line
    assert "pip install 'autotune-grpo[postgres]'" in line and PASSWORD not in line


def test_another_driver_named_in_the_url_is_named_in_the_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pg8000", None)
    line = _refused(f"postgresql+pg8000://bob:{PASSWORD}@127.0.0.1:1/db").one_line()
    assert "the PostgreSQL driver for this URL is not installed (no module pg8000)" in line
    assert "Install the module pg8000" in line and PASSWORD not in line


def test_postgres_scheme_gets_the_spelling_sqlalchemy_knows() -> None:
    line = _refused(f"postgres://bob:{PASSWORD}@127.0.0.1:1/db").one_line()
    assert "Can't load plugin" in line and "Write the URL as postgresql://" in line
    assert PASSWORD not in line
