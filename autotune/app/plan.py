"""The ``autotune plan`` job: every candidate of a search space judged by the memory and time estimates.

What ``autotune plan`` and :func:`autotune.plan` run: :class:`PlanRequest` holds every option of the
command (the CLI builds one from its flags), :func:`plan_job` resolves and judges it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["PlanRequest", "plan_job", "run_plan"]

# Roles (JobConfig fields) whose knobs the GPU estimates do not depend on: fixed at their default
# unless filtered with --knob.
_NO_EFFECT = ("dataloader_num_workers",)


@dataclass(frozen=True)
class PlanRequest:
    """Every option of ``autotune plan``, with the command's defaults.

    Named as the command's flags: ``knobs`` are ``--knob name=v1,v2`` filters, ``pins`` are
    ``--pin name=value``.
    """

    model: str
    model_config: str | None = None
    gpus: int | None = None
    gpu_type: str | None = None
    gpu_memory_gib: float | None = None
    backend: str = "trl"
    space: str | None = None
    # None: the framework's default for the job, as ``search`` takes it (autotune.jobsemantics)
    global_batch: int | None = None
    num_generations: int | None = None
    max_completion_length: int | None = None
    max_prompt_length: int = 512
    beta: float | None = None
    lora_rank: int = 0
    vllm_max_model_len: int | None = None
    knobs: tuple[str, ...] = ()
    pins: tuple[str, ...] = ()
    margin: float = 0.15


def plan_job(req: PlanRequest) -> tuple[Any, list[str]]:
    """Resolve every input of ``req``, then judge the space. Returns the plan and notes for the user."""
    fields = asdict(req)
    fields["space_path"] = fields.pop("space")
    fields["knobs"] = list(req.knobs)
    fields["pins"] = list(req.pins)
    return run_plan(**fields)


def run_plan(
    *,
    model: str,
    model_config: str | None,
    gpus: int | None,
    gpu_type: str | None,
    gpu_memory_gib: float | None,
    backend: str,
    space_path: str | None,
    global_batch: int | None,
    num_generations: int | None,
    max_completion_length: int | None,
    max_prompt_length: int,
    beta: float | None,
    lora_rank: int,
    vllm_max_model_len: int | None,
    knobs: list[str],
    margin: float,
    pins: list[str] | tuple[str, ...] = (),
) -> tuple[Any, list[str]]:
    """Resolve every input, then judge the space. Returns the plan and notes for the user.

    The keyword arguments are :class:`PlanRequest`'s fields (``knobs`` and ``pins`` as lists).

    Raises:
        UsageError: bad input (unknown model, backend, knob or value; impossible batch or TP).
        HardwareError: unknown GPU type without memory, or no GPU to detect.
    """
    from pathlib import Path

    from autotune.backends import backend_class, planned_backends
    from autotune.errors import UsageError
    from autotune.estimate import ModelSpec, find_model, model_from_config, resolve_gpu
    from autotune.estimate.plan import plan_space
    from autotune.jobsemantics import FIELDS, Place, Source, resolve_semantics
    from autotune.space import Platform
    from autotune.study.hardware import resolve_hardware

    planned = planned_backends()
    if backend not in planned:
        raise UsageError(
            f"plan does not know backend {backend!r}",
            hint=f"Use --backend with one of: {', '.join(planned)}",
        )
    facts = backend_class(backend)
    options = {"global_batch": global_batch, "num_generations": num_generations}
    options["max_completion_length"] = max_completion_length
    for name, value in options.items():
        if value is not None and value < 1:
            flag = FIELDS[name]
            raise UsageError(f"{flag} must be at least 1, got {value}", hint=f"Give a positive {flag}")
    if max_prompt_length < 0 or lora_rank < 0:
        raise UsageError("--max-prompt-length and --lora-rank cannot be negative", hint="Use 0 or more")
    if not 0 <= margin < 1:
        raise UsageError(f"--margin must be in [0, 1), got {margin}", hint="Use e.g. 0.15")

    # model
    spec: ModelSpec | None
    if model_config:
        spec = model_from_config(Path(model_config))
    elif Path(model).expanduser().exists():
        spec = model_from_config(Path(model).expanduser())
    else:
        spec = find_model(model)
        if spec is None:
            from autotune.estimate import known_models

            raise UsageError(
                f"unknown model {model!r}",
                hint=f"Give --model-config path/to/config.json, or a known model such as {', '.join(known_models()[:6])}",
            )

    # GPUs
    hardware = resolve_hardware(gpus, gpu_type=gpu_type, gpu_memory_gib=gpu_memory_gib, allow_cpu=False)
    first = hardware.gpus[0]
    gpu = resolve_gpu(first.name, first.memory_total_bytes)
    if gpu is None:  # pragma: no cover - resolve_hardware always gives a memory size
        raise UsageError(f"unknown GPU {first.name!r}", hint="Give --gpu-memory-gib")
    n_gpus = len(hardware.gpus)
    places = [
        Place(Source.OPTION, FIELDS[k], {k: (v, FIELDS[k])}) for k, v in options.items() if v is not None
    ]
    semantics = resolve_semantics(places, facts.job_defaults, n_gpus, demo=False)
    global_batch, num_generations, max_completion_length = (
        semantics.global_batch.value,
        semantics.num_generations.value,
        semantics.max_completion_length.value,
    )
    notes: list[str] = [semantics.line()]
    if not gpu.known:
        notes.append(
            f"GPU {first.name!r} is not in the catalog: memory {first.memory_total_bytes / 2**30:.1f} GiB, speed of an A10-class card assumed"
        )

    # space
    space = (
        _load_space(backend, space_path)
        .restrict(Platform.machine(gpu_present=True))
        .with_roles(facts.knob_roles())
    )
    filters = _parse_filters(knobs, space)
    filters.update(_pin_filters(pins, space, filters))
    _check_tp(filters, space.knob_for("vllm_tp"), n_gpus, spec)
    filters = _with_conditions(filters, space)
    # A knob no JobConfig field reads (it has no role) cannot change an estimate either.
    with_role = {n for names in facts.knob_fields.values() for n in names}
    no_effect = [space.knob_for(role) for role in _NO_EFFECT]
    no_effect += [k.name for k in space.knobs if k.name not in with_role and k.name not in no_effect]
    for name in no_effect:
        if name is not None and name not in filters:
            knob = space[name]
            value = knob.default if knob.contains(knob.default) else knob.values()[0]
            filters[name] = [value]
            notes.append(f"{name} does not change memory or speed estimates: fixed at {value!r}")
    space = space.narrow(filters)

    fixed: dict[str, Any] = {
        "global_batch": global_batch,
        "num_generations": num_generations,
        "max_completion_length": max_completion_length,
        "max_prompt_length": max_prompt_length,
    }
    if beta is not None:
        fixed["beta"] = beta
    if lora_rank > 0:
        fixed.update(facts.lora_args(lora_rank))
    if vllm_max_model_len is not None:
        fixed[facts.knob_fields["vllm_max_model_len"][0]] = vllm_max_model_len
    elif (use_vllm := space.knob_for("use_vllm")) is not None and space[use_vllm].contains(True):
        notes.append(
            f"vLLM max_model_len defaults to the model's max_position_embeddings ({spec.max_position}), as the "
            f"frameworks do; most jobs set it near prompt + completion ({max_prompt_length + max_completion_length}) "
            "with --vllm-max-model-len"
        )

    basis = _peak_basis(gpu)
    notes.append(f"ceilings from {basis.text()}")
    result = plan_space(
        space,
        backend=backend,
        describe=facts.describe,
        model=spec,
        gpu=gpu,
        n_gpus=n_gpus,
        fixed=fixed,
        margin=margin,
        basis=basis,
    )
    if not result.candidates:
        rules = ", ".join(f"{k} ({v})" for k, v in sorted(result.invalid.items())) or "none"
        raise UsageError(
            f"no valid candidate on {n_gpus} GPU(s): every configuration breaks a start-up rule: {rules}",
            hint="Change --gpus, --global-batch or the --knob filters",
        )
    return result, notes


def _peak_basis(gpu: Any) -> Any:
    """The peaks of the ceilings: this machine's measured peaks of that GPU where ``autotune doctor
    --bench`` cached them, else the catalog's."""
    from autotune.estimate import PeakBasis, cached_peaks

    for name in (*gpu.nvml_names, gpu.name):
        basis = PeakBasis.resolve(gpu, cached_peaks(name))
        if basis is not None and basis.source == "measured":
            return basis
    return PeakBasis.from_gpu(gpu)


