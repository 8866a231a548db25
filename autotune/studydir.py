"""The study directory on disk: the one place that names every file of a study and of a trial.

::

    runs/<study>/
      study.db            Optuna storage
      study.json          resolved settings, the outcome and the recommendation
      study.lock          held (flock) by the run writing the study; names its pid and host
      trials/<n>/         launch.json, command.sh, stdout.log, stderr.log, metrics.jsonl,
                          timeline.parquet, phases.jsonl, proc.json, result.json (+ the backend's own)
      trials/confirm-<n>-<k>/   the same files for round k of the re-measurement of trial n's
                          configuration after the search (not a trial: no Optuna trial, no trial slot)
      report.html  report.md  charts/
      best/               the winner's exported configs

A profiled run (``autotune profile``) is one trial directory with a ``profile.json`` beside its files.
JSON writes are atomic (write to a temporary file, then ``os.replace``) so a study killed at any moment
never leaves a half-written record behind. Every file of a study is written through
:func:`write_text_atomic` / :func:`write_json_atomic` (records, scripts) or :func:`create_file`
(streamed logs): none follows a symbolic link planted in the study, and a failed write is a
:class:`~autotune.errors.WriteError` naming the file and the cause.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import stat
import tempfile
from pathlib import Path
from typing import BinaryIO

from autotune.errors import UsageError, WriteError
from autotune.jsontypes import JsonValue
from autotune.records import Hardware, Recommendation, TrialResult
from autotune.studysettings import StudySettings
from autotune.writable import ensure_writable

__all__ = [
    "StudyDir",
    "StudyFileError",
    "TrialDir",
    "create_file",
    "denied",
    "check_creatable",
    "ensure_study_out",
    "ensure_writable",
    "parse_json_bounded",
    "read_json_guarded",
    "read_study_bytes",
    "read_text_guarded",
    "regular_file",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_text_atomic",
]


def write_json_atomic(path: Path, data: object) -> None:
    """Write JSON to ``path`` atomically (see :func:`write_text_atomic`).

    Raises:
        WriteError: the file cannot be written (disk full, read-only, no permission).
    """
    write_text_atomic(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def write_text_atomic(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (see :func:`write_bytes_atomic`).

    Raises:
        WriteError: the file cannot be written (disk full, read-only, no permission).
    """
    write_bytes_atomic(path, text.encode("utf-8"), mode=mode)


