#!/usr/bin/env bash
# Written by autotune export (--format swift) from study trl-a100, trial 1: fastest healthy trial in the search: 6.4 completions/s.
# Measured 6.4 completions/s, 3000 tokens/s, peak GPU memory 60.0 GiB at a global batch of 64 completions (8 per prompt) on 4x NVIDIA A100-SXM4-80GB, with TRL 1.16.0.
# Verdict: 2.00× the baseline (trial 0) from one run of each (not re-measured).
# Translated from a TRL trial; arguments not written here take ms-swift's defaults, which differ from TRL's for some (learning rate, loss type).
# Flags for ms-swift 4.6.0; arguments given to this script are passed on (--max_steps 2).
# --reward_funcs autotune_demo is autotune's demo reward: replace it with your own.
set -euo pipefail
export NPROC_PER_NODE=4
export CUDA_VISIBLE_DEVICES=0,1,2,3
export CUDA_DEVICE_ORDER=PCI_BUS_ID
swift rlhf \
  --rlhf_type grpo \
  --model Qwen/Qwen2.5-1.5B-Instruct \
  --use_hf true \
  --dataset trl-lib/DeepMath-103K \
  --external_plugins <AUTOTUNE>/assets/swift_reward_plugin.py \
  --reward_funcs autotune_demo \
  --num_generations 8 \
  --max_completion_length 512 \
  --per_device_train_batch_size 8 \
  --gradient_checkpointing false \
  --dataloader_num_workers 2 \
  --deepspeed zero3_offload \
  --use_vllm true \
  --vllm_mode colocate \
  --vllm_gpu_memory_utilization 0.45 \
  --vllm_tensor_parallel_size 2 \
  --sleep_level 0 \
  --gradient_accumulation_steps 2 \
  --beta 0.04 \
  --learning_rate 1e-06 \
  --logging_steps 10 \
  "$@"
