"""One TRL GRPO trial, run inside its own process: ``python -m autotune.backends.trl_worker <config.json>``.

Also runs under torchrun (``python -m torch.distributed.run --nproc_per_node N -m
autotune.backends.trl_worker <config.json>``). :class:`~autotune.backends.trl.backend.TrlBackend` writes the
config; its keys (see :class:`WorkerConfig`):

``model``           local directory or hub id of the policy.
``dataset``         a ``.jsonl``/``.json`` file (rows with ``prompt`` or ``messages``) or a dataset name.
``reward_funcs``    list of ``"autotune"`` (the built-in reward), ``"module:function"`` or a reward model id.
``metrics_path``    where rank 0 appends one JSON line per optimizer step.
``samples_per_step`` completions per optimizer step (the global batch), written into each line.
``grpo_config``     keyword arguments of ``trl.GRPOConfig``, passed as they are.

GRPOConfig's own ``ValueError`` for an invalid combination is not caught: the process exits non-zero
with TRL's message, which the runner classifies as INVALID.

Each metrics line::

    {"step": 3, "t_mono_s": ..., "t_wall_s": ..., "duration_s": ..., "samples": 16, "tokens": 256.0,
     "values": {"loss": ..., "grad_norm": ..., "reward": ..., "reward_std": ..., "step_time": ..., ...}}

``t_mono_s`` is the moment the optimizer step ended; ``duration_s`` the time since the previous step ended
(the first step: since training began), so it covers generation, backward, optimizer and data loading.

Its dotted name is public: trial commands run it with ``-m`` and exported TRL configs name its demo
reward (``autotune.backends.trl_worker.autotune_reward``), so it keeps this path while the rest of the
TRL backend lives in :mod:`autotune.backends.trl`.
"""

from __future__ import annotations

import importlib
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

__all__ = [
    "MetricsWriter",
    "PhaseTracker",
    "WorkerConfig",
    "autotune_reward",
    "given_option_names",
    "main",
    "numeric_values",
    "run",
]


@dataclass(frozen=True)
class WorkerConfig:
    """The trial config the backend writes (``trial_config.json``)."""

    model: str
    dataset: str
    metrics_path: str
    samples_per_step: int
    grpo_config: dict[str, Any] = field(default_factory=dict)
    reward_funcs: tuple[str, ...] = ("autotune",)

    @classmethod
    def load(cls, path: Path) -> WorkerConfig:
        """Read and check the config file; a broken file exits with a one-line message."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise SystemExit(f"autotune trl_worker: cannot read trial config {path}: {exc}") from None
        missing = [k for k in ("model", "dataset", "metrics_path", "samples_per_step") if k not in data]
        if missing:
            raise SystemExit(f"autotune trl_worker: trial config {path} lacks {', '.join(missing)}")
        return cls(
            model=str(data["model"]),
            dataset=str(data["dataset"]),
            metrics_path=str(data["metrics_path"]),
            samples_per_step=int(data["samples_per_step"]),
            grpo_config={**dict(data.get("grpo_config") or {}), **_secrets(data.get("secret_env") or {})},
            reward_funcs=tuple(data.get("reward_funcs") or ("autotune",)),
        )


def _secrets(names: Mapping[str, str]) -> dict[str, str]:
    """The secret arguments of the trial (a hub token), from the environment variables its config names:
    the config file itself never holds a secret."""
    return {str(name): os.environ[var] for name, var in names.items() if var in os.environ}


# ---------------------------------------------------------------------------------------------- reward


def _completion_text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):  # conversational: [{"role": "assistant", "content": ...}]
        return "".join(str(m.get("content", "")) for m in completion if isinstance(m, Mapping))
    return str(completion)


def autotune_reward(
    completions: list[Any], solution: list[str | None] | None = None, **_: Any
) -> list[float]:
    """The built-in reward (TRL reward-function signature): the answer, plus the share of digits.

    See :func:`autotune.workload.datasets.score_completion`. Rows without a ``solution`` column score digits only.
    """
    from autotune.workload.datasets import score_completion

    solutions = solution if solution is not None else [None] * len(completions)
    return [score_completion(_completion_text(c), s) for c, s in zip(completions, solutions, strict=True)]


def _resolve_reward(spec: str) -> Callable[..., list[float]] | str:
    if spec == "autotune":
        return autotune_reward
    module_name, sep, attr = spec.partition(":")
    if sep and module_name and attr:
        try:
            return getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise SystemExit(f"autotune trl_worker: cannot import reward {spec!r}: {exc}") from None
    return spec  # a reward model id or path: TRL loads it


# --------------------------------------------------------------------------------------------- metrics


def numeric_values(logs: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a log record as floats (bools and text dropped; NaN and inf kept for the health gate)."""
    out: dict[str, float] = {}
    for key, value in logs.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        out[key] = float(value)
    return out


