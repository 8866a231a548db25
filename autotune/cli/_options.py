"""Every option that more than one command takes, and every option of ``search`` and ``plan``, defined
once: its flag, its help and the help panel it is listed under.

A command names an option by its alias here (``gpus: options.Gpus = None``); its default stays in the
command's signature, because commands differ in defaults, not in meaning. The panel an option appears
under in ``-h`` and in the CLI reference is the ``rich_help_panel`` given here, nowhere else.

``-h`` is drawn by click's plain formatter (the app sets ``rich_markup_mode=None``): typer draws panels
only in its rich mode, whose boxes squeeze the help column to a few words at 80 columns and rewrap the
examples. :class:`PanelledCommand` sections click's plain listing by the same ``rich_help_panel``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from autotune.backends import BACKENDS, planned_backends
from autotune.strategy import search_help
from autotune.trackers import TRACKERS, trackers_help

__all__ = ["ARGUMENTS_PANEL", "OTHER_PANEL", "PANELS", "PanelledCommand", "panel_of"]

WORKLOAD = "Workload"
HARDWARE = "Hardware"
SEARCH = "Search"
TRIALS = "Trials"
OUTPUT = "Output"
STORAGE = "Storage and workers"
#: the panels, in the order ``-h`` lists them
PANELS: tuple[str, ...] = (WORKLOAD, HARDWARE, SEARCH, TRIALS, OUTPUT, STORAGE)
#: where an option without a panel (``-h``, a command's own option) is listed
OTHER_PANEL = "Options"
ARGUMENTS_PANEL = "Arguments"


def _option(flag: str, *, panel: str, help: str, **more: Any) -> Any:  # noqa: A002 - typer's name
    return typer.Option(flag, help=help, rich_help_panel=panel, **more)


def panel_of(param: Any) -> str:
    """The panel ``param`` (a click parameter of a command) is listed under."""
    return getattr(param, "rich_help_panel", None) or OTHER_PANEL


class PanelledCommand(TyperCommand):
    """A command whose ``-h`` lists its options under their panels, in :data:`PANELS` order."""

    def panels(self, ctx: Any) -> dict[str, list[Any]]:
        """The command's listed parameters by section: arguments, :data:`PANELS` in order, the rest."""
        found: dict[str, list[Any]] = {}
        for param in self.get_params(ctx):
            if param.get_help_record(ctx) is None:
                continue
            name = ARGUMENTS_PANEL if param.param_type_name == "argument" else panel_of(param)
            found.setdefault(name, []).append(param)
        return {name: found[name] for name in (ARGUMENTS_PANEL, *PANELS, OTHER_PANEL) if name in found}

    def format_options(self, ctx: Any, formatter: Any) -> None:
        """Click's plain definition lists, one section per panel."""
        for name, params in self.panels(ctx).items():
            with formatter.section(name):
                formatter.write_dl([param.get_help_record(ctx) for param in params])


def backend(names: Sequence[str]) -> Any:
    """``--backend``, listing the backends this command takes (``plan`` judges fewer than ``search`` runs)."""
    return _option("--backend", panel=WORKLOAD, help=f"{', '.join(names)}.")


_JOB = "default: your job's, else the framework's"

