#!/usr/bin/env bash
# Written by autotune export (--format command) from study qwen2-7b-a10, trial 3: fastest healthy trial in the search: 1.71 completions/s.
# Measured 1.71 completions/s, 1400 tokens/s, peak GPU memory 20.3 GiB at a global batch of 32 completions (8 per prompt) on 4x NVIDIA A10, with ms-swift 4.6.0.
# Verdict: 1.52× the baseline (trial 0) from one run of each (not re-measured).
# The trial's own command; arguments given to this script are passed on.
# It writes its metrics and outputs beside this script, never into the study.
# Secrets are not written here: export HF_TOKEN WANDB_API_KEY before running (autotune never stores them).
set -euo pipefail
export NPROC_PER_NODE=4
export CUDA_VISIBLE_DEVICES=0,1,2,3
HERE="$(cd "$(dirname "$0")" && pwd)"
cd "$HERE"
swift rlhf \
  --rlhf_type grpo \
  --model Qwen/Qwen2-7B \
  --tuner_type lora \
  --lora_rank 16 \
  --use_vllm true \
  --vllm_mode colocate \
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
  --max_steps 12 \
  --logging_steps 1 \
  --output_dir "$HERE/output" \
  "$@"
