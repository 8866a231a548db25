"""Step records and failure text from verl: its console metric lines and what Ray wraps around them.

verl's console logger (``verl/utils/logger/aggregate_logger.py::LocalLogger.log`` through
``concat_dict_to_str``, verl 0.9.1) prints one line per training step from the TaskRunner actor::

    step:3 - actor/pg_loss:-0.0012 - actor/grad_norm:np.float64(0.31) - timing_s/gen:4.12 - ...

Values are ``pprint.pformat`` of numbers: plain floats, or ``np.float64(...)`` under numpy 2; releases
before ``pformat`` printed ``%.3f``. Ray forwards the actor's stdout with a ``(TaskRunner pid=N)`` prefix,
coloured by default, and a tqdm bar may end right before the line without a newline (``...s/it]step:2``).
Steps start at 1; ``step:0`` is the validation before training (off in trials). The file logger's JSON lines
``{"step": N, "data": {...}}`` (``$VERL_FILE_LOGGER_PATH``) are read too when a path is given. The
console line itself is read by :func:`autotune.backends._loglines.parse_verl_console_line`, shared with
the ``command`` backend and ``autotune profile``.

Besides verl's own keys (the phase timings ``timing_s/*`` the timeline lays out, ``perf/*``) each record
carries the names the health gate reads: ``grad_norm`` (``actor/grad_norm``), ``kl`` (``actor/kl_loss``),
``loss`` (``actor/pg_loss``), ``reward`` (``critic/score/mean``), ``completions/mean_length`` and
``completions/clipped_ratio`` (``response_length/*``), ``step_time`` (``timing_s/step``) and
``memory_gib`` (``perf/max_memory_reserved_gb``, else ``..._allocated_gb``; GiB, rank 0's torch peak).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from autotune.backends._base import FailurePattern, StepParser
from autotune.backends._loglines import parse_verl_console_line as parse_console_line
from autotune.records import StepMetrics
from autotune.tail import FileTail

__all__ = ["CANONICAL", "FAILURE_PATTERNS", "VerlLogParser", "parse_console_line"]


#: verl key → the name the health gate and the reports read.
CANONICAL: dict[str, str] = {
    "actor/grad_norm": "grad_norm",
    "actor/kl_loss": "kl",
    "actor/pg_loss": "loss",
    "critic/score/mean": "reward",
    "response_length/mean": "completions/mean_length",
    "response_length/clip_ratio": "completions/clipped_ratio",
    "timing_s/step": "step_time",
}
# verl 0.9.1's v1 trainer prefixes the actor worker's metrics with "actor/"
# (trainer/ppo/v1/trainer_base.py rename_dict(output["metrics"], "actor/")); earlier releases did not
_MEMORY_KEYS = (
    "actor/perf/max_memory_reserved_gb",
    "actor/perf/max_memory_allocated_gb",
    "perf/max_memory_reserved_gb",
    "perf/max_memory_allocated_gb",
)

_RAY_OOM_DOC = (
    "ray-project/ray doc/source/ray-core/scheduling/ray-oom-prevention.rst: the memory monitor's kill, "
    "'Task was killed due to the node running low on memory.' (Ray ≤ 2.54) and "
    "'N worker(s) were killed due to the node running low on memory.' (newer)"
)

#: verl's and Ray's own failure text, on top of the common patterns (CUDA OOM, vLLM start-up).
FAILURE_PATTERNS: tuple[FailurePattern, ...] = (
    # Ray's memory monitor kills a worker when the node's RAM passes its threshold (_RAY_OOM_DOC).
    FailurePattern(
        "HOST_OOM",
        r"(?:Task was|worker\(s\) were) killed due to the node running low on memory",
        "Ray's memory monitor killed a worker: the node ran out of host RAM",
    ),
    # verl/utils/config.py::validate_config
    FailurePattern(
        "INVALID",
        r"real_train_batch_size \(\d+\) must be divisible by minimal possible batch size",
        "the batch does not divide over the GPUs (verl validate_config)",
    ),
    FailurePattern(
        "INVALID",
        r"Please set at least one of '[\w.]*micro_batch_size'",
        "a micro-batch size is missing (verl validate_config / ActorConfig)",
    ),
    # verl/workers/config/actor.py::ActorConfig.validate
    FailurePattern(
        "INVALID",
        r"train_batch_size \(\d+\) must be >= actor\.ppo_mini_batch_size",
        "the mini-batch is larger than the train batch (verl ActorConfig.validate)",
    ),
    # verl/workers/engine_workers.py::ActorRolloutRefWorker.init_model
    FailurePattern(
        "INVALID",
        r"rollout world_size: \d+ is not divisible by infer_world_size",
        "the rollout tensor-parallel size does not divide the GPUs",
    ),
    # hydra (hydra/_internal/config_loader_impl.py) refusing an override verl's config does not have
    FailurePattern("INVALID", r"Could not override '[^']+'", "verl's config has no such key"),
    FailurePattern(
        "INVALID", r"Could not append to config\. An item is already at '", "verl's config has that key"
    ),
    # a Ray actor that died without saying why (a SIGKILL, a segfault) ends the job with this; the
    # worker's own lines above it, when there are any, decide first (CUDA OOM, the memory monitor).
    FailurePattern(
        "CRASH",
        r"ray\.exceptions\.ActorDiedError: The actor died",
        "a verl worker (Ray actor) died: ActorDiedError",
    ),
)


def with_canonical(values: dict[str, float]) -> dict[str, float]:
    """verl's values plus the common names (:data:`CANONICAL`, ``memory_gib``)."""
    out = dict(values)
    for key, name in CANONICAL.items():
        if key in values and name not in out:
            out[name] = values[key]
    for key in _MEMORY_KEYS:
        value = values.get(key)
        if value is not None and math.isfinite(value) and "memory_gib" not in out:
            out["memory_gib"] = value
    return out


class VerlLogParser(StepParser):
    """Parser of a verl run's console lines, or of its JSON-lines file when one is given."""

    def __init__(self, jsonl_path: Path | None = None) -> None:
        self.jsonl_path = jsonl_path
        self._tail = FileTail(jsonl_path) if jsonl_path is not None else None
        self._seen: set[int] = set()

    def _make(
        self, step: int, values: dict[str, float], t_mono_s: float, t_wall_s: float
    ) -> list[StepMetrics]:
        if step < 1 or step in self._seen:  # step 0: the validation before training
            return []
        self._seen.add(step)
        duration = values.get("timing_s/step")
        return [
            StepMetrics(
                step=step,
                t_mono_s=t_mono_s,
                t_wall_s=t_wall_s,
                duration_s=duration,
                values=with_canonical(values),
            )
        ]

    def feed(self, stream: str, line: str, t_mono_s: float, t_wall_s: float) -> list[StepMetrics]:
        parsed = parse_console_line(line)
        return self._make(parsed[0], parsed[1], t_mono_s, t_wall_s) if parsed else []

    def poll(self, t_mono_s: float, t_wall_s: float) -> list[StepMetrics]:
        if self._tail is None:
            return []
        out: list[StepMetrics] = []
        for raw in self._tail.lines():
            try:
                record = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if (
                isinstance(record, dict)
                and isinstance(record.get("step"), int)
                and isinstance(record.get("data"), dict)
            ):
                values = {
                    k: float(v)
                    for k, v in record["data"].items()
                    if isinstance(v, (int, float)) and not isinstance(v, bool)
                }
                out.extend(self._make(record["step"], values, t_mono_s, t_wall_s))
        return out
