"""``autotune doctor``: one line per check of this machine (ok / warn / fail, with the fix)."""

from __future__ import annotations

from typing import Annotated

import typer

from autotune.cli import _options as o

HELP = """Check this machine before tuning on it: the NVIDIA driver and NVML, torch's CUDA against the
driver (torch as the trials' interpreter has it: --backend, --executable), the GPUs this process may use (CUDA_VISIBLE_DEVICES) and who else is on them, MIG, persistence,
ECC, clock slowdowns, the frameworks installed and their pins on each other, /dev/shm, the open-file
limit, --out writable with free disk, the cache writable, host RAM against what offload needs, and the NCCL environment.

Exits 0 when nothing fails (warnings included; no GPU is a warning), 1 otherwise.
--bench measures this machine's peaks (matmul FLOP/s, memory and host-to-device bandwidth, all-reduce
on 2+ GPUs; the CPU's on a machine without GPU) and caches them for plan, search and the report.
--calibrate (GPU) runs a few short real trials and writes the table the estimator corrects itself with.

\b
Examples:
  autotune doctor
  autotune doctor --out /scratch/runs --model Qwen2.5-7B --json
  autotune doctor --backend swift --executable /envs/swift/bin/swift
  autotune doctor --bench --seconds 3"""


def register(app: typer.Typer) -> None:
    """Add the command to the app."""

    @app.command("doctor", cls=o.PanelledCommand, help=HELP)
    def doctor(
        out: Annotated[
            str, typer.Option("--out", help="Where studies will be written (free disk).")
        ] = "runs",
        model: Annotated[
            str | None,
            typer.Option("--model", help="A model to check host RAM against (ZeRO-3 offload of it)."),
        ] = None,
        backend: Annotated[
            str,
            typer.Option(
                "--backend",
                help="Whose trials' interpreter to read for torch, its CUDA build and the frameworks.",
            ),
        ] = "trl",
        executable: o.Executable = None,
        quick: Annotated[
            bool, typer.Option("--quick", help="Only the checks search runs before its first trial.")
        ] = False,
        bench: Annotated[
            bool, typer.Option("--bench", help="Measure and cache this machine's peaks.")
        ] = False,
        seconds: Annotated[
            float, typer.Option("--seconds", help="Seconds per micro-benchmark of --bench.")
        ] = 3.0,
        calibrate: Annotated[
            bool,
            typer.Option(
                "--calibrate", help="Run short real trials on the GPU and write the calibration table."
            ),
        ] = False,
        as_json: o.Json = False,
    ) -> None:
        import json

        from autotune.app.doctor import DoctorRequest, run_doctor
        from autotune.cli._console import err_console, say

        outcome = run_doctor(
            DoctorRequest(
                out=out,
                model=model,
                backend=backend,
                executable=executable,
                quick=quick,
                bench=bench,
                seconds=seconds,
                calibrate=calibrate,
            ),
            err_console,
        )
        if as_json:
            say(json.dumps(outcome.to_dict(), indent=2))
        else:
            for finding in outcome.report.findings:
                say(finding.line())
        raise typer.Exit(outcome.report.exit_code)
