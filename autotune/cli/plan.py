"""``autotune plan``: every candidate of a search space judged by the memory and time estimates.

No GPU is needed: declare the GPUs with ``--gpu-type`` (or ``--gpu-memory-gib``).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

HELP = """Estimate per-GPU memory and relative speed of every candidate configuration, without a GPU.

Shows which candidates fit, which do not (the component to blame and by how much), the vLLM KV-cache
capacity and rollout concurrency, and the predicted relative speed (for ordering only).

\b
Examples:
  autotune plan --gpus 4 --gpu-type A10 --model Qwen2-7B
  autotune plan --gpus 8 --gpu-type H100 --model Qwen2.5-7B --backend swift --lora-rank 64
  autotune plan --gpus 4 --gpu-type A100-80G --model Qwen2-7B --knob zero_stage=3 --knob use_vllm=true --json"""

# Roles (JobConfig fields) whose knobs the GPU estimates do not depend on: fixed at their default
# unless filtered with --knob.
_NO_EFFECT = ("dataloader_num_workers",)


def register(app: typer.Typer) -> None:
    """Add the command to the app."""

    @app.command("plan", help=HELP)
    def plan(
        model: Annotated[
            str,
            typer.Option(
                "--model", help="A catalog name (Qwen2-7B), a hub id, or a folder with config.json."
            ),
        ],
        gpus: Annotated[
            int | None, typer.Option("--gpus", help="GPUs per trial (default: all detected).")
        ] = None,
        gpu_type: Annotated[
            str | None, typer.Option("--gpu-type", help="Declare the GPU type (A10, A100-80G, H100, ...).")
        ] = None,
        gpu_memory_gib: Annotated[
            float | None, typer.Option("--gpu-memory-gib", help="Declare GPU memory in GiB.")
        ] = None,
        backend: Annotated[str, typer.Option("--backend", help="trl or swift.")] = "trl",
        model_config: Annotated[
            str | None,
            typer.Option("--model-config", help="config.json (or its folder) of a model not in the catalog."),
        ] = None,
        space: Annotated[
            str | None, typer.Option("--space", help="Search-space YAML (default: the backend's own).")
        ] = None,
        global_batch: Annotated[
            int, typer.Option("--global-batch", help="Completions per optimizer step.")
        ] = 64,
        num_generations: Annotated[
            int, typer.Option("--num-generations", help="Completions per prompt (G).")
        ] = 8,
        max_completion_length: Annotated[
            int, typer.Option("--max-completion-length", help="Completion tokens.")
        ] = 1024,
        max_prompt_length: Annotated[int, typer.Option("--max-prompt-length", help="Prompt tokens.")] = 512,
        beta: Annotated[
            float | None,
            typer.Option("--beta", help="KL coefficient (default: the framework's: TRL 0.0, ms-swift 0.04)."),
        ] = None,
        lora_rank: Annotated[int, typer.Option("--lora-rank", help="LoRA rank; 0 = full fine-tuning.")] = 0,
        vllm_max_model_len: Annotated[
            int | None,
            typer.Option(
                "--vllm-max-model-len",
                help="vLLM max_model_len (default: the model's max position, as the frameworks do).",
            ),
        ] = None,
        knob: Annotated[
            list[str] | None,
            typer.Option("--knob", help="Keep only these values of a knob: name=v1,v2 (repeatable)."),
        ] = None,
        margin: Annotated[
            float, typer.Option("--margin", help="Pruning margin, a fraction of GPU memory.")
        ] = 0.15,
        top: Annotated[
            int | None, typer.Option("--top", help="Show the first N candidates (default 20; JSON: all).")
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
    ) -> None:
        import json
        import sys

        from autotune.cli._console import console, notice

        result, notes = run_plan(
            model=model,
            model_config=model_config,
            gpus=gpus,
            gpu_type=gpu_type,
            gpu_memory_gib=gpu_memory_gib,
            backend=backend,
            space_path=space,
            global_batch=global_batch,
            num_generations=num_generations,
            max_completion_length=max_completion_length,
            max_prompt_length=max_prompt_length,
            beta=beta,
            lora_rank=lora_rank,
            vllm_max_model_len=vllm_max_model_len,
            knobs=knob or [],
            margin=margin,
        )
        if as_json:
            data = result.to_dict(top)
            data["notes"] = list(notes) + data["notes"]
            # straight to stdout: through the console, megabytes of JSON take a minute to lay out
            sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
            return
        for line in notes:
            notice(line)
        _render(console, result, top if top is not None else 20)


def run_plan(
    *,
    model: str,
    model_config: str | None,
    gpus: int | None,
    gpu_type: str | None,
    gpu_memory_gib: float | None,
    backend: str,
    space_path: str | None,
    global_batch: int,
    num_generations: int,
    max_completion_length: int,
    max_prompt_length: int,
    beta: float | None,
    lora_rank: int,
    vllm_max_model_len: int | None,
    knobs: list[str],
    margin: float,
) -> tuple[Any, list[str]]:
    """Resolve every input, then judge the space. Returns the plan and notes for the user.

    Raises:
        UsageError: bad input (unknown model, backend, knob or value; impossible batch or TP).
        HardwareError: unknown GPU type without memory, or no GPU to detect.
    """
    from pathlib import Path

    from autotune.backends import BACKENDS, backend_class
    from autotune.errors import UsageError
    from autotune.estimate import ModelSpec, find_model, model_from_config, resolve_gpu
    from autotune.estimate.plan import plan_space
    from autotune.study.hardware import resolve_hardware

    planned = [name for name in sorted(BACKENDS) if backend_class(name).space_name is not None]
    if backend not in planned:
        raise UsageError(
            f"plan does not know backend {backend!r}",
            hint=f"Use --backend with one of: {', '.join(planned)}",
        )
    facts = backend_class(backend)
    for flag, value in (
        ("--global-batch", global_batch),
        ("--num-generations", num_generations),
        ("--max-completion-length", max_completion_length),
    ):
        if value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}", hint=f"Give a positive {flag}")
    if max_prompt_length < 0 or lora_rank < 0:
        raise UsageError("--max-prompt-length and --lora-rank cannot be negative", hint="Use 0 or more")
    if num_generations < 2:
        raise UsageError(
            f"--num-generations must be at least 2, got {num_generations}",
            hint="GRPO compares completions of one prompt",
        )
    if global_batch % num_generations:
        raise UsageError(
            f"--global-batch {global_batch} is not a multiple of --num-generations {num_generations}",
            hint="Every prompt needs all of its completions in one batch",
        )
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
    notes: list[str] = []
    if not gpu.known:
        notes.append(
            f"GPU {first.name!r} is not in the catalog: memory {first.memory_total_bytes / 2**30:.1f} GiB, speed of an A10-class card assumed"
        )

    # space
    space = _load_space(backend, space_path).restrict(gpu_present=True).with_roles(facts.knob_roles())
    filters = _parse_filters(knobs, space)
    _check_tp(filters, space.knob_for("vllm_tp"), n_gpus, spec)
    filters = _with_conditions(filters, space)
    for name in (space.knob_for(role) for role in _NO_EFFECT):
        if name is not None and name not in filters:
            filters[name] = [space[name].default]
            notes.append(
                f"{name} does not change memory or speed estimates: fixed at {space[name].default!r}"
            )
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

    result = plan_space(
        space,
        backend=backend,
        describe=facts.describe,
        model=spec,
        gpu=gpu,
        n_gpus=n_gpus,
        fixed=fixed,
        margin=margin,
    )
    if not result.candidates:
        rules = ", ".join(f"{k} ({v})" for k, v in sorted(result.invalid.items())) or "none"
        raise UsageError(
            f"no valid candidate on {n_gpus} GPU(s): every configuration breaks a start-up rule: {rules}",
            hint="Change --gpus, --global-batch or the --knob filters",
        )
    return result, notes


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

    raw = text.strip()
    if raw.lower() in ("none", "null"):
        return None
    try:
        if typ == "bool":
            low = raw.lower()
            if low in ("true", "1", "yes", "on"):
                return True
            if low in ("false", "0", "no", "off"):
                return False
            raise ValueError(raw)
        if typ == "int":
            return int(raw)
        if typ == "float":
            return float(raw)
    except ValueError:
        raise UsageError(
            f"--knob {name}: {raw!r} is not a {typ}", hint=f"Give {typ} values, e.g. --knob {name}=v1,v2"
        ) from None
    return raw


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


def _fmt_value(v: Any) -> str:
    if isinstance(v, bool):
        return "T" if v else "F"
    if isinstance(v, float):
        return f"{v:g}"
    return "-" if v is None else str(v)


def speed_decimals(speeds: list[float]) -> int:
    """The fewest decimals (2 to 6) that print distinct relative speeds as distinct numbers."""
    distinct = sorted(set(speeds))
    for digits in range(2, 7):
        if len({f"{v:.{digits}f}" for v in distinct}) == len(distinct):
            return digits
    return 6


def _table(headers: list[str], rows: list[list[str]], right: set[int]) -> list[str]:
    """Plain aligned text (predictable when piped or pasted into a report)."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)]


