"""Search spaces: a YAML file of knobs → typed, validated, conditional distributions.

A space file looks like this::

    backend: trl
    knobs:
      per_device_train_batch_size:
        type: int
        choices: [1, 2, 4, 8, 16]
        default: 8
        memory: increasing        # more of it needs more GPU memory (OOM inference)
      offload_optimizer:
        type: bool
        default: false
        when: {zero_stage: [2, 3]}   # only exists under these values of an earlier knob
        memory: decreasing
      vllm_gpu_memory_utilization:
        type: float
        low: 0.3
        high: 0.9
        step: 0.05
        default: 0.3
        applies: gpu              # dropped, with the platform's reason, where no GPU is present
        cpu: {high: 0.2}          # its values on a CPU-only run (here: a share of host memory)

A knob whose ``when`` does not hold is *inactive*: it is absent from a trial's params, so conditional
knobs do not multiply the space. Knobs are ordered; a condition may only name earlier knobs.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from autotune.errors import SpaceError
from autotune.spacefile import NEEDS, CpuValues, KnobFields, KnobType, validated
from autotune.yamlfile import read_yaml

__all__ = ["NEEDS", "Knob", "Platform", "SearchSpace", "load_space", "canonical_key", "Suggester"]

_V = TypeVar("_V")

#: the most choices a knob may list (a longer list is a range: the search samples it)
MAX_CHOICES = 256
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_GRID_LIMIT = 64  # values a continuous knob may expand to for grid search / dedupe


@dataclass(frozen=True)
class Platform:
    """What the machine the trials run on cannot give a knob, in the platform's own words.

    Built once per study by the backend (:meth:`autotune.backends.Backend.platform`, from the machine and
    the packages its probe found); :meth:`SearchSpace.restrict` drops every knob whose ``applies:`` names a
    need found in :attr:`lacks`, with that reason, and gives the knobs with a ``cpu:`` block their CPU
    values on a CPU-only run.

    Attributes:
        gpu_present: the trials run on GPUs (False: a CPU-only run).
        lacks: a need of :data:`NEEDS` → why this machine cannot meet it.
    """

    gpu_present: bool
    lacks: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def machine(cls, *, gpu_present: bool, **lacks: str) -> Platform:
        """The machine's own part (GPU or CPU-only run) and the extra needs it lacks, by name."""
        own = (
            {"cpu": "only tuned on CPU runs; on GPUs the world size is the GPU count"}
            if gpu_present
            else {"gpu": "needs a GPU and none is present"}
        )
        unknown = sorted(set(lacks) - set(NEEDS))
        if unknown:
            raise ValueError(f"unknown need {unknown[0]!r}; needs: {', '.join(NEEDS)}")
        return cls(gpu_present=gpu_present, lacks={**own, **lacks})


class Suggester(Protocol):
    """The part of ``optuna.trial.Trial`` a space needs (so tests can pass a fake)."""

    def suggest_categorical(self, name: str, choices: Any) -> Any: ...
    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int: ...
    def suggest_float(
        self, name: str, low: float, high: float, *, step: float | None = None, log: bool = False
    ) -> float: ...


