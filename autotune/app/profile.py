"""``autotune profile``: one run of any training command under the probes — timeline, phases,
diagnosis — with no search.

Step records are recognised in every format autotune knows: JSON lines (stdout or
``$AUTOTUNE_METRICS_FILE``, which :class:`autotune.probes.callback.AutotuneCallback` writes), Hugging Face
Trainer / TRL log dicts, ms-swift's log dicts and ``logging.jsonl``, and verl's console lines and file
logger. Phase markers come from ``probes.phases`` inside the training process (``$AUTOTUNE_PHASES_FILE``).
"""

from __future__ import annotations

import shlex
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from autotune.backends._base import OpenPhase, StepParser
from autotune.errors import UsageError
from autotune.records import Hardware, LaunchPlan, StepMetrics, TrialResult, TrialSpec
from autotune.trial.live import LiveGpus

if TYPE_CHECKING:
    from autotune.studydir import TrialDir
    from autotune.trial.pipeline import TrialJob

__all__ = ["AnyFormatParser", "EchoParser", "ProfileOutcome", "ProfileRequest", "run_profile"]

# The formats' own step files in the run directory (in a study, each backend names its own).
_COMMAND_METRICS = "command_metrics.jsonl"
_VERL_METRICS = "verl_metrics.jsonl"


class AnyFormatParser(StepParser):
    """Feeds every line to each known parser; the first to report a step number wins it."""

    def __init__(self, parsers: Sequence[StepParser]) -> None:
        self.parsers = list(parsers)
        self._seen: set[int] = set()

    def _keep(self, steps: list[StepMetrics]) -> list[StepMetrics]:
        out = []
        for s in steps:
            if s.step not in self._seen:
                self._seen.add(s.step)
                out.append(s)
        return out

    def feed(self, stream: str, line: str, t_mono_s: float, t_wall_s: float) -> list[StepMetrics]:
        return self._keep([s for p in self.parsers for s in p.feed(stream, line, t_mono_s, t_wall_s)])

    def poll(self, t_mono_s: float, t_wall_s: float) -> list[StepMetrics]:
        return self._keep([s for p in self.parsers for s in p.poll(t_mono_s, t_wall_s)])

    def finish(self, t_mono_s: float, t_wall_s: float) -> list[StepMetrics]:
        return self._keep([s for p in self.parsers for s in p.finish(t_mono_s, t_wall_s)])


