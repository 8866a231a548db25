"""``autotune profile``: run any training command under the probes, no search."""

from __future__ import annotations

from typing import Annotated

import typer

from autotune.cli import _options as o

HELP = """Run one training command under the GPU and host probes (no search) and write its timeline,
phase breakdown and a report with the same charts and diagnosis as a study.

\b
Examples:
  autotune profile -- swift rlhf --rlhf_type grpo --model Qwen/Qwen2.5-7B ...
  autotune profile --out runs/profile-1 -- accelerate launch my_grpo.py"""


def register(app: typer.Typer) -> None:
    """Add the command to the app."""

    @app.command(
        "profile", cls=o.PanelledCommand, help=HELP, context_settings={"allow_interspersed_args": False}
    )
    def profile(
        command: Annotated[
            list[str] | None, typer.Argument(help="The training command, after --.", show_default=False)
        ] = None,
        out: Annotated[
            str | None, typer.Option("--out", help="Output directory (default runs/profile-<time>).")
        ] = None,
        gpus: o.Gpus = None,
        sample_interval: o.SampleInterval = 0.1,
        metrics_file: o.MetricsFile = None,
        global_batch: Annotated[
            int | None, typer.Option("--global-batch", help="Completions per step, for throughput.")
        ] = None,
        hang_floor: Annotated[
            str, typer.Option("--hang-floor", help="Stop the run after this long without a step.")
        ] = "30m",
        startup_timeout: Annotated[
            str, typer.Option("--startup-timeout", help="Time allowed before the first step.")
        ] = "1h",
        secret_arg: o.SecretArg = None,
        report_to: o.ReportTo = None,
    ) -> None:
        import time
        from pathlib import Path

        from autotune.app.durations import parse_duration_s
        from autotune.app.profile import ProfileRequest, run_profile
        from autotune.cli._console import say
        from autotune.errors import UsageError
        from autotune.study.hardware import resolve_hardware

        if sample_interval <= 0:
            raise UsageError(
                f"--sample-interval must be positive, got {sample_interval:g}",
                hint="For example --sample-interval 0.1",
            )
        req = ProfileRequest(
            command=tuple(command or ()),
            out=Path(out) if out else Path("runs") / time.strftime("profile-%Y%m%d-%H%M%S"),
            hardware=resolve_hardware(gpus),
            sample_interval_s=sample_interval,
            metrics_file=Path(metrics_file) if metrics_file else None,
            global_batch=global_batch,
            hang_floor_s=parse_duration_s(hang_floor, flag="--hang-floor"),
            startup_timeout_s=parse_duration_s(startup_timeout, flag="--startup-timeout"),
            secret_args=tuple(secret_arg or ()),
            report_to=tuple(report_to or ()),
        )
        import contextlib

        from autotune.cli._console import console
        from autotune.cli._gpus import watching_gpus

        sampled = req.hardware.visible and bool(req.hardware.gpus)  # a CPU run has no GPU rows
        with watching_gpus(console) if sampled else contextlib.nullcontext() as board:
            outcome = run_profile(req, live=board)
        say(outcome.summary)
        say(f"report: {outcome.html}  {outcome.markdown}")
        raise typer.Exit(outcome.exit_code)
