"""What every test folder shares: a PostgreSQL database of its own for each test that asks for one.

``postgres_url`` is a fresh, empty database on a real server (dropped after the test), so no test sees
another's studies. The server is ``AUTOTUNE_TEST_POSTGRES_URL`` when set (``scripts/test.sh`` starts
one), else one this session starts with ``scripts/postgres.sh`` and stops at its end; with neither the
test is skipped, saying how to get one. Tests that use it carry the ``postgres`` marker.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "postgres.sh"
URL_ENV = "AUTOTUNE_TEST_POSTGRES_URL"
HOW = (
    f"set {URL_ENV}=postgresql://USER:PASSWORD@HOST:PORT/DB, or let the tests start one: scripts/postgres.sh"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "postgres_url" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.postgres)


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a database on a PostgreSQL server in which the tests may create databases."""
    if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is None:
        pytest.skip("the PostgreSQL driver is not installed: pip install -e '.[postgres]'")
    url = os.environ.get(URL_ENV, "").strip()
    if url:
        yield url
        return
    state = tmp_path_factory.mktemp("postgres")
    try:
        proc = subprocess.run(
            ["bash", str(SCRIPT), "start", str(state)], capture_output=True, text=True, timeout=300
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        pytest.skip(f"no PostgreSQL server ({exc}); {HOW}")
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["scripts/postgres.sh start failed"])[-1]
        pytest.skip(f"no PostgreSQL server ({why}); {HOW}")
    try:
        yield proc.stdout.strip()
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop", str(state)], capture_output=True, timeout=120)


@pytest.fixture
def postgres_url(postgres_server: str) -> Iterator[str]:
    """The URL (``postgresql://…``, password included) of a new empty database, dropped afterwards."""
    import sqlalchemy

    server = sqlalchemy.engine.make_url(postgres_server)
    name = f"autotune_t_{uuid.uuid4().hex[:16]}"  # [a-z0-9_]: needs no quoting
    # CREATE/DROP DATABASE cannot run inside a transaction
    admin = sqlalchemy.create_engine(server, isolation_level="AUTOCOMMIT", poolclass=sqlalchemy.pool.NullPool)
    try:
        with admin.connect() as conn:
            conn.execute(sqlalchemy.text(f"CREATE DATABASE {name}"))
        yield server.set(database=name).render_as_string(hide_password=False)
        with admin.connect() as conn:  # FORCE: a worker the test killed may still hold a connection
            conn.execute(sqlalchemy.text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    finally:
        admin.dispose()
