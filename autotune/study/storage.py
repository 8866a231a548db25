"""Where a study's Optuna records live: opening the storage, and the one-line error when it cannot be.

The default is SQLite inside the study directory; ``--storage`` takes any Optuna storage URL
(``postgresql://…`` for workers on several hosts). Nothing here prints a URL's password: every URL
shown goes through :meth:`SecretRule.redact_url`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import re
import socket
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

import optuna
from optuna.trial import FrozenTrial

from autotune.errors import UsageError, WriteError
from autotune.jsontypes import JsonObject
from autotune.secrets import SecretRule
from autotune.study.optuna_view import MachineAttrs

__all__ = [
    "HEARTBEAT_ENV",
    "Heartbeat",
    "Worker",
    "fail_stale",
    "grace_s",
    "heartbeat_s",
    "live_workers",
    "open_storage",
    "silent_trials",
    "storage_error",
    "workers_of",
]

log = logging.getLogger(__name__)


def storage_error(
    url: str, exc: Exception, secrets: SecretRule, *, own: bool = False
) -> UsageError | WriteError:
    """The one-line error for a storage that cannot be opened: a URL no driver knows, a missing
    directory, a driver not installed, a server out of reach or refusing the login (the URL's password
    masked); a storage that cannot be written (a read-only ``study.db``) is a :class:`WriteError`
    (exit 74), as every write failure is. ``own``: the URL is the study directory's own ``study.db``
    (no ``--storage`` was given): the fix names that file, never the flag."""
    text = _first_line(getattr(exc, "orig", None) or exc)
    read_only = next((t for t in map(_first_line, _causes(exc)) if _READ_ONLY.search(t)), None)
    if read_only is not None:  # Optuna wraps SQLite's words ("during the commit"): the cause says it
        where = url.removeprefix("sqlite:///") if own else secrets.redact_url(url)
        return WriteError(
            f"cannot write the study storage {where}: {secrets.mask(read_only)[:200]}",
            hint="Make the file and its directory writable (or free space), then run the same command "
            "again to resume",
        )
    hint = (
        "Pass a valid Optuna storage URL with --storage (sqlite:////abs/path.db, postgresql://…) whose "
        "directory or server exists"
    )
    backend = _backend(url)
    if own:
        return UsageError(
            f"cannot open the study's own storage {url.removeprefix('sqlite:///')}: {secrets.mask(text)[:200]}",
            hint="Restore study.db from a backup, or move it away so that it is rebuilt from the trial "
            "directories, then run the same command again",
        )
    if isinstance(exc, ImportError) or "DB access module" in text:
        module = getattr(exc.__cause__, "name", None) or getattr(exc, "name", None)
        text, hint = _driver_missing(backend, module)
    elif backend in _SERVERS:
        text, hint = _server_failure(url, backend, text, hint)
    return UsageError(
        f"cannot open study storage {secrets.redact_url(url)}: {secrets.mask(text)[:200]}", hint=hint
    )


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc``, the driver's own error under it (SQLAlchemy's ``orig``), then its causes, in order."""
    chain: list[BaseException] = []
    todo: BaseException | None = exc
    while todo is not None and todo not in chain and len(chain) < 16:
        chain.append(todo)
        orig = getattr(todo, "orig", None)
        if isinstance(orig, BaseException) and orig not in chain:
            chain.append(orig)
        todo = todo.__cause__ or todo.__context__
    return chain


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


#: what SQLite and the servers say of a storage they cannot write
_READ_ONLY = re.compile(
    r"readonly database|read-only|permission denied|disk I/O error",
    re.IGNORECASE,
)


class _Server(NamedTuple):
    name: str  # as a person says it
    port: int  # its default port
    drivers: tuple[str, ...]  # the driver modules our extra installs (SQLAlchemy's default among them)
    install: str | None  # how to install them