# Workload: what is trained
Model = Annotated[
    str,
    _option(
        "--model",
        panel=WORKLOAD,
        help="A catalog name (Qwen2-7B), a hub id or a folder with config.json; search also takes"
        " tiny-qwen2 / small-qwen2, built here.",
    ),
]
SearchBackend = Annotated[str, backend(list(BACKENDS))]
PlannedBackend = Annotated[str, backend(planned_backends())]
Fixed = Annotated[
    str | None,
    _option(
        "--fixed", panel=WORKLOAD, help="YAML of fixed framework arguments (dataset, rewards, beta, ...)."
    ),
]
Baseline = Annotated[
    str | None,
    _option("--baseline", panel=WORKLOAD, help="YAML of your current knob values, run as trial 0."),
]
Dataset = Annotated[
    str | None,
    _option("--dataset", panel=WORKLOAD, help="Dataset to train on (default: prompts generated here)."),
]
GlobalBatch = Annotated[
    int | None,
    _option(
        "--global-batch",
        panel=WORKLOAD,
        help=f"Completions per optimizer step, the same in every trial ({_JOB}; tiny models 16).",
        show_default=False,
    ),
]
NumGenerations = Annotated[
    int | None,
    _option(
        "--num-generations",
        panel=WORKLOAD,
        help=f"Completions per prompt (G), the same in every trial ({_JOB}; tiny models 4).",
        show_default=False,
    ),
]
MaxCompletionLength = Annotated[
    int | None,
    _option(
        "--max-completion-length",
        panel=WORKLOAD,
        help=f"Completion tokens, the same in every trial ({_JOB}; tiny models 16).",
        show_default=False,
    ),
]
MaxPromptLength = Annotated[int, _option("--max-prompt-length", panel=WORKLOAD, help="Prompt tokens.")]
ModelConfig = Annotated[
    str | None,
    _option(
        "--model-config", panel=WORKLOAD, help="config.json (or its folder) of a model not in the catalog."
    ),
]
Beta = Annotated[
    float | None,
    _option(
        "--beta", panel=WORKLOAD, help="KL coefficient (default: the framework's: TRL 0.0, ms-swift 0.04)."
    ),
]
LoraRank = Annotated[int, _option("--lora-rank", panel=WORKLOAD, help="LoRA rank; 0 = full fine-tuning.")]
VllmMaxModelLen = Annotated[
    int | None,
    _option(
        "--vllm-max-model-len",
        panel=WORKLOAD,
        help="vLLM max_model_len (default: the model's max position, as the frameworks do).",
    ),
]
Executable = Annotated[
    str | None,
    _option(
        "--executable",
        panel=WORKLOAD,
        help="The swift command (swift backend) or verl's python (verl backend) the trials run (default: on"
        " PATH, this python).",
    ),
]
MetricsFile = Annotated[
    str | None,
    _option(
        "--metrics-file",
        panel=WORKLOAD,
        help="JSON-lines metrics file your own command writes (the command backend, profile).",
    ),
]

# Hardware: what it runs on
Gpus = Annotated[
    int | None, _option("--gpus", panel=HARDWARE, help="Number of GPUs (default: all detected).")
]
GpuType = Annotated[
    str | None,
    _option(
        "--gpu-type",
        panel=HARDWARE,
        help="Declare the GPU type, for GPUs this host cannot see (A10, A100-80G, H100, ...).",
    ),
]
GpuMemoryGib = Annotated[
    float | None, _option("--gpu-memory-gib", panel=HARDWARE, help="Declare GPU memory in GiB.")
]
GpusPerTrial = Annotated[
    int | None,
    _option(
        "--gpus-per-trial",
        panel=HARDWARE,
        help="GPUs one trial uses; a host with more runs trials at once on disjoint GPU sets.",
    ),
]

# Search: which configurations, how many
Space = Annotated[
    str | None, _option("--space", panel=SEARCH, help="Search-space YAML (default: the backend's own).")
]
Pin = Annotated[
    list[str] | None,
    _option(
        "--pin",
        panel=SEARCH,
        help="Keep a knob at one value in every candidate: name=value (repeatable); the other knobs vary."
        " (A knob named by your own flags after -- only sets the baseline's value, still searched.)",
    ),
]
Knob = Annotated[
    list[str] | None,
    _option("--knob", panel=SEARCH, help="Keep only these values of a knob: name=v1,v2 (repeatable)."),
]
Margin = Annotated[float, _option("--margin", panel=SEARCH, help="Pruning margin, a fraction of GPU memory.")]
Trials = Annotated[
    int,
    _option(
        "--trials", panel=SEARCH, help="Trials to launch in total (a resumed study counts its earlier ones)."
    ),
]
TimeBudget = Annotated[
    str | None, _option("--time-budget", panel=SEARCH, help="Wall-time budget, e.g. 30m or 2h.")
]
SearchKind = Annotated[str, _option("--search", panel=SEARCH, help=search_help())]
Seed = Annotated[int, _option("--seed", panel=SEARCH, help="Seed of training and of the search.")]
ConfirmRuns = Annotated[
    int,
    _option(
        "--confirm-runs",
        panel=SEARCH,
        help="After the search, re-run the winner and the baseline (and runners-up within the"
        " noise of the winner) this many times each, interleaved, and report the speedup with a"
        " 95 % interval; a speedup whose interval includes 1 is reported as no measurable"
        " speedup. Not counted in --trials; counted in the time budget. 0 skips it.",
    ),
]

