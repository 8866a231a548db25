"""``--format verl``: the winner as ``python3 -m verl.trainer.main_ppo`` with hydra overrides, in a script.

Checked against verl 0.9.1's ``trainer/config/ppo_trainer.yaml`` (hydra ``compose`` in the tests). verl
trains with FSDP and generates with a vLLM server, so each knob maps to the verl setting with the same
meaning, or is refused (``AR`` = ``actor_rollout_ref``):

- global batch B, num_generations G → ``data.train_batch_size`` = B / G prompts and
  ``AR.actor.ppo_mini_batch_size`` = B / G (one optimizer step per batch, as the trials ran);
  ``AR.rollout.n`` = G.
- ``per_device_train_batch_size`` → ``AR.actor.ppo_micro_batch_size_per_gpu`` and the ``rollout`` / ``ref``
  ``log_prob_micro_batch_size_per_gpu`` (gradient accumulation follows: B / (micro × GPUs)).
- world size → ``trainer.n_gpus_per_node`` (one node).
- ``gradient_checkpointing`` → ``AR.model.enable_gradient_checkpointing``;
  ``dataloader_num_workers`` → ``data.dataloader_num_workers``.
- ZeRO-3 (``zero3``, ``zero_stage: 3``) → FSDP full sharding (``fsdp_config.reshard_after_forward: true``).
- ZeRO-2 (``zero2``, ``zero_stage: 2``) → ``fsdp_config.reshard_after_forward: false``: verl 0.9.1 then
  shards with FSDP's ``SHARD_GRAD_OP``, ZeRO-2's sharding.
- no DeepSpeed (or ``zero0``) → ``fsdp_config.fsdp_size: 1``: shard groups of one GPU, every GPU keeps
  everything, as DDP does. ZeRO-1 is refused (FSDP has no optimizer-only sharding).
- DeepSpeed optimizer / parameter offload, and ms-swift's vLLM-phase ``offload_optimizer`` /
  ``offload_model`` → ``AR.actor.fsdp_config.optimizer_offload`` / ``param_offload`` (verl moves them to
  the CPU whenever the actor is idle, which covers both meanings); ``AR.ref.fsdp_config.param_offload``
  follows parameter offload.
- ``use_vllm`` → ``AR.rollout.name: vllm``; without vLLM: refused (verl generates with vLLM, SGLang or
  TensorRT-LLM servers only). ``vllm_mode server`` is refused (verl runs its own rollout servers).
- ``vllm_gpu_memory_utilization`` → ``AR.rollout.gpu_memory_utilization``;
  ``vllm_tensor_parallel_size`` → ``AR.rollout.tensor_model_parallel_size``.
- ``sleep_level`` 0 / 1 (TRL: sleep mode off) → ``AR.rollout.free_cache_engine`` false / true; level 2
  (TRL's sleep mode) is refused: verl frees the KV cache only.
- ``move_model_batches`` is refused.

Fixed arguments with a verl equivalent are mapped (:data:`FIXED_TO_VERL`: learning rate, epochs, steps,
clipping, sampling, LoRA rank/alpha, prompt length, ``report_to`` → ``trainer.logger``); ``beta`` > 0 →
``actor.use_kl_loss: true`` with ``kl_loss_coef`` = beta and the k3 estimator (``low_var_kl``), as GRPO in
ms-swift and TRL; the source framework's default beta applies when it was not fixed (ms-swift 0.04, TRL
0). Anything else is refused, named. verl reads ``.parquet``, ``.json`` and ``.jsonl`` files with its own
columns (``prompt`` chat list, ``data_source``, ``reward_model.ground_truth``); autotune's generated
prompts do not have them and are refused. autotune's demo reward ships as ``autotune_verl_reward.py``
(verl's ``compute_score`` signature), loaded through ``reward.custom_reward_function``; other rewards are
refused. ``trainer.logger`` is ``[console]`` unless ``report_to`` names more (verl's default asks for wandb).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from autotune.backends._vocab import TRL_NAMES
from autotune.errors import UsageError
from autotune.export._common import MARKER, Export, ShellWord, mask_secrets, refuse, shell_script
from autotune.export._job import header, trial_environment, user_dataset, uses_demo_reward
from autotune.export._winner import Winner
from autotune.jobconfig import JobConfig
from autotune.secrets import MASK
from autotune.values import as_float, typed

__all__ = ["FIXED_TO_VERL", "REWARD_FILE", "SCRIPT", "export_verl", "overrides_of", "reward_source"]

SCRIPT = "command.sh"
REWARD_FILE = "autotune_verl_reward.py"
_AR = "actor_rollout_ref"

#: fixed argument (ms-swift / TRL name) → verl override key.
FIXED_TO_VERL: dict[str, str] = {
    "learning_rate": f"{_AR}.actor.optim.lr",
    "weight_decay": f"{_AR}.actor.optim.weight_decay",
    "warmup_ratio": f"{_AR}.actor.optim.lr_warmup_steps_ratio",
    "max_grad_norm": f"{_AR}.actor.grad_clip",
    "num_train_epochs": "trainer.total_epochs",
    "max_steps": "trainer.total_training_steps",
    "temperature": f"{_AR}.rollout.temperature",
    "top_p": f"{_AR}.rollout.top_p",
    "top_k": f"{_AR}.rollout.top_k",
    "epsilon": f"{_AR}.actor.clip_ratio_low",
    "epsilon_high": f"{_AR}.actor.clip_ratio_high",
    "max_prompt_length": "data.max_prompt_length",
    "vllm_max_model_len": f"{_AR}.rollout.max_model_len",
    "vllm_max_model_length": f"{_AR}.rollout.max_model_len",
    "lora_rank": f"{_AR}.model.lora_rank",
    "lora_r": f"{_AR}.model.lora_rank",
    "lora_alpha": f"{_AR}.model.lora_alpha",
    "output_dir": "trainer.default_local_dir",
}
#: arguments carried by the knob mapping or handled on their own (either framework's names).
_HANDLED = frozenset(
    {
        "per_device_train_batch_size",
        "gradient_checkpointing",
        "dataloader_num_workers",
        "num_processes",
        "deepspeed",
        "zero_stage",
        "offload_param",
        "use_vllm",
        "vllm_mode",
        "vllm_gpu_memory_utilization",
        "vllm_tensor_parallel_size",
        "vllm_enable_sleep_mode",
        "sleep_level",
        "offload_optimizer",
        "offload_model",
        "move_model_batches",
        "rlhf_type",
        "beta",
        "report_to",
        "tuner_type",
        "dataset",
        "reward_funcs",
        "external_plugins",
        "num_generations",  # the study's own values hold (the backends refuse a different fixed one)
        "max_completion_length",
    }
)
_LOGGERS = {
    "none": [],
    "wandb": ["wandb"],
    "tensorboard": ["tensorboard"],
    "swanlab": ["swanlab"],
    "mlflow": ["mlflow"],
}
_PLAIN = re.compile(r"^[A-Za-z0-9_./~+-]+$")

_REWARD_SOURCE = '''"""autotune's demo reward for verl (``reward.custom_reward_function``). {marker}.

