"""Step records from ms-swift's training log: the stdout dict lines and ``logging.jsonl``.

On every logging step rank 0 appends the record to ``<output_dir>/logging.jsonl`` (numbers) and *then*
prints it on stdout as a Python dict literal. The stdout form differs by version:

- 3.x (transformers 4): numbers, ``{'loss': 1.47077751, ..., 'global_step/max_steps': '1/94',
  'percentage': '1.06%', 'elapsed_time': '2s', ..., 'train_speed(iter/s)': 0.345807}``;
- 4.x (transformers 5 formats floats with ``.4g``): text, ``{'loss': '6e-08', ..., 'train_speed(s/it)':
  '0.07121'}``.

A tqdm bar may share the line through a carriage return. ``nan``/``inf`` appear as bare names. The dict
is the Hugging Face Trainer's log record (read by :mod:`autotune.backends._loglines`) with ms-swift's keys.

Rank 0 writes the JSONL line before it prints the stdout line, so the parser reads the file when a stdout
record arrives and takes the file's full-precision numbers with the stdout line's arrival time. With
several processes on CPU every rank prints the dict (transformers 5 does not see the process group), so
another rank's line may come first: such a record waits (at most ``grace_s``, checked at every
:meth:`~SwiftLogParser.poll`) for rank 0's file line. The stdout values serve alone when the file never
shows the step (PAI jobs, an unwritable output directory). Each step is returned once.

Values are normalised so that 3.x and 4.x logs give the same records: ``memory(GiB)`` → ``memory_gib``,
both speed keys → ``train_speed_s_per_it``, plus ``elapsed_s`` rebuilt from the speed (seconds since
training began, ms-swift's own clock). ``duration_s`` of a step is the difference of ``elapsed_s`` between
consecutive records, so it covers the whole step (data loading, generation, optimizer), unlike the
trainer's ``step_time`` (the ``training_step`` call only).

ms-swift prints nothing of its own around the weight sync to vLLM; with colocated vLLM in sleep mode
(``--sleep_level`` 1 or 2) vLLM's wake-up lines bracket it (:data:`PHASE_MARKS`), and the parser says
a weight sync is open between them (:meth:`SwiftLogParser.open_phase`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.backends._base import OpenPhase, PhaseMark, StepParser
from autotune.backends._loglines import completion_tokens, parse_dict_literal
from autotune.backends._phases import LinePhases
from autotune.records import StepMetrics
from autotune.tail import FileTail
from autotune.values import as_number

__all__ = ["PHASE_MARKS", "SwiftLogParser", "is_step_record", "record_values"]

_FAST_INFER = (
    "modelscope/ms-swift swift/rlhf_trainers/rollout_mixin.py::RolloutTrainerMixin._fast_infer "
    "(main, 2026-08, commit 3602360a): colocate with sleep_level > 0 calls "
    "engine.wake_up(tags=['weights']), then _move_model_to_vllm(), then wake_up(tags=['kv_cache'])"
)
_VLLM_WAKE = (
    "vllm-project/vllm vllm/v1/executor/abstract.py::Executor.wake_up (ExecutorBase.wake_up in "
    "vllm/executor/executor_base.py in older releases) logs 'It took %.6f seconds to wake up tags %s.' "
    "once the wake-up is done, with the tags as passed (ms-swift passes a list)"
)
#: The weight sync of ms-swift with colocated vLLM in sleep mode, as vLLM's own log lines show it.
PHASE_MARKS: tuple[PhaseMark, ...] = (
    PhaseMark(
        "weight_sync",
        "begin",
        r"seconds to wake up tags [\[{]'weights'[\]}]",
        f"{_FAST_INFER}; {_VLLM_WAKE}",
    ),
    PhaseMark(
        "weight_sync",
        "end",
        r"seconds to wake up tags [\[{]'kv_cache'[\]}]",
        f"{_FAST_INFER}; {_VLLM_WAKE}",
    ),
    PhaseMark(
        "weight_sync",
        "end",
        r"It took [\d.]+ seconds to fall asleep",
        "vllm-project/vllm vllm/v1/executor/abstract.py::Executor.sleep (ExecutorBase.sleep in older "
        "releases) logs 'It took %.6f seconds to fall asleep.'; ms-swift puts vLLM to sleep after the "
        "rollout, so the sync before it has ended",
    ),
)

STEP_KEY = "global_step/max_steps"
_ANNOUNCE_RE = re.compile(r"The logging file will be saved in: (.+?logging\.jsonl)\s*$")
_SKIP_KEYS = frozenset(
    {
        STEP_KEY,
        "percentage",
        "elapsed_time",
        "remaining_time",
        "train_speed(s/it)",
        "train_speed(iter/s)",
        "memory(GiB)",
    }
)


def _step_of(record: Mapping[str, object]) -> int | None:
    raw = record.get(STEP_KEY)
    if not isinstance(raw, str):
        return None
    m = re.match(r"^\s*(\d+)\s*/\s*(\d+)\s*$", raw)
    return int(m.group(1)) if m else None


def is_step_record(record: Mapping[str, object]) -> bool:
    """A training step: has a step counter and is neither an eval record nor the end-of-training summary."""
    if _step_of(record) is None:
        return False
    return "train_runtime" not in record and not any(k.startswith("eval_") for k in record)


def record_values(record: Mapping[str, object], *, start_step: int = 0) -> dict[str, float]:
    """Every numeric value of one record, with version-specific keys normalised (see module docstring)."""
    values: dict[str, float] = {}
    for key, raw in record.items():
        if key in _SKIP_KEYS:
            continue
        num = as_number(raw)
        if num is not None:
            values[key] = num
    mem = as_number(record.get("memory(GiB)"))
    if mem is not None:
        values["memory_gib"] = mem
    step = _step_of(record)
    s_per_it = as_number(record.get("train_speed(s/it)"))
    it_per_s = as_number(record.get("train_speed(iter/s)"))
    if step is not None and s_per_it is not None and s_per_it > 0:
        # 3.12.5+: elapsed / (global_step - start_step)
        values["train_speed_s_per_it"] = s_per_it
        values["elapsed_s"] = s_per_it * (step - start_step)
    elif step is not None and it_per_s is not None and it_per_s > 0:
        # up to 3.12.4: global_step / elapsed
        values["train_speed_s_per_it"] = 1.0 / it_per_s
        values["elapsed_s"] = step / it_per_s
    return values


class SwiftLogParser(StepParser):
    """Parser of one ms-swift trial. Not thread-safe (the runner calls it from one thread).

    Args:
        jsonl_path: where ``logging.jsonl`` will appear, when known in advance; the path ms-swift
            announces on its log replaces it.
        samples: completions per optimizer step (the global batch), for :attr:`StepMetrics.samples`.
        start_step: the step training starts from (0 unless resumed).
    """

    def __init__(
        self,
        *,
        jsonl_path: Path | None = None,
        samples: int | None = None,
        start_step: int = 0,
        grace_s: float = 1.0,
    ) -> None:
        self._jsonl_path = jsonl_path
        self._tail = FileTail(jsonl_path) if jsonl_path is not None else None
        self._samples = samples
        self._start_step = start_step
        self._grace_s = grace_s
        self._seen: set[int] = set()
        # step -> (stdout record, t_mono_s, t_wall_s): seen on stdout, waiting for the file's line
        self._pending: dict[int, tuple[dict[str, Any], float, float]] = {}
        self._last: tuple[int, float] | None = None  # (step, elapsed_s) of the last returned step
        self._phases = LinePhases(PHASE_MARKS)

    @property
    def jsonl_path(self) -> Path | None:
        return self._jsonl_path

    def feed(self, stream: str, line: str, t_mono_s: float, t_wall_s: float) -> list[StepMetrics]:
        out: list[StepMetrics] = []
        self._phases.feed(line, t_mono_s)
        for segment in line.split("\r"):
            m = _ANNOUNCE_RE.search(segment)
            if m:
                path = Path(m.group(1).strip())
                if path != self._jsonl_path:
                    self._jsonl_path, self._tail = path, FileTail(path)
                continue
            if STEP_KEY not in segment:
                continue
            record = parse_dict_literal(segment)
            if record is None or not is_step_record(record):
                continue
            number = _step_of(record)
            if number is None or number in self._seen or number in self._pending:
                continue
            self._pending[number] = (record, t_mono_s, t_wall_s)
            out.extend(self._read_jsonl(t_mono_s, t_wall_s))  # rank 0 wrote it before printing
            if self._jsonl_path is None:
                out.extend(self._flush(t_mono_s, force=True))
        out.extend(self._flush(t_mono_s, force=False))
        return out

    def poll(self, t_mono_s: float, t_wall_s: float) -> list[StepMetrics]:
        out = self._read_jsonl(t_mono_s, t_wall_s)
        return out + self._flush(t_mono_s, force=False)

    def finish(self, t_mono_s: float, t_wall_s: float) -> list[StepMetrics]:
        out = self._read_jsonl(t_mono_s, t_wall_s)
        return out + self._flush(t_mono_s, force=True)

    def _flush(self, t_mono_s: float, *, force: bool) -> list[StepMetrics]:
        """Return pending stdout records whose file line did not come within the grace period."""
        out: list[StepMetrics] = []
        for number in sorted(self._pending):
            record, t_seen, t_wall_seen = self._pending[number]
            if force or t_mono_s - t_seen >= self._grace_s:
                del self._pending[number]
                step = self._make_step(record, t_seen, t_wall_seen)
                if step is not None:
                    out.append(step)
        return out

    def _read_jsonl(self, t_mono_s: float, t_wall_s: float) -> list[StepMetrics]:
        if self._tail is None:
            return []
        out: list[StepMetrics] = []
        for raw in self._tail.lines():  # whole lines only: a partial one waits for its newline
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict) and is_step_record(record):
                number = _step_of(record)
                seen_at = self._pending.pop(number, None) if number is not None else None
                t_mono, t_wall = (seen_at[1], seen_at[2]) if seen_at is not None else (t_mono_s, t_wall_s)
                step = self._make_step(record, t_mono, t_wall)
                if step is not None:
                    out.append(step)
        return out

    def open_phase(self) -> OpenPhase | None:
        """The weight sync, between vLLM waking its weights and its KV cache (:data:`PHASE_MARKS`)."""
        return self._phases.open()

    def _make_step(
        self, record: Mapping[str, object], t_mono_s: float, t_wall_s: float
    ) -> StepMetrics | None:
        step = _step_of(record)
        if step is None or step in self._seen:
            return None
        self._seen.add(step)
        self._phases.step()
        values = record_values(record, start_step=self._start_step)
        duration_s: float | None = None
        elapsed = values.get("elapsed_s")
        if elapsed is not None:
            prev_step, prev_elapsed = self._last if self._last is not None else (self._start_step, 0.0)
            if step > prev_step and elapsed >= prev_elapsed:
                duration_s = (elapsed - prev_elapsed) / (step - prev_step)
            self._last = (step, elapsed)
        return StepMetrics(
            step=step,
            t_mono_s=t_mono_s,
            t_wall_s=t_wall_s,
            duration_s=duration_s,
            samples=self._samples,
            tokens=completion_tokens(values, self._samples),
            values=values,
        )