def write_bytes_atomic(path: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Write ``data`` to ``path`` atomically: a fresh temporary file beside it, then a rename.

    A reader never sees half a file, and a symbolic link planted at ``path`` is replaced, never followed
    (the rename replaces the link itself; the temporary file is created with ``O_EXCL``).

    Raises:
        WriteError: the file cannot be written (disk full, read-only, no permission).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                os.fchmod(fh.fileno(), mode)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise WriteError.of(path, exc) from None


def denied(path: Path) -> UsageError:
    """The one line for a file or directory of a study that this user may not read (exit 2).

    Names the folder that blocks the way when ``path`` lies under one this user cannot enter (a trial
    directory with mode 000), since that is the one to fix.
    """
    blocked = next((p for p in reversed(path.parents) if not os.access(p, os.X_OK)), path)
    try:
        folder = blocked.is_dir()
    except OSError:
        folder = False
    fix = f"chmod -R u+rwX {blocked}" if folder else f"chmod u+rw {blocked}"
    return UsageError(
        f"cannot read {blocked}: permission denied",
        hint=f"Fix its permissions ({fix}), or run as the user who owns the study",
    )


class StudyFileError(UsageError):
    """A file of a study that is not one of its records: a link, a FIFO, a device, too big, too deep,
    not JSON (exit 2). A report lists it as a problem of its trial; a command that needs it stops."""


#: the most a study's record (a JSON file, a log read by a report) may hold: a bigger one is not ours
MAX_RECORD_BYTES = 256 * 2**20
#: the deepest nesting a study's JSON may have (autotune writes 6 at most); deeper is refused unparsed
MAX_JSON_DEPTH = 64
_JSON_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')
_JSON_OPENERS = re.compile(rb"[\[{]|[\]}]")


def regular_file(path: Path) -> bool:
    """True when ``path`` is a plain file itself: not a link, a FIFO, a device, a socket or a folder."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def read_study_bytes(path: Path, *, fix: str, max_bytes: int = MAX_RECORD_BYTES) -> bytes:
    """The bytes of a file of a study: the one way every study file is opened for reading.

    The file is opened without following a link and without blocking (a FIFO with no writer), then
    refused unless it is a regular file of at most ``max_bytes``: a link planted in the study, a FIFO,
    a device (``/dev/zero``) or a socket is one line, never read, never waited on.

    Raises:
        UsageError: the file is missing, a link, not a regular file, too big, or unreadable.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist", hint=fix) from None
    except PermissionError:
        raise denied(path) from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StudyFileError(f"{path} is a symbolic link (a study's files never are)", hint=fix) from None
        raise StudyFileError(
            f"cannot read {path}: {exc.strerror or exc.__class__.__name__}", hint=fix
        ) from None
    with os.fdopen(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise StudyFileError(f"{path} is not a regular file ({_file_kind(info.st_mode)})", hint=fix)
        if info.st_size > max_bytes:
            raise StudyFileError(f"{path} is too big ({info.st_size} bytes, at most {max_bytes})", hint=fix)
        try:
            data = fh.read(max_bytes + 1)
        except OSError as exc:
            raise StudyFileError(
                f"cannot read {path}: {exc.strerror or exc.__class__.__name__}", hint=fix
            ) from None
    if len(data) > max_bytes:  # grew while read
        raise StudyFileError(f"{path} is too big (more than {max_bytes} bytes)", hint=fix)
    return data


def _file_kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
    )
    return next((name for test, name in kinds if test(mode)), "a special file")


def read_text_guarded(path: Path, *, fix: str, max_bytes: int = MAX_RECORD_BYTES) -> str:
    """The UTF-8 text of a file of a study (:func:`read_study_bytes`), or one line naming it and the fix.

    Raises:
        UsageError: the file is missing, a link, special, too big, unreadable or not UTF-8.
    """
    data = read_study_bytes(path, fix=fix, max_bytes=max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise StudyFileError(f"cannot read {path}: not UTF-8 text", hint=fix) from None


def read_json_guarded(path: Path, *, fix: str, max_bytes: int = MAX_RECORD_BYTES) -> JsonValue:
    """The JSON value of a file of a study, read by :func:`read_study_bytes`, its depth bounded before it
    is parsed (:data:`MAX_JSON_DEPTH`) and every number finite (``NaN``, ``1e999`` refused).

    Raises:
        UsageError: the file cannot be read (see :func:`read_text_guarded`), is not JSON, nests too
            deep, or holds a number that is not finite.
    """
    data = read_study_bytes(path, fix=fix, max_bytes=max_bytes)
    return parse_json_bounded(data, where=str(path), fix=fix)


def parse_json_bounded(data: bytes | str, *, where: str, fix: str) -> JsonValue:
    """``data`` parsed as JSON with the bounds of :func:`read_json_guarded` (one line when refused)."""
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    depth = 0
    for match in _JSON_OPENERS.finditer(_JSON_STRINGS.sub(b'""', raw)):
        depth += 1 if match.group() in (b"[", b"{") else -1
        if depth > MAX_JSON_DEPTH:
            raise StudyFileError(
                f"{where} nests deeper than {MAX_JSON_DEPTH} levels (not autotune's)", hint=fix
            )
    try:
        value: JsonValue = json.loads(raw, parse_constant=_not_finite, parse_float=_finite_float)
    except (ValueError, RecursionError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc) or exc.__class__.__name__
        raise StudyFileError(f"{where} is not valid JSON ({reason})", hint=fix) from None
    return value


def _not_finite(text: str) -> float:
    raise ValueError(f"the number {text} is not finite")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"the number {text[:20]} is not finite")
    return value


def _json_kind(value: object) -> str:
    """How a JSON value is named in a message ("a list", "null", "a string")."""
    if value is None:
        return "null"
    names = {list: "a list", str: "a string", bool: "a boolean", int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


def create_file(path: Path, *, mode: int = 0o644) -> BinaryIO:
    """Open ``path`` as a fresh, empty file for writing (unbuffered bytes), never through a symbolic link.

    The one way autotune opens a study's streamed files (logs, ``metrics.jsonl``): a link planted at
    ``path`` is removed (its target is untouched), as is a FIFO or socket planted there, and the file
    is opened with ``O_NOFOLLOW``.

    Raises:
        WriteError: the file cannot be created (disk full, read-only, no permission).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if os.path.lexists(path) and not regular_file(path):
            path.unlink()  # a link, or a FIFO (opening it would wait for a reader forever), or a socket
        fd = os.open(path, flags | os.O_NONBLOCK, mode)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "wb", buffering=0)
    except OSError as exc:
        raise WriteError.of(path, exc) from None


def check_creatable(directory: Path, *, flag: str = "--out") -> None:
    """Prove ``directory`` could be made and written without leaving anything behind: a folder is made
    and removed in its nearest existing parent (or in it, when it exists). A one-line UsageError names
    ``directory`` when it cannot (``/proc/x``), before any check reads its free disk."""
    parent = directory
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    try:
        probe = tempfile.mkdtemp(prefix=".autotune-write-test-", dir=parent)
        os.rmdir(probe)
    except OSError as exc:
        raise UsageError(
            f"cannot write to {flag} {directory}: {exc.strerror or exc.__class__.__name__}",
            hint=f"Choose a writable directory with {flag}",
        ) from None


def ensure_study_out(directory: Path, *, flag: str = "--out") -> None:
    """Accept ``directory`` for a study only when it is new, empty, or a study; then prove it writable.

    A directory that holds anything else (a project, ``$HOME``) is refused: the study would write its
    ``report.md``, ``charts/``, ``best/`` … into it, over files of the same name.

    Raises:
        UsageError: ``directory`` is not a directory, or holds files that are not a study's (one line
            naming those autotune would have replaced), or cannot be written.
    """
    held = _foreign_entries(directory, flag)
    if held:
        clash = sorted(n for n in held if n in StudyDir.WRITES)
        shown = clash or sorted(held)
        listed = ", ".join(shown[:6]) + (f" and {len(shown) - 6} more" if len(shown) > 6 else "")
        what = f"autotune would replace {listed}" if clash else f"it holds {listed}"
        raise UsageError(
            f"{flag} {directory} is neither empty nor a study: {what}",
            hint=f"Choose a new or empty directory with {flag}, or the directory of an existing study",
        )
    ensure_writable(directory, flag=flag)


def _foreign_entries(directory: Path, flag: str) -> list[str]:
    """The entries of ``directory`` that make it neither new, empty, nor a study (empty: none)."""
    try:
        if not directory.exists():
            return []
        if not directory.is_dir():
            return [directory.name]
        names = [child.name for child in directory.iterdir()]
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        raise UsageError(
            f"cannot read {flag} {directory}: {reason}", hint=f"Choose a readable directory with {flag}"
        ) from None
    if StudyDir.SETTINGS in names:
        return []
    # what a study writes before its study.json (the storage, its lock, the trials' directory)
    early = {StudyDir.LOCK, StudyDir.TRIALS, "cache"}
    return [n for n in names if n not in early and not n.startswith(StudyDir.DB)]


class TrialDir:
    """The files of one trial (``trials/<n>/``), or of a profiled run."""

    LAUNCH = "launch.json"
    COMMAND = "command.sh"
    STDOUT = "stdout.log"
    STDERR = "stderr.log"
    METRICS = "metrics.jsonl"
    TIMELINE = "timeline.parquet"
    PHASES = "phases.jsonl"
    PROC = "proc.json"
    RESULT = "result.json"
    PROFILE = "profile.json"
    PROMPTS = "prompts.jsonl"  # autotune's generated prompts, when the trial trained on them
    #: what a run writes about itself (never an input of its command)
    RECORDS = frozenset({LAUNCH, COMMAND, STDOUT, STDERR, METRICS, TIMELINE, PHASES, PROC, RESULT, PROFILE})

    def __init__(self, path: Path) -> None:
        self.path = path

    def __truediv__(self, name: str) -> Path:
        return self.path / name

    @property
    def launch_json(self) -> Path:
        return self.path / self.LAUNCH

    @property
    def command_sh(self) -> Path:
        return self.path / self.COMMAND

    @property
    def stdout_log(self) -> Path:
        return self.path / self.STDOUT

    @property
    def stderr_log(self) -> Path:
        return self.path / self.STDERR

    @property
    def metrics_jsonl(self) -> Path:
        return self.path / self.METRICS

    @property
    def timeline_parquet(self) -> Path:
        return self.path / self.TIMELINE

    @property
    def phases_jsonl(self) -> Path:
        return self.path / self.PHASES

    @property
    def proc_json(self) -> Path:
        return self.path / self.PROC

    @property
    def result_json(self) -> Path:
        return self.path / self.RESULT

    @property
    def profile_json(self) -> Path:
        return self.path / self.PROFILE

    @property
    def prompts_jsonl(self) -> Path:
        return self.path / self.PROMPTS


class StudyDir:
    """Paths and records of one study directory (``runs/<study>``)."""

    SETTINGS = "study.json"
    DB = "study.db"
    LOCK = "study.lock"
    TRIALS = "trials"
    BEST = "best"
    CHARTS = "charts"
    REPORT_HTML = "report.html"
    REPORT_MD = "report.md"
    # in best/, written by autotune.export: the winner's knobs (the json export) and the script that runs it
    BEST_KNOBS = "knobs.json"
    BEST_COMMAND = "command.sh"
    # in trials/: the re-measurement runs, confirm-<trial>-<round>
    CONFIRM_PREFIX = "confirm-"
    # what a study writes at its root: an existing file of one of these names would be replaced
    WRITES = frozenset({SETTINGS, DB, LOCK, TRIALS, BEST, CHARTS, REPORT_HTML, REPORT_MD, "cache"})

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def study_json(self) -> Path:
        return self.root / self.SETTINGS

    @property
    def lock_path(self) -> Path:
        return self.root / self.LOCK

    @property
    def db_path(self) -> Path:
        return self.root / self.DB

    @property
    def trials_dir(self) -> Path:
        return self.root / self.TRIALS

    @property
    def best_dir(self) -> Path:
        return self.root / self.BEST

    @property
    def charts_dir(self) -> Path:
        return self.root / self.CHARTS

    @property
    def report_html(self) -> Path:
        return self.root / self.REPORT_HTML

    @property
    def report_md(self) -> Path:
        return self.root / self.REPORT_MD

    @property
    def cache_dir(self) -> Path:
        return self.root / "cache"

    def own_dir(self, path: Path) -> Path:
        """Create ``path`` (a directory of this study: ``trials/``, ``trials/<n>/``) and return it.

        Raises:
            WriteError: it, or a directory between the study's root and it, is a symbolic link (a study's
                own directories are never links: writing through one could land anywhere), or it cannot
                be created.
        """
        try:
            inner = path.relative_to(self.root)
        except ValueError:
            inner = Path(path.name)
        at = path.parent if inner == Path(path.name) else self.root
        for part in inner.parts:
            at = at / part
            if at.is_symlink():
                raise WriteError.of(
                    at, OSError(errno.ELOOP, "a symbolic link where the study keeps its own directory")
                )
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise WriteError.of(path, exc) from None
        return path

    def own_file(self, path: Path) -> Path:
        """``path`` (a file of this study that a library opens by its name: ``study.db``), checked to be
        absent or a regular file, and returned.

        Raises:
            WriteError: it is a symbolic link (SQLite would write its tables into the link's target,
                another application's database) or a FIFO, device or socket.
        """
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return path
        except OSError as exc:
            raise WriteError.of(path, exc) from None
        if stat.S_ISREG(mode):
            return path
        what = "a symbolic link" if stat.S_ISLNK(mode) else _file_kind(mode)
        raise WriteError(
            f"cannot use {path}: it is {what}, not the study's own file",
            hint="Move it away (autotune never writes through a link or into a special file planted in "
            "the study), then run the same command again",
        )

    def trial_dir(self, number: int) -> Path:
        return self.trials_dir / str(number)

    def trial(self, number: int) -> TrialDir:
        return TrialDir(self.trial_dir(number))

    def confirm_dir(self, number: int, round_: int) -> Path:
        """The directory of round ``round_`` of the re-measurement of trial ``number``'s configuration."""
        return self.trials_dir / f"{self.CONFIRM_PREFIX}{number}-{round_}"

    def write_confirm_result(self, result: TrialResult, round_: int) -> None:
        """Store a re-measurement run's result (``result.number`` is the trial it repeats)."""
        path = TrialDir(self.confirm_dir(result.number, round_)).result_json
        write_json_atomic(path, result.model_dump(mode="json"))

    def read_confirm_result(self, number: int, round_: int) -> TrialResult | None:
        """A re-measurement run's result, or None when it never ran (or its record cannot be read)."""
        path = TrialDir(self.confirm_dir(number, round_)).result_json
        if not regular_file(path):
            return None
        try:
            return TrialResult.from_dict(read_json_guarded(path, fix="it runs again"))
        except (UsageError, ValueError):  # half a record from an older, killed run: it runs again
            return None

    def exists(self) -> bool:
        return self.study_json.exists()

    def read_settings(self) -> StudySettings:
        """``study.json``, the one way it is read (:func:`read_json_guarded`: no link, no FIFO or device,
        size and depth bounded), as :class:`~autotune.records.StudySettings`.

        Raises:
            UsageError: it is missing, unreadable, not JSON, or not a JSON object (one line naming it).
        """
        if not self.study_json.exists() and not self.study_json.is_symlink():
            raise UsageError(
                f"{self.root} is not a study directory (no study.json)",
                hint="Point at a directory written by autotune search",
            )
        data = read_json_guarded(self.study_json, fix="Restore it or start a new study with another --out")
        if not isinstance(data, dict):
            raise UsageError(
                f"{self.study_json} does not hold a JSON object (it holds {_json_kind(data)})",
                hint="Restore it or start a new study with another --out",
            )
        return StudySettings.from_json(data)

    def write_settings(self, settings: StudySettings) -> None:
        """Store ``study.json`` (:meth:`StudySettings.to_json`: the shape it was read or built in)."""
        write_json_atomic(self.study_json, settings.to_json())

    def write_result(self, result: TrialResult) -> None:
        """Store a trial's ``result.json`` (its directory is checked: never a link, see :meth:`own_dir`)."""
        self.own_dir(self.trial_dir(result.number))
        write_json_atomic(self.trial(result.number).result_json, result.model_dump(mode="json"))

    def read_result(self, number: int) -> TrialResult | None:
        """A trial's result, or None when it has none (a link planted in its place is not one).

        Raises:
            UsageError: the file is not a trial result (one line naming it).
        """
        path = self.trial(number).result_json
        try:
            if not path.exists() or path.is_symlink() or self.trial_dir(number).is_symlink():
                return None
        except PermissionError:  # the trial's directory cannot be searched (chmod 000, another owner)
            raise denied(self.trial_dir(number)) from None
        data = read_json_guarded(
            path, fix="Restore it, or move the trial's directory away to run that trial again"
        )
        try:
            return TrialResult.from_dict(data)
        except ValueError:
            raise UsageError(
                f"{path} is not a trial result (unreadable JSON)",
                hint="Restore it, or move the trial's directory away to run that trial again",
            ) from None

    def results(self) -> list[TrialResult]:
        """Every trial result on disk, by trial number."""
        out: list[TrialResult] = []
        if not self.trials_dir.exists():
            return out
        try:
            children = list(self.trials_dir.iterdir())
        except OSError as exc:
            raise UsageError(
                f"cannot read {self.trials_dir}: {exc.strerror or exc.__class__.__name__}",
                hint="Fix the directory's permissions (it holds the study's results)",
            ) from None
        for child in children:
            if child.is_dir() and child.name.isdigit():
                result = self.read_result(int(child.name))
                if result is not None:
                    out.append(result)
        return sorted(out, key=lambda r: r.number)

    def hardware(self, settings: StudySettings | None = None) -> Hardware | None:
        """The study's hardware from ``study.json`` (None when it lacks it or cannot be read)."""
        data = (settings if settings is not None else self.read_settings()).hardware
        if data is None:
            return None
        try:
            return Hardware.model_validate(data)
        except ValueError:
            return None

    def recommendation(
        self, settings: StudySettings | None = None, results: list[TrialResult] | None = None
    ) -> Recommendation | None:
        """The study's recommendation as stored in ``study.json`` when it ended.

        A study that has not ended (still running, or killed) has none stored: it is then decided from
        the results on disk by the same rule, :func:`autotune.recommend.recommend`.
        """
        settings = settings if settings is not None else self.read_settings()
        if settings.stored_recommendation:
            stored = settings.recommendation
            if stored is None:
                return None
            try:
                return Recommendation.model_validate(stored)
            except ValueError as exc:
                count = exc.error_count() if hasattr(exc, "error_count") else 1
                raise UsageError(
                    f"{self.study_json}: its recommendation is not one ({count} error(s))",
                    hint='Restore study.json, or delete its "recommendation" entry so that it is decided '
                    "again from the trials on disk",
                ) from None
        from autotune.recommend import recommend

        return recommend(self.results() if results is None else results, self.hardware(settings))