#: database servers Optuna's RDB storage talks to
_SERVERS = {
    "postgresql": _Server(
        "PostgreSQL", 5432, ("psycopg", "psycopg2"), "pip install 'autotune-grpo[postgres]'"
    ),
    "mysql": _Server("MySQL", 3306, (), None),
}


def _backend(url: str) -> str:
    """The database a URL names (``postgresql+psycopg2://…`` → ``postgresql``)."""
    scheme = url.split(":", 1)[0].split("+", 1)[0].lower()
    return "postgresql" if scheme == "postgres" else scheme


def _driver_missing(backend: str, module: str | None) -> tuple[str, str]:
    """What to say when the URL's driver cannot be imported."""
    server = _SERVERS.get(backend)
    missing = f" (no module {module})" if module else ""
    if server is not None and server.install is not None and (module is None or module in server.drivers):
        return f"the {server.name} driver is not installed{missing}", f"Install it: {server.install}"
    what = f"the {server.name if server else 'database'} driver for this URL is not installed{missing}"
    todo = f"Install the module {module}" if module else "Install its driver"
    if server is not None and server.install is not None:
        todo += f", or use a {backend}:// URL ({server.install})"
    return what, todo


# what libpq (PostgreSQL) and the MySQL drivers say when they never reach the server or it says no
_UNREACHABLE = re.compile(
    r"connection refused|could not translate host name|name or service not known|timeout expired|"
    r"no route to host|network is unreachable|can't connect to mysql server|could not connect to server",
    re.IGNORECASE,
)
_LOGIN = re.compile(r"authentication failed|access denied|no password supplied", re.IGNORECASE)
_NO_DATABASE = re.compile(r'database "?[^"]*"? does not exist|unknown database', re.IGNORECASE)


def _server_failure(url: str, backend: str, text: str, hint: str) -> tuple[str, str]:
    """The error of a database server that cannot be used, naming it by host:port."""
    from sqlalchemy.engine import make_url  # optuna's dependency; only a server URL needs it

    server = _SERVERS[backend]
    if "Can't load plugin" in text:  # SQLAlchemy knows postgresql://, not postgres://
        return text, f"Write the URL as {backend}://… or {backend}+DRIVER://… in --storage"
    try:
        parsed = make_url(url)
        where = f"{parsed.host or 'localhost'}:{parsed.port or server.port}"
    except Exception:  # noqa: BLE001 - an unparsable URL keeps the driver's own words
        return text, hint
    # libpq: '[connection failed: ]connection to server at "h", port p failed: FATAL:  the reason'
    reason = re.sub(r"^.*\bfailed:\s*", "", text)
    reason = re.sub(r"^(FATAL|ERROR):\s*", "", reason).strip() or text
    name = server.name
    if _UNREACHABLE.search(text):
        return (
            f"cannot reach the {name} server at {where} ({reason})",
            "Start the server, or fix the host and port in --storage; it must accept TCP connections "
            "from this host",
        )
    if _LOGIN.search(text):
        return (
            f"the {name} server at {where} refused the login ({reason})",
            f"Check the user name and password in --storage ({backend}://USER:PASSWORD@HOST:PORT/DB)",
        )
    if _NO_DATABASE.search(text):
        return (
            f"the {name} server at {where} has no such database ({reason})",
            "Create it first (createdb NAME) or name an existing database in --storage",
        )
    return f"the {name} server at {where}: {reason}", hint


#: seconds between a worker's heartbeats (``AUTOTUNE_HEARTBEAT_S`` changes it, e.g. for a test)
HEARTBEAT_ENV = "AUTOTUNE_HEARTBEAT_S"
_DEFAULT_HEARTBEAT_S = 10
#: a running trial whose worker has not beaten for this many heartbeats is stale (its worker is gone)
_GRACE_BEATS = 4


def heartbeat_s() -> int:
    """Seconds between heartbeats (Optuna counts them in whole seconds)."""
    raw = os.environ.get(HEARTBEAT_ENV, "")
    try:
        return max(1, int(float(raw))) if raw.strip() else _DEFAULT_HEARTBEAT_S
    except ValueError:
        return _DEFAULT_HEARTBEAT_S


