"""``autotune search``: the main job — real trials, timelines, a recommendation and reports."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import typer

from autotune.cli import _options as o
from autotune.errors import UsageError
from autotune.fixed import UnknownFlag

HELP = """Run short real GRPO trials over a search space and recommend the fastest configuration that
neither OOMs, hangs nor breaks training on the GPUs detected (or on the CPU with a tiny model).

\b
Examples:
  autotune search --model tiny-qwen2 --trials 4 --out runs/demo
  autotune search --model Qwen2-7B --fixed job.yaml --time-budget 2h
  autotune search --gpus 4 --model Qwen2-7B --backend swift --fixed job.yaml
  autotune search --backend command --space bs.yaml -- ./train.sh --bs {bs}

After the search the winner and the baseline run again, interleaved (--confirm-runs), and the speedup
is given with a 95 % interval; one whose interval includes 1 is reported as no measurable speedup.

Running the same command again resumes the study in --out.

Exit codes: 0 a configuration is recommended, 3 nothing to recommend (the reason is printed), 2 bad
input, 130 interrupted (run the same command to resume)."""


def _own_option(exc: UnknownFlag, ctx: typer.Context, after: Sequence[str]) -> UsageError:
    """An argument after ``--`` (``after``) that the framework does not know but autotune does
    (``--trials 1``): the user meant autotune's option, which only counts before ``--``. Anything else
    stays the framework's refusal."""
    ours = {opt.lstrip("-").replace("-", "_"): opt for param in ctx.command.params for opt in param.opts}
    given = {item.split("=", 1)[0].lstrip("-").replace("-", "_") for item in after if item.startswith("--")}
    if exc.name not in ours or exc.name not in given:
        return exc
    option = ours[exc.name]
    return UsageError(
        f"{option} after -- is autotune's option, not an argument of {exc.framework}",
        hint=f"give {option} before --",
    )


def register(app: typer.Typer) -> None:
    """Add the command to the app."""

    @app.command(
        "search",
        cls=o.PanelledCommand,
        help=HELP,
        context_settings={"allow_interspersed_args": False},
    )
    def search(
        ctx: typer.Context,
        command: Annotated[
            list[str] | None,
            typer.Argument(
                help="After --: the command template (command backend) or extra framework arguments.",
                show_default=False,
            ),
        ] = None,
        model: o.Model = "tiny-qwen2",
        backend: o.SearchBackend = "trl",
        gpus: o.Gpus = None,
        gpu_type: o.GpuType = None,
        gpu_memory_gib: o.GpuMemoryGib = None,
        out: o.StudyOut = None,
        space: o.Space = None,
        fixed: o.Fixed = None,
        baseline: o.Baseline = None,
        trials: o.Trials = 8,
        time_budget: o.TimeBudget = None,
        search_kind: o.SearchKind = "auto",
        storage: o.Storage = None,
        study_name: o.StudyName = None,
        gpus_per_trial: o.GpusPerTrial = None,
        global_batch: o.GlobalBatch = None,
        num_generations: o.NumGenerations = None,
        max_steps: o.MaxSteps = 20,
        max_completion_length: o.MaxCompletionLength = None,
        dataset: o.Dataset = None,
        seed: o.Seed = 0,
        startup_timeout: o.StartupTimeout = None,
        hang_k: o.HangK = 5.0,
        hang_floor: o.HangFloor = "60s",
        trial_timeout: o.TrialTimeout = None,
        sample_interval: o.SampleInterval = 0.1,
        early_stop: o.EarlyStop = True,
        prune: o.Prune = True,
        metrics_file: o.MetricsFile = None,
        executable: o.Executable = None,
        confirm_runs: o.ConfirmRuns = 2,
        secret_arg: o.SecretArg = None,
        pin: o.Pin = None,
        as_json: o.Json = False,
        report_to: o.ReportTo = None,
    ) -> None:
        import json

        from autotune.app.search import SearchRequest, search_study
        from autotune.cli._console import console, err_console, say
        from autotune.cli._live import RichView

        request = SearchRequest(
            command=tuple(command or ()),
            model=model,
            backend=backend,
            gpus=gpus,
            gpu_type=gpu_type,
            gpu_memory_gib=gpu_memory_gib,
            out=out,
            space=space,
            fixed=fixed,
            baseline=baseline,
            trials=trials,
            time_budget=time_budget,
            search=search_kind,
            storage=storage,
            study_name=study_name,
            gpus_per_trial=gpus_per_trial,
            global_batch=global_batch,
            num_generations=num_generations,
            max_steps=max_steps,
            max_completion_length=max_completion_length,
            dataset=dataset,
            seed=seed,
            startup_timeout=startup_timeout,
            hang_k=hang_k,
            hang_floor=hang_floor,
            trial_timeout=trial_timeout,
            sample_interval_s=sample_interval,
            early_stop=early_stop,
            prune=prune,
            metrics_file=metrics_file,
            executable=executable,
            confirm_runs=confirm_runs,
            secret_args=tuple(secret_arg or ()),
            pins=tuple(pin or ()),
            report_to=tuple(report_to or ()),
        )
        shown = err_console if as_json else console
        try:
            summary = search_study(request, shown, RichView(shown))
        except UnknownFlag as exc:
            raise _own_option(exc, ctx, command or ()) from None
        if as_json:
            say(json.dumps(summary.to_dict(), indent=2, default=str))
        raise typer.Exit(summary.exit_code)