@dataclass(frozen=True)
class Knob:
    """One tunable setting, named as the framework names it.

    Attributes:
        name: the framework's name for it.
        type: value type: int, float, bool or str.
        choices: discrete values (``None`` allowed as "not set"); exclusive with low/high.
        low, high, step, log: a numeric range.
        default: the framework's default (used by the baseline and where the knob is dropped).
        when: the knob exists only when each named earlier knob has one of the listed values.
        applies: what the knob needs of the machine (a name of :data:`NEEDS`): dropped where the
            :class:`Platform` lacks it ("gpu": without GPUs, "cpu": with GPUs, "vllm_sleep": where vLLM
            has no sleep mode ...).
        cpu: the knob on a CPU-only run when its values differ there (a ``cpu:`` block in the file).
        memory: "increasing" if a larger value needs more GPU memory, "decreasing" if less.
        help: one line for the report.
        label: a short name for tables and the live view (the knob's name when empty).
    """

    name: str
    type: KnobType
    default: Any
    choices: tuple[Any, ...] | None = None
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    when: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)
    applies: str = "any"
    cpu: Knob | None = None
    memory: Literal["increasing", "decreasing"] | None = None
    help: str = ""
    label: str = ""

    @property
    def short(self) -> str:
        """The knob's short name for tables (its label, else its name)."""
        return self.label or self.name

    def values(self) -> tuple[Any, ...]:
        """Every value the knob can take (a range by its step; past 64 values, 64 spread evenly)."""
        if self.choices is not None:
            return self.choices
        assert self.low is not None and self.high is not None  # guaranteed by the loader
        low, high = self.low, self.high
        # counted, then sampled evenly: a range of 10^12 steps is never expanded
        if self.type == "int":
            step = int(self.step or 1)
            n = (int(high) - int(low)) // step + 1
            at: Callable[[int], Any] = lambda i: int(low) + i * step  # noqa: E731
        else:
            step_f = self.step or (high - low) / 8
            n = int(math.floor((high - low) / step_f + 1e-9)) + 1 if step_f > 0 else 1
            at = lambda i: round(low + i * step_f, 10)  # noqa: E731
        if n > _GRID_LIMIT:
            return tuple(
                at(i) for i in sorted({round(i * (n - 1) / (_GRID_LIMIT - 1)) for i in range(_GRID_LIMIT)})
            )
        return tuple(at(i) for i in range(n))

    def describe_values(self) -> str:
        """The values this knob can take, for an error's hint ("1, 2, 4" or "int from 1 to 8")."""
        return _describe_values(self)

    def contains(self, value: object) -> bool:
        """True when ``value`` is one this knob can take."""
        if self.choices is not None:
            return any(_same(value, c) for c in self.choices)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        assert self.low is not None and self.high is not None
        return self.low - 1e-9 <= value <= self.high + 1e-9

    def active(self, params: Mapping[str, object]) -> bool:
        """Whether this knob exists given the values of earlier knobs."""
        for other, allowed in self.when.items():
            if other not in params or not any(_same(params[other], a) for a in allowed):
                return False
        return True

    def suggest(self, trial: Suggester) -> Any:
        """Ask the search algorithm for a value."""
        if self.choices is not None:
            return trial.suggest_categorical(self.name, list(self.choices))
        assert self.low is not None and self.high is not None
        if self.type == "int":
            return trial.suggest_int(
                self.name, int(self.low), int(self.high), step=int(self.step or 1), log=self.log
            )
        return trial.suggest_float(self.name, float(self.low), float(self.high), step=self.step, log=self.log)

    def memory_rank(self, value: object) -> float | None:
        """A number that grows with the GPU memory ``value`` needs, or None if not ordered."""
        if self.memory is None or value is None:
            return None
        if isinstance(value, bool):
            rank = float(value)
        elif isinstance(value, (int, float)):
            rank = float(value)
        else:
            return None
        return rank if self.memory == "increasing" else -rank


def _same(a: object, b: object) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def canonical_key(params: Mapping[str, object]) -> str:
    """A stable text key for a configuration: equal configurations give equal keys."""

    def norm(v: object) -> Any:
        if isinstance(v, float) and not isinstance(v, bool):
            return round(v, 9) if not v.is_integer() else int(v) if abs(v) < 2**53 else v
        return v

    return json.dumps({k: norm(v) for k, v in sorted(params.items())}, sort_keys=True, default=str)


