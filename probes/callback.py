"""A ``transformers.TrainerCallback`` for users' own Trainer scripts: step records and phase markers.

Add it to a Hugging Face ``Trainer`` (or TRL's ``GRPOTrainer``) and run the script under ``autotune
profile`` (or as a ``command`` backend trial)::

    from autotune.probes.callback import AutotuneCallback

    trainer = GRPOTrainer(model=..., reward_funcs=..., args=..., train_dataset=...)
    trainer.add_callback(AutotuneCallback(trainer))
    trainer.train()

It writes what the probes read, where autotune's environment says (nothing when the variables are unset):

- one JSON line per logged optimizer step to ``$AUTOTUNE_METRICS_FILE`` (the format
  :class:`~autotune.backends.command.CommandParser` reads): ``step``, ``t_mono_s``/``t_wall_s`` of the
  step's end, ``duration_s`` since the previous step ended, ``samples``, ``tokens`` and every number the
  trainer logged under ``values``, with this process's torch CUDA peaks (``memory_gib``: reserved,
  ``memory_allocated_gib``: held by tensors) when it uses a GPU;
- phase markers through :mod:`autotune.probes.phases` (``$AUTOTUNE_PHASES_FILE``).

Which phase boundaries are exact. Trainer callbacks see only the step's edges (``on_step_begin``,
``on_substep_end``, ``on_step_end``, ``on_log``); they have no event between generation and training. So
given the trainer, the callback wraps the trainer *instance*'s own methods (its class is not changed):

- ``rollout`` (generation) — exactly the trainer's generation call: ``GRPOTrainer._generate`` when the
  installed TRL has it (1.16 does), else the whole ``_generate_and_score_completions`` (which then also
  holds the log-probability passes);
- ``other`` (scoring) — exactly ``GRPOTrainer._calculate_rewards``, the reward functions and reward
  models; named ``other`` as verl's ``timing_s/reward`` is (see ``probes.timeline``);
- ``weight_sync`` — exactly ``vllm_generation.sync_weights()`` (TRL 1.16, with vLLM) or
  ``_move_model_to_vllm`` (older TRL), carved out of the generation that calls it;
- ``train`` (training step) — from the end of generation (the log-probability passes, loss, backward
  and optimizer) or, on a step that reuses buffered generations, from ``_prepare_inputs``' return, to
  ``on_step_end``. Its start is exact; its end is the trainer's ``on_step_end`` event, which comes after
  the optimizer step and the scheduler step.

Time outside these (data loading, logging, the time before the first generation) is ``other`` in the
timeline. A plain ``transformers.Trainer`` has no generation: its steps are ``train`` from
``_prepare_inputs`` to ``on_step_end``. Without the trainer (``callbacks=[AutotuneCallback()]``) only
step records are written: the step's edges alone cannot tell generation from training.

Only rank 0 writes (``RANK`` unset, empty or ``"0"``, as :mod:`~autotune.probes.phases`).
transformers is imported when :class:`AutotuneCallback` is first used, so importing this module does
not need it; :class:`MetricsWriter` and :class:`PhaseTracker` are free of it.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from autotune.probes import phases as _phases

__all__ = [
    "AutotuneCallback",  # noqa: F822 (built on first use by the module's __getattr__)
    "ENV_METRICS_FILE",
    "MetricsWriter",
    "PhaseTracker",
    "numeric_values",
    "torch_peak_memory_gib",
    "watch_trainer",
]

ENV_METRICS_FILE = "AUTOTUNE_METRICS_FILE"


def _is_rank0() -> bool:
    return os.environ.get("RANK", "").strip() in ("", "0")


def numeric_values(logs: Mapping[str, object]) -> dict[str, float]:
    """The numbers of a log record as floats (bools and text dropped; NaN and inf kept for the health gate)."""
    out: dict[str, float] = {}
    for key, value in logs.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        out[key] = float(value)
    return out


def torch_peak_memory_gib() -> dict[str, float]:
    """This process's torch CUDA peaks so far, in GiB: ``memory_gib`` (the caching allocator's reserve,
    what NVML sees of it) and ``memory_allocated_gib`` (what tensors held at once).

    Empty where torch is not imported or has not started CUDA: torch is never imported here.
    """
    torch = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is None or not cuda.is_initialized():
            return {}
        device = cuda.current_device()
        return {
            "memory_gib": cuda.max_memory_reserved(device) / 2**30,
            "memory_allocated_gib": cuda.max_memory_allocated(device) / 2**30,
        }
    except (RuntimeError, AssertionError):  # a CUDA error is the trainer's to report, not the metrics'
        return {}


class MetricsWriter:
    """Appends one JSON line per optimizer step to the metrics file (rank 0 only; flushed per line).

    The callback calls :meth:`train_begin`, :meth:`step_end` and :meth:`log`; free of transformers so it
    can be tested on its own. :meth:`train_begin` creates the file, so a reader knows from the start that
    this run writes autotune's step records (and need not read the trainer's printed dicts).
    """

    def __init__(
        self,
        path: Path,
        samples_per_step: int | None,
        *,
        is_main: bool = True,
        memory: Callable[[], Mapping[str, float]] = torch_peak_memory_gib,
    ) -> None:
        self.path = Path(path)
        self.memory = memory
        self.samples_per_step = samples_per_step
        self.is_main = is_main
        self._fh: IO[str] | None = None
        self._last_end_mono_s: float | None = None
        self._step_end: tuple[int, float, float, float | None] | None = None
        self._written: set[int] = set()

    def _open(self) -> IO[str]:
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("a", encoding="utf-8")
        return self._fh

    def train_begin(self) -> None:
        self._last_end_mono_s = time.monotonic()
        if self.is_main:
            self._open()

    def step_end(self, step: int) -> None:
        now_mono, now_wall = time.monotonic(), time.time()
        duration = now_mono - self._last_end_mono_s if self._last_end_mono_s is not None else None
        self._last_end_mono_s = now_mono
        self._step_end = (step, now_mono, now_wall, duration)

    def log(self, step: int, logs: Mapping[str, object]) -> dict[str, Any] | None:
        """Write the record of ``step``; returns it (None when nothing was written)."""
        if not self.is_main or step in self._written or ("loss" not in logs and "reward" not in logs):
            return None  # the final train-summary log (train_runtime, ...) is not a step
        if self._step_end is not None and self._step_end[0] == step:
            _, t_mono_s, t_wall_s, duration_s = self._step_end
        else:
            t_mono_s, t_wall_s, duration_s = time.monotonic(), time.time(), None
        values = numeric_values(logs)
        for name, gib in self.memory().items():
            values.setdefault(name, gib)  # what the trainer logged itself wins
        mean_len = values.get("completions/mean_length")
        tokens = (
            mean_len * self.samples_per_step
            if mean_len is not None and math.isfinite(mean_len) and self.samples_per_step
            else None
        )
        record = {
            "step": step,
            "t_mono_s": t_mono_s,
            "t_wall_s": t_wall_s,
            "duration_s": duration_s,
            "samples": self.samples_per_step,
            "tokens": tokens,
            "values": values,
        }
        fh = self._open()
        fh.write(json.dumps(record, allow_nan=True) + "\n")
        fh.flush()
        self._written.add(step)
        return record

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


class PhaseTracker:
    """Turns trainer hooks into disjoint phase intervals: rollout, weight_sync, scoring, then train.

    ``train`` opens once a step's generation is done (or its inputs are ready) and closes when the
    optimizer step ends; a weight sync or a scoring inside another phase closes that phase around it and
    resumes it after, so intervals never overlap.

    Args:
        marker: what writes a marker (:mod:`autotune.probes.phases`, or a fake with the same ``mark``).
    """

    def __init__(self, marker: Any = _phases) -> None:
        self._marker = marker
        self._open: str | None = None

    def _begin(self, phase: str, step: int) -> None:
        if self._open == phase:
            return
        self._end(step)
        self._marker.mark(phase, "begin", step=step)
        self._open = phase

    def _end(self, step: int) -> None:
        if self._open is not None:
            self._marker.mark(self._open, "end", step=step)
            self._open = None

    @contextmanager
    def rollout(self, step: int) -> Iterator[None]:
        self._begin("rollout", step)
        try:
            yield
        finally:
            if self._open == "rollout":
                self._end(step)

    @contextmanager
    def _inside(self, phase: str, step: int) -> Iterator[None]:
        resume = self._open
        self._begin(phase, step)
        try:
            yield
        finally:
            self._end(step)
            if resume is not None and resume != phase:
                self._begin(resume, step)

    def weight_sync(self, step: int) -> Any:
        """A weight sync; the phase it interrupts resumes after it."""
        return self._inside("weight_sync", step)

    def scoring(self, step: int) -> Any:
        """Reward scoring (phase ``other``); the phase it interrupts resumes after it."""
        return self._inside("other", step)

    def train_ready(self, step: int) -> None:
        self._begin("train", step)

    def step_end(self, step: int) -> None:
        self._end(step)


def _wrap(obj: Any, name: str, around: Callable[[], Any], *, training_only: Any = None) -> bool:
    """Replace ``obj.name`` on the instance by a call inside the context ``around()``; False when absent."""
    original = getattr(obj, name, None)
    if original is None or getattr(original, "__autotune_wrapped__", False):
        return False

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if training_only is not None and not training_only():
            return original(*args, **kwargs)
        with around():
            return original(*args, **kwargs)

    wrapped.__autotune_wrapped__ = True  # type: ignore[attr-defined]
    setattr(obj, name, wrapped)
    return True


def watch_trainer(trainer: Any, tracker: PhaseTracker) -> list[str]:
    """Mark the phases of ``trainer``'s own methods (see the module docstring); returns what was wrapped.

    Wraps the instance's attributes, so the trainer's class and other instances are untouched; calling
    it twice wraps nothing more.
    """

    def step() -> int:
        return int(trainer.state.global_step) + 1

    def training() -> bool:
        model = getattr(trainer, "model", None)
        return bool(getattr(model, "training", True))

    @contextmanager
    def generation() -> Iterator[None]:
        with tracker.rollout(step()):
            yield
        tracker.train_ready(step())  # what follows generation in the step is the training work

    wrapped = []
    gen_name = "_generate" if hasattr(trainer, "_generate") else "_generate_and_score_completions"
    if _wrap(trainer, gen_name, generation, training_only=training):
        wrapped.append(gen_name)
    if _wrap(trainer, "_calculate_rewards", lambda: tracker.scoring(step()), training_only=training):
        wrapped.append("_calculate_rewards")
    if _wrap(trainer, "_move_model_to_vllm", lambda: tracker.weight_sync(step())):
        wrapped.append("_move_model_to_vllm")
    vllm = getattr(trainer, "vllm_generation", None)
    if vllm is not None and _wrap(vllm, "sync_weights", lambda: tracker.weight_sync(step())):
        wrapped.append("vllm_generation.sync_weights")

    original_prepare = getattr(trainer, "_prepare_inputs", None)
    if original_prepare is not None and not getattr(original_prepare, "__autotune_wrapped__", False):

        def prepare(*args: object, **kwargs: object) -> Any:
            out = original_prepare(*args, **kwargs)
            if training():
                tracker.train_ready(step())
            return out

        prepare.__autotune_wrapped__ = True  # type: ignore[attr-defined]
        trainer._prepare_inputs = prepare
        wrapped.append("_prepare_inputs")
    return wrapped


class _Hooks:
    """The callback's behaviour; :class:`AutotuneCallback` mixes it into ``transformers.TrainerCallback``.

    Args:
        trainer: the trainer, for exact generation/scoring/weight-sync boundaries (None: steps only).
        metrics_path: where step records go (default ``$AUTOTUNE_METRICS_FILE``; neither: none written).
        samples_per_step: completions (samples) per optimizer step; default from the training arguments,
            ``per_device_train_batch_size × gradient_accumulation_steps × world_size``.
        marker: what writes phase markers (default :mod:`autotune.probes.phases`).
    """

    def __init__(
        self,
        trainer: object = None,
        *,
        metrics_path: str | os.PathLike[str] | None = None,
        samples_per_step: int | None = None,
        marker: object = _phases,
    ) -> None:
        path = metrics_path if metrics_path is not None else os.environ.get(ENV_METRICS_FILE)
        self.metrics_path = Path(path) if path else None
        self.samples_per_step = samples_per_step
        self.tracker = PhaseTracker(marker)
        self.watched = watch_trainer(trainer, self.tracker) if trainer is not None else []
        self._writer: MetricsWriter | None = None

    def _samples(self, args: Any) -> int | None:
        if self.samples_per_step is not None:
            return self.samples_per_step
        try:
            return int(args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size)
        except (AttributeError, TypeError, ValueError):
            return None

    def on_train_begin(self, args: object, state: object, control: object, **kwargs: object) -> None:
        if self.metrics_path is not None and self._writer is None:
            self._writer = MetricsWriter(self.metrics_path, self._samples(args), is_main=_is_rank0())
        if self._writer is not None:
            self._writer.train_begin()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.tracker.step_end(int(state.global_step))
        if self._writer is not None:
            self._writer.step_end(int(state.global_step))

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
        if self._writer is not None and logs and getattr(state, "is_world_process_zero", True):
            self._writer.log(int(state.global_step), logs)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.tracker.step_end(int(state.global_step))
        self.close()

    def close(self) -> None:
        """Close the metrics file (also at the end of training; safe to call twice)."""
        if self._writer is not None:
            self._writer.close()


def _callback_class() -> type:
    from transformers import TrainerCallback

    return type(
        "AutotuneCallback",
        (_Hooks, TrainerCallback),
        {"__doc__": _Hooks.__doc__, "__module__": __name__, "__qualname__": "AutotuneCallback"},
    )


def __getattr__(name: str) -> Any:
    """``AutotuneCallback``, built on first use so that importing this module needs no transformers."""
    if name == "AutotuneCallback":
        cls = _callback_class()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
