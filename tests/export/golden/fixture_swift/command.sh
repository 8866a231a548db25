#!/usr/bin/env bash
# Written by autotune export (--format swift) from study qwen2-7b-a10, trial 3: fastest healthy trial in the search: 1.71 completions/s.
# Measured 1.71 completions/s, 1400 tokens/s, peak GPU memory 20.3 GiB at a global batch of 32 completions (8 per prompt) on 4x NVIDIA A10, with ms-swift 4.6.0.
# Verdict: 1.52× the baseline (trial 0) from one run of each (not re-measured).
# Flags for ms-swift 4.6.0; arguments given to this script are passed on (--max_steps 2).
# --reward_funcs autotune_demo is autotune's demo reward: replace it with your own.
# --hub_token is a secret: scripts read it from $HUB_TOKEN, other files show ***
# Secrets are not written here: export HUB_TOKEN before running (autotune never stores them).
set -euo pipefail
export NPROC_PER_NODE=4
export CUDA_VISIBLE_DEVICES=0,1,2,3
export CUDA_DEVICE_ORDER=PCI_BUS_ID
swift rlhf \
  --rlhf_type grpo \
  --model Qwen/Qwen2-7B \
  --use_hf true \
  --dataset /data/runs/qwen2-7b-a10/../data/math.jsonl \
  --external_plugins <STUDY>/trials/3/swift_reward_plugin.py \
  --reward_funcs autotune_demo \
  --num_generations 8 \
  --max_completion_length 1024 \
  --per_device_train_batch_size 4 \
  --gradient_checkpointing true \
  --dataloader_num_workers 1 \
  --deepspeed zero3 \
  --vllm_gpu_memory_utilization 0.5 \
  --vllm_tensor_parallel_size 4 \
  --sleep_level 0 \
  --offload_optimizer false \
  --offload_model false \
  --gradient_accumulation_steps 2 \
  --tuner_type lora \
  --lora_rank 16 \
  --beta 0.04 \
  --use_vllm true \
  --vllm_mode colocate \
  --max_prompt_length 512 \
  --hub_token "${HUB_TOKEN}" \
  "$@"