def _load_space(backend: str, space_path: str | None) -> Any:
    from importlib.util import find_spec
    from pathlib import Path

    from autotune.errors import SpaceError
    from autotune.space import load_space

    if space_path:
        return load_space(space_path, backend=backend)
    # find_spec rather than importlib.resources.files: it also works when an editable install maps
    # search_spaces as a namespace package.
    spec = find_spec("autotune.search_spaces")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise SpaceError("the packaged search spaces are missing", hint="Give --space path/to/space.yaml")
    return load_space(Path(locations[0]) / f"{backend}.yaml", backend=backend)


def _parse_value(text: str, typ: str, name: str) -> Any:
    from autotune.errors import UsageError
    from autotune.fixed import knob_text

    try:
        return knob_text(text, typ)
    except ValueError:
        raise UsageError(
            f"--knob {name}: {text.strip()!r} is not a {typ}",
            hint=f"Give {typ} values, e.g. --knob {name}=v1,v2",
        ) from None


def _parse_filters(items: list[str], space: Any) -> dict[str, list[Any]]:
    from autotune.errors import UsageError

    filters: dict[str, list[Any]] = {}
    for item in items:
        name, sep, values = item.partition("=")
        name = name.strip()
        if not sep or not name or not values.strip():
            raise UsageError(f"--knob {item!r} is not name=v1,v2", hint="Write e.g. --knob zero_stage=2,3")
        if name not in space:
            dropped = space.dropped.get(name)
            why = f"it was dropped ({dropped})" if dropped else "it is not in the search space"
            raise UsageError(f"--knob {name}: {why}", hint=f"Knobs: {', '.join(space.names)}")
        filters[name] = [_parse_value(v, space[name].type, name) for v in values.split(",")]
    return filters