def _varies(cands: Any, j: int, start: int, end: int) -> bool:
    """Whether knob ``j`` takes more than one value among candidates ``start:end`` (inactive = None)."""
    import numpy as np

    values = list(cands.knob_values.values())[j]
    column = cands.knob_index[start:end, j]
    shown = {repr(values[x]) if x >= 0 else repr(None) for x in np.unique(column)}
    return len(shown) > 1


def _render(console: Any, result: Any, top: int) -> None:
    import numpy as np

    gib = 2**30
    out: list[str] = [
        f"{result.model.name} ({result.model.params / 1e9:.2f}B) on {result.n_gpus} x {result.gpu.name} "
        f"({result.gpu.memory_bytes / gib:.1f} GiB), backend {result.backend}: {len(result.candidates)} candidates, "
        f"{result.n_fit} fit, {len(result.candidates) - result.n_fit} do not "
        f"({result.n_pruned} would be pruned at margin {result.margin:.0%}), {sum(result.invalid.values())} invalid"
    ]
    # one row per predicted step time: candidates the time model ties share a row (the one with the
    # most headroom shows, "ties" counts the others), so the rows shown are the top distinct predictions.
    # Fitting candidates come first, fastest first: equal ranks are contiguous.
    judged = result.candidates
    n_fit = result.n_fit
    ranks = judged.speed_rank[:n_fit]
    starts = [int(i) for i in np.flatnonzero(np.diff(ranks, prepend=-1))][:top]
    spans = [(a, int(np.searchsorted(ranks, ranks[a], side="right"))) for a in starts]
    fitting = [judged[a] for a, _ in spans]
    ties = {id(c): b - a - 1 for c, (a, b) in zip(fitting, spans, strict=True)}
    missing = judged[n_fit : n_fit + max(5, top // 4)]
    decimals = speed_decimals([c.relative_speed for c in fitting if c.relative_speed is not None])
    # knob columns: in the order they first appear down the plan; constant when one value everywhere
    index = judged.knob_index
    knob_names = list(judged.knob_values)
    first_seen = {
        k: int(np.argmax(index[:, j] >= 0)) for j, k in enumerate(knob_names) if (index[:, j] >= 0).any()
    }
    names = sorted(first_seen, key=lambda k: (first_seen[k], knob_names.index(k)))
    constant = {k for k in names if len(np.unique(index[:, knob_names.index(k)])) == 1}
    shown = [k for k in names if k not in constant]
    headers = [
        "#",
        *(result.labels.get(k, k) for k in shown),
        "peak/cap GiB",
        "fits",
        "overflow",
        "KV tokens",
        "conc",
        "speed",
        "ties",
    ]
    n_knobs = len(shown)
    right = {0, *range(1, n_knobs + 2), n_knobs + 4, n_knobs + 5, n_knobs + 6, n_knobs + 7}
    for title, cands in (("fit (fastest first):", fitting), ("do not fit (closest first):", missing)):
        if not cands:
            continue
        rows = []
        for i, c in enumerate(cands, 1):
            mem = c.memory
            over = mem.overflow()
            rows.append(
                [
                    str(i),
                    *(_fmt_value(c.params[k]) if k in c.params else "" for k in shown),
                    f"{mem.peak_bytes / gib:.1f}/{mem.capacity_bytes / gib:.1f}",
                    "yes" if c.fits else ("no" if c.pruned else "tight"),
                    f"{over[0]} +{over[1] / gib:.1f} GiB" if over else "",
                    f"{mem.kv_tokens:,}" if mem.kv_tokens else "",
                    str(mem.rollout_concurrency) if mem.rollout_concurrency else "",
                    f"{c.relative_speed:.{decimals}f}" if c.relative_speed is not None else "",
                    f"+{ties[id(c)]}" if ties.get(id(c)) else "",
                ]
            )
        out += ["", title, *_table(headers, rows, right)]
    out.append("")
    tied = [(a, b) for a, b in spans if b - a > 1]
    if tied:
        neutral = [k for k in names if any(_varies(judged, knob_names.index(k), a, b) for a, b in tied)]
        out.append(
            f"ties: +N more candidates with the same predicted step time (the row shows the one with the"
            f" most headroom); they differ only in knobs the time model holds neutral there:"
            f" {', '.join(result.labels.get(k, k) for k in neutral)}"
        )
    if constant:
        out.append(
            "same in every candidate: "
            + " ".join(f"{k}={_fmt_value(judged.params(0)[k])}" for k in names if k in constant)
        )
    legend = ", ".join(f"{result.labels[k]}={k}" for k in shown if k in result.labels)
    if legend:
        out.append(f"columns: {legend}")
    out.append(
        "speed: predicted throughput relative to the fastest candidate that fits (for ordering only; "
        "rows differ in their predicted step time, shown with as many decimals as it takes to tell them apart); "
        "tight: over capacity by less than the margin, so a search would still try it"
    )
    for line in out:
        console.print(line, markup=False, soft_wrap=True)
