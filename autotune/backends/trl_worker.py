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
Both the lines and the phase markers are written by :class:`autotune.probes.callback.AutotuneCallback`,
the callback users add to their own TRL scripts.

Its dotted name is public: trial commands run it with ``-m`` and exported TRL configs name its demo
reward (``autotune.backends.trl_worker.autotune_reward``), so it keeps this path while the rest of the
TRL backend lives in :mod:`autotune.backends.trl`.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["WorkerConfig", "autotune_reward", "given_option_names", "main", "run"]


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


def _completion_text(completion: object) -> str:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):  # conversational: [{"role": "assistant", "content": ...}]
        return "".join(str(m.get("content", "")) for m in completion if isinstance(m, Mapping))
    return str(completion)


def autotune_reward(
    completions: list[Any], solution: list[str | None] | None = None, **_: object
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


def _set_threads() -> None:
    """Pin this rank to its share of the trial's cores (CPU-only trials) and size torch's thread pool."""
    import torch

    from autotune.affinity import parse_cores, pin, rank_cores

    mine = rank_cores(
        parse_cores(os.environ),
        int(os.environ.get("LOCAL_RANK", "0") or 0),
        int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1),
    )
    note = pin(0, mine)
    if note:
        print(f"autotune trl_worker: {note}", file=sys.stderr)
    threads = os.environ.get("OMP_NUM_THREADS")
    n = (
        int(threads)
        if threads and threads.isdigit() and int(threads) > 0
        else max(1, len(mine) or os.cpu_count() or 1)
    )
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
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from autotune.backends.trl.aliases import current_names, deprecated_aliases
    from autotune.probes.callback import AutotuneCallback

    kwargs = {**config.grpo_config, **_extra_grpo_args(list(extra or []), GRPOConfig)}
    kwargs = current_names(kwargs, deprecated_aliases(GRPOConfig))  # no FutureWarning on every run
    kwargs, model_kwargs = _split_model_args(kwargs, GRPOConfig)
    args = GRPOConfig(**kwargs)  # TRL's ValueError on an invalid combination propagates
    if args.use_vllm and args.use_cpu:  # before GRPOTrainer builds the LLM: weights must reach it
        from autotune.backends import vllm_cpu_sync

        vllm_cpu_sync.apply()
    peft_config = _model_config(args, config.model, model_kwargs)
    if args.deepspeed:
        _attach_deepspeed_comm()
    dataset = _load_dataset(config.dataset)
    tokenizer = AutoTokenizer.from_pretrained(config.model)
    rewards: list[Any] = [_resolve_reward(r) for r in config.reward_funcs]  # functions or model ids
    trainer = GRPOTrainer(
        model=config.model,
        reward_funcs=rewards,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    # The callback users add to their own scripts: step records and the phases of the trainer's methods.
    callback = AutotuneCallback(
        trainer, metrics_path=config.metrics_path, samples_per_step=config.samples_per_step
    )
    trainer.add_callback(callback)
    try:
        trainer.train()
    finally:
        callback.close()
    _shutdown_distributed()


def _split_model_args(kwargs: dict[str, Any], config_cls: type) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``GRPOConfig`` arguments and, apart, the ``ModelConfig`` ones (``use_peft``, ``lora_r``,
    ``dtype``, ...): ``trl grpo`` reads one YAML into both, and so does a study's ``--fixed`` file."""
    import dataclasses

    from trl import ModelConfig

    own = {f.name for f in dataclasses.fields(config_cls)}
    model = {f.name for f in dataclasses.fields(ModelConfig)} - own
    return {k: v for k, v in kwargs.items() if k not in model}, {
        k: v for k, v in kwargs.items() if k in model
    }


def _model_config(args: Any, model: str, model_kwargs: dict[str, Any]) -> Any:
    """What ``trl grpo`` makes of the ``ModelConfig`` arguments: the LoRA adapter config (None without
    ``use_peft``) and the model's loading arguments (dtype, attention, revision) in ``model_init_kwargs``."""
    if not model_kwargs:
        return None
    from trl import ModelConfig, get_peft_config

    model_args = ModelConfig(model_name_or_path=model, **model_kwargs)
    loading = {"dtype": "dtype", "attn_implementation": "attn_implementation", "model_revision": "revision"}
    init = {to: model_kwargs[name] for name, to in loading.items() if name in model_kwargs}
    if init:
        args.model_init_kwargs = {**init, **(args.model_init_kwargs or {})}
    return get_peft_config(model_args)


def _shutdown_distributed() -> None:
    """End the process group cleanly: without it, gloo's threads abort the interpreter at exit on some
    ranks ("terminate called without an active exception", SIGABRT), which would turn a finished
    multi-process trial into a crash. Not enough on its own: see :func:`_exit_at_once`."""
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


def _exit_at_once(code: int) -> None:
    """End a rank of a multi-process run that finished without finalizing the interpreter.

    Once DDP has run over gloo (torch 2.13), ``destroy_process_group`` leaves gloo's threads
    (``pt_gloo_runloop``, ``gloo_tcp_loop``) running, even with the model released; they are then torn
    down with the interpreter, and a rank sometimes aborts there ("terminate called without an active
    exception", SIGABRT) after every step is done. Nothing is left to run at that point (the metrics
    file is closed, phase markers are written line by line), so the rank flushes its output and exits
    with ``code`` at once. A single process exits normally.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        sys.exit(code)
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _fail_at_once() -> None:
    """Print the exception the run raised as Python would (the traceback is the failure text the runner
    classifies: TRL's ValueError, a CUDA OOM) and exit 1 at once: tearing down an interpreter that has
    torch, transformers and the trackers TRL imports takes seconds, a failed trial's seconds for nothing,
    past the runner's grace after a fatal line on a loaded host."""
    import traceback

    traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


if __name__ == "__main__":
    try:
        code = main()
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException:  # noqa: BLE001 - printed as Python would, then the process ends at once
        _fail_at_once()
    _exit_at_once(code)