@dataclass(frozen=True)
class SearchSpace:
    """An ordered set of knobs and the notices of what was dropped.

    Attributes:
        backend: the backend the file was written for.
        knobs: knobs in file order.
        dropped: knob name → why it was dropped on this machine (its default then holds).
        source: where the space came from (for reports).
        roles: what a knob means to the search, as the backend says (``{"vllm_util":
            "vllm_gpu_memory_utilization"}``, see :meth:`autotune.backends.Backend.knob_roles`).
        pinned: knob name → the value the user pinned it to (``--pin``, see :meth:`pin`).
    """

    backend: str
    knobs: tuple[Knob, ...]
    dropped: Mapping[str, str] = field(default_factory=dict)
    dropped_defaults: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    roles: Mapping[str, str] = field(default_factory=dict)
    pinned: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {k.name: k for k in self.knobs})

    def __contains__(self, name: object) -> bool:
        return name in self._by_name  # type: ignore[attr-defined]

    def __getitem__(self, name: str) -> Knob:
        return self._by_name[name]  # type: ignore[attr-defined]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(k.name for k in self.knobs)

    def with_roles(self, roles: Mapping[str, str]) -> SearchSpace:
        """The same space, with the backend's word on what its knobs mean (JobConfig field → knob)."""
        return replace(self, roles=dict(roles))

    def knob_for(self, role: str) -> str | None:
        """The knob of this space that plays ``role`` (a JobConfig field name), or None."""
        name = self.roles.get(role)
        return name if name is not None and name in self else None

    def _context(self, params: Mapping[str, object]) -> dict[str, Any]:
        ctx = dict(self.dropped_defaults)
        ctx.update(params)
        return ctx

    def active(self, params: Mapping[str, object]) -> dict[str, Any]:
        """``params`` restricted to active knobs, in knob order; missing active knobs take defaults."""
        out: dict[str, Any] = {}
        for knob in self.knobs:
            if knob.active(self._context(out)):
                out[knob.name] = params.get(knob.name, knob.default)
        return out

    def defaults(self) -> dict[str, Any]:
        """The framework defaults of every active knob."""
        return self.active({})

    def suggest(self, trial: Suggester) -> dict[str, Any]:
        """Ask for a value of every active knob, in order (conditional knobs only when active)."""
        out: dict[str, Any] = {}
        for knob in self.knobs:
            if knob.active(self._context(out)):
                out[knob.name] = knob.suggest(trial)
        return out

    def validate_params(self, params: Mapping[str, object]) -> None:
        """Raise :class:`SpaceError` when ``params`` names an unknown knob or an impossible value."""
        for name, value in params.items():
            if name not in self:
                raise SpaceError(f"unknown knob {name!r}", hint=f"Known knobs: {', '.join(self.names)}")
            if not self[name].contains(value):
                raise SpaceError(
                    f"value {value!r} is outside knob {name!r}",
                    hint=f"Allowed: {_describe_values(self[name])}",
                )

    def grid(self) -> Iterator[dict[str, Any]]:
        """Every distinct configuration (inactive knobs do not multiply), in a stable order."""
        seen: set[str] = set()

        def rec(i: int, acc: dict[str, Any]) -> Iterator[dict[str, Any]]:
            if i == len(self.knobs):
                key = canonical_key(acc)
                if key not in seen:
                    seen.add(key)
                    yield dict(acc)
                return
            knob = self.knobs[i]
            if knob.active(self._context(acc)):
                for v in knob.values():
                    acc[knob.name] = v
                    yield from rec(i + 1, acc)
                del acc[knob.name]
            else:
                yield from rec(i + 1, acc)

        yield from rec(0, {})

    def size(self) -> int:
        return sum(1 for _ in self.grid())

    def restrict(self, platform: Platform) -> SearchSpace:
        """Drop the knobs that need what ``platform`` lacks (their defaults then hold, the reason is kept
        in :attr:`dropped`); on a CPU-only run, a knob with a ``cpu:`` block takes its CPU values."""
        keep: list[Knob] = []
        dropped = dict(self.dropped)
        dropped_defaults = dict(self.dropped_defaults)
        for knob in self.knobs:
            if not platform.gpu_present and knob.cpu is not None:
                knob = knob.cpu
            reason = platform.lacks.get(knob.applies)
            if reason is None:
                keep.append(knob)
                continue
            dropped[knob.name] = reason
            dropped_defaults[knob.name] = knob.default
        return replace(self, knobs=tuple(keep), dropped=dropped, dropped_defaults=dropped_defaults)

    def narrow(self, filters: Mapping[str, Iterable[Any]]) -> SearchSpace:
        """Keep only the listed values of some knobs (``plan --knob``, a fixed choice)."""
        knobs = []
        for knob in self.knobs:
            if knob.name in filters:
                wanted = tuple(filters[knob.name])
                for v in wanted:
                    if not knob.contains(v):
                        raise SpaceError(
                            f"value {v!r} is outside knob {knob.name!r}",
                            hint=f"Allowed: {_describe_values(knob)}",
                        )
                default = knob.default if any(_same(knob.default, w) for w in wanted) else wanted[0]
                knob = replace(knob, choices=wanted, low=None, high=None, step=None, default=default)
            knobs.append(knob)
        unknown = set(filters) - set(self.names)
        if unknown:
            raise SpaceError(
                f"unknown knob {sorted(unknown)[0]!r}", hint=f"Known knobs: {', '.join(self.names)}"
            )
        return replace(self, knobs=tuple(knobs))

    def pin(self, values: Mapping[str, object]) -> SearchSpace:
        """Keep each named knob at one value in every configuration (``--pin name=value``).

        A pinned knob's only value is the pinned one (and its default, so the baseline holds it too);
        pinning a conditional knob also keeps the knobs its condition names to the values that make it
        exist (``vllm_tensor_parallel_size=2`` keeps ``use_vllm`` true).

        Raises:
            SpaceError: an unknown or dropped knob, or a value the knob cannot take (naming the valid
                choices).
        """
        for name, value in values.items():
            if name not in self:
                why = f"it was dropped ({self.dropped[name]})" if name in self.dropped else "no such knob"
                raise SpaceError(f"cannot pin {name!r}: {why}", hint=f"Knobs: {', '.join(self.names)}")
            if not self[name].contains(value):
                raise SpaceError(
                    f"cannot pin {name!r} to {value!r}: not one of its values",
                    hint=f"Allowed: {_describe_values(self[name])}",
                )
        filters: dict[str, list[Any]] = {name: [value] for name, value in values.items()}
        for name in values:
            for other, allowed in self[name].when.items():
                if other in values:
                    if not any(_same(values[other], a) for a in allowed):
                        raise SpaceError(
                            f"cannot pin {name!r} with {other}={values[other]!r}: {name} exists only when"
                            f" {other} is one of {list(allowed)}",
                            hint=f"Pin {other} to one of {list(allowed)}, or do not pin {name}",
                        )
                    continue
                if other not in self:  # dropped on this machine: its default holds (and lets the knob exist)
                    continue
                current = filters.get(other, list(self[other].values()))
                filters[other] = [v for v in current if any(_same(v, a) for a in allowed)] or list(allowed)
        pinned = replace(self.narrow(filters), pinned={**self.pinned, **values})
        return pinned

    @property
    def searched(self) -> tuple[str, ...]:
        """The knobs the search varies: those with more than one value that are not pinned and that
        some configuration of the space makes active (an offload knob of ZeRO 2/3 is not searched
        when the space holds ZeRO 0 only)."""
        reachable = self.reachable()
        return tuple(
            k.name
            for k in self.knobs
            if k.name not in self.pinned and len(k.values()) > 1 and k.name in reachable
        )

    def reachable(self) -> frozenset[str]:
        """The knobs that some configuration of this space makes active (each ``when`` satisfiable by
        values the knobs it names can take here, those knobs reachable themselves)."""
        possible: dict[str, tuple[Any, ...]] = {name: (v,) for name, v in self.dropped_defaults.items()}
        for knob in self.knobs:  # a condition names earlier knobs only (the loader checks it)
            if all(
                any(_same(v, a) for v in possible.get(other, ()) for a in allowed)
                for other, allowed in knob.when.items()
            ):
                possible[knob.name] = knob.values()
        return frozenset(k.name for k in self.knobs if k.name in possible)

    def describe(self) -> list[dict[str, Any]]:
        """A JSON-friendly description (for study.json and reports)."""
        return [
            {
                "name": k.name,
                "type": k.type,
                "values": list(k.values()),
                "default": k.default,
                "when": {a: list(b) for a, b in k.when.items()},
                "applies": k.applies,
                "memory": k.memory,
                "help": k.help,
                "pinned": k.name in self.pinned,
            }
            for k in self.knobs
        ]


