"""The report's header: what the study is (model, backend, versions, fixed arguments, hardware), how
it ended, and the labels that depend on where it ran (GPUs or the CPU)."""

from __future__ import annotations

import shlex
from typing import Any

from autotune.reports._format import DASH, gib, is_num, knob_value
from autotune.reports._load import StudyData
from autotune.reports._progress import running_text
from autotune.reports._safety import Sanitizer

from autotune.studydir import StudyDir, TrialDir
from autotune.studysettings import StudySettings


def meta_view(data: StudyData, clean: Sanitizer) -> dict[str, Any]:
    """The report's title and what was tuned, on what, and how the study ended."""
    cpu_only = runs_on_cpu(data)
    outcome = _outcome(data)
    gpu_seconds: float = (
        float(outcome["gpu_seconds"])
        if is_num(outcome.get("gpu_seconds"))
        else sum(r.gpu_seconds for r in data.results)
    )
    launched = sum(
        1 for t in data.trials if t.steps or t.files.get(TrialDir.LAUNCH) or t.files.get(TrialDir.STDOUT)
    )
    name = data.settings.name or data.root.name
    return {
        "kind": data.kind,
        "title": clean.clean(
            f"autotune report — {name}" if data.kind == "study" else f"autotune profile — {name}"
        ),
        "name": clean.clean(name),
        "gpus": clean.clean(_gpu_summary(data) + _vllm_on_cpu(data)),
        "host": clean.clean(_host_summary(data)),
        "meta": _meta_pairs(data.settings, clean),
        "search": clean.clean(data.settings.search or DASH),
        "outcome": _outcome_view(data, outcome, clean),
        "trials_total": len(data.trials),
        "trials_launched": launched,
        "hours_label": hours_label(data),
        "util_label": "GPU util (mean)" if not cpu_only else "CPU util (mean, all cores)",
        "peak_label": "peak memory per GPU" if not cpu_only else "peak RSS",
        "gpu_hours_text": f"{gpu_seconds / 3600:.2f}",
    }


def hours_label(data: StudyData) -> str:
    """What the study's time is counted in: GPU-hours, or CPU-hours for a study without a GPU."""
    return "CPU-hours" if runs_on_cpu(data) else "GPU-hours"


def _outcome_view(data: StudyData, outcome: dict[str, Any], clean: Sanitizer) -> dict[str, str]:
    """How the study ended (``stopped``, ``detail``), or, for one that has not (still running, killed,
    a damaged ``study.json``), what is missing."""
    view = {k: clean.clean(str(outcome[k])) for k in ("stopped", "detail") if outcome.get(k)}
    if running_text(data):  # not ended because it is still running: the banner says so
        return {"stopped": "", "detail": ""}
    if data.kind == "study" and not view.get("stopped"):
        view["stopped"] = "not ended"
        view.setdefault(
            "detail",
            f"{StudyDir.SETTINGS} holds no outcome: the search is still running, or was stopped before "
            "it ended; this report shows the trials on disk so far",
        )
    return {"stopped": view.get("stopped", ""), "detail": view.get("detail", "")}


def _outcome(data: StudyData) -> dict[str, Any]:
    return dict(data.settings.outcome or {})


#: what the trials with vLLM measured on a CPU-only run, and what only GPUs show
VLLM_ON_CPU = (
    "; vLLM ran as vLLM's CPU build: the generation phase and the weight sync are the real engine's, but a "
    "CPU run cannot show vLLM's GPU behaviours (sleep mode, server-mode training, CUDA graphs, what the KV "
    "cache and the memory share do to GPU memory, GPU timings)"
)


def _vllm_on_cpu(data: StudyData) -> str:
    """:data:`VLLM_ON_CPU` when a trial of a CPU-only study generated with vLLM, else nothing."""
    if not runs_on_cpu(data) or data.kind != "study":
        return ""
    from autotune.reports.diagnosis import Context

    ctx = Context(data=data, signals={})
    configs = (ctx.config(t.params) for t in data.trials if t.params)
    return VLLM_ON_CPU if any(c is not None and c.use_vllm for c in configs) else ""


