"""``--format swift``: the winner as a runnable ``swift rlhf --rlhf_type grpo`` script.

The script exports the environment the job needs (``NPROC_PER_NODE`` for more than one process,
``CUDA_VISIBLE_DEVICES``; ``OMP_NUM_THREADS=1`` on a CPU-only study), then runs ms-swift with the
winner's knobs and the user's fixed arguments, rendered for the ms-swift version the study used by
:meth:`autotune.backends.swift.backend.SwiftBackend.job_plan` — the trial's own command without what only a
trial needs (``--max_steps``, ``--logging_steps 1``, ``--save_strategy no``, ``--report_to none``, the
trial's ``--output_dir``, ...). Arguments given to the script are passed on (``bash command.sh
--max_steps 2``). Secret arguments (``--hub_token``) are left out, with a note in the script.

From a TRL study the knobs are translated (:mod:`autotune.export._translate`): ``zero_stage`` and the
offload flags become the ms-swift preset with the same meaning (stage 2 → ``zero2``, stage 2 + optimizer
offload → ``zero2_offload``, stage 3 → ``zero3``, stage 3 + optimizer and parameter offload →
``zero3_offload``; other combinations have no preset and are refused), ``vllm_enable_sleep_mode`` →
``--sleep_level 2``, ``num_processes`` → ``NPROC_PER_NODE``. TRL's ``beta`` default (0.0) is written
out, since ms-swift's default is 0.04. Fixed arguments outside the shared vocabulary are refused.
autotune's demo reward becomes its ms-swift plugin (``--external_plugins`` from the installed autotune);
autotune's generated prompts are TRL-shaped and are refused.
"""

from __future__ import annotations

from importlib.resources import files
from typing import Any

from autotune.backends._base import TrialContext
from autotune.backends._vocab import SHARED_ARGS, TRL_NAMES
from autotune.backends.swift.config import preset_for
from autotune.errors import UsageError
from autotune.export._common import Export, flag_lines, mask_secrets, refuse, shell_script
from autotune.export._job import demo_prompts, header, trial_environment, user_dataset, uses_demo_reward
from autotune.export._winner import Winner
from autotune.jobconfig import JobConfig
from autotune.records import TrialSpec

__all__ = ["DEFAULT_SWIFT_VERSION", "SCRIPT", "export_swift"]

SCRIPT = "command.sh"
#: the ms-swift version a TRL study's export is written for (the study never ran ms-swift).
DEFAULT_SWIFT_VERSION = "4.6.0"

_TRL_TO_SWIFT = {trl: swift for swift, trl in TRL_NAMES.items()}
#: TRL knobs (and GRPOConfig fields that are knobs' neighbours) carried by the knob translation.
_TRL_KNOB_ARGS = frozenset(
    {
        "per_device_train_batch_size",
        "gradient_checkpointing",
        "dataloader_num_workers",
        "zero_stage",
        "offload_optimizer",
        "offload_param",
        "num_processes",
        "use_vllm",
        "vllm_mode",
        "vllm_gpu_memory_utilization",
        "vllm_enable_sleep_mode",
        "vllm_tensor_parallel_size",
        "num_generations",  # the study's own values hold
        "max_completion_length",
    }
)


def swift_preset(k: JobConfig, fmt: str, instead: str | None) -> str | None:
    """The ``--deepspeed`` preset for the knobs' ZeRO stage and offload (None: DeepSpeed off).

    Raises:
        UsageError: a stage/offload combination no preset has (ZeRO-3 with only one kind of offload,
            ZeRO-1 with offload).
    """
    if k.ds_config_path is not None:
        return k.ds_config_path
    if k.sharding_stage is None:
        return None
    preset = preset_for(k.sharding_stage, k.ds_offload_optimizer, k.ds_offload_param)
    if preset is not None:
        return preset
    what = k.named("ds_offload_param" if k.sharding_stage == 3 else "ds_offload_optimizer")
    raise refuse(f"{what} with ZeRO-{k.sharding_stage}", fmt, instead)


def _context(w: Winner, fixed: dict[str, Any]) -> TrialContext:
    s = w.settings
    return TrialContext(
        study_dir=w.study_dir,
        trial_dir=w.trial_dir,
        model=s.model.ref(),
        gpus=w.hardware.gpus if w.hardware is not None else (),
        global_batch=s.global_batch or 16,
        num_generations=s.num_generations or 4,
        max_steps=s.max_steps or 20,
        max_completion_length=s.max_completion_length or 16,
        fixed=fixed,
        dataset=s.dataset,
        seed=s.seed or 0,
    )


