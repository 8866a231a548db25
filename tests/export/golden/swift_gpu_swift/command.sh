#!/usr/bin/env bash
# Written by autotune export (--format swift) from study swift-a100, trial 1: fastest healthy trial in the search: 6.4 completions/s.
# Measured 6.4 completions/s, 3000 tokens/s, peak GPU memory 60.0 GiB at a global batch of 64 completions (8 per prompt) on 2x NVIDIA A100-SXM4-80GB, with ms-swift 4.6.0.
# Verdict: 2.00× the baseline (trial 0) from one run of each (not re-measured).
# Flags for ms-swift 4.6.0; arguments given to this script are passed on (--max_steps 2).
# --reward_funcs autotune_demo is autotune's demo reward: replace it with your own.
set -euo pipefail
export NPROC_PER_NODE=2
export CUDA_VISIBLE_DEVICES=0,1
export CUDA_DEVICE_ORDER=PCI_BUS_ID
swift rlhf \
  --rlhf_type grpo \
  --model Qwen/Qwen2.5-1.5B-Instruct \
  --use_hf true \
  --dataset /data/math/train.parquet \
  --external_plugins <STUDY>/trials/1/swift_reward_plugin.py \
  --reward_funcs autotune_demo \
  --num_generations 8 \
  --max_completion_length 512 \
  --per_device_train_batch_size 4 \
  --gradient_checkpointing true \
  --dataloader_num_workers 4 \
  --deepspeed zero2_offload \
  --use_vllm true \
  --vllm_mode colocate \
  --vllm_gpu_memory_utilization 0.5 \
  --vllm_tensor_parallel_size 1 \
  --sleep_level 0 \
  --offload_optimizer false \
  --offload_model false \
  --gradient_accumulation_steps 8 \
  --tuner_type lora \
  --lora_rank 32 \
  --learning_rate 1e-5 \
  "$@"
