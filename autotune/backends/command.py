"""The ``command`` backend: tune any training script.

    autotune search --backend command --space my_space.yaml -- \\
        python train.py --zero {zero_stage} --bs {per_device_train_batch_size}

Each argv item of the template is formatted with ``str.format`` (never through a shell): ``{name}``
takes the trial's value of knob ``name`` (``{lr:.2e}`` applies a format spec to the raw value; ``{{``
and ``}}`` are literal braces). Besides knobs, these names are built in: ``trial_dir``,
``global_batch``, ``world_size``, ``gradient_accumulation_steps`` (when derived), ``max_steps``,
``seed``, ``master_port``, ``num_generations``, ``max_completion_length``, ``model``,
``metrics_file``, ``trial_number``. A placeholder that is neither a knob of the space nor built in is
a :class:`~autotune.errors.SpaceError`.

Values are rendered as text: booleans ``true``/``false``, None ``none``, numbers as Python prints them.
Every knob is also passed as ``AUTOTUNE_KNOB_<NAME>`` (upper case, other characters ``_``), with
``AUTOTUNE_TRIAL_DIR``, ``AUTOTUNE_GLOBAL_BATCH``, ``AUTOTUNE_WORLD_SIZE``, ``AUTOTUNE_METRICS_FILE``,
``AUTOTUNE_PHASES_FILE``, ``AUTOTUNE_MAX_STEPS``, ``AUTOTUNE_SEED``, ``AUTOTUNE_TRIAL_NUMBER``.

Metrics: any stdout line that parses as a JSON object with an integer ``"step"``, or the same JSON
lines appended to ``$AUTOTUNE_METRICS_FILE``. Recognised fields: ``step``, ``t_mono_s`` /
``t_wall_s`` (``time.monotonic()`` / ``time.time()`` when the step ended; otherwise the moment autotune
read the line), ``duration_s``, ``samples``, ``tokens``, an optional ``values`` object, and every other
numeric field (numbers or numeric strings) as a metric (``loss``, ``grad_norm``, ``kl``, ...). A step
number seen twice keeps its first record.

Logs scripts already print are read too (:mod:`autotune.backends._loglines`): Hugging Face Trainer /
TRL dict lines (``{'loss': 0.12, 'grad_norm': 1.3, 'epoch': 0.1}``, numbered in order) and verl's console
lines (``step:3 - actor/loss:0.1 - ...``). A script that writes the JSON step records (on stdout, or in
the metrics file, which :class:`autotune.probes.callback.AutotuneCallback` creates when training
begins) is read from those alone: its printed dicts are the same records in the trainer's words.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import string
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from autotune.backends._base import (
    Backend,
    BackendInfo,
    ModelRef,
    OpenPhase,
    RuleViolation,
    StepParser,
    TrialContext,
)
from autotune.backends._loglines import TrainerLogParser
from autotune.backends._phases import MarkerPhases
from autotune.backends._registry import backend_class
from autotune.errors import BackendError, SpaceError, UsageError
from autotune.jobconfig import JobConfig
from autotune.records import LaunchPlan, StepMetrics, TrialSpec
from autotune.space import SearchSpace
from autotune.studydir import TrialDir
from autotune.tail import FileTail
from autotune.values import as_number

__all__ = ["BUILTIN_PLACEHOLDERS", "CommandBackend", "CommandParser", "knob_env_name", "template_fields"]

BUILTIN_PLACEHOLDERS = frozenset(
    {
        "trial_dir",
        "global_batch",
        "world_size",
        "gradient_accumulation_steps",
        "max_steps",
        "seed",
        "master_port",
        "num_generations",
        "max_completion_length",
        "model",
        "metrics_file",
        "trial_number",
    }
)
_WORLD_KNOBS = ("num_processes", "world_size")
_RESERVED_FIELDS = {"step", "t_mono_s", "t_wall_s", "duration_s", "samples", "tokens", "values"}
_DEFAULT_METRICS_NAME = "script_metrics.jsonl"


def template_fields(template: Sequence[str]) -> list[str]:
    """The placeholder names used in a command template, in order of first use.

    Raises:
        UsageError: an item is not a valid format string (an unmatched ``{`` or ``}``), or a
            placeholder uses indexing or attributes (``{a.b}``, ``{a[0]}``).
    """
    names: list[str] = []
    formatter = string.Formatter()
    for item in template:
        try:
            parsed = list(formatter.parse(item))
        except ValueError as exc:
            raise UsageError(
                f"command template item {item!r} is not valid: {exc}",
                hint="Write knobs as {name}; write a literal brace as {{ or }}",
            ) from None
        for _, name, spec, conversion in parsed:
            if name is None:
                continue
            _check_placeholder(item, name, spec or "", conversion)
            if not name.isidentifier():
                raise UsageError(
                    f"command template item {item!r} has placeholder {{{name}}}",
                    hint="Placeholders are plain knob names such as {per_device_train_batch_size}",
                )
            if name not in names:
                names.append(name)
    return names


#: the widest a placeholder may format a value (a width or precision past it would make an argument of
#: megabytes: the kernel refuses it, or the formatting runs out of memory)
MAX_FORMAT_WIDTH = 4096


def _check_placeholder(item: str, name: str, spec: str, conversion: str | None) -> None:
    """Refuse a conversion (``{bs!r}`` would pass a Python repr) or a width past :data:`MAX_FORMAT_WIDTH`.

    Raises:
        UsageError: one line naming the placeholder.
    """
    if conversion is not None:
        raise UsageError(
            f"command template item {item!r} converts {{{name}!{conversion}}}",
            hint=f"Write {{{name}}} (the value as text) or a format spec such as {{{name}:.2e}}",
        )
    if "{" in spec:
        raise UsageError(
            f"command template item {item!r} nests a placeholder in the format of {{{name}}}",
            hint=f"Give {{{name}}} a literal format spec such as {{{name}:.2e}}",
        )
    widths = [d.lstrip("0") or "0" for d in re.findall(r"\d+", spec)]
    if any(len(w) > len(str(MAX_FORMAT_WIDTH)) or int(w) > MAX_FORMAT_WIDTH for w in widths):
        widest = max(widths, key=lambda w: (len(w), w))
        raise UsageError(
            f"command template item {item!r} formats {{{name}}} {widest[:20]} characters wide",
            hint=f"Keep widths and precisions at most {MAX_FORMAT_WIDTH}",
        )


def knob_env_name(name: str) -> str:
    """``AUTOTUNE_KNOB_<NAME>``: the knob name upper-cased, other characters replaced by ``_``."""
    return "AUTOTUNE_KNOB_" + re.sub(r"[^A-Za-z0-9]", "_", name).upper()


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "none"
    return str(value)


class _Value:
    """A value that formats as autotune's text form without a spec and with the raw value's rules with one."""

    def __init__(self, value: object) -> None:
        self.value = value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec) if spec else _text(self.value)


class CommandParser(StepParser):
    """Step records from JSON lines on stdout and in a metrics file (tailed; partial lines kept).

    Args:
        metrics_path: the metrics file the command writes (``$AUTOTUNE_METRICS_FILE``), if any.
        phases_path: the phase-marker file (``$AUTOTUNE_PHASES_FILE``): a script that marks its phases
            with :mod:`autotune.probes.phases` tells :meth:`open_phase` where it is.
        printed: the reader of printed trainer logs (Trainer dicts, verl console lines), used while the
            script writes no JSON step record; None reads JSON lines alone.
    """

    def __init__(
        self,
        metrics_path: Path | None,
        phases_path: Path | None = None,
        *,
        printed: TrainerLogParser | None = None,
    ) -> None:
        self.metrics_path = metrics_path
        # the one bounded, non-blocking reader: a link to /dev/zero or a FIFO never blocks nor fills us
        self._tail = FileTail(metrics_path) if metrics_path is not None else None
        self._seen: set[int] = set()
        self._json = False  # a JSON step record was read: printed logs are ignored
        self._phases = MarkerPhases(phases_path) if phases_path is not None else None
        self._printed = printed

    def _writes_json(self) -> bool:
        """The script speaks autotune's format: a JSON record was read, or the metrics file exists."""
        return self._json or (self.metrics_path is not None and os.path.lexists(self.metrics_path))

    def open_phase(self) -> OpenPhase | None:
        """The phase the script's last marker opened and no marker closed."""
        return self._phases.open() if self._phases is not None else None

    def _record(self, line: str, t_mono_s: float, t_wall_s: float) -> StepMetrics | None:
        text = line.strip()
        if not text.startswith("{"):
            return None
        try:
            obj = json.loads(text)
        except ValueError:
            return None
        if not isinstance(obj, dict):
            return None
        step = obj.get("step")
        if isinstance(step, bool) or not isinstance(step, int) or step in self._seen:
            return None
        values: dict[str, float] = {}
        nested = obj.get("values")
        if isinstance(nested, Mapping):
            for key, value in nested.items():
                num = as_number(value)
                if num is not None:
                    values[str(key)] = num
        for key, value in obj.items():
            if key in _RESERVED_FIELDS:
                continue
            num = as_number(value)
            if num is not None:
                values[key] = num
        t_mono = as_number(obj.get("t_mono_s"))
        t_wall = as_number(obj.get("t_wall_s"))
        duration = as_number(obj.get("duration_s"))
        samples = as_number(obj.get("samples"))
        tokens = as_number(obj.get("tokens"))
        self._seen.add(step)
        self._json = True
        return StepMetrics(
            step=step,
            # the script's own stamp, never later than when its line was read (one clock on one host)
            t_mono_s=min(t_mono, t_mono_s) if t_mono is not None and math.isfinite(t_mono) else t_mono_s,
            t_wall_s=t_wall if t_wall is not None and math.isfinite(t_wall) else t_wall_s,
            duration_s=duration if duration is not None and math.isfinite(duration) else None,
            samples=int(samples) if samples is not None and math.isfinite(samples) else None,
            tokens=tokens if tokens is not None and math.isfinite(tokens) else None,
            values=values,
        )

    def feed(self, stream: str, line: str, t_mono_s: float, t_wall_s: float) -> list[StepMetrics]:
        if stream != "stdout":
            return []
        rec = self._record(line, t_mono_s, t_wall_s)
        if rec is not None:
            return [rec]
        if self._printed is None:
            return []
        out = self.poll(t_mono_s, t_wall_s)  # a callback's file line may precede the printed dict
        if self._writes_json():
            return out
        for step in self._printed.feed(stream, line, t_mono_s, t_wall_s):
            if step.step not in self._seen:
                self._seen.add(step.step)
                out.append(step)
        return out

    def poll(self, t_mono_s: float, t_wall_s: float) -> list[StepMetrics]:
        if self._phases is not None:
            self._phases.poll()
        if self._tail is None:
            return []
        out = []
        for raw in self._tail.lines():
            rec = self._record(raw.decode("utf-8", "replace"), t_mono_s, t_wall_s)
            if rec is not None:
                out.append(rec)
        return out

    def finish(self, t_mono_s: float, t_wall_s: float) -> list[StepMetrics]:
        out = self.poll(t_mono_s, t_wall_s)
        last = self._tail.rest() if self._tail is not None else b""
        if last.strip():  # a last line without its newline
            rec = self._record(last.decode("utf-8", "replace"), t_mono_s, t_wall_s)
            if rec is not None:
                out.append(rec)
        return out


