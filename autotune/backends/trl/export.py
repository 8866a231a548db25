"""``--format trl``: the winner as a ``trl grpo --config grpo.yaml`` run.

Files:

- ``grpo.yaml`` (main): the fields of TRL's ``trl grpo`` parsers — ``GRPOConfig``, ``ModelConfig``
  (``model_name_or_path``, LoRA), the script's ``reward_funcs`` and ``datasets`` — plus
  ``accelerate_config: accelerate.yaml``, which ``trl grpo`` hands to ``accelerate launch``.
- ``accelerate.yaml``: processes and distribution: ``NO`` (one process), ``MULTI_GPU``, or ``DEEPSPEED``
  with ``deepspeed_config_file: ds_config.json``.
- ``ds_config.json``: when the winner uses ZeRO (see :mod:`autotune.export.deepspeed`; concrete values
  that match ``grpo.yaml``'s batch, clipping and precision, as transformers checks).
- ``command.sh``: ``cd`` to the files, the environment (``CUDA_VISIBLE_DEVICES``; on a CPU-only study
  ``OMP_NUM_THREADS=1``), ``trl grpo --config grpo.yaml "$@"``. Relative names in the YAML resolve from
  that directory.

From a TRL study the user's fixed arguments (``GRPOConfig`` fields) carry over as they are; what only a
trial needs does not: ``max_steps``, ``logging_steps: 1``, ``report_to: none``, ``save_strategy: no``,
the trial's ``output_dir``, ``disable_tqdm`` and the ``min_new_tokens`` autotune adds so that trials
generate comparable lengths (the user's own values for those are kept). autotune's generated prompts,
when the study trained on them, are kept (they are the user's data then; a comment says so); the demo
reward becomes its import path ``autotune.backends.trl_worker.autotune_reward``; ``module:function``
rewards become ``module.function`` (the form ``trl grpo`` imports); a reward model id becomes
``reward_model_name_or_path``.

From an ms-swift study the knobs are translated (:mod:`autotune.export._translate`): the ``deepspeed``
preset → ZeRO stage and offload in ``ds_config.json``; ``sleep_level 2`` → ``vllm_enable_sleep_mode``;
``sleep_level 1``, ``offload_optimizer`` / ``offload_model`` (vLLM-phase offload) and
``move_model_batches`` have no TRL equivalent and are refused, named. ``--tuner_type lora`` →
``use_peft: true`` with ``lora_rank`` → ``lora_r``; ms-swift's ``beta`` default (0.04) is written out,
since TRL's is 0.0. Fixed arguments outside the shared vocabulary are refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from autotune.backends._vocab import SHARED_ARGS, SWIFT_KNOBS, TRL_NAMES, list_value
from autotune.backends.trl.aliases import current_names, installed_aliases
from autotune.errors import UsageError
from autotune.export._common import MARKER, Export, json_text, mask_secrets, refuse, shell_script
from autotune.export._job import (
    demo_prompts,
    header,
    precision,
    trial_environment,
    user_dataset,
    uses_demo_reward,
)
from autotune.export._winner import Winner
from autotune.export.deepspeed import DS_CONFIG, config_for
from autotune.jobconfig import JobConfig
from autotune.plaintext import comment_line
from autotune.values import typed

__all__ = ["ACCELERATE", "CONFIG", "DEMO_REWARD_PATH", "SCRIPT", "export_trl"]

CONFIG = "grpo.yaml"
ACCELERATE = "accelerate.yaml"
SCRIPT = "command.sh"
DEMO_REWARD_PATH = "autotune.backends.trl_worker.autotune_reward"

#: fields the export writes from the winner and the study (a fixed value for them does not hold).
_FROM_WINNER = frozenset(
    {
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "gradient_checkpointing",
        "dataloader_num_workers",
        "num_generations",
        "max_completion_length",
        "use_cpu",
        "deepspeed",
        "use_vllm",
        "vllm_mode",
        "vllm_gpu_memory_utilization",
        "vllm_enable_sleep_mode",
        "vllm_tensor_parallel_size",
        "zero_stage",
        "offload_optimizer",
        "offload_param",
        "num_processes",
        "bf16",
        "fp16",
    }
)
#: ms-swift knob flags, carried by the knob translation instead.
_SWIFT_KNOB_ARGS = frozenset(SWIFT_KNOBS) | {
    "rlhf_type",
    "num_generations",  # the study's own (ms-swift's check_flags refused a different one)
    "max_completion_length",
}
_DATA_SUFFIXES = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}


def _check_knobs(k: JobConfig) -> None:
    """Refuse what TRL has no setting for."""
    if k.ds_config_path is not None:
        raise refuse(k.named("ds_config_path"), "trl", "swift")
    if k.sleep_level == 1:
        raise refuse(f"{k.named('sleep_level')} (TRL's vLLM sleeps at level 2 only)", "trl", "swift")
    if k.rollout_offload_optimizer:
        raise refuse(
            f"{k.named('rollout_offload_optimizer')} (optimizer to the CPU while vLLM generates)",
            "trl",
            "swift",
        )
    if k.rollout_offload_model:
        raise refuse(
            f"{k.named('rollout_offload_model')} (weights to the CPU while vLLM generates)", "trl", "swift"
        )
    if k.move_model_batches is not None:
        raise refuse(k.named("move_model_batches"), "trl", "swift")


def _dataset_fields(w: Winner, fixed: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``datasets`` (a local file) or ``dataset_name`` (a hub id), and comments."""
    dataset = user_dataset(w, fixed)
    if dataset is None:
        prompts = demo_prompts(w, fixed)
        if w.backend != "trl" or prompts is None:
            raise UsageError(
                "the study trained on autotune's generated prompts, written in ms-swift's 'messages' form; "
                "TRL reads 'prompt' rows",
                hint="Run the study with --dataset, or use --format swift",
            )
        return (
            {"datasets": [{"path": "json", "data_files": str(prompts)}]},
            [
                "datasets: the prompts autotune generated for the study (it trained on them): replace them with your own data."
            ],
        )
    if isinstance(dataset, list | tuple):
        if len(dataset) != 1:
            raise refuse(
                f"fixed argument dataset={' '.join(map(str, dataset))} (several datasets)", "trl", w.backend
            )
        dataset = dataset[0]
    text = str(dataset)
    kind = _DATA_SUFFIXES.get(Path(text).suffix.lower())
    if kind is not None:
        local = Path(text).expanduser()
        path = str(local.resolve()) if local.exists() else text
        return {"datasets": [{"path": kind, "data_files": path}]}, []
    if w.backend == "swift" and any(ch in text for ch in "#:"):
        raise refuse(f"fixed argument dataset={text} (ms-swift dataset syntax)", "trl", "swift")
    return {"dataset_name": text}, []