def _pin_filters(
    items: list[str] | tuple[str, ...], space: Any, filters: dict[str, list[Any]]
) -> dict[str, list[Any]]:
    """``--pin name=value`` as one-value filters, checked against the space (and the --knob filters)."""
    from autotune.errors import UsageError
    from autotune.fixed import parse_pins

    pins = parse_pins(items, space)
    space.pin(pins)  # refuses an unknown knob or a value outside it, naming the valid ones
    for name, value in pins.items():
        if name in filters and value not in filters[name]:
            raise UsageError(
                f"--pin {name}={value!r} is not among --knob {name}'s values {filters[name]}",
                hint=f"Drop --knob {name} or pin one of its values",
            )
    return {name: [value] for name, value in pins.items()}


def _check_tp(filters: dict[str, list[Any]], tp_knob: str | None, n_gpus: int, model: Any) -> None:
    from autotune.errors import UsageError

    for tp in filters.get(tp_knob, []) if tp_knob is not None else []:
        if tp is None:
            continue
        if tp < 1 or n_gpus % tp:
            raise UsageError(
                f"--knob {tp_knob}={tp} does not divide --gpus {n_gpus}",
                hint="vLLM's tensor-parallel size must divide the number of GPUs: change --gpus or the TP",
            )
        if model.heads % tp:
            raise UsageError(
                f"--knob {tp_knob}={tp} does not divide {model.name}'s {model.heads} attention heads",
                hint="vLLM splits attention heads evenly: choose a TP that divides them",
            )


def _with_conditions(filters: dict[str, list[Any]], space: Any) -> dict[str, list[Any]]:
    """Forcing a conditional knob forces its condition (``tp=2`` means ``use_vllm=true``)."""
    out = dict(filters)
    for name in filters:
        for other, allowed in space[name].when.items():
            if other not in filters:
                current = out.get(other, list(allowed))
                out[other] = [v for v in current if v in allowed] or list(allowed)
    return out
