"""Reading a study directory (or a profile directory) into typed objects.

Everything is optional on disk: a trial pruned before launch has only ``result.json``, a CPU study has
no GPU rows, a study killed mid-trial has a trial without a result. What cannot be read becomes a
note in :attr:`StudyData.problems`, never an exception — except a directory that is not a study at all,
which is a :class:`~autotune.errors.UsageError`.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import pandas as pd
from autotune.probes.timeline import phase_intervals
from pydantic import ValidationError

from autotune.errors import UsageError
from autotune.jsontypes import JsonValue
from autotune.recommend import baseline_of
from autotune.records import Hardware, StepMetrics, TrialResult, TrialStatus
from autotune.studydir import (
    StudyDir,
    StudyFileError,
    TrialDir,
    denied,
    parse_json_bounded,
    read_json_guarded,
    read_study_bytes,
    regular_file,
)
from autotune.studysettings import StudySettings

__all__ = [
    "PhaseSpan",
    "TrialData",
    "StudyData",
    "load_study",
    "load_profile",
    "is_study_dir",
    "is_profile_dir",
]


@dataclass(frozen=True)
class PhaseSpan:
    """One phase of one step on the monotonic clock.

    Attributes:
        open: True when the phase began and never ended (the trial died or hung inside it).
        source: "markers" (written by the training process) or what probes inferred.
    """

    phase: str
    step: int | None
    t0_mono_s: float
    t1_mono_s: float
    open: bool = False
    source: str = "markers"

    @property
    def duration_s(self) -> float:
        return max(0.0, self.t1_mono_s - self.t0_mono_s)


@dataclass
class TrialData:
    """One trial as found on disk."""

    number: int
    result: TrialResult
    dir: Path | None
    steps: list[StepMetrics] = field(default_factory=list)
    markers: list[dict[str, Any]] = field(default_factory=list)
    timeline: pd.DataFrame | None = None
    spans: list[PhaseSpan] = field(default_factory=list)
    command: str | None = None
    launch: dict[str, Any] | None = None
    files: dict[str, Path] = field(default_factory=dict)

    @property
    def status(self) -> TrialStatus:
        return self.result.status

    @property
    def params(self) -> dict[str, Any]:
        return self.result.params

    def gpu_rows(self) -> pd.DataFrame | None:
        """Timeline rows of GPUs (None when the trial has none)."""
        if self.timeline is None or "source" not in self.timeline:
            return None
        rows = self.timeline[self.timeline["source"] == "gpu"]
        return rows if len(rows) else None

    def host_rows(self) -> pd.DataFrame | None:
        """Timeline rows of the host sampler (None when the trial has none)."""
        if self.timeline is None or "source" not in self.timeline:
            return None
        rows = self.timeline[self.timeline["source"] == "host"]
        return rows if len(rows) else None

    @property
    def t0_mono_s(self) -> float | None:
        """The earliest moment known for the trial (timeline, markers or steps)."""
        candidates: list[float] = []
        if self.timeline is not None and len(self.timeline) and "t_mono_s" in self.timeline:
            candidates.append(float(self.timeline["t_mono_s"].min()))
        candidates.extend(s.t0_mono_s for s in self.spans)
        if self.steps:
            first = self.steps[0]
            candidates.append(first.t_mono_s - (first.duration_s or 0.0))
        return min(candidates) if candidates else None

    @property
    def t_end_mono_s(self) -> float | None:
        """The latest moment known for the trial."""
        candidates: list[float] = []
        if self.timeline is not None and len(self.timeline) and "t_mono_s" in self.timeline:
            candidates.append(float(self.timeline["t_mono_s"].max()))
        candidates.extend(s.t1_mono_s for s in self.spans)
        candidates.extend(s.t_mono_s for s in self.steps)
        return max(candidates) if candidates else None


@dataclass
class StudyData:
    """A study (or a single profiled run) as found on disk.

    Attributes:
        kind: "study" for ``autotune search`` output, "profile" for ``autotune profile``.
        meta: ``study.json`` (or ``profile.json``) as written; :attr:`settings` reads it.
        roots: absolute directories that stand for this study (where it is and where it was written).
        env_maps: the extra environments of the trials' launch plans (to know their secrets).
        secret_names: argument names the study declared secret (``--secret-arg``, in ``study.json``).
        problems: files that could not be read, one line each.
    """

    root: Path
    kind: Literal["study", "profile"]
    meta: dict[str, Any]
    hardware: Hardware | None
    trials: list[TrialData]
    best_command: str | None = None
    best_knobs: dict[str, Any] | None = None
    roots: list[str] = field(default_factory=list)
    env_maps: list[dict[str, str]] = field(default_factory=list)
    secret_names: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @cached_property
    def settings(self) -> StudySettings:
        """:attr:`meta` as the study's settings record (a profile's ``profile.json`` shares its fields:
        ``command``, ``secret_args``, ``hardware``; its own are kept as extra)."""
        return StudySettings.from_json(self.meta)

    def trial(self, number: int | None) -> TrialData | None:
        """The trial with this number, if it is on disk."""
        return next((t for t in self.trials if t.number == number), None)

    @property
    def baseline(self) -> TrialData | None:
        chosen = baseline_of([t.result for t in self.trials])
        return self.trial(chosen.number) if chosen is not None else None

    @property
    def results(self) -> list[TrialResult]:
        return [t.result for t in self.trials]

    @property
    def gpu_count(self) -> int:
        if self.hardware is not None and self.hardware.gpus:
            return len(self.hardware.gpus)
        return max((len(t.result.peak_mem_bytes) for t in self.trials), default=0)

    def gpu_label(self, position: int) -> str:
        """``GPU 2`` for the GPU at this position of the selection."""
        if self.hardware is not None and position < len(self.hardware.gpus):
            return f"GPU {self.hardware.gpus[position].index}"
        return f"GPU {position}"

    def gpu_index(self, position: int) -> int:
        """The NVML index (timeline ``device``) of the GPU at this position of the selection."""
        if self.hardware is not None and position < len(self.hardware.gpus):
            return self.hardware.gpus[position].index
        return position

    def capacity_bytes(self, position: int, trial: TrialData | None = None) -> int | None:
        """Total memory of the GPU at this position (hardware first, then what the trial measured)."""
        if self.hardware is not None and position < len(self.hardware.gpus):
            return self.hardware.gpus[position].memory_total_bytes
        if trial is not None:
            gpus = trial.result.timeline_summary.gpus if trial.result.timeline_summary is not None else ()
            total = gpus[position].mem_total_bytes if position < len(gpus) else None
            if total:
                return int(total)
            rows = trial.gpu_rows()
            if rows is not None and "mem_total_bytes" in rows:
                dev = rows[rows["device"] == self.gpu_index(position)]["mem_total_bytes"].dropna()
                if len(dev):
                    return int(dev.max())
        return None


def _num(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def is_study_dir(path: Path) -> bool:
    """True when ``path`` looks like an ``autotune search`` study directory."""
    study = StudyDir(path)
    return path.is_dir() and (study.study_json.is_file() or study.trials_dir.is_dir())


def is_profile_dir(path: Path) -> bool:
    """True when ``path`` looks like an ``autotune profile`` output directory."""
    return path.is_dir() and TrialDir(path).profile_json.is_file()


def _read_json(path: Path, problems: list[str], root: Path) -> JsonValue:
    """A JSON file of the study read the one way (:func:`~autotune.studydir.read_json_guarded`): a link,
    a special file, a huge, deep or non-finite one is a problem of the report, never a traceback."""
    if not os.path.lexists(path):
        return None
    try:
        return read_json_guarded(path, fix="")
    except StudyFileError as exc:
        problems.append(f"{_rel(path, root)}: unreadable ({_why(exc, path)})")
        return None


def _why(exc: StudyFileError, path: Path) -> str:
    return exc.message.replace(str(path), "", 1).strip(" :")


def _rel(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root))
    except ValueError:
        return path.name


def _read_text(path: Path) -> str | None:
    """A text file of the study read the one way (:func:`~autotune.studydir.read_study_bytes`), or None
    when it is missing, a link, special or too big."""
    if not os.path.lexists(path):
        return None
    try:
        return read_study_bytes(path, fix="").decode("utf-8", errors="replace")
    except StudyFileError:
        return None


def _whole_lines(text: str, *, live: bool) -> list[str]:
    """The lines of an appended file; while its trial runs, a last line without its newline is still
    being written: it is left for the next read, not counted as damage."""
    lines = text.splitlines()
    if live and lines and not text.endswith(("\n", "\r")):
        lines.pop()
    return lines


def _read_steps(path: Path, problems: list[str], root: Path, *, live: bool = False) -> list[StepMetrics]:
    text = _read_text(path)
    if text is None:
        return []
    steps: list[StepMetrics] = []
    bad = 0
    for line in _whole_lines(text, live=live):
        if not line.strip():
            continue
        try:
            steps.append(StepMetrics.model_validate_json(line))
        except ValidationError:
            bad += 1
    if bad:
        problems.append(f"{_rel(path, root)}: {bad} unreadable line(s) skipped")
    return sorted(steps, key=lambda s: s.t_mono_s)


def _read_markers(path: Path, problems: list[str], root: Path, *, live: bool = False) -> list[dict[str, Any]]:
    text = _read_text(path)
    if text is None:
        return []
    markers: list[dict[str, Any]] = []
    bad = 0
    for line in _whole_lines(text, live=live):
        if not line.strip():
            continue
        try:
            item = parse_json_bounded(line, where=str(path), fix="")
        except StudyFileError:
            bad += 1
            continue
        if isinstance(item, dict) and item.get("event") in ("begin", "end") and _num(item.get("t_mono_s")):
            markers.append(item)
        else:
            bad += 1
    if bad:
        problems.append(f"{_rel(path, root)}: {bad} unreadable line(s) skipped")
    return sorted(markers, key=lambda m: float(m["t_mono_s"]))


def _read_timeline(path: Path, problems: list[str], root: Path) -> pd.DataFrame | None:
    if not regular_file(path):  # a link or a FIFO planted there is never opened
        return None
    try:
        df = pd.read_parquet(path)
    except PermissionError:
        raise denied(path) from None
    except (OSError, ValueError, ImportError) as exc:
        problems.append(f"{_rel(path, root)}: unreadable ({exc.__class__.__name__})")
        return None
    if "t_mono_s" not in df.columns or "source" not in df.columns:
        problems.append(f"{_rel(path, root)}: no t_mono_s/source columns")
        return None
    if "device" not in df.columns:
        df = df.assign(device=-1)
    return df.sort_values("t_mono_s", kind="stable").reset_index(drop=True)


def spans_from_markers(markers: list[dict[str, Any]], end_mono_s: float | None) -> list[PhaseSpan]:
    """Pair begin/end markers into spans. A begin without an end runs to ``end_mono_s`` (open)."""
    spans: list[PhaseSpan] = []
    opened: dict[str, list[dict[str, Any]]] = {}
    for m in markers:
        phase = str(m.get("phase") or "other")
        if m["event"] == "begin":
            opened.setdefault(phase, []).append(m)
        elif opened.get(phase):
            begin = opened[phase].pop()
            spans.append(
                PhaseSpan(
                    phase,
                    _step(begin.get("step", m.get("step"))),
                    float(begin["t_mono_s"]),
                    float(m["t_mono_s"]),
                )
            )
    for phase, begins in opened.items():
        for begin in begins:
            t0 = float(begin["t_mono_s"])
            t1 = max(t0, end_mono_s) if end_mono_s is not None else t0
            spans.append(PhaseSpan(phase, _step(begin.get("step")), t0, t1, open=True))
    return sorted(spans, key=lambda s: s.t0_mono_s)


def _step(value: Any) -> int | None:
    return int(value) if _num(value) else None


def _inferred_spans(trial: TrialData, problems: list[str]) -> list[PhaseSpan]:
    """Phases inferred by ``probes.timeline`` when the trial wrote no markers."""
    if trial.timeline is None or not trial.steps:
        return []
    steps = [
        {"step": s.step, "t_mono_s": s.t_mono_s, "duration_s": s.duration_s, "values": dict(s.values)}
        for s in trial.steps
    ]
    try:
        intervals = phase_intervals(steps, trial.markers, trial.timeline)
    except Exception as exc:  # noqa: BLE001 - inference is best effort; a failure is shown as a note
        problems.append(f"trial {trial.number}: phases could not be inferred ({exc.__class__.__name__})")
        return []
    spans = []
    for item in intervals or []:
        try:
            spans.append(
                PhaseSpan(
                    str(item["phase"]),
                    _step(item.get("step")),
                    float(item["t0_mono_s"]),
                    float(item["t1_mono_s"]),
                    source=str(item.get("source") or "inferred"),
                )
            )
        except (KeyError, TypeError, ValueError):
            continue
    return sorted(spans, key=lambda s: s.t0_mono_s)


_TRIAL_DIR_RE = re.compile(rf"^(?P<root>/.+?)/{re.escape(StudyDir.TRIALS)}/\d+(?:/|$)")


def _load_trial(
    number: int, directory: Path, root: Path, problems: list[str], result: TrialResult | None
) -> TrialData | None:
    files = TrialDir(directory)
    if result is None:
        raw = _read_json(files.result_json, problems, root)
        if raw is None:
            if directory.is_dir() and any(directory.iterdir()):
                problems.append(f"{_rel(directory, root)}: no {TrialDir.RESULT} (the trial did not finish)")
            return None
        try:
            result = TrialResult.from_dict(raw)
        except ValidationError as exc:
            problems.append(
                f"{_rel(files.result_json, root)}: not a trial result ({exc.error_count()} error(s))"
            )
            return None
    trial = TrialData(number=number, result=result, dir=directory)
    for name in (
        TrialDir.STDOUT,
        TrialDir.STDERR,
        TrialDir.COMMAND,
        TrialDir.LAUNCH,
        TrialDir.METRICS,
        TrialDir.TIMELINE,
        TrialDir.PHASES,
    ):
        if (files / name).is_file():
            trial.files[name] = files / name
    live = result.status is TrialStatus.RUNNING
    trial.steps = _read_steps(files.metrics_jsonl, problems, root, live=live)
    trial.markers = _read_markers(files.phases_jsonl, problems, root, live=live)
    trial.timeline = _read_timeline(files.timeline_parquet, problems, root)
    trial.command = _read_text(files.command_sh)
    launch = _read_json(files.launch_json, problems, root)
    trial.launch = launch if isinstance(launch, dict) else None
    trial.spans = spans_from_markers(trial.markers, trial.t_end_mono_s)
    if not trial.spans:
        trial.spans = _inferred_spans(trial, problems)
    return trial


def _original_roots(trials: list[TrialData]) -> list[str]:
    """Where the study was when its launch plans were written (it may have moved since)."""
    roots: set[str] = set()
    for t in trials:
        if not t.launch:
            continue
        for value in [t.launch.get("cwd"), *(t.launch.get("metrics_paths") or [])]:
            if isinstance(value, str):
                m = _TRIAL_DIR_RE.match(value)
                if m:
                    roots.add(m["root"])
    return sorted(roots)


def _hardware(raw: object, problems: list[str]) -> Hardware | None:
    if not isinstance(raw, dict):
        return None
    try:
        return Hardware.model_validate(raw)
    except ValidationError as exc:
        problems.append(f"hardware in the settings is unreadable ({exc.error_count()} error(s))")
        return None


def _env_maps(trials: list[TrialData]) -> list[dict[str, str]]:
    maps = []
    for t in trials:
        env = (t.launch or {}).get("env")
        if isinstance(env, dict):
            maps.append({str(k): str(v) for k, v in env.items()})
    return maps


def load_study(study_dir: Path) -> StudyData:
    """Read ``runs/<study>``: settings, every trial, and the exported winner.

    Safe while a search writes the study (``autotune report`` at any moment): the read is a snapshot
    built from single reads. Every file is read once, whole: ``study.json``, each ``result.json``, the
    timelines and ``best/`` are replaced atomically by their writers (a temporary file, then a rename),
    so each read sees one complete version, never a half-written one. The trial list is taken once; a
    trial that appears later is in the next report. The files a running trial appends to
    (``metrics.jsonl``, ``phases.jsonl``) are read up to their last complete line. The Optuna storage
    (``study.db``) is not read at all: the trial directories hold every result (``--storage`` copies a
    study from its storage into the directory first). What is missing or damaged is a line of
    ``problems``, never an exception.

    Raises:
        UsageError: ``study_dir`` is not a study directory.
    """
    with _readable():
        return _load_study(Path(study_dir))


@contextmanager
def _readable() -> Iterator[None]:
    """A file or directory of the study that this user may not read is one line (exit 2), wherever the
    read hit it (a listing, a stat, a read)."""
    try:
        yield
    except PermissionError as exc:
        if exc.filename is None:
            raise
        raise denied(Path(exc.filename)) from None


def _load_study(study_dir: Path) -> StudyData:
    root = Path(study_dir)
    if not is_study_dir(root):
        raise UsageError(
            f"{study_dir} is not a study directory (no {StudyDir.SETTINGS} or {StudyDir.TRIALS}/ in it)",
            hint="Pass the runs/<study> directory that autotune search wrote",
        )
    study = StudyDir(root)
    problems: list[str] = []
    meta = _read_json(study.study_json, problems, root)
    if not isinstance(meta, dict):
        if study.study_json.exists() or meta is not None:
            problems.append(f"{StudyDir.SETTINGS} is not a JSON object")
        meta = {}
    trials: list[TrialData] = []
    trials_dir = study.trials_dir
    if trials_dir.is_dir():
        numbered = sorted((int(p.name), p) for p in trials_dir.iterdir() if p.is_dir() and p.name.isdigit())
        for number, directory in numbered:
            trial = _load_trial(number, directory, root, problems, None)
            if trial is not None:
                trials.append(trial)
    best_dir = study.best_dir
    knobs = _read_json(best_dir / StudyDir.BEST_KNOBS, problems, root)
    data = StudyData(
        root=root.resolve(),
        kind="study",
        meta=meta,
        hardware=_hardware(StudySettings.from_json(meta).hardware, problems),
        trials=trials,
        best_command=_read_text(best_dir / StudyDir.BEST_COMMAND),
        best_knobs=knobs if isinstance(knobs, dict) else None,
        problems=problems,
    )
    data.roots = sorted({str(root.resolve()), str(root.absolute()), *_original_roots(trials)})
    data.env_maps = _env_maps(trials)
    data.secret_names = list(data.settings.secret_args)
    return data


def load_profile(out_dir: Path) -> StudyData:
    """Read an ``autotune profile`` run directory (see :func:`_load_profile`).

    Raises:
        UsageError: not a profile directory, or a file this user may not read (one line).
    """
    with _readable():
        return _load_profile(out_dir)


def _load_profile(out_dir: Path) -> StudyData:
    """Read an ``autotune profile`` directory: the per-trial files at its top level plus ``profile.json``.

    Raises:
        UsageError: ``out_dir`` holds neither ``profile.json`` nor the files of a run.
    """
    root = Path(out_dir)
    run = TrialDir(root)
    run_files = (TrialDir.RESULT, TrialDir.METRICS, TrialDir.TIMELINE, TrialDir.PHASES)
    if not root.is_dir() or not (is_profile_dir(root) or any((run / f).is_file() for f in run_files)):
        raise UsageError(
            f"{out_dir} is not a profile directory (no {TrialDir.PROFILE} or run files in it)",
            hint="Pass the directory that autotune profile wrote",
        )
    problems: list[str] = []
    meta = _read_json(run.profile_json, problems, root)
    meta = meta if isinstance(meta, dict) else {}
    result: TrialResult | None = None
    raw = _read_json(run.result_json, problems, root)
    if raw is not None:
        try:
            result = TrialResult.from_dict(raw)
        except ValidationError as exc:
            problems.append(f"{TrialDir.RESULT}: not a run result ({exc.error_count()} error(s))")
    if result is None:
        status = meta.get("status")
        result = TrialResult.outline(
            0,
            {},
            status=TrialStatus(status) if status in TrialStatus.__members__ else TrialStatus.COMPLETE,
            reason=str(meta.get("reason") or f"profiled run (no {TrialDir.RESULT})"),
        )
    trial = _load_trial(result.number, root, root, problems, result)
    trials = [trial] if trial is not None else []
    data = StudyData(
        root=root.resolve(),
        kind="profile",
        meta=meta,
        hardware=_hardware(StudySettings.from_json(meta).hardware, problems),
        trials=trials,
        problems=problems,
    )
    data.roots = sorted({str(root.resolve()), str(root.absolute())})
    data.env_maps = _env_maps(trials)
    data.secret_names = list(data.settings.secret_args)
    return data