def _reward_fields(w: Winner, fixed: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    if w.backend == "trl":
        rewards = fixed.get("reward_funcs") or ["autotune"]
        rewards = [rewards] if isinstance(rewards, str) else [str(r) for r in rewards]
        funcs: list[str] = []
        models: list[str] = []
        for reward in rewards:
            if reward == "autotune":
                funcs.append(DEMO_REWARD_PATH)
            elif ":" in reward:
                module, _, attr = reward.partition(":")
                funcs.append(f"{module}.{attr}")
            else:
                models.append(reward)
        if len(models) > 1:
            raise refuse(
                f"fixed argument reward_funcs={' '.join(rewards)} (several reward models)", "trl", None
            )
        out: dict[str, Any] = {}
        if models:
            out["reward_model_name_or_path"] = models[0]
        if funcs:
            out["reward_funcs"] = funcs
        notes = (
            [f"{DEMO_REWARD_PATH} is autotune's demo reward: replace it with your own."]
            if "autotune" in rewards
            else []
        )
        return out, notes
    if uses_demo_reward(w, fixed):
        return (
            {"reward_funcs": [DEMO_REWARD_PATH]},
            [f"{DEMO_REWARD_PATH} is autotune's demo reward (the study used it): replace it with your own."],
        )
    if "reward_funcs" in fixed:
        raise refuse(f"fixed argument reward_funcs={_text(fixed['reward_funcs'])}", "trl", "swift")
    reward_model = fixed.get("reward_model")
    if isinstance(reward_model, list | tuple):
        if len(reward_model) != 1:
            raise refuse(f"fixed argument reward_model={_text(reward_model)}", "trl", "swift")
        reward_model = reward_model[0]
    return {"reward_model_name_or_path": str(reward_model)}, []


def _text(value: object) -> str:
    return " ".join(map(str, value)) if isinstance(value, list | tuple) else str(value)


def _user_fields(w: Winner, fixed: dict[str, Any]) -> dict[str, Any]:
    """The user's fixed arguments in GRPOConfig / ModelConfig words."""
    out: dict[str, Any] = {}
    if w.backend == "trl":
        for name, value in fixed.items():
            if name in _FROM_WINNER or name in ("reward_funcs", "dataset"):
                continue
            if name == "generation_kwargs" and isinstance(value, dict):
                value = {k: v for k, v in value.items() if k != "min_new_tokens"} or None
                if value is None:
                    continue
            out[name] = typed(value)
        return out
    out["beta"] = 0.04  # ms-swift's default; TRL's is 0.0
    for name, value in fixed.items():
        if name in _SWIFT_KNOB_ARGS or name in ("dataset", "reward_funcs", "reward_model", "bf16", "fp16"):
            continue
        if name == "tuner_type":
            kind = str(value).lower()
            if kind == "lora":
                out["use_peft"] = True
            elif kind != "full":
                raise refuse(f"fixed argument tuner_type={value}", "trl", "swift")
            continue
        if name in ("external_plugins",) and uses_demo_reward(w, fixed):
            continue
        if name in SHARED_ARGS:
            out[name] = typed(list_value(name, value))
        elif name in TRL_NAMES:
            out[TRL_NAMES[name]] = typed(list_value(name, value))
        else:
            raise refuse(f"fixed argument {name}={_text(value)}", "trl", "swift")
    if "lora_r" in out and not out.get("use_peft"):
        raise refuse(f"fixed argument lora_rank={out['lora_r']} without --tuner_type lora", "trl", "swift")
    return out


def _accelerate(k: JobConfig, w: Winner, bf16: bool, fp16: bool) -> dict[str, Any]:
    config: dict[str, Any] = {"compute_environment": "LOCAL_MACHINE", "debug": False}
    if k.sharding_stage is not None:
        config["distributed_type"] = "DEEPSPEED"
        config["deepspeed_config"] = {
            "deepspeed_config_file": DS_CONFIG,
            "zero3_init_flag": k.sharding_stage == 3,
        }
    elif k.world_size > 1:
        config["distributed_type"] = "MULTI_GPU"
    else:
        config["distributed_type"] = "NO"
    config.update(
        machine_rank=0,
        main_training_function="main",
        mixed_precision="bf16" if bf16 else "fp16" if fp16 else "no",
        num_machines=1,
        num_processes=k.world_size,
        rdzv_backend="static",
        same_network=True,
        use_cpu=w.cpu_only and k.world_size == 1 and k.sharding_stage is None,
    )
    if k.sharding_stage is not None:
        del config["mixed_precision"]  # DeepSpeed takes it from ds_config.json
    return config


def _yaml_section(comment: str | None, data: dict[str, Any]) -> str:
    if not data:
        return ""
    text = yaml.safe_dump(data, sort_keys=False, default_flow_style=False, allow_unicode=True, width=1000)
    return (_yaml_comment(comment) if comment else "") + text


def _yaml_comment(text: str) -> str:
    """One ``#`` line of YAML: a newline in ``text`` (a study's name) never ends the comment."""
    return f"# {comment_line(text)}\n"


def export_trl(w: Winner) -> Export:
    """``grpo.yaml`` + ``accelerate.yaml`` (+ ``ds_config.json``) + ``command.sh`` for the winner.

    Raises:
        UsageError: a knob or fixed argument TRL cannot express (from an ms-swift study), or a study of
            the command backend.
    """
    if w.backend not in ("swift", "trl"):
        raise refuse(f"a study of the {w.backend or 'unknown'} backend", "trl", "command")
    fixed, notes = mask_secrets(w.fixed, w.secrets)
    k = w.config
    _check_knobs(k)
    bf16, fp16 = precision(w, fixed)
    data_fields, data_notes = _dataset_fields(w, fixed)
    reward_fields, reward_notes = _reward_fields(w, fixed)
    user = _user_fields(w, fixed)

    job: dict[str, Any] = {"model_name_or_path": w.settings.model.loaded}
    job.update(data_fields)
    job.update(reward_fields)
    tuned: dict[str, Any] = {
        "per_device_train_batch_size": k.per_device_batch,
        "gradient_accumulation_steps": k.grad_accum,
        "gradient_checkpointing": k.gradient_checkpointing,
        "dataloader_num_workers": k.dataloader_num_workers,
    }
    if k.use_vllm:
        tuned.update(
            use_vllm=True,
            vllm_mode=k.vllm_mode or "colocate",
            vllm_gpu_memory_utilization=k.vllm_util,
            vllm_tensor_parallel_size=k.vllm_tp,
            vllm_enable_sleep_mode=k.sleep_level == 2,
        )
    study = {
        "num_generations": w.settings.num_generations or 4,
        "max_completion_length": w.settings.max_completion_length or 16,
    }
    machine: dict[str, Any] = {"bf16": bf16, "fp16": fp16}
    if w.cpu_only:
        machine["use_cpu"] = True
    machine["accelerate_config"] = ACCELERATE

    comments = header(w, "trl")
    version = w.settings.backend_version if w.backend == "trl" else None
    comments.append(
        f"For trl {version or '>= 1.0'}; run from this directory: trl grpo --config {CONFIG}   (or ./{SCRIPT})"
    )
    if w.backend == "swift":
        comments.append(
            "Translated from an ms-swift trial; fields not written here take TRL's defaults, which differ from "
            "ms-swift's for some (learning rate, loss type)."
        )
    comments += data_notes + reward_notes + notes
    text = "".join(_yaml_comment(c) for c in comments)
    # the names the installed transformers accepts without a deprecation warning on every run
    aliases = installed_aliases()
    text += _yaml_section(None, current_names(job, aliases))
    text += _yaml_section(f"the knobs autotune tuned (trial {w.number})", current_names(tuned, aliases))
    text += _yaml_section("fixed for the whole study", study)
    text += _yaml_section("your fixed arguments", current_names(user, aliases))
    text += _yaml_section("this machine", current_names(machine, aliases))

    files = {CONFIG: text}
    accel = _accelerate(k, w, bf16, fp16)
    files[ACCELERATE] = _yaml_comment(f"{MARKER} from study {w.study_name}, trial {w.number}.") + (
        yaml.safe_dump(accel, sort_keys=False, default_flow_style=False)
    )
    if k.sharding_stage is not None:
        files[DS_CONFIG] = json_text(config_for(w, "trl", instead="json"))
    env: dict[str, str] = {}
    if w.cpu_only:
        env["CUDA_VISIBLE_DEVICES"] = ""
        if k.sharding_stage is not None:
            env["DS_ACCELERATOR"] = "cpu"
    else:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in w.gpu_indices)
    env.update(trial_environment(w))  # the thread counts and devices the trial ran with
    if (
        w.settings.model.local
        and data_fields.get("datasets")
        and not reward_fields.get("reward_model_name_or_path")
    ):
        env["HF_HUB_OFFLINE"] = "1"  # model, data and reward are on disk: never wait on the hub
    files[SCRIPT] = shell_script(
        [
            header(w, "trl")[0],
            f"Runs {CONFIG} with TRL's CLI; arguments given here are passed on (--max_steps 2).",
        ],
        [["trl", "grpo"], ["--config", CONFIG]],
        env=env,
        setup=['cd "$(dirname "$0")"'],
        secrets=w.secrets,
    )
    return Export(
        format="trl",
        files=files,
        main=CONFIG,
        trial=w.number,
        executable=frozenset({SCRIPT}),
        notes=tuple(notes),
    )