def grace_s() -> int:
    """Seconds after its last heartbeat before a worker counts as gone."""
    return _GRACE_BEATS * heartbeat_s()


def open_storage(
    url: str,
    secrets: SecretRule,
    on_stale: Callable[[optuna.Study, FrozenTrial], None] | None = None,
    *,
    own: bool = False,
) -> optuna.storages.BaseStorage | None:
    """The Optuna storage behind ``url``, with heartbeats (None for ``":memory:"``: this process only).

    Every relational storage (SQLite, PostgreSQL, MySQL) records a heartbeat for each running trial, so
    a worker that died (``kill -9``, a lost node) is told apart from a live one: its trial goes stale
    after :func:`grace_s` and ``on_stale`` is called for it (Optuna's failed-trial callback).

    Raises:
        UsageError: the URL names no storage Optuna knows, its driver is not installed, the server or
            directory cannot be reached (one line, the password masked).
    """
    if url == ":memory:":
        return None
    try:
        if url.split(":", 1)[0].split("+", 1)[0] not in _RDB_SCHEMES:
            return optuna.storages.get_storage(url)
        # SQLite serialises writers: several workers on one file wait for each other, not fail
        # a server that never answers: its connection gives up (the drivers' connect_timeout, seconds)
        engine = (
            {"connect_args": {"timeout": 60}}
            if url.startswith("sqlite")
            else {"pool_pre_ping": True, "connect_args": {"connect_timeout": _CONNECT_TIMEOUT_S}}
        )
        # a loop of our own, not tenacity (no dependency of autotune): one call, five tries, and only the
        # table-creation race below is retried
        for attempt in range(_CREATE_ATTEMPTS):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # the heartbeat's
                    return optuna.storages.RDBStorage(
                        url,
                        engine_kwargs=engine,
                        heartbeat_interval=heartbeat_s(),
                        grace_period=grace_s(),
                        heartbeat_stale_trial_callback=on_stale,
                    )
            except Exception as exc:  # noqa: BLE001 - see below
                # workers that start together on an empty database race to create its tables: the
                # losers find them made and open again
                if attempt + 1 == _CREATE_ATTEMPTS or not _CREATE_RACE.search(str(exc)):
                    raise
                time.sleep(0.2 + random.random())
        raise AssertionError("unreachable")
    except Exception as exc:  # noqa: BLE001 - Optuna and SQLAlchemy raise many kinds; all are one line
        raise storage_error(url, exc, secrets, own=own) from None


_CREATE_ATTEMPTS = 5
_CONNECT_TIMEOUT_S = 30
# what SQLite and PostgreSQL say when another worker created the same table or version row first
_CREATE_RACE = re.compile(r"already exists|UNIQUE constraint|duplicate key|database is locked", re.IGNORECASE)


_RDB_SCHEMES = ("sqlite", "postgresql", "postgres", "mysql", "oracle", "mssql")