class MetricsWriter:
    """Appends one JSON line per optimizer step to the metrics file (rank 0 only; flushed per line).

    The TRL callback calls :meth:`train_begin`, :meth:`step_end` and :meth:`log`; kept free of
    transformers so it can be tested on its own.
    """

    def __init__(self, path: Path, samples_per_step: int, *, is_main: bool = True) -> None:
        self.path = Path(path)
        self.samples_per_step = samples_per_step
        self.is_main = is_main
        self._fh: IO[str] | None = None
        self._last_end_mono_s: float | None = None
        self._step_end: tuple[int, float, float, float | None] | None = None
        self._written: set[int] = set()

    def train_begin(self) -> None:
        self._last_end_mono_s = time.monotonic()

    def step_end(self, step: int) -> None:
        now_mono, now_wall = time.monotonic(), time.time()
        duration = now_mono - self._last_end_mono_s if self._last_end_mono_s is not None else None
        self._last_end_mono_s = now_mono
        self._step_end = (step, now_mono, now_wall, duration)

    def log(self, step: int, logs: Mapping[str, Any]) -> dict[str, Any] | None:
        """Write the record of ``step``; returns it (None when nothing was written)."""
        if not self.is_main or step in self._written or ("loss" not in logs and "reward" not in logs):
            return None  # the final train-summary log (train_runtime, ...) is not a step
        if self._step_end is not None and self._step_end[0] == step:
            _, t_mono_s, t_wall_s, duration_s = self._step_end
        else:
            t_mono_s, t_wall_s, duration_s = time.monotonic(), time.time(), None
        values = numeric_values(logs)
        mean_len = values.get("completions/mean_length")
        tokens = (
            mean_len * self.samples_per_step if mean_len is not None and math.isfinite(mean_len) else None
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
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("a", encoding="utf-8")
        self._fh.write(json.dumps(record, allow_nan=True) + "\n")
        self._fh.flush()
        self._written.add(step)
        return record

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


# ---------------------------------------------------------------------------------------------- phases


class _NoPhases:
    """Stand-in when ``probes.phases`` is not importable: markers are dropped."""

    @staticmethod
    def mark(phase: str, event: str, step: int | None = None) -> None:
        return None

    @staticmethod
    @contextmanager
    def phase(name: str, step: int | None = None) -> Iterator[None]:
        yield


def _phases_module() -> Any:
    try:
        from autotune.probes import phases
    except ImportError:
        return _NoPhases()
    return phases


class PhaseTracker:
    """Turns trainer hooks into disjoint phase intervals: rollout, weight_sync, then train.

    ``train`` opens once a step's inputs are ready (after any rollout) and closes when the optimizer step
    ends; a weight sync inside a rollout closes the rollout around it so intervals never overlap.
    """

    def __init__(self, marker: Any) -> None:
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
    def weight_sync(self, step: int) -> Iterator[None]:
        resume = self._open
        self._begin("weight_sync", step)
        try:
            yield
        finally:
            self._end(step)
            if resume is not None and resume != "weight_sync":
                self._begin(resume, step)

    def train_ready(self, step: int) -> None:
        self._begin("train", step)

    def step_end(self, step: int) -> None:
        self._end(step)


# ---------------------------------------------------------------------------------------------- trainer


def _load_dataset(spec: str) -> Any:
    import datasets

    from autotune.workload.datasets import read_rows

    path = Path(spec)
    if path.suffix in (".jsonl", ".json") and path.is_file():
        rows = read_rows(path)
        for row in rows:
            if "prompt" not in row and isinstance(row.get("messages"), list):
                messages = row.pop("messages")
                if messages and messages[-1].get("role") == "assistant":
                    messages = messages[:-1]
                row["prompt"] = messages
        return datasets.Dataset.from_list(rows)
    return datasets.load_dataset(spec, split="train")


def _trainer_class(base: type) -> type:
    """A subclass of ``GRPOTrainer`` that marks phases around the methods the installed TRL has."""

    class PhasedGRPOTrainer(base):  # type: ignore[misc, valid-type]
        autotune_phases: PhaseTracker

        def _autotune_step(self) -> int:
            return int(self.state.global_step) + 1

        if hasattr(base, "_generate_and_score_completions"):

            def _generate_and_score_completions(self, *args: Any, **kwargs: Any) -> Any:
                if not self.model.training:
                    return super()._generate_and_score_completions(*args, **kwargs)
                with self.autotune_phases.rollout(self._autotune_step()):
                    return super()._generate_and_score_completions(*args, **kwargs)

        def _prepare_inputs(self, *args: Any, **kwargs: Any) -> Any:
            out = super()._prepare_inputs(*args, **kwargs)
            if self.model.training:
                self.autotune_phases.train_ready(self._autotune_step())
            return out

        if hasattr(base, "_move_model_to_vllm"):  # older TRL

            def _move_model_to_vllm(self, *args: Any, **kwargs: Any) -> Any:
                with self.autotune_phases.weight_sync(self._autotune_step()):
                    return super()._move_model_to_vllm(*args, **kwargs)

        def autotune_wrap_vllm_sync(self) -> None:
            """TRL ≥ 1.x syncs weights through ``self.vllm_generation.sync_weights()``: wrap that instance."""
            gen = getattr(self, "vllm_generation", None)
            sync = getattr(gen, "sync_weights", None)
            if gen is None or sync is None:
                return

            def sync_weights(*args: Any, **kwargs: Any) -> Any:
                with self.autotune_phases.weight_sync(self._autotune_step()):
                    return sync(*args, **kwargs)

            gen.sync_weights = sync_weights

    return PhasedGRPOTrainer


def _callback(base: type, writer: MetricsWriter, tracker: PhaseTracker) -> Any:
    class MetricsCallback(base):  # type: ignore[misc, valid-type]
        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            writer.train_begin()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            tracker.step_end(int(state.global_step))
            writer.step_end(int(state.global_step))

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if state.is_world_process_zero and logs:
                writer.log(int(state.global_step), logs)

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            writer.close()

    return MetricsCallback()


def _set_threads() -> None:
    import torch

    threads = os.environ.get("OMP_NUM_THREADS")
    n = int(threads) if threads and threads.isdigit() and int(threads) > 0 else max(1, os.cpu_count() or 1)
    torch.set_num_threads(n)


def given_option_names(extra: list[str]) -> list[str]:
    """Field names of the ``--name value`` / ``--name=value`` / ``--no_name`` options in ``extra``."""
    names = []
    for token in extra:
        if token.startswith("--") and len(token) > 2:
            names.append(token[2:].split("=", 1)[0].replace("-", "_"))
    return names


def _extra_grpo_args(extra: list[str], config_cls: type) -> dict[str, Any]:
    """GRPOConfig arguments given on the command line after the config path, typed by TRL's own parser.

    An unknown option exits the way TRL's CLI does (argparse: ``error: unrecognized arguments``).
    """
    if not extra:
        return {}
    from transformers import HfArgumentParser

    namespace = vars(HfArgumentParser(config_cls).parse_args(extra))  # type: ignore[arg-type]  # a dataclass
    out: dict[str, Any] = {}
    for name in given_option_names(extra):
        key = name if name in namespace else name.removeprefix("no_")
        if key in namespace:
            out[key] = namespace[key]
    return out


def _attach_deepspeed_comm() -> None:
    """Let DeepSpeed see the process group accelerate already opened.

    ZeRO-3 partitions weights while ``from_pretrained`` runs (``deepspeed.zero.Init``), before the trainer
    initialises DeepSpeed's communication; DeepSpeed then assumes a world size of 1 and fails its batch
    check when there are more processes. Found on CPU with gloo under torchrun.
    """
    import torch.distributed as torch_dist

    if not torch_dist.is_available() or not torch_dist.is_initialized():
        return
    import deepspeed

    deepspeed.init_distributed(dist_backend=torch_dist.get_backend())


def run(config: WorkerConfig, extra: list[str] | None = None) -> None:
    """Build the GRPOTrainer of ``config`` and train; metrics and phase markers are written as it runs.

    Args:
        config: the trial config.
        extra: GRPOConfig options given after the config path (``--beta 0.04``); they win over the file.
    """
    _set_threads()
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    kwargs = {**config.grpo_config, **_extra_grpo_args(list(extra or []), GRPOConfig)}
    args = GRPOConfig(**kwargs)  # TRL's ValueError on an invalid combination propagates
    if args.deepspeed:
        _attach_deepspeed_comm()
    dataset = _load_dataset(config.dataset)
    tokenizer = AutoTokenizer.from_pretrained(config.model)
    tracker = PhaseTracker(_phases_module())
    writer = MetricsWriter(
        Path(config.metrics_path), config.samples_per_step, is_main=os.environ.get("RANK", "0") == "0"
    )
    trainer = _trainer_class(GRPOTrainer)(
        model=config.model,
        reward_funcs=[_resolve_reward(r) for r in config.reward_funcs],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[_callback(TrainerCallback, writer, tracker)],
    )
    trainer.autotune_phases = tracker
    trainer.autotune_wrap_vllm_sync()
    try:
        trainer.train()
    finally:
        writer.close()
    _shutdown_distributed()


def _shutdown_distributed() -> None:
    """End the process group cleanly: without it, gloo's threads abort the interpreter at exit on some
    ranks ("terminate called without an active exception", SIGABRT), which would turn a finished
    multi-process trial into a crash."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Entry point: ``python -m autotune.backends.trl_worker <trial_config.json> [--grpo_option value ...]``."""
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        print(
            "usage: python -m autotune.backends.trl_worker <trial_config.json> [--option value ...]",
            file=sys.stderr,
        )
        return 2
    run(WorkerConfig.load(Path(argv[0])), argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