def _describe_values(knob: Knob) -> str:
    if knob.choices is not None:
        return ", ".join(repr(c) for c in knob.choices)
    return f"{knob.type} from {knob.low} to {knob.high}"


def _finite(value: _V, where: str) -> _V:
    """``value`` when it is a finite number (a range to ``.inf`` has no grid nor midpoint)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise SpaceError(f"{where}: {value} is not a finite number", hint="Give a finite bound and step")
    return value


def _plain_text(value: str, where: str) -> str:
    """``value`` when it holds no control character (it reaches terminals, reports and argv)."""
    if _CONTROL.search(value):
        raise SpaceError(
            f"{where}: {value[:40]!r} holds a control character", hint="Remove it: names and values are text"
        )
    return value


def _coerce(value: object, typ: str, where: str) -> Any:
    if value is None:
        return None
    if typ == "bool":
        if isinstance(value, bool):
            return value
    elif typ == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif typ == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif typ == "str":
        if isinstance(value, str):
            return _plain_text(value, where)
    raise SpaceError(f"{where}: {value!r} is not a {typ}", hint="Fix the value's type in the space file")


def _parse_knob(name: str, spec: object, earlier: dict[str, Knob], where: str) -> Knob:
    here = f"{where}: knob {name!r}"
    if not isinstance(spec, dict):
        raise SpaceError(f"{here} must be a mapping", hint="Give it type, choices or low/high, and default")
    fields: KnobFields = validated(KnobFields, spec, here)
    typ = fields.type
    choices, low, high = fields.choices, fields.low, fields.high
    if typ == "bool" and choices is None and low is None:
        choices = [False, True]
    if choices is not None:
        if low is not None or high is not None:
            raise SpaceError(f"{here} has both choices and low/high", hint="Keep one of them")
        if len(choices) > MAX_CHOICES:
            raise SpaceError(
                f"{here} has {len(choices)} choices, more than {MAX_CHOICES}",
                hint="Give a range (low:, high:, step:) instead: the search samples it",
            )
        choices_t: tuple[Any, ...] | None = tuple(_coerce(c, typ, f"{here} choice") for c in choices)
    else:
        if typ not in ("int", "float") or low is None or high is None:
            raise SpaceError(
                f"{here} needs choices, or low and high", hint="Write choices: [...] or low:/high:"
            )
        low = _finite(_coerce(low, typ, f"{here} low"), f"{here} low")
        high = _finite(_coerce(high, typ, f"{here} high"), f"{here} high")
        if low > high:
            raise SpaceError(f"{here}: low {low} is above high {high}", hint="Swap them")
        choices_t = None
    step = fields.step
    if step is not None:
        step = _finite(
            _coerce(step, typ if typ in ("int", "float") else "float", f"{here} step"), f"{here} step"
        )
        if step <= 0:
            raise SpaceError(f"{here}: step must be positive", hint="Use a step above 0")
    default = _coerce(fields.default, typ, f"{here} default")
    when: dict[str, tuple[Any, ...]] = {}
    for other, allowed in (fields.when or {}).items():
        if other not in earlier:
            raise SpaceError(
                f"{here}: condition names {other!r}, which is not an earlier knob",
                hint="Define the knob it depends on above it",
            )
        allowed_l = allowed if isinstance(allowed, list) else [allowed]
        when[other] = tuple(_coerce(a, earlier[other].type, f"{here} when {other}") for a in allowed_l)
    cpu = _parse_cpu_values(name, fields, earlier, where)
    knob = Knob(
        name=name,
        type=typ,
        default=default,
        choices=choices_t,
        low=low if choices_t is None else None,
        high=high if choices_t is None else None,
        step=step,
        log=fields.log,
        when=when,
        applies=fields.applies,
        cpu=cpu,
        memory=fields.memory,
        help=fields.help,
        label=fields.label,
    )
    if default is not None and not knob.contains(default):
        raise SpaceError(
            f"{here}: default {default!r} is not one of its values", hint=f"Allowed: {_describe_values(knob)}"
        )
    return knob


def _parse_cpu_values(name: str, fields: KnobFields, earlier: dict[str, Knob], where: str) -> Knob | None:
    """The knob of a ``cpu:`` block: the file's knob with the block's values (checked the same way)."""
    if fields.cpu is None:
        return None
    here = f"{where}: knob {name!r} cpu"
    block = validated(CpuValues, fields.cpu, here).model_dump(exclude_unset=True)
    if not block:
        raise SpaceError(
            f"{here} must map some of {', '.join(CpuValues.model_fields)} to its values on a CPU-only run",
            hint="Write cpu: {high: 0.2, default: 0.1}",
        )
    merged = fields.model_dump(exclude_unset=True, exclude={"cpu"})
    if "choices" in block:
        merged = {k: v for k, v in merged.items() if k not in ("low", "high", "step", "log")}
    elif "low" in block or "high" in block:
        merged.pop("choices", None)
    return _parse_knob(name, {**merged, **block}, earlier, f"{where} (its cpu: values)")


def load_space(
    source: Path | Traversable | str,
    *,
    backend: str | None = None,
    known_knobs: frozenset[str] | None = None,
) -> SearchSpace:
    """Load and validate a space file.

    Args:
        source: a path (or packaged resource) of a YAML file.
        backend: the backend in use; a file written for another backend is refused.
        known_knobs: knob names the backend can render; None accepts any.

    Raises:
        SpaceError: anything wrong with the file, as one line naming the problem and the fix.
    """
    where = str(source)
    data = read_yaml(source, what="search-space", flag="--space", error=SpaceError)
    if not isinstance(data, dict) or not isinstance(data.get("knobs"), dict) or not data["knobs"]:
        raise SpaceError(
            f"search-space file {where} has no 'knobs' mapping", hint="Start it with knobs: {name: {...}}"
        )
    file_backend = data.get("backend")
    if backend is not None and file_backend not in (None, backend):
        raise SpaceError(
            f"search-space file {where} is written for backend {file_backend!r}, not {backend!r}",
            hint=f"Use --backend {file_backend} or a space for {backend}",
        )
    knobs: dict[str, Knob] = {}
    for name, spec in data["knobs"].items():
        if not isinstance(name, str):
            raise SpaceError(
                f"{where}: knob name {name!r} is not text", hint="Name knobs as the framework does"
            )
        _plain_text(name, f"{where}: knob name")
        if known_knobs is not None and name not in known_knobs:
            raise SpaceError(
                f"{where}: unknown knob {name!r} for backend {backend}",
                hint=f"Known knobs: {', '.join(sorted(known_knobs))}",
            )
        knobs[name] = _parse_knob(name, spec, knobs, where)
    return SearchSpace(backend=str(file_backend or backend or ""), knobs=tuple(knobs.values()), source=where)