def _from_trl(w: Winner, k: JobConfig, fixed: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """ms-swift knobs and fixed flags with the meaning of a TRL trial's."""
    params: dict[str, Any] = {
        "per_device_train_batch_size": k.per_device_batch,
        "gradient_checkpointing": k.gradient_checkpointing,
        "dataloader_num_workers": k.dataloader_num_workers,
    }
    if w.cpu_only:
        params["num_processes"] = k.world_size
    preset = swift_preset(k, "swift", "trl")
    if preset is not None:
        params["deepspeed"] = preset
    if k.use_vllm:
        params.update(
            use_vllm=True,
            vllm_mode=k.vllm_mode or "colocate",
            vllm_gpu_memory_utilization=k.vllm_util,
            vllm_tensor_parallel_size=k.vllm_tp,
            sleep_level=k.sleep_level,
        )
    out: dict[str, Any] = {"beta": 0.0}  # TRL's default; ms-swift's is 0.04
    for name, value in fixed.items():
        if name in _TRL_KNOB_ARGS or name in ("reward_funcs", "dataset"):
            continue
        if name in SHARED_ARGS:
            out[name] = value
        elif name in _TRL_TO_SWIFT:
            out[_TRL_TO_SWIFT[name]] = value
        else:
            raise refuse(f"fixed argument {name}={value}", "swift", "trl")
    if uses_demo_reward(w, fixed):
        rewards = fixed.get("reward_funcs") or ["autotune"]
        rewards = [rewards] if isinstance(rewards, str) else list(rewards)
        if rewards != ["autotune"]:
            raise refuse(f"fixed argument reward_funcs={' '.join(map(str, rewards))}", "swift", "trl")
        plugin = files("autotune") / "assets" / "swift_reward_plugin.py"
        out["external_plugins"] = [str(plugin)]
        out["reward_funcs"] = ["autotune_demo"]
    else:
        rewards = fixed.get("reward_funcs")
        text = " ".join(map(str, rewards)) if isinstance(rewards, list | tuple) else str(rewards)
        raise refuse(f"fixed argument reward_funcs={text}", "swift", "trl")
    dataset = user_dataset(w, fixed)
    if dataset is None:
        raise UsageError(
            "the study trained on autotune's generated prompts, written in TRL's 'prompt' form; ms-swift "
            "reads 'messages' rows",
            hint="Run the study with --dataset, or use --format trl",
        )
    out["dataset"] = dataset
    if not w.settings.model.local:
        out["use_hf"] = True  # a TRL study's model and data ids are Hugging Face Hub ids
    return params, out


def export_swift(w: Winner) -> Export:
    """The winner as ``command.sh`` running ``swift rlhf``.

    Raises:
        UsageError: a knob or fixed argument ms-swift cannot express (from a TRL study), or a study of
            the command backend.
    """
    from autotune.backends.swift.backend import SwiftBackend

    if w.backend not in ("swift", "trl"):
        raise refuse(f"a study of the {w.backend or 'unknown'} backend", "swift", "command")
    fixed, notes = mask_secrets(w.fixed, w.secrets)
    k = w.config
    comments = header(w, "swift")
    if w.backend == "swift":
        params = dict(w.result.params)
        swift_fixed = fixed
        version = w.settings.backend_version or str(w.settings.versions.get("ms-swift") or "")
        version = version or DEFAULT_SWIFT_VERSION
        exe = w.launch.argv[0] if w.launch is not None and w.launch.argv else "swift"
    else:
        params, swift_fixed = _from_trl(w, k, fixed)
        version = str(w.settings.versions.get("ms-swift") or DEFAULT_SWIFT_VERSION)
        exe = "swift"
        comments.append(
            "Translated from a TRL trial; arguments not written here take ms-swift's defaults, which differ "
            "from TRL's for some (learning rate, loss type)."
        )
    comments.append(
        f"Flags for ms-swift {version}; arguments given to this script are passed on (--max_steps 2)."
    )
    if demo_prompts(w, fixed) is not None and w.backend == "swift":
        comments.append(
            "--dataset is the prompts autotune generated for the study (it trained on them): replace it with "
            "your own data."
        )
    if uses_demo_reward(w, fixed):
        comments.append("--reward_funcs autotune_demo is autotune's demo reward: replace it with your own.")
    comments += notes
    backend = SwiftBackend(executable=exe, version=version, flag_names=())
    ctx = _context(w, swift_fixed)
    derived = {"world_size": k.world_size, "gradient_accumulation_steps": k.grad_accum}
    plan = backend.job_plan(TrialSpec(number=w.number, params=params, derived=derived), ctx)
    env = {**plan.env, **trial_environment(w)}  # the devices and thread counts the trial ran with
    script = shell_script(comments, flag_lines(plan.argv, lead=2), env=env, secrets=w.secrets)
    return Export(
        format="swift",
        files={SCRIPT: script},
        main=SCRIPT,
        trial=w.number,
        executable=frozenset({SCRIPT}),
        notes=tuple(notes),
    )
