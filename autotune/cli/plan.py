"""``autotune plan``: every candidate of a search space judged by the memory and time estimates.

No GPU is needed: declare the GPUs with ``--gpu-type`` (or ``--gpu-memory-gib``).
"""

from __future__ import annotations

from typing import Any

import typer

from autotune.cli import _options as o

HELP = """Estimate per-GPU memory and relative speed of every candidate configuration, without a GPU.

Shows which candidates fit, which do not (the component to blame and by how much), the vLLM KV-cache
capacity and rollout concurrency, and the predicted relative speed (for ordering only).

\b
Examples:
  autotune plan --gpus 4 --gpu-type A10 --model Qwen2-7B
  autotune plan --gpus 8 --gpu-type H100 --model Qwen2.5-7B --lora-rank 64
  autotune plan --gpus 8 --gpu-type H100 --model Qwen2.5-7B --backend swift
  autotune plan --gpus 4 --gpu-type A10 --model Qwen2-7B --knob zero_stage=3
  autotune plan --gpus 4 --gpu-type A100-80G --model Qwen2-7B --json"""


def register(app: typer.Typer) -> None:
    """Add the command to the app."""

    @app.command("plan", cls=o.PanelledCommand, help=HELP)
    def plan(
        model: o.Model,
        gpus: o.Gpus = None,
        gpu_type: o.GpuType = None,
        gpu_memory_gib: o.GpuMemoryGib = None,
        backend: o.PlannedBackend = "trl",
        model_config: o.ModelConfig = None,
        space: o.Space = None,
        global_batch: o.GlobalBatch = None,
        num_generations: o.NumGenerations = None,
        max_completion_length: o.MaxCompletionLength = None,
        max_prompt_length: o.MaxPromptLength = 512,
        beta: o.Beta = None,
        lora_rank: o.LoraRank = 0,
        vllm_max_model_len: o.VllmMaxModelLen = None,
        knob: o.Knob = None,
        pin: o.Pin = None,
        margin: o.Margin = 0.15,
        top: o.Top = None,
        as_json: o.Json = False,
    ) -> None:
        import json
        import sys

        from autotune.app.plan import PlanRequest, plan_job
        from autotune.cli._console import console, notice

        request = PlanRequest(
            model=model,
            model_config=model_config,
            gpus=gpus,
            gpu_type=gpu_type,
            gpu_memory_gib=gpu_memory_gib,
            backend=backend,
            space=space,
            global_batch=global_batch,
            num_generations=num_generations,
            max_completion_length=max_completion_length,
            max_prompt_length=max_prompt_length,
            beta=beta,
            lora_rank=lora_rank,
            vllm_max_model_len=vllm_max_model_len,
            knobs=tuple(knob or ()),
            pins=tuple(pin or ()),
            margin=margin,
        )
        result, notes = plan_job(request)
        if as_json:
            data = result.to_dict(top)
            data["notes"] = list(notes) + data["notes"]
            # straight to stdout: through the console, megabytes of JSON take a minute to lay out
            sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
            return
        for line in notes:
            notice(line)
        _render(console, result, top if top is not None else 20)


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
    """Plain aligned text (predictable when piped or pasted into a report).

    Kept rather than rich's ``Table``: that one fits itself to the console (80 columns when piped, where a
    candidate's row wraps over several lines) unless given a width, and pads every line with blanks; here
    a candidate is one line that ``grep`` and ``cut`` read, in ten lines of code.
    """
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
        "step s",
        "ceiling s",
        "ties",
    ]
    n_knobs = len(shown)
    right = {0, *range(1, n_knobs + 2), *range(n_knobs + 4, n_knobs + 10)}
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
                    f"{c.time.total_s:.3g}",
                    f"{c.ceiling.step_s:.3g}" if c.ceiling is not None else "",
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
        "tight: over capacity by less than the margin, so a search would still try it; "
        "step s: the predicted step time (rough); ceiling s: the least time the step could take on this "
        "hardware (physical bound: no run of the candidate is faster)"
    )
    for line in out:
        console.print(line, markup=False, soft_wrap=True)
