"""``autotune profile``: one run of any training command under the probes — timeline, phases,
diagnosis — with no search.

Step records are recognised in every format autotune knows: JSON lines (stdout or
``$AUTOTUNE_METRICS_FILE``, which :class:`autotune.probes.callback.AutotuneCallback` writes), Hugging Face
Trainer / TRL log dicts, ms-swift's log dicts and ``logging.jsonl``, and verl's console lines and file
logger. Phase markers come from ``probes.phases`` inside the training process (``$AUTOTUNE_PHASES_FILE``).
"""

from __future__ import annotations

import shlex
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from autotune.backends._base import StepParser
from autotune.errors import UsageError
from autotune.records import Hardware, LaunchPlan, StepMetrics
from autotune.trial.live import LiveGpus

__all__ = ["ProfileRequest", "AnyFormatParser", "run_profile"]

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


def run_profile(req: ProfileRequest, live: LiveGpus | None = None) -> tuple[int, Path, Path]:
    """Run the command under the probes; write the run's files, ``profile.json`` and the report.

    Args:
        req: what to run and how.
        live: a board the live view reads the run's GPUs from (:mod:`autotune.trial.live`), or None.

    Returns:
        (the command's exit code, report.html, report.md).
    """
    from autotune.backends._loglines import TrainerLogParser
    from autotune.backends.command import CommandParser
    from autotune.backends.swift._log import SwiftLogParser, is_step_record
    from autotune.backends.verl._log import VerlLogParser
    from autotune.records import TrialResult
    from autotune.studydir import TrialDir, ensure_writable, write_json_atomic
    from autotune.trial.execute import ProbeSettings, make_samplers, summarize_trial
    from autotune.trial.outcome import classify, health_check
    from autotune.trial.runner import EarlyStopConfig, WatchdogConfig, run_trial
    from autotune.trial.steady import steady_estimate

    if not req.command:
        raise UsageError(
            "autotune profile needs a command after --", hint="e.g. autotune profile -- python train.py"
        )
    from autotune.app.tracking import ProfileTracking

    tracking = ProfileTracking(req.report_to, req.out)  # a missing tracker package: before anything runs
    ensure_writable(req.out)
    files = TrialDir(req.out)
    if files.profile_json.exists() or files.result_json.exists():
        raise UsageError(
            f"{req.out} already holds a profile", hint="Choose a new --out so the earlier run is kept"
        )
    metrics = req.metrics_file or (req.out / _COMMAND_METRICS)
    env = {
        "AUTOTUNE_PHASES_FILE": str(files.phases_jsonl.resolve()),
        "AUTOTUNE_METRICS_FILE": str(metrics.resolve()),
        "VERL_FILE_LOGGER_PATH": str((req.out / _VERL_METRICS).resolve()),
        **tracking.env(),
    }
    if req.hardware.gpus and req.hardware.visible:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g.index) for g in req.hardware.gpus)
    plan = LaunchPlan(argv=tuple(req.command), env=env, cwd=str(Path.cwd()), metrics_paths=())
    parser = AnyFormatParser(
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
    watchdog = WatchdogConfig(
        startup_timeout_s=req.startup_timeout_s, hang_k=req.hang_k, hang_floor_s=req.hang_floor_s
    )
    from autotune.secrets import SecretRule

    secrets = SecretRule(req.secret_args).learning(req.command)
    shown = secrets.redact_argv(req.command)  # profile.json never holds a secret
    header = {
        "command": list(shown),
        "command_line": shlex.join(shown),
        "secret_args": list(req.secret_args),
        "hardware": req.hardware.model_dump(mode="json"),
        "started_wall_s": time.time(),
    }
    write_json_atomic(files.profile_json, header)
    samplers = make_samplers(req.hardware, ProbeSettings(gpu_interval_s=req.sample_interval_s))
    watched = live.open("profile", parser.open_phase) if live is not None else None
    try:
        record = run_trial(
            plan,
            parser,
            req.out,
            global_batch=req.global_batch or 1,
            watchdog=watchdog,
            early_stop=EarlyStopConfig(enabled=False),
            samplers=watched.samplers(samplers) if watched is not None else samplers,
            stop_event=threading.Event(),
            secrets=secrets,
        )
    finally:
        if watched is not None:
            watched.close()
    steps = list(record.steps)
    batch = req.global_batch or next((s.samples for s in steps if s.samples), None)
    steady = steady_estimate(steps, batch) if batch else None
    health = (
        health_check(steps, beta=None, max_completion_length=None, baseline=None)
        if steps and record.exit_code == 0
        else []
    )
    verdict = classify(record, health=health, steps_required=False)
    summary = summarize_trial(req.out, steps)
    peaks = [g.get("peak_mem_bytes") for g in (summary or {}).get("gpus", [])]
    host_peak = ((summary or {}).get("host") or {}).get("peak_rss_bytes")
    result = TrialResult(
        number=0,
        params={},
        status=verdict.status,
        reason=secrets.mask(verdict.reason),
        evidence=secrets.mask(verdict.evidence) if verdict.evidence is not None else None,
        exit_code=record.exit_code,
        signal=record.signal,
        steps=len(steps),
        steady=steady,
        health=health,
        peak_mem_bytes=peaks,
        host_peak_rss_bytes=int(host_peak) if host_peak else None,
        timeline_summary=summary,
        started_wall_s=record.started_wall_s,
        duration_s=record.duration_s,
        startup_s=record.startup_s,
        gpu_seconds=record.duration_s * max(1, len(req.hardware.gpus)),
    )
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
    return code, paths.html, paths.markdown