class EchoParser(StepParser):
    """Shows the command's own output as it comes (its stdout on ours, its stderr on ours), then hands
    each line to the parser that reads it: ``profile`` is watched as the command would be run alone,
    and its logs are still recorded by the runner."""

    def __init__(self, inner: StepParser, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.inner = inner
        self._streams = {"stdout": out or sys.stdout, "stderr": err or sys.stderr}
        self._lock = threading.Lock()

    def feed(self, stream: str, line: str, t_mono_s: float, t_wall_s: float) -> list[StepMetrics]:
        target = self._streams.get(stream, self._streams["stdout"])
        with self._lock:
            try:
                target.write(line.rstrip("\n") + "\n")
                target.flush()
            except (OSError, ValueError):
                pass  # a closed terminal must not end the run
        return self.inner.feed(stream, line, t_mono_s, t_wall_s)

    def poll(self, t_mono_s: float, t_wall_s: float) -> list[StepMetrics]:
        return self.inner.poll(t_mono_s, t_wall_s)

    def finish(self, t_mono_s: float, t_wall_s: float) -> list[StepMetrics]:
        return self.inner.finish(t_mono_s, t_wall_s)

    def open_phase(self) -> OpenPhase | None:
        return self.inner.open_phase()


@dataclass(frozen=True)
class ProfileOutcome:
    """How a profiled run ended: the command's exit code, the reports, and a summary line (status,
    steps, seconds per step at steady state, throughput when the batch is known)."""

    exit_code: int
    html: Path
    markdown: Path
    summary: str


@dataclass(frozen=True)
class ProfileRequest:
    """What ``autotune profile`` was asked to do."""

    command: tuple[str, ...]
    out: Path
    hardware: Hardware
    sample_interval_s: float = 0.1
    metrics_file: Path | None = None
    global_batch: int | None = None
    startup_timeout_s: float = 3600.0
    hang_floor_s: float = 1800.0
    hang_k: float = 20.0
    secret_args: tuple[str, ...] = ()
    report_to: tuple[str, ...] = ()


def run_profile(req: ProfileRequest, live: LiveGpus | None = None, echo: bool = True) -> ProfileOutcome:
    """Run the command under the probes; write the run's files, ``profile.json`` and the report.

    Args:
        req: what to run and how.
        live: a board the live view reads the run's GPUs from (:mod:`autotune.trial.live`), or None.
        echo: show the command's output live (the CLI); its logs are recorded either way.
    """
    from autotune.app.tracking import ProfileTracking
    from autotune.secrets import SecretRule
    from autotune.studydir import TrialDir, ensure_writable, write_json_atomic
    from autotune.trial.execute import ProbeSettings, make_samplers
    from autotune.trial.pipeline import TrialPipeline

    if not req.command:
        raise UsageError(
            "autotune profile needs a command after --", hint="e.g. autotune profile -- python train.py"
        )
    tracking = ProfileTracking(req.report_to, req.out)  # a missing tracker package: before anything runs
    ensure_writable(req.out)
    files = TrialDir(req.out)
    if files.profile_json.exists() or files.result_json.exists():
        raise UsageError(
            f"{req.out} already holds a profile", hint="Choose a new --out so the earlier run is kept"
        )
    secrets = SecretRule(req.secret_args).learning(req.command)
    shown = secrets.redact_argv(req.command)  # profile.json never holds a secret
    header = {
        "command": list(shown),
        "command_line": shlex.join(shown),
        "secret_args": list(req.secret_args),
        "hardware": req.hardware.model_dump(mode="json"),
        "started_wall_s": time.time(),
    }
    job = _job(req, files, tracking.env(), echo)
    write_json_atomic(files.profile_json, header)
    pipeline = TrialPipeline(
        hardware=req.hardware,
        samplers=make_samplers(req.hardware, ProbeSettings(gpu_interval_s=req.sample_interval_s)),
        live=live,
        secrets=secrets,
    )
    judged = pipeline.run(job)
    result, record = judged.result, judged.record
    write_json_atomic(files.result_json, result.model_dump(mode="json"))
    tracking.log(result)
    write_json_atomic(
        files.profile_json,
        {
            **header,
            "finished_wall_s": time.time(),
            "status": result.status.value,
            "reason": result.reason,
        },
    )
    from autotune.reports import render_profile

    paths = render_profile(req.out)
    code = record.exit_code if record.exit_code is not None else (128 + (record.signal or 0))
    return ProfileOutcome(code, paths.html, paths.markdown, _summary(result, list(record.steps)))


def _job(req: ProfileRequest, files: TrialDir, tracker_env: dict[str, str], echo: bool) -> TrialJob:
    """The profiled command as a pipeline job: its plan (the probes' files and the trackers' variables
    in its environment), a parser of every step format, the profile's patient watchdog, and a judging
    that needs no step record and keeps what it measured of a run that failed."""
    from autotune.backends._loglines import TrainerLogParser
    from autotune.backends.command import CommandParser
    from autotune.backends.swift._log import SwiftLogParser, is_step_record
    from autotune.backends.verl._log import VerlLogParser
    from autotune.trial.pipeline import Judging, TrialJob
    from autotune.trial.runner import EarlyStopConfig, WatchdogConfig

    metrics = req.metrics_file or (req.out / _COMMAND_METRICS)
    env = {
        "AUTOTUNE_PHASES_FILE": str(files.phases_jsonl.resolve()),
        "AUTOTUNE_METRICS_FILE": str(metrics.resolve()),
        "VERL_FILE_LOGGER_PATH": str((req.out / _VERL_METRICS).resolve()),
        **tracker_env,
    }
    if req.hardware.gpus and req.hardware.visible:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g.index) for g in req.hardware.gpus)
    parser: StepParser = AnyFormatParser(
        [
            CommandParser(
                metrics,
                files.phases_jsonl,
                printed=TrainerLogParser(samples=req.global_batch, skip=is_step_record),
            ),
            SwiftLogParser(samples=req.global_batch),
            VerlLogParser(req.out / _VERL_METRICS),
        ]
    )
    return TrialJob(
        spec=TrialSpec(number=0, params={}),
        plan=LaunchPlan(argv=tuple(req.command), env=env, cwd=str(Path.cwd()), metrics_paths=()),
        parser=EchoParser(parser) if echo else parser,
        trial_dir=req.out,
        label="profile",
        global_batch=req.global_batch,
        watchdog=WatchdogConfig(
            startup_timeout_s=req.startup_timeout_s, hang_k=req.hang_k, hang_floor_s=req.hang_floor_s
        ),
        early_stop=EarlyStopConfig(enabled=False),
        judging=Judging(steps_required=False, steady_of_failures=True),
    )


def _summary(result: TrialResult, steps: list[StepMetrics]) -> str:
    """One line: status, steps, seconds per step at steady state (measured without a batch too) and
    the throughput when the batch is known."""
    from autotune.trial.steady import steady_estimate

    line = f"{result.status.value}: {len(steps)} step(s)"
    timing = steady_estimate(steps, 1) if len(steps) >= 2 else None
    if timing is not None:
        line += f", {timing.step_time_s:.3g} s/step at steady state (±{timing.rel_ci95:.0%})"
    if result.steady is not None:
        line += f", {result.steady.throughput:.3g} completions/s"
    elif timing is not None:
        line += " (give --global-batch for completions/s)"
    return line