def _gpu_summary(data: StudyData) -> str:
    hw = data.hardware
    if hw is None:
        return DASH
    if not hw.gpus:
        return "no GPU (CPU-only run)" + (f"; {hw.nvml_note}" if hw.nvml_note else "")
    names: dict[str, int] = {}
    for g in hw.gpus:
        key = f"{g.name} ({gib(g.memory_total_bytes)})"
        names[key] = names.get(key, 0) + 1
    text = ", ".join(f"{n} × {k}" for k, n in names.items())
    driver = []
    if hw.driver_version:
        driver.append(f"driver {hw.driver_version}")
    if hw.cuda_driver_version:
        driver.append(f"CUDA {hw.cuda_driver_version}")
    if any(g.declared for g in hw.gpus):
        driver.append("declared, not detected")
    return text + (f"; {', '.join(driver)}" if driver else "")


def _host_summary(data: StudyData) -> str:
    hw = data.hardware
    if hw is None:
        return DASH
    h = hw.host
    cores = f"{h.cpu_cores_logical} logical cores" + (
        f" ({h.cpu_cores_physical} physical)" if h.cpu_cores_physical else ""
    )
    return f"{h.hostname}: {cores}, {gib(h.ram_total_bytes, 0)} RAM, {h.platform}"


def _meta_pairs(settings: StudySettings, clean: Sanitizer) -> dict[str, Any]:
    model = settings.model
    model_text = DASH
    if model.name or model.path_or_id:
        name = model.name or ""
        ident = model.path_or_id or ""
        model_text = name if not ident or ident == name else f"{name} ({ident})"
        params = model.facts.get("params")
        if params is not None and is_num(params):
            model_text += f", {_count(params)} parameters"
    backend = settings.backend or DASH
    if settings.backend_version:
        backend += f" {settings.backend_version}"
    job = {
        "global_batch": settings.global_batch,
        "num_generations": settings.num_generations,
        "max_completion_length": settings.max_completion_length,
        "max_steps": settings.max_steps,
    }
    fixed = [(key, clean.clean(knob_value(value))) for key, value in job.items() if value is not None]
    fixed += [(str(k), clean.clean(knob_value(v))) for k, v in settings.fixed.items()]
    versions = settings.versions
    dropped = settings.dropped_knobs or {}
    pinned = [
        (str(k["name"]), knob_value(k.get("default")))
        for k in settings.knobs
        if k.get("pinned") and "name" in k
    ]
    return {
        "model": clean.clean(model_text),
        "backend": clean.clean(backend),
        "fixed": fixed,
        "versions": [(clean.clean(k), clean.clean(v)) for k, v in versions.items()],
        "dropped": [(clean.clean(k), clean.clean(v)) for k, v in dropped.items()],
        "pinned": [(clean.clean(k), clean.clean(v)) for k, v in pinned],
        "command": clean.clean_command(command_text(settings.command)),
        "dataset": clean.clean(settings.dataset or ""),
    }


def _count(n: float) -> str:
    """A parameter count: ``7.62 B``, ``2.5 M``, ``107 k``."""
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f}"


def command_text(value: Any) -> str:
    """A command line from ``study.json``/``profile.json``: a string as is, an argv list shell-quoted."""
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple):
        return shlex.join(str(v) for v in value)
    return ""


def _measured(data: StudyData) -> str:
    """``"GPU"`` or ``"CPU"``: what the trials' timelines measured, which every utilization, memory and
    hours label names. A timeline with GPU samples measured GPUs; one with the host's alone measured the
    CPU (a machine without GPUs, or NVML unavailable). Without any timeline, the hardware decides."""
    summaries = [r.timeline_summary for r in data.results if r.timeline_summary is not None]
    if summaries:
        return "GPU" if any(s.gpus for s in summaries) else "CPU"
    return "CPU" if data.hardware is not None and not data.hardware.gpus else "GPU"


def runs_on_cpu(data: StudyData) -> bool:
    return _measured(data) == "CPU"