1.0 when the completion contains the row's ground truth, plus the share of digit characters in it — the
score autotune's CPU demo trials used. Replace it with your own reward.
"""

from __future__ import annotations

from typing import Any


def compute_score(
    data_source: Any, solution_str: str, ground_truth: Any, extra_info: Any = None, **kwargs: Any
) -> float:
    """verl's custom reward signature: one completion, one score."""
    text = str(solution_str).strip()
    digits = sum(ch.isdigit() for ch in text)
    share = digits / len(text) if text else 0.0
    hit = 1.0 if ground_truth is not None and str(ground_truth) and str(ground_truth) in text else 0.0
    return hit + share
'''


def reward_source() -> str:
    """The demo reward's module text (verl's ``compute_score`` signature), as trials and exports ship it."""
    return _REWARD_SOURCE.format(marker=MARKER)


def _value(value: object) -> str:
    """A hydra override value: numbers and booleans as hydra reads them, other text quoted when needed."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return format(value, ".10g")
    if isinstance(value, list | tuple):
        return "[" + ",".join(_value(v) for v in value) + "]"
    text = str(value)
    if _PLAIN.match(text) and text.lower() not in ("true", "false", "null", "none"):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _check(k: JobConfig, instead: str) -> None:
    """Refuse the knobs verl has no setting for."""
    if k.ds_config_path is not None:
        raise refuse(k.named("ds_config_path"), "verl", instead)
    if not k.use_vllm:
        what = k.setting("use_vllm") or "use_vllm=false"
        raise refuse(
            f"knob {what} (verl generates with vLLM, SGLang or TensorRT-LLM servers only)", "verl", instead
        )
    if k.vllm_mode == "server":
        raise refuse(f"{k.named('vllm_mode')} (verl runs its own rollout servers)", "verl", instead)
    if k.sharding_stage == 1:
        raise refuse(f"{k.named('zero_stage')} (FSDP has no optimizer-only sharding)", "verl", instead)
    if k.sleep_level == 2:
        raise refuse(f"{k.named('sleep_level')} (verl frees vLLM's KV cache only)", "verl", instead)
    if k.move_model_batches is not None:
        raise refuse(k.named("move_model_batches"), "verl", instead)


def overrides_of(w: Winner) -> tuple[list[tuple[str, Any]], list[str], bool]:
    """The verl overrides of the winner, the comments they need, and whether the demo reward file ships.

    Raises:
        UsageError: a knob, fixed argument, dataset or reward verl cannot express.
    """
    if w.backend not in ("swift", "trl"):
        raise refuse(f"a study of the {w.backend or 'unknown'} backend", "verl", "command")
    instead = w.backend
    k = w.config
    _check(k, instead)
    fixed, _ = mask_secrets(w.fixed, w.secrets)
    # verl has no setting for a secret of the trainer's (a hub token): left out, the notes say so
    secret = [k for k, v in fixed.items() if MASK in str(v)]
    notes = [f"--{k} left out: a secret verl has no setting for" for k in secret]
    fixed = {k: v for k, v in fixed.items() if k not in secret}
    gb = w.settings.global_batch or 16
    g = w.settings.num_generations or 4
    prompts_per_step = gb // g
    out: list[tuple[str, Any]] = [
        ("algorithm.adv_estimator", "grpo"),
        (f"{_AR}.model.path", w.settings.model.loaded),
    ]
    comments: list[str] = []
    dataset = user_dataset(w, fixed)
    if dataset is None:
        raise UsageError(
            "the study trained on autotune's generated prompts, which lack verl's columns (prompt, data_source, "
            "reward_model.ground_truth)",
            hint=f"Run the study with --dataset, or use --format {instead}",
        )
    if isinstance(dataset, list | tuple):
        if len(dataset) != 1:
            raise refuse(
                f"fixed argument dataset={' '.join(map(str, dataset))} (several datasets)", "verl", instead
            )
        dataset = dataset[0]
    path = Path(str(dataset)).expanduser()
    if path.suffix.lower() not in (".parquet", ".json", ".jsonl"):
        raise refuse(
            f"dataset {dataset} (verl 0.9.1 reads .parquet, .json and .jsonl files)", "verl", instead
        )
    data = str(path.resolve()) if path.exists() else str(dataset)
    out += [("data.train_files", data), ("data.val_files", data)]
    comments.append(
        "verl reads rows with a 'prompt' chat list, 'data_source' and 'reward_model.ground_truth' "
        "(see verl's examples/data_preprocess); data.val_files repeats the training file: set your own."
    )
    out += [
        ("data.train_batch_size", prompts_per_step),
        ("data.max_response_length", w.settings.max_completion_length or 16),
        ("data.dataloader_num_workers", k.dataloader_num_workers),
        (f"{_AR}.rollout.name", "vllm"),
        (f"{_AR}.rollout.n", g),
        (f"{_AR}.rollout.gpu_memory_utilization", k.vllm_util),
        (f"{_AR}.rollout.tensor_model_parallel_size", k.vllm_tp or 1),
        (f"{_AR}.rollout.free_cache_engine", k.sleep_level >= 1),
        (f"{_AR}.rollout.log_prob_micro_batch_size_per_gpu", k.per_device_batch),
        (f"{_AR}.ref.log_prob_micro_batch_size_per_gpu", k.per_device_batch),
        (f"{_AR}.actor.ppo_mini_batch_size", prompts_per_step),
        (f"{_AR}.actor.ppo_micro_batch_size_per_gpu", k.per_device_batch),
        (f"{_AR}.model.enable_gradient_checkpointing", k.gradient_checkpointing),
    ]
    fsdp = f"{_AR}.actor.fsdp_config"
    if k.sharding_stage is None:
        out.append((f"{fsdp}.fsdp_size", 1))
    else:
        out.append((f"{fsdp}.reshard_after_forward", k.sharding_stage == 3))
    param_off = k.ds_offload_param or k.rollout_offload_model
    out += [
        (f"{fsdp}.param_offload", param_off),
        (f"{fsdp}.optimizer_offload", k.ds_offload_optimizer or k.rollout_offload_optimizer),
        (f"{_AR}.ref.fsdp_config.param_offload", param_off),
    ]
    default_beta = 0.04 if w.backend == "swift" else 0.0
    beta = as_float(fixed.get("beta"))
    beta = default_beta if beta is None else beta
    if beta > 0:
        out += [
            (f"{_AR}.actor.use_kl_loss", True),
            (f"{_AR}.actor.kl_loss_coef", beta),
            (f"{_AR}.actor.kl_loss_type", "low_var_kl"),
        ]
    else:
        out.append((f"{_AR}.actor.use_kl_loss", False))
    out.append(("algorithm.use_kl_in_reward", False))
    tuner = str(fixed.get("tuner_type") or ("lora" if fixed.get("use_peft") else "full")).lower()
    if tuner not in ("lora", "full"):
        raise refuse(f"fixed argument tuner_type={tuner}", "verl", instead)
    rank_names = ("lora_rank", "lora_r")
    if tuner == "lora" and not any(n in fixed for n in rank_names):
        out.append((f"{_AR}.model.lora_rank", 8))  # ms-swift's default rank
        comments.append("LoRA rank 8 is ms-swift's default, which the study used.")
    for name, value in fixed.items():
        if name in _HANDLED or name == "use_peft":
            continue
        key = FIXED_TO_VERL.get(name) or FIXED_TO_VERL.get(TRL_NAMES.get(name, ""))
        if key is None:
            raise refuse(f"fixed argument {name}={_text(value)}", "verl", instead)
        if key.endswith("lora_rank") and tuner != "lora":
            continue  # a rank without LoRA training does nothing
        out.append((key, typed(value)))
    reports = fixed.get("report_to") or []
    reports = reports.split() if isinstance(reports, str) else [str(r) for r in reports]
    loggers = ["console"]
    for r in reports:
        if r not in _LOGGERS:
            raise refuse(f"fixed argument report_to={r}", "verl", instead)
        loggers += [x for x in _LOGGERS[r] if x not in loggers]
    out += [
        ("trainer.logger", loggers),
        ("trainer.nnodes", 1),
        ("trainer.n_gpus_per_node", k.world_size),
    ]
    ships_reward = False
    if uses_demo_reward(w, fixed):
        if w.backend == "trl":
            rewards = fixed.get("reward_funcs") or ["autotune"]
            rewards = [rewards] if isinstance(rewards, str) else list(rewards)
            if rewards != ["autotune"]:
                raise refuse(f"fixed argument reward_funcs={_text(rewards)}", "verl", instead)
        ships_reward = True
        comments.append(
            f"{REWARD_FILE} is autotune's demo reward (the study used it): replace it with your own."
        )
    else:
        what = fixed.get("reward_funcs", fixed.get("reward_model"))
        raise refuse(f"fixed argument reward_funcs={_text(what)}", "verl", instead)
    return out, comments + notes, ships_reward


def _text(value: object) -> str:
    return " ".join(map(str, value)) if isinstance(value, list | tuple) else str(value)


#: trial-only overrides left out of the job a verl study exports (unless the user fixed them).
_TRIAL_ONLY = (
    "trainer.total_training_steps",
    "trainer.save_freq",
    "trainer.test_freq",
    "trainer.val_before_train",
    "trainer.default_local_dir",
    "actor_rollout_ref.rollout.ignore_eos",
    "+ray_kwargs.ray_init.include_dashboard",
    "ray_kwargs.ray_init.num_cpus",
)


def _from_verl_study(w: Winner) -> Export:
    """A verl study's trial as the user's job: the overrides it ran with, without what only made it a
    short trial (its step limit, no checkpoint, no validation, its checkpoint folder) — the user's own
    values for those come back. Data and reward files autotune wrote stay in the trial directory."""
    if w.launch is None or len(w.launch.argv) < 4:
        raise UsageError(
            f"trial {w.number} of the verl study was never launched (no launch.json)",
            hint="Pick a trial that ran with --trial N",
        )
    # launch.json holds secrets masked; the script reads them from variables (shell_script)
    fixed, notes = mask_secrets(w.fixed, w.secrets)
    items = [a.partition("=") for a in w.launch.argv[3:]]
    command: list[list[str | ShellWord]] = [["python3", "-m", "verl.trainer.main_ppo"]]
    for key, _, value in items:
        if key in _TRIAL_ONLY and key not in fixed:
            continue
        text = _value(typed(fixed[key])) if key in _TRIAL_ONLY else value
        command.append([f"{key}={text}"])
    comments = header(w, "verl")
    comments.append(
        "The overrides the trial ran with, without its step limit, no-checkpoint and no-validation ones."
    )
    if any(k == "data.train_files" and str(w.trial_dir) in v for k, _, v in items):
        comments.append(
            "data.train_files is the prompts autotune generated for the study: replace it with yours."
        )
    comments += notes
    env = {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in w.gpu_indices)} if not w.cpu_only else {}
    env.update(trial_environment(w))  # the devices and thread counts the trial ran with
    return Export(
        format="verl",
        files={SCRIPT: shell_script(comments, command, env=env, secrets=w.secrets)},
        main=SCRIPT,
        trial=w.number,
        executable=frozenset({SCRIPT}),
        notes=tuple(notes),
    )


def export_verl(w: Winner) -> Export:
    """``command.sh`` running ``python3 -m verl.trainer.main_ppo`` with the winner's overrides (and
    ``autotune_verl_reward.py`` when the study used autotune's demo reward).

    Raises:
        UsageError: a knob, fixed argument, dataset or reward verl cannot express.
    """
    if w.backend == "verl":
        return _from_verl_study(w)
    overrides, notes, ships_reward = overrides_of(w)
    command: list[list[str | ShellWord]] = [["python3", "-m", "verl.trainer.main_ppo"]]
    command += [[f"{key}={_value(value)}"] for key, value in overrides]
    setup: list[str] = []
    if ships_reward:
        setup.append('HERE="$(cd "$(dirname "$0")" && pwd)"')
        command.append([ShellWord(f'reward.custom_reward_function.path="$HERE/{REWARD_FILE}"')])
        command.append(["reward.custom_reward_function.name=compute_score"])
    comments = header(w, "verl")
    comments.append(
        "Translated to verl 0.9.1's hydra overrides; settings not written here take verl's defaults. "
        "Arguments given to this script are passed on as more overrides."
    )
    comments += notes
    env = {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in w.gpu_indices)} if not w.cpu_only else {}
    files = {SCRIPT: shell_script(comments, command, env=env, setup=setup, secrets=w.secrets)}
    if ships_reward:
        files[REWARD_FILE] = reward_source()
    return Export(
        format="verl",
        files=files,
        main=SCRIPT,
        trial=w.number,
        executable=frozenset({SCRIPT}),
        notes=tuple(notes),
    )
