"""ms-swift's rules before a launch: the start-up validity rules a trial's arguments must pass
(:func:`start_rules`, each one a ``ValueError`` ms-swift would raise at launch) and the check of every flag
a trial would pass against the installed version (:func:`fixed_flag_notices`). :class:`SwiftBackend`'s
``check_rules`` and ``check_flags`` read them here."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from autotune.backends._base import BackendInfo, RuleViolation, TrialContext
from autotune.backends._vllm import refusals as vllm_refusals
from autotune.backends.swift._args import SwiftFlags
from autotune.errors import BackendError
from autotune.fixed import UnknownFlag, flag_name
from autotune.values import as_bool, as_int

__all__ = ["CONTROLLED_FLAGS", "fixed_flag_notices", "start_rules"]

#: flags autotune sets for every trial; a fixed value for them is replaced (with a notice).
CONTROLLED_FLAGS: tuple[str, ...] = (
    "gradient_accumulation_steps",
    "max_steps",
    "logging_steps",
    "save_strategy",
    "eval_strategy",
    "report_to",
    "output_dir",
    "add_version",
    "seed",
)


def start_rules(
    eff: Mapping[str, object],
    world: int,
    ctx: TrialContext,
    *,
    info: BackendInfo | None,
    flags: Callable[[], SwiftFlags],
) -> list[RuleViolation]:
    """ms-swift's start-up validity rules (each would raise ``ValueError`` at launch), by stable name.

    Args:
        eff: the trial's effective arguments (the fixed ones under its knobs).
        world: the trial's world size.
        ctx: the study's context.
        info: what the probe found installed (None before a probe).
        flags: the flag vocabulary of the ms-swift version (asked only when a rule needs it).
    """
    out: list[RuleViolation] = []
    pdbs = as_int(eff.get("per_device_train_batch_size", 1)) or 1
    per_step = pdbs * world
    G = ctx.num_generations
    if ctx.global_batch % per_step != 0 or ctx.global_batch < per_step:
        out.append(
            RuleViolation(
                "global_batch_divisible",
                f"global batch {ctx.global_batch} is not a multiple of per_device_train_batch_size {pdbs} "
                f"× world size {world} = {per_step}",
            )
        )
    ga = ctx.global_batch // per_step if ctx.global_batch % per_step == 0 else None
    gen_batch = as_int(eff.get("generation_batch_size"))
    steps_per_gen = as_int(eff.get("steps_per_generation"))
    if gen_batch is not None and steps_per_gen is not None:
        expected = per_step * steps_per_gen
        if gen_batch != expected:
            out.append(
                RuleViolation(
                    "generation_batch_matches_steps",
                    f"generation_batch_size {gen_batch} must equal per_device_train_batch_size {pdbs} × world "
                    f"size {world} × steps_per_generation {steps_per_gen} = {expected}",
                )
            )
    elif gen_batch is not None and gen_batch % per_step != 0:
        out.append(
            RuleViolation(
                "generation_batch_divisible_by_batch",
                f"generation_batch_size {gen_batch} is not divisible by per_device_train_batch_size {pdbs} "
                f"× world size {world} = {per_step}",
            )
        )
    if gen_batch is None:
        spg = steps_per_gen if steps_per_gen is not None else ga
        gen_batch = per_step * spg if spg is not None else None
    if G < 2:
        out.append(RuleViolation("num_generations_min", f"num_generations is {G}; GRPO needs at least 2"))
    elif gen_batch is not None and gen_batch % G != 0:
        out.append(
            RuleViolation(
                "generation_batch_divisible_by_num_generations",
                f"generation batch {gen_batch} (completions per generation round) is not divisible by "
                f"num_generations {G}",
            )
        )
    use_vllm = as_bool(eff.get("use_vllm", False))
    mode = eff.get("vllm_mode", "colocate")  # a trial without one is rendered with colocate
    if use_vllm:
        out += [
            RuleViolation(rule, message)
            for rule, message in vllm_refusals(
                cpu_only=ctx.cpu_only,
                versions=info.extra if info is not None else None,
                server=mode == "server",
                sleep=(as_int(eff.get("sleep_level", 0)) or 0) > 0,
            )
        ]
        if mode is None and flags().vllm_mode_required:
            out.append(
                RuleViolation(
                    "vllm_mode_required",
                    f"use_vllm true needs vllm_mode colocate or server (ms-swift {flags().label} has no default)",
                )
            )
        if mode == "server" and not (eff.get("vllm_server_host") or eff.get("vllm_server_base_url")):
            out.append(
                RuleViolation(
                    "vllm_server_address",
                    "vllm_mode server needs vllm_server_host or vllm_server_base_url among the fixed arguments "
                    "(a running `swift rollout` server)",
                )
            )
        tp = as_int(eff.get("vllm_tensor_parallel_size", 1)) or 1
        if mode in (None, "colocate") and world % tp != 0:
            out.append(
                RuleViolation(
                    "vllm_tp_divides_world",
                    f"vllm_tensor_parallel_size {tp} does not divide the world size {world}",
                )
            )
    if as_bool(eff.get("async_generate", False)) and not (use_vllm and mode == "server"):
        out.append(
            RuleViolation(
                "async_generate_needs_server", "async_generate needs use_vllm true and vllm_mode server"
            )
        )
    deepspeed = eff.get("deepspeed")
    if deepspeed not in (None, "", "none"):
        if eff.get("fsdp"):
            out.append(RuleViolation("deepspeed_with_fsdp", "deepspeed and fsdp cannot both be set"))
        if info is not None and not info.extra.get("deepspeed"):
            out.append(
                RuleViolation(
                    "deepspeed_not_installed",
                    f"deepspeed {deepspeed} but DeepSpeed is not installed beside ms-swift",
                )
            )
    mmb = as_int(eff.get("move_model_batches"))
    if eff.get("move_model_batches") is not None and (mmb is None or mmb < 1):
        out.append(
            RuleViolation("move_model_batches_positive", "move_model_batches must be a positive integer")
        )
    return out


def fixed_flag_notices(
    flags: SwiftFlags,
    accepted_names: Callable[[], frozenset[str]],
    params: Mapping[str, object],
    fixed: Mapping[str, object],
    ctx: TrialContext | None = None,
) -> list[str]:
    """Check every flag a trial would pass against the installed ms-swift, before any launch.

    Args:
        flags: the flag vocabulary of the ms-swift version trials are rendered for.
        accepted_names: every flag the installed ``swift rlhf`` accepts (asked after the version's refusals).
        params: knob values (any trial's; only the names matter).
        fixed: the user's fixed flags.
        ctx: the study context, to compare fixed values with the study's own (num_generations ...).

    Returns:
        Notices for the user (fixed flags that trials replace).

    Raises:
        UnknownFlag: a fixed flag ``RLHFArguments`` does not have, with its nearest field.
        BackendError: a flag this version removed, or a fixed flag that conflicts with what autotune
            controls.
    """
    names = {flag_name(k) for k in fixed}
    norm_fixed = {flag_name(k): v for k, v in fixed.items()}
    if "rlhf_type" in norm_fixed and str(norm_fixed["rlhf_type"]) != "grpo":
        raise BackendError(
            f"--rlhf_type {norm_fixed['rlhf_type']} is fixed, but autotune tunes GRPO runs",
            hint="Remove --rlhf_type from the fixed arguments",
        )
    if "model" in norm_fixed:
        raise BackendError(
            "--model is among the fixed arguments",
            hint="Give the model with autotune's own --model option",
        )
    if ctx is not None:
        for name, own in (
            ("num_generations", ctx.num_generations),
            ("max_completion_length", ctx.max_completion_length),
        ):
            if name in norm_fixed and as_int(norm_fixed[name]) != own:
                raise BackendError(
                    f"--{name} {norm_fixed[name]} in the fixed arguments differs from the study's {own}",
                    hint=f"Set it with autotune's --{name.replace('_', '-')} option instead",
                )
    knob_flags = {k for k in params if k != "num_processes"}
    emitted = (
        names
        | knob_flags
        | set(CONTROLLED_FLAGS)
        | {"rlhf_type", "model", "num_generations", "max_completion_length"}
        | ({"use_cpu"} if ctx is not None and ctx.cpu_only else set())
    )
    emitted = {flags.translate(n) for n in emitted}
    for name in sorted(emitted):
        refusal = flags.refusal(name)
        if refusal:
            raise BackendError(refusal, hint="Fix the flag in the fixed arguments or upgrade ms-swift")
    accepted = accepted_names()
    for name in sorted(names):
        if flags.translate(name) not in accepted:  # the user's own flag: name ms-swift's nearest field
            raise UnknownFlag(
                name, accepted, framework="swift rlhf", place=f"your job (ms-swift {flags.label})"
            )
    unknown = sorted(n for n in emitted if n not in accepted)
    if unknown:
        raise BackendError(
            f"ms-swift {flags.label} does not accept --{unknown[0]}"
            + (f" (nor {', '.join('--' + u for u in unknown[1:])})" if len(unknown) > 1 else ""),
            hint="Check the flag's spelling against `swift rlhf --help` for this version",
        )
    notes = []
    for name in CONTROLLED_FLAGS:
        if name in norm_fixed:
            notes.append(f"--{name} from the fixed arguments is replaced by autotune's own value in trials")
    for name in sorted(knob_flags & set(norm_fixed)):
        notes.append(
            f"--{name} is a tuned knob: trials set their own value (the fixed one holds where it is not tuned)"
        )
    return notes