def fail_stale(study: optuna.Study) -> None:
    """Fail the trials whose worker stopped beating (their ``on_stale`` callback runs)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


@dataclass(frozen=True)
class Worker:
    """Who runs trials in a study: a process on a host (and its slot when one process runs several)."""

    host: str
    pid: int
    slot: int | None = None

    @classmethod
    def this(cls, slot: int | None = None) -> Worker:
        return cls(host=socket.gethostname(), pid=os.getpid(), slot=slot)

    @property
    def name(self) -> str:
        return f"{self.host}:{self.pid}" + (f":{self.slot}" if self.slot is not None else "")

    def to_dict(self) -> JsonObject:
        return {"host": self.host, "pid": self.pid, "slot": self.slot, "name": self.name}


_WORKER_ATTR = "worker:"


class Heartbeat:
    """A worker's heartbeat while it runs: the running trial's (Optuna's heartbeat, which tells a dead
    worker's trial from a live one) and the worker's own in the study's attributes (when it started,
    when last seen: the study's clock and the report's list of workers).

    Use as a context manager around the worker's run; :meth:`beat_for` points it at a trial.
    """

    def __init__(
        self, study: optuna.Study, storage: optuna.storages.BaseStorage | None, worker: Worker
    ) -> None:
        self._study = study
        self._storage = storage
        self._worker = worker
        self._trial_id: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.started_wall_s = time.time()
        self.error: Exception | None = None

    def beat_for(self, trial_id: int | None) -> None:
        """Beat for this trial from now on (None: no trial running); beats once at once."""
        with self._lock:
            self._trial_id = trial_id
        self._beat()

    def _beat(self) -> None:
        with self._lock:
            trial_id = self._trial_id
        record_heartbeat = getattr(self._storage, "record_heartbeat", None)
        if trial_id is not None and record_heartbeat is not None:
            record_heartbeat(trial_id)
        record = {**self._worker.to_dict(), "started_wall_s": self.started_wall_s, "seen_wall_s": time.time()}
        MachineAttrs(self._study).set(_WORKER_ATTR + self._worker.name, record)

    def _run(self) -> None:
        while not self._stop.wait(heartbeat_s()):
            try:
                self._beat()
            except Exception as exc:  # noqa: BLE001 - a lost beat is retried; the last error is kept
                self.error = exc
                log.debug("heartbeat failed: %s", exc)

    def __enter__(self) -> Heartbeat:
        self._beat()
        self._thread = threading.Thread(target=self._run, name=f"heartbeat-{self._worker.name}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(Exception):
            machine = MachineAttrs(self._study)
            record = machine.get(_WORKER_ATTR + self._worker.name) or {}
            machine.set(_WORKER_ATTR + self._worker.name, {**record, "ended_wall_s": time.time()})


def live_workers(study: optuna.Study, now_wall_s: float | None = None) -> list[dict[str, Any]]:
    """The workers of a study seen within the grace period and not ended, oldest first."""
    now = time.time() if now_wall_s is None else now_wall_s
    out = []
    for key, rec in MachineAttrs(study).items():
        if not key.startswith(_WORKER_ATTR) or not isinstance(rec, dict) or rec.get("ended_wall_s"):
            continue
        if now - float(rec.get("seen_wall_s") or 0) <= grace_s():
            out.append(rec)
    return sorted(out, key=lambda r: float(r.get("started_wall_s") or 0))


#: a worker that has not beaten for this many heartbeats has probably died: the study waits for its
#: running trial to go stale (:func:`grace_s`) rather than end with that trial's slot lost
_SILENT_BEATS = 2


def silent_trials(study: optuna.Study, now_wall_s: float | None = None) -> list[int]:
    """The running trials whose worker stopped beating (or never named itself) and that are not yet
    stale: a worker about to end the study waits for them to go stale, then runs them again."""
    now = time.time() if now_wall_s is None else now_wall_s
    seen = {
        str(rec.get("name")): float(rec.get("seen_wall_s") or 0)
        for key, rec in study.user_attrs.items()
        if key.startswith(_WORKER_ATTR) and isinstance(rec, dict) and not rec.get("ended_wall_s")
    }
    out = []
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        name = (t.user_attrs.get("worker") or {}).get("name")
        last = seen.get(str(name)) if name is not None else None
        if last is None or now - last > _SILENT_BEATS * heartbeat_s():
            out.append(t.number)
    return out


def workers_of(study: optuna.Study) -> list[dict[str, Any]]:
    """Every worker that ever joined the study, oldest first."""
    recs = [r for k, r in MachineAttrs(study).items() if k.startswith(_WORKER_ATTR) and isinstance(r, dict)]
    return sorted(recs, key=lambda r: float(r.get("started_wall_s") or 0))
