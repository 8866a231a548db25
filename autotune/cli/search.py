"""``autotune search``: the main job — real trials, timelines, a recommendation and reports."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import typer

from autotune.backends import BACKENDS
from autotune.errors import UsageError
from autotune.fixed import UnknownFlag
from autotune.strategy import search_help
from autotune.trackers import TRACKERS, trackers_help

HELP = """Run short real GRPO trials over a search space and recommend the fastest configuration that
neither OOMs, hangs nor breaks training on the GPUs detected (or on the CPU with a tiny model).

\b
Examples:
  autotune search --model tiny-qwen2 --trials 4 --out runs/demo
  autotune search --gpus 4 --model Qwen2-7B --backend swift --fixed job.yaml --time-budget 2h
  autotune search --backend command --space my_space.yaml -- python train.py --bs {per_device_train_batch_size}

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
        model: Annotated[
            str,
            typer.Option(
                "--model",
                help="tiny-qwen2 / small-qwen2 (built here), a short name (Qwen2-7B), a hub id or a local folder.",
            ),
        ] = "tiny-qwen2",
        backend: Annotated[str, typer.Option("--backend", help=f"{', '.join(BACKENDS)}.")] = "trl",
        gpus: Annotated[
            int | None, typer.Option("--gpus", help="Number of GPUs (default: all detected; CPU when none).")
        ] = None,
        gpu_type: Annotated[
            str | None, typer.Option("--gpu-type", help="Declare GPUs this host cannot see (e.g. A10).")
        ] = None,
        gpu_memory_gib: Annotated[
            float | None, typer.Option("--gpu-memory-gib", help="Declare GPU memory in GiB.")
        ] = None,
        out: Annotated[
            str | None, typer.Option("--out", help="Study directory (default runs/<model>-<backend>).")
        ] = None,
        space: Annotated[
            str | None, typer.Option("--space", help="Search-space YAML (default: the backend's own).")
        ] = None,
        fixed: Annotated[
            str | None,
            typer.Option("--fixed", help="YAML of fixed framework arguments (dataset, rewards, beta, ...)."),
        ] = None,
        baseline: Annotated[
            str | None, typer.Option("--baseline", help="YAML of your current knob values, run as trial 0.")
        ] = None,
        trials: Annotated[
            int,
            typer.Option(
                "--trials", help="Trials to launch in total (a resumed study counts its earlier ones)."
            ),
        ] = 8,
        time_budget: Annotated[
            str | None, typer.Option("--time-budget", help="Wall-time budget, e.g. 30m or 2h.")
        ] = None,
        search_kind: Annotated[str, typer.Option("--search", help=search_help())] = "auto",
        storage: Annotated[
            str | None,
            typer.Option(
                "--storage",
                help="Optuna storage URL (default sqlite in --out); postgresql://… for workers on many hosts.",
            ),
        ] = None,
        study_name: Annotated[
            str | None,
            typer.Option(
                "--study-name",
                help="Join this study in --storage as one of its workers (default: --out's name, alone).",
            ),
        ] = None,
        gpus_per_trial: Annotated[
            int | None,
            typer.Option(
                "--gpus-per-trial",
                help="GPUs one trial uses; a host with more runs trials at once on disjoint GPU sets.",
            ),
        ] = None,
        global_batch: Annotated[
            int | None,
            typer.Option(
                "--global-batch",
                help="Completions per optimizer step, fixed for every trial (default: your job's, else the "
                "framework's; tiny models 16).",
                show_default=False,
            ),
        ] = None,
        num_generations: Annotated[
            int | None,
            typer.Option(
                "--num-generations",
                help="Completions per prompt (G), fixed (default: your job's, else the framework's; tiny models 4).",
                show_default=False,
            ),
        ] = None,
        max_steps: Annotated[int, typer.Option("--max-steps", help="Steps a trial may run at most.")] = 20,
        max_completion_length: Annotated[
            int | None,
            typer.Option(
                "--max-completion-length",
                help="Completion tokens, fixed (default: your job's, else the framework's; tiny models 16).",
                show_default=False,
            ),
        ] = None,
        dataset: Annotated[
            str | None,
            typer.Option("--dataset", help="Dataset to train on (default: prompts generated here)."),
        ] = None,
        seed: Annotated[int, typer.Option("--seed", help="Seed of training and of the search.")] = 0,
        startup_timeout: Annotated[
            str | None,
            typer.Option(
                "--startup-timeout",
                help="Time allowed before the first step (default grows with model size).",
            ),
        ] = None,
        hang_k: Annotated[
            float,
            typer.Option("--hang-k", help="A trial with no step for hang-k × median step time is a hang."),
        ] = 5.0,
        hang_floor: Annotated[
            str, typer.Option("--hang-floor", help="Never call a hang before this long without a step.")
        ] = "60s",
        trial_timeout: Annotated[
            str | None,
            typer.Option(
                "--trial-timeout",
                help="Wall budget of one trial (default: the start-up budget + max-steps × hang-k × hang-floor).",
            ),
        ] = None,
        sample_interval: Annotated[
            float, typer.Option("--sample-interval", help="GPU sampling interval in seconds.")
        ] = 0.1,
        early_stop: Annotated[
            bool,
            typer.Option(
                "--early-stop/--no-early-stop", help="Stop a trial once its throughput estimate is stable."
            ),
        ] = True,
        metrics_file: Annotated[
            str | None,
            typer.Option(
                "--metrics-file", help="command backend: JSON-lines metrics file the command writes."
            ),
        ] = None,
        executable: Annotated[
            str | None,
            typer.Option("--executable", help="swift backend: the swift executable (default: on PATH)."),
        ] = None,
        confirm_runs: Annotated[
            int,
            typer.Option(
                "--confirm-runs",
                help="After the search, re-run the winner and the baseline (and runners-up within the"
                " noise of the winner) this many times each, interleaved, and report the speedup with a"
                " 95 % interval; a speedup whose interval includes 1 is reported as no measurable"
                " speedup. Not counted in --trials; counted in the time budget. 0 skips it.",
            ),
        ] = 2,
        secret_arg: Annotated[
            list[str] | None,
            typer.Option(
                "--secret-arg",
                help="An argument name whose value is a secret (repeatable), on top of names with token,"
                " key, password or secret in them: never written to a file (scripts read it from"
                " ${NAME}, other files show ***).",
            ),
        ] = None,
        pin: Annotated[
            list[str] | None,
            typer.Option(
                "--pin",
                help="Keep a knob at one value in every trial: name=value (repeatable). The search varies"
                " the other knobs; your own flags after -- that name knobs are the baseline, still searched.",
            ),
        ] = None,
        as_json: Annotated[
            bool,
            typer.Option("--json", help="Print the final summary as JSON on stdout (the rest on stderr)."),
        ] = False,
        report_to: Annotated[
            list[str] | None, typer.Option("--report-to", help=trackers_help(TRACKERS), show_default=False)
        ] = None,
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
