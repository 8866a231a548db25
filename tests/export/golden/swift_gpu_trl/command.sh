#!/usr/bin/env bash
# Written by autotune export (--format trl) from study swift-a100, trial 1: fastest healthy trial in the search: 6.4 completions/s.
# Runs grpo.yaml with TRL's CLI; arguments given here are passed on (--max_steps 2).
set -euo pipefail
export CUDA_VISIBLE_DEVICES=0,1
cd "$(dirname "$0")"
trl grpo \
  --config grpo.yaml \
  "$@"
