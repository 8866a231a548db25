"""What every test folder shares: a PostgreSQL database of its own for each test that asks for one.

``postgres_url`` is a fresh, empty database on a real server (dropped after the test), so no test sees
another's studies. The server is ``AUTOTUNE_TEST_POSTGRES_URL`` when set (``scripts/test.sh`` starts
one), else one this session starts with ``scripts/postgres.sh`` and stops at its end; with neither the
test is skipped, saying how to get one. Tests that use it carry the ``postgres`` marker.

The tiers (pyproject's ``addopts`` deselects the slow two; ``--all-tiers`` runs every one):
- ``infra``: a browser, a database, the wheelhouse or packaging. A test that asks for PostgreSQL gets the
  marker here, so it cannot land in the fast tier by forgetting it.
- ``e2e``: starts a framework process (a real TRL/ms-swift/vLLM/DeepSpeed trial or study, verl composing
  its config in its own interpreter). A test that asks for a framework's interpreter gets the marker
  here; one without it that launches a framework from the test process (TRL's worker,
  ``torch.distributed.run``, ``swift rlhf``, a trainer module) fails, naming the marker to add.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import tempfile
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


# argv items that only a real framework process carries (fake trainers in the fast tier run scripts)
FRAMEWORK_ARGV = (
    "autotune.backends.trl_worker",
    "torch.distributed.run",
    "verl.trainer.main_ppo",
    "swift.cli.rlhf",
    "deepspeed.launcher.runner",
    "vllm.entrypoints.openai.api_server",
)

# fixtures that hand a test a framework's own interpreter (verl's, which composes verl's config with hydra)
FRAMEWORK_FIXTURES = ("verl_python",)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--all-tiers",
        action="store_true",
        help="run every tier (fast, e2e, infra): clears the -m 'not e2e and not infra' of pyproject's addopts",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--all-tiers"):
        config.option.markexpr = ""


@pytest.hookimpl(tryfirst=True)  # before -m deselects: a marker added here decides the item's tier
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "postgres_url" in fixtures or "postgres_server" in fixtures:
            item.add_marker(pytest.mark.postgres)
        if item.get_closest_marker("postgres") is not None:
            item.add_marker(pytest.mark.infra)
        if any(name in fixtures for name in FRAMEWORK_FIXTURES):
            item.add_marker(pytest.mark.e2e)


def _framework_launch(args: object) -> str | None:
    """The framework item in a Popen argv, if this argv starts a framework process."""
    if isinstance(args, (str, bytes, os.PathLike)):
        return None  # a single program path: never one of the module launches above
    words = [str(a) for a in args]  # type: ignore[attr-defined]
    if len(words) > 1 and Path(words[0]).name == "swift" and words[1] == "rlhf":
        # ms-swift's console script; the fake ones tests write live under the temporary folder
        if not Path(words[0]).resolve().is_relative_to(Path(tempfile.gettempdir()).resolve()):
            return "swift rlhf"
    # a launch names what to run after the module (a usage check of the bare module starts nothing)
    return next((w for w in words[:-1] if w in FRAMEWORK_ARGV), None)


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_framework(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside ``e2e``, launching a framework process from the test process fails the test."""
    if request.node.get_closest_marker("e2e") is not None:
        return
    real = subprocess.Popen
    test = request.node.nodeid

    class GuardedPopen(real):  # type: ignore[misc,valid-type]
        def __init__(self, args: object, *rest: object, **kwargs: object) -> None:
            found = _framework_launch(args)
            if found is not None:
                pytest.fail(
                    f"{test} starts a framework process ({found}) but is not marked e2e: add @pytest.mark.e2e",
                    pytrace=False,
                )
            super().__init__(args, *rest, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(subprocess, "Popen", GuardedPopen)


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