#: the backend whose vocabulary a command's knobs are read in (Hugging Face ``TrainingArguments`` names,
#: TRL's defaults), reached through the registry and the backend contract, not its modules.
VOCABULARY = "trl"


class CommandBackend(Backend):
    """Any command: knobs substituted into argv items and passed as environment variables.

    Args:
        template: the command after ``--``, one argv item each, with ``{knob}`` placeholders.
        metrics_file: where the script appends its JSON step lines; relative paths are inside the
            trial directory (default ``script_metrics.jsonl`` there). Always passed as
            ``AUTOTUNE_METRICS_FILE``; stdout is read too.
        cwd: the trial's working directory (default: the directory autotune was started in).

    Raises:
        UsageError: an empty template or a malformed placeholder.
    """

    name: ClassVar[str] = "command"
    display_name: ClassVar[str] = "command"
    knob_fields = backend_class(VOCABULARY).knob_fields  # TRL's vocabulary (see describe)
    knob_names: ClassVar[frozenset[str] | None] = None
    takes_command: ClassVar[bool] = True

    @classmethod
    def describe(
        cls,
        params: Mapping[str, object],
        derived: Mapping[str, object],
        fixed: Mapping[str, object],
        n_gpus: int,
    ) -> JobConfig:
        """A command's knobs read in TRL's vocabulary (Hugging Face ``TrainingArguments`` names, with
        TRL's defaults): a script that names its knobs so is estimated and explained like a TRL job.

        The knobs are the user's own, so a knob whose value does not read in that vocabulary (a
        ``zero_stage`` of ``"z3"``) is left out of the description rather than refused.
        """
        vocabulary = backend_class(VOCABULARY)

        def readable(args: Mapping[str, object]) -> dict[str, Any]:
            out = {}
            for name, value in args.items():
                try:
                    vocabulary.describe({name: value}, {}, {}, n_gpus)
                except UsageError:
                    continue
                out[name] = value
            return out

        try:
            return vocabulary.describe(params, derived, fixed, n_gpus)
        except UsageError:
            return vocabulary.describe(readable(params), derived, readable(fixed), n_gpus)

    @classmethod
    def from_cli(
        cls,
        *,
        command: tuple[str, ...] = (),
        space: str | None = None,
        metrics_file: str | None = None,
        executable: str | None = None,
    ) -> CommandBackend:
        """The command after ``--`` is the trial's template; ``--space`` is required (no default space).

        Raises:
            UsageError: no command, or no ``--space``.
        """
        if not command:
            raise UsageError(
                "the command backend needs a command after --",
                hint="e.g. autotune search --backend command --space s.yaml -- python train.py --bs {per_device_train_batch_size}",
            )
        if not space:
            raise UsageError(
                "the command backend needs --space", hint="Write a search-space YAML of your script's knobs"
            )
        return cls(template=list(command), metrics_file=metrics_file)

    @classmethod
    def resolve_model(cls, name: str) -> ModelRef:
        """Only a name: the command decides what it trains (no facts, so no memory estimate)."""
        return ModelRef(name=name, path_or_id=name, local=False, facts={})

    def trial_python(self) -> str | None:
        """None: a trial runs the user's command, in whatever interpreter it names."""
        return None

    def __init__(
        self, template: Sequence[str], metrics_file: str | None = None, cwd: str | None = None
    ) -> None:
        self.template = tuple(str(x) for x in template)
        if not self.template:
            raise UsageError(
                "the command backend needs a command",
                hint="Give it after --, e.g. autotune search --backend command --space s.yaml -- python train.py",
            )
        self.fields = template_fields(self.template)
        self.metrics_file = metrics_file
        self.cwd = cwd or os.getcwd()
        self._defaults: dict[str, Any] = {}

    # -- study set-up ---------------------------------------------------------------------------------

    def study_identity(self) -> dict[str, Any]:
        """The command template and the metrics file define a command study."""
        return {"command": list(self.template), "metrics_file": self.metrics_file}

    def adapt_space(self, space: SearchSpace) -> tuple[SearchSpace, list[str]]:
        """The space stays; the template is checked against it (:meth:`check_template`)."""
        self.check_template(space)
        return space, []

    def check_template(self, space: SearchSpace) -> None:
        """Check the template against the space and remember knob defaults.

        A knob that is inactive in a trial (its ``when`` does not hold) or dropped on this machine is
        rendered with its default.

        Raises:
            SpaceError: a placeholder names neither a knob of the space nor a built-in name.
        """
        known = set(space.names) | set(space.dropped_defaults)
        for name in self.fields:
            if name not in known and name not in BUILTIN_PLACEHOLDERS:
                raise SpaceError(
                    f"command template names {{{name}}}, which is not a knob in the search space {space.source}",
                    hint=f"Add knob {name!r} to the space or fix the placeholder (knobs: {', '.join(space.names)})",
                )
        self._defaults = {k.name: k.default for k in space.knobs}
        self._defaults.update(space.dropped_defaults)

    def probe(self) -> BackendInfo:
        exe = self.template[0]
        if "{" in exe:
            return BackendInfo(name=self.name, version=None, executable=exe)
        found = shutil.which(exe) if os.sep not in exe else (exe if os.access(exe, os.X_OK) else None)
        if found is None and os.sep in exe and not os.path.isabs(exe):
            candidate = os.path.join(self.cwd, exe)
            found = candidate if os.access(candidate, os.X_OK) else None
        if found is None:
            raise BackendError(
                f"command {exe!r} is not an executable on PATH or a path",
                hint="Check the first word of the command after --",
            )
        return BackendInfo(name=self.name, version=None, executable=found)

    def default_space(self) -> Any:
        raise UsageError(
            "the command backend has no default search space", hint="Give one with --space my_space.yaml"
        )

    def derive(self, params: dict[str, Any], ctx: TrialContext) -> dict[str, Any]:
        world = 1
        for key in _WORLD_KNOBS:
            value = params.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                world = value
                break
        derived: dict[str, Any] = {"world_size": world}
        pdbs = params.get("per_device_train_batch_size")
        if isinstance(pdbs, int) and not isinstance(pdbs, bool) and pdbs > 0:
            per_step = pdbs * world
            if ctx.global_batch % per_step == 0:
                derived["gradient_accumulation_steps"] = ctx.global_batch // per_step
        return derived

    def check_rules(
        self, params: dict[str, Any], derived: dict[str, Any], ctx: TrialContext
    ) -> list[RuleViolation]:
        pdbs = params.get("per_device_train_batch_size")
        if (
            "gradient_accumulation_steps" not in derived
            and isinstance(pdbs, int)
            and not isinstance(pdbs, bool)
        ):
            world = derived.get("world_size", 1)
            return [
                RuleViolation(
                    "global_batch_divisible",
                    f"global batch {ctx.global_batch} is not a multiple of per_device_train_batch_size {pdbs} "
                    f"× world size {world}",
                )
            ]
        return []

    # -- one trial ------------------------------------------------------------------------------------

    def _metrics_path(self, ctx: TrialContext) -> Path:
        if self.metrics_file is None:
            return ctx.trial_dir / _DEFAULT_METRICS_NAME
        path = Path(self.metrics_file)
        return path if path.is_absolute() else ctx.trial_dir / path

    def render(self, spec: TrialSpec, ctx: TrialContext) -> LaunchPlan:
        metrics = self._metrics_path(ctx)
        world = int(spec.derived.get("world_size", 1))
        builtins: dict[str, Any] = {
            "trial_dir": str(ctx.trial_dir),
            "global_batch": ctx.global_batch,
            "world_size": world,
            "max_steps": ctx.max_steps,
            "seed": ctx.seed,
            "master_port": ctx.master_port,
            "num_generations": ctx.num_generations,
            "max_completion_length": ctx.max_completion_length,
            "model": ctx.model.path_or_id,
            "metrics_file": str(metrics),
            "trial_number": spec.number,
        }
        if "gradient_accumulation_steps" in spec.derived:
            builtins["gradient_accumulation_steps"] = spec.derived["gradient_accumulation_steps"]
        values: dict[str, Any] = {**builtins, **self._defaults, **spec.derived, **spec.params}
        missing = [n for n in self.fields if n not in values]
        if missing:
            raise SpaceError(
                f"command template names {{{missing[0]}}}, which is not a knob in the search space",
                hint="Add the knob to the space or fix the placeholder",
            )
        wrapped = {k: _Value(v) for k, v in values.items()}
        argv = tuple(item.format_map(wrapped) for item in self.template)
        env = {
            "AUTOTUNE_TRIAL_DIR": str(ctx.trial_dir),
            "AUTOTUNE_GLOBAL_BATCH": str(ctx.global_batch),
            "AUTOTUNE_WORLD_SIZE": str(world),
            "AUTOTUNE_METRICS_FILE": str(metrics),
            "AUTOTUNE_PHASES_FILE": str(ctx.trial_dir / TrialDir.PHASES),
            "AUTOTUNE_MAX_STEPS": str(ctx.max_steps),
            "AUTOTUNE_SEED": str(ctx.seed),
            "AUTOTUNE_TRIAL_NUMBER": str(spec.number),
        }
        if "gradient_accumulation_steps" in spec.derived:
            env["AUTOTUNE_GRADIENT_ACCUMULATION_STEPS"] = str(spec.derived["gradient_accumulation_steps"])
        for name, value in spec.params.items():
            env[knob_env_name(name)] = _text(value)
        gpu = self.trial_env(spec, ctx)  # the environment every GPU trial gets (none on a CPU-only run)
        env.update(gpu.env)
        return LaunchPlan(
            argv=argv,
            env=env,
            cwd=self.cwd,
            metrics_paths=(str(metrics),),
            world_size=world,
            unset_env=gpu.unset,
        )

    def parser(self, spec: TrialSpec, ctx: TrialContext) -> StepParser:
        return CommandParser(
            self._metrics_path(ctx),
            ctx.trial_dir / TrialDir.PHASES,
            printed=TrainerLogParser(samples=ctx.global_batch),
        )
