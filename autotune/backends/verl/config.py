"""What verl's knobs and hydra overrides mean (verl 0.9.1, ``verl.trainer.main_ppo`` with the v1 trainer).

Facts of verl 0.9.1's source the decoder encodes (``AR`` = ``actor_rollout_ref``):

- The actor trains under FSDP with fp32 parameters (``AR.actor.fsdp_config.model_dtype: fp32``) and
  ``reshard_after_forward: true`` (FULL_SHARD, ZeRO-3's sharding): :attr:`JobConfig.fsdp`, stage 3.
  ``param_offload`` / ``optimizer_offload`` move parameters (and gradients) / optimizer states to the
  CPU whenever the actor is idle and back for its passes (``verl/workers/engine/fsdp/transformer_impl.py``
  ``FSDPEngine.to``, called by the train/eval mode contexts): the rollout-phase offload of JobConfig.
- The reference model is forward-only and always CPU-offloaded (``FSDPEngine._build_fsdp_module``):
  :attr:`JobConfig.reference_offload`. It exists when ``AR.actor.use_kl_loss`` or
  ``algorithm.use_kl_in_reward`` is set (``verl/trainer/ppo/utils.py::need_reference_policy``).
- Rollout is a colocated vLLM (hybrid engine) reserving ``gpu_memory_utilization`` of each GPU; with
  ``free_cache_engine`` it sleeps between rollouts at level 2 (level 1 for LoRA adapters:
  ``vllm_async_server.py::vLLMHttpServer._resolve_sleep_level``); weights reach it one tensor at a time.
  ``max_model_len`` null means the model's ``max_position_embeddings`` (``_validate_configs``).
- ``use_dynamic_bsz`` packs micro-batches up to ``ppo_max_token_len_per_gpu`` tokens
  (:attr:`JobConfig.micro_batch_tokens`); otherwise ``ppo_micro_batch_size_per_gpu`` sequences.
- Global batch = ``data.train_batch_size`` prompts × ``AR.rollout.n``; autotune sets
  ``AR.actor.ppo_mini_batch_size`` to the train batch (one optimizer step per batch).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autotune.jobconfig import JobConfig
from autotune.values import as_bool, as_float, as_int, pick, required_float, required_int

__all__ = [
    "AR",
    "DYNAMIC_BSZ",
    "KNOB_FIELDS",
    "LOG_PROB_MICRO",
    "MAX_TOKENS",
    "PPO_MICRO",
    "REF_LOG_PROB_MICRO",
    "VERL_FACTS",
    "describe_verl",
]

AR = "actor_rollout_ref"
DYNAMIC_BSZ = f"{AR}.actor.use_dynamic_bsz"
MAX_TOKENS = f"{AR}.actor.ppo_max_token_len_per_gpu"
PPO_MICRO = f"{AR}.actor.ppo_micro_batch_size_per_gpu"
LOG_PROB_MICRO = f"{AR}.rollout.log_prob_micro_batch_size_per_gpu"
#: the reference's forward micro-batch: rendered with the rollout's log-prob value (same pass, same size).
REF_LOG_PROB_MICRO = f"{AR}.ref.log_prob_micro_batch_size_per_gpu"
PARAM_OFFLOAD = f"{AR}.actor.fsdp_config.param_offload"
OPTIMIZER_OFFLOAD = f"{AR}.actor.fsdp_config.optimizer_offload"
GPU_UTIL = f"{AR}.rollout.gpu_memory_utilization"
ROLLOUT_TP = f"{AR}.rollout.tensor_model_parallel_size"
FREE_CACHE = f"{AR}.rollout.free_cache_engine"
CHUNKED_PREFILL = f"{AR}.rollout.enable_chunked_prefill"
BATCHED_TOKENS = f"{AR}.rollout.max_num_batched_tokens"
GRAD_CKPT = f"{AR}.model.enable_gradient_checkpointing"
MAX_MODEL_LEN = f"{AR}.rollout.max_model_len"
MAX_NUM_SEQS = f"{AR}.rollout.max_num_seqs"
LORA_RANK = f"{AR}.model.lora_rank"
USE_KL_LOSS = f"{AR}.actor.use_kl_loss"
KL_COEF = f"{AR}.actor.kl_loss_coef"
KL_IN_REWARD = "algorithm.use_kl_in_reward"
PROMPT_LEN = "data.max_prompt_length"
RESPONSE_LEN = "data.max_response_length"

#: verl 0.9.1's defaults for what is not a knob of its space (_generated_ppo_trainer.yaml).
VERL_FACTS: dict[str, Any] = {
    MAX_NUM_SEQS: 256,
    KL_COEF: 0.001,
    PROMPT_LEN: 512,
    RESPONSE_LEN: 512,
    "rollout_name": "vllm",  # AR.rollout.name is required (???); autotune renders vllm
}

#: JobConfig field → verl's knob or override keys that set it (the first is the knob's name).
KNOB_FIELDS: dict[str, tuple[str, ...]] = {
    "per_device_batch": (PPO_MICRO,),
    "micro_batch_tokens": (MAX_TOKENS, DYNAMIC_BSZ),
    "gradient_checkpointing": (GRAD_CKPT,),
    "rollout_offload_model": (PARAM_OFFLOAD,),
    "rollout_offload_optimizer": (OPTIMIZER_OFFLOAD,),
    "vllm_util": (GPU_UTIL,),
    "vllm_tp": (ROLLOUT_TP,),
    "sleep_level": (FREE_CACHE,),
    "vllm_max_num_batched_tokens": (BATCHED_TOKENS,),
    "vllm_chunked_prefill": (CHUNKED_PREFILL,),
    "vllm_max_model_len": (MAX_MODEL_LEN,),
    "vllm_max_num_seqs": (MAX_NUM_SEQS,),
    "lora_rank": (LORA_RANK,),
    "beta": (KL_COEF, USE_KL_LOSS),
    "max_prompt_length": (PROMPT_LEN,),
    "max_completion_length": (RESPONSE_LEN,),
}


def packed_micro_batch(per_gpu: int, token_budget: int, seq_len: int) -> int:
    """Sequences of one packed micro-batch, as a divisor of the per-GPU batch (for the batch shape).

    verl packs up to ``token_budget`` tokens; with sequences of at most ``seq_len`` tokens that is at
    least ``token_budget // seq_len`` of them. The largest divisor of ``per_gpu`` not above that keeps
    the accumulation count whole.
    """
    fit = max(1, token_budget // max(1, seq_len))
    return max(d for d in range(1, max(1, per_gpu) + 1) if per_gpu % d == 0 and d <= fit) if per_gpu else 1


def describe_verl(
    params: Mapping[str, Any],
    derived: Mapping[str, Any],
    fixed: Mapping[str, Any],
    n_gpus: int,
    defaults: Mapping[str, Any],
) -> JobConfig:
    """verl's knobs (over the study's fixed overrides and job facts) as a :class:`JobConfig`.

    Args:
        params: the trial's knobs (verl's hydra keys).
        derived: ``world_size`` when derived.
        fixed: the study's fixed overrides and job facts (``global_batch``, ``num_generations``,
            ``max_completion_length``, ``max_prompt_length``, ``beta``).
        n_gpus: GPUs of the trial (0 on a CPU-only study).
        defaults: the knobs' defaults (the verl space's).
    """
    given = {**fixed, **params}
    p: dict[str, Any] = {**VERL_FACTS, **defaults, **given}
    origin: dict[str, tuple[str, Any]] = {}
    for field, names in KNOB_FIELDS.items():
        for name in names:
            if name in given:
                origin[field] = (name, given[name])
                break

    world = int(derived.get("world_size") or n_gpus or 1)
    global_batch = int(pick(p, "global_batch", default=64))
    prompt_len = int(pick(p, "max_prompt_length", PROMPT_LEN, default=VERL_FACTS[PROMPT_LEN]))
    response_len = int(pick(p, "max_completion_length", RESPONSE_LEN, default=VERL_FACTS[RESPONSE_LEN]))
    per_gpu = max(1, global_batch // max(1, world))
    dynamic = as_bool(p.get(DYNAMIC_BSZ))
    budget: int | None = None
    if dynamic:
        budget = required_int(p, MAX_TOKENS, int(defaults.get(MAX_TOKENS) or 16384))
        micro = packed_micro_batch(per_gpu, budget, prompt_len + response_len)
    else:
        micro = required_int(p, PPO_MICRO, 1)
    lora_rank = max(0, required_int(p, LORA_RANK, 0))
    use_kl = as_bool(p.get(USE_KL_LOSS)) or as_bool(p.get(KL_IN_REWARD))
    beta_given = as_float(p.get("beta"))
    if beta_given is not None:
        beta = beta_given
    else:
        beta = required_float(p, KL_COEF, VERL_FACTS[KL_COEF]) if use_kl else 0.0
    tp = max(1, required_int(p, ROLLOUT_TP, 2))
    free_cache = as_bool(p.get(FREE_CACHE), default=True)
    return JobConfig(
        world_size=world,
        global_batch=global_batch,
        num_generations=int(pick(p, "num_generations", default=8)),
        per_device_batch=max(1, micro),
        grad_accum=max(1, per_gpu // max(1, micro)),
        max_prompt_length=prompt_len,
        max_completion_length=response_len,
        gradient_checkpointing=as_bool(p.get(GRAD_CKPT), default=True),
        fsdp=True,
        zero_stage=3,
        micro_batch_tokens=budget,
        lora_rank=lora_rank,
        beta=beta,
        reference_offload=True,
        use_vllm=True,
        vllm_mode="colocate",
        vllm_util=required_float(p, GPU_UTIL, 0.5),
        vllm_tp=tp,
        sleep_level=(1 if lora_rank > 0 else 2) if free_cache else 0,
        rollout_offload_model=as_bool(p.get(PARAM_OFFLOAD)),
        rollout_offload_optimizer=as_bool(p.get(OPTIMIZER_OFFLOAD)),
        vllm_max_model_len=as_int(p.get(MAX_MODEL_LEN)),
        vllm_max_num_seqs=required_int(p, MAX_NUM_SEQS, VERL_FACTS[MAX_NUM_SEQS]),
        vllm_max_num_batched_tokens=required_int(p, BATCHED_TOKENS, 8192),
        vllm_chunked_prefill=as_bool(p.get(CHUNKED_PREFILL), default=True),
        weight_sync="parameter",
        loads_before_vllm=True,
        origin=origin,
    )