# Trials: how one trial is run and judged
MaxSteps = Annotated[int, _option("--max-steps", panel=TRIALS, help="Steps a trial may run at most.")]
StartupTimeout = Annotated[
    str | None,
    _option(
        "--startup-timeout",
        panel=TRIALS,
        help="Time allowed before the first step (search's default grows with model size).",
    ),
]
HangK = Annotated[
    float,
    _option("--hang-k", panel=TRIALS, help="A trial with no step for hang-k × median step time is a hang."),
]
HangFloor = Annotated[
    str, _option("--hang-floor", panel=TRIALS, help="Never call a hang before this long without a step.")
]
TrialTimeout = Annotated[
    str | None,
    _option(
        "--trial-timeout",
        panel=TRIALS,
        help="Wall budget of one trial (default: the start-up budget + max-steps × hang-k × hang-floor).",
    ),
]
SampleInterval = Annotated[
    float, _option("--sample-interval", panel=TRIALS, help="GPU sampling interval in seconds.")
]
EarlyStop = Annotated[
    bool,
    _option(
        "--early-stop/--no-early-stop",
        panel=TRIALS,
        help="Stop a trial once its throughput estimate is stable.",
    ),
]
Prune = Annotated[
    bool,
    _option(
        "--prune/--no-prune",
        panel=TRIALS,
        help="Stop a trial whose throughput is clearly below the best so far (--no-prune measures every trial).",
    ),
]

# Output: what is written and shown
StudyOut = Annotated[
    str | None, _option("--out", panel=OUTPUT, help="Study directory (default runs/<model>-<backend>).")
]
Json = Annotated[
    bool,
    _option("--json", panel=OUTPUT, help="Print the result as JSON on stdout (anything else on stderr)."),
]
Top = Annotated[
    int | None, _option("--top", panel=OUTPUT, help="Show the first N candidates (default 20; JSON: all).")
]
SecretArg = Annotated[
    list[str] | None,
    _option(
        "--secret-arg",
        panel=OUTPUT,
        help="An argument name whose value is a secret (repeatable), on top of names with token,"
        " key, password or secret in them: never written to a file (scripts read it from"
        " ${NAME}, other files show ***).",
    ),
]
ReportTo = Annotated[
    list[str] | None, _option("--report-to", panel=OUTPUT, help=trackers_help(TRACKERS), show_default=False)
]

# Storage and workers: where the study lives
Storage = Annotated[
    str | None,
    _option(
        "--storage",
        panel=STORAGE,
        help="Optuna storage URL (default sqlite in --out); postgresql://… for workers on many hosts.",
    ),
]
StudyName = Annotated[
    str | None,
    _option(
        "--study-name",
        panel=STORAGE,
        help="Join this study in --storage as one of its workers (default: --out's name, alone).",
    ),
]
StorageToRead = Annotated[
    str | None,
    _option(
        "--storage",
        panel=STORAGE,
        help="Read the study from this Optuna storage (with --study-name) into DIR first: any host, any worker.",
    ),
]
StudyNameToRead = Annotated[
    str | None,
    _option(
        "--study-name", panel=STORAGE, help="The study in --storage that autotune search workers joined."
    ),
]
