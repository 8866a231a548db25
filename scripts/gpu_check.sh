#!/usr/bin/env bash
# The first GPU run, as one prepared command (not run by CI).
#
#   bash scripts/gpu_check.sh --prepare     # on a connected machine: the wheels the GPU host lacks, in .whl/
#   bash scripts/gpu_check.sh               # on the GPU host (no network): install, then the checks
#
# The GPU host is assumed to have torch (CUDA), transformers, accelerate, peft, pandas, pyarrow and
# nvidia-ml-py, but not trl, optuna, pydantic, datasets, deepspeed or vllm, and no network: --prepare
# downloads those (and builds autotune's own wheel) for the host's Python (GPU_CHECK_PYTHON_VERSION,
# default 3.12), about 12 MiB. On the GPU host the checks are, each under its own time limit:
#   1. autotune doctor (JSON and text), 2. doctor --bench (the GPU's measured peaks),
#   3. doctor --calibrate on a locally built Qwen2-shaped model with random weights (large-qwen2, 0.66 B
#      parameters: three TRL batch sizes and one deliberate CUDA OOM),
#   4. a real TRL study of GPU_CHECK_TRIALS trials on the same model, whose space reaches a batch the GPU
#      cannot hold,
#   5. `autotune plan` for the same job before and after the calibration: the estimator's prediction to
#      set beside what was measured.
# Everything lands in $OUT (default runs/gpu-check): gpu_check.log, versions.txt, doctor.json,
# plan.json, plan-calibrated.json and gpu-runs.tar.gz (the studies: reports, timelines, results, calibration).
# Rehearse it on a CPU machine: GPU_CHECK_MODEL=tiny-qwen2 bash scripts/gpu_check.sh (the calibration
# then says it needs a GPU, and the study runs on the CPU).
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=${GPU_CHECK_WHEELS:-.whl}
PYV=${GPU_CHECK_PYTHON_VERSION:-3.12}

if [ "${1:-}" = "--prepare" ]; then
  set -e
  mkdir -p "$WHEELS"
  rm -f "$WHEELS"/autotune_grpo-*.whl
  plat=()
  for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
    manylinux2014_x86_64 manylinux1_x86_64; do plat+=(--platform "$p"); done
  # trl and its datasets, optuna and its storage, pydantic: what autotune[trl] needs beyond the image
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
    "${plat[@]}" -d "$WHEELS" trl==1.16.0 datasets dill multiprocess optuna==5.0.0 alembic sqlalchemy \
    colorlog mako greenlet pydantic pydantic-core annotated-types typing-inspection
  python3 -m pip wheel -q --no-deps -w "$WHEELS" .
  du -sh "$WHEELS"
  exit 0
fi

OUT=${OUT:-$PWD/runs/gpu-check}
MODEL=${GPU_CHECK_MODEL:-large-qwen2}
TRIALS=${GPU_CHECK_TRIALS:-4}
RUNS=${GPU_CHECK_RUNS:-/tmp/gpu-check-runs}
mkdir -p "$OUT" "$RUNS"
exec > >(tee -a "$OUT/gpu_check.log") 2>&1
t0=$SECONDS
DEADLINE=${GPU_CHECK_SECONDS:-540}  # the whole check, collection included, ends by then
step() { echo "== +$((SECONDS - t0)) s: $*"; }
# within() CAP CMD...: run CMD under a time limit of CAP seconds, or less when the deadline is nearer
within() {
  local cap=$1 left=$((DEADLINE - 25 - SECONDS + t0)); shift
  [ "$left" -lt "$cap" ] && cap=$left
  [ "$cap" -gt 5 ] || { echo "skipped (deadline): $*"; return 124; }
  timeout "$cap" "$@"
}

step "install (carried wheels, no network)"
if ! python3 -c 'import trl, optuna, pydantic, autotune' 2>/dev/null; then
  SITE=/tmp/gpu-check-site
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$WHEELS"/*.whl || { echo "install failed: run scripts/gpu_check.sh --prepare first"; exit 1; }
  export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} PATH=$SITE/bin:$PATH
fi
AT=(python3 -P -m autotune)  # -P: the installed autotune, not the source folder here
export AUTOTUNE_CACHE_DIR=${AUTOTUNE_CACHE_DIR:-/tmp/gpu-check-cache} PYTHONUNBUFFERED=1
{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 || true
  python3 -c 'import sys, torch, transformers, trl, optuna
print("python", sys.version.split()[0]); print("torch", torch.__version__, "cuda", torch.version.cuda)
print("transformers", transformers.__version__, "trl", trl.__version__, "optuna", optuna.__version__)'
  nproc
} > "$OUT/versions.txt" 2>&1
cat "$OUT/versions.txt"

step "doctor"
within 60 "${AT[@]}" doctor --out "$RUNS" --json > "$OUT/doctor.json"
within 60 "${AT[@]}" doctor --out "$RUNS" || true

step "doctor --bench"
within 90 "${AT[@]}" doctor --bench --seconds 1 || echo "doctor --bench exited $?"

step "build $MODEL (random weights, no download)"
MODEL_DIR=$(within 120 python3 -P -c "from autotune.workload.tinymodels import ensure_model; print(ensure_model('$MODEL'))") ; MODEL_DIR=${MODEL_DIR##*$'\n'}
echo "$MODEL_DIR"

# the study: micro-batches from the whole global batch down, with and without activation
# checkpointing (the largest without it is where a GPU runs out first)
BATCHES=${GPU_CHECK_BATCHES:-512, 256, 64}
space=$RUNS/space-trl.yaml
cat > "$space" <<EOF
backend: trl
knobs:
  per_device_train_batch_size: {type: int, choices: [$BATCHES], default: ${BATCHES%%,*}, memory: increasing}
  gradient_checkpointing: {type: bool, default: false, memory: decreasing}
EOF
read -r -a job <<< "${GPU_CHECK_JOB:---global-batch 512 --num-generations 8 --max-completion-length 256}"
plan() {  # the estimator's prediction for the study's space (with the calibration table once cached)
  within 60 "${AT[@]}" plan --backend trl --model "$MODEL" --model-config "$MODEL_DIR" --space "$space" \
    "${job[@]}" --json > "$OUT/$1" || echo "plan exited $?"
}
step "plan, before calibration"
plan plan.json

step "doctor --calibrate --model $MODEL"
within 210 "${AT[@]}" doctor --calibrate --model "$MODEL" --out "$RUNS" || echo "doctor --calibrate exited $?"
step "plan, after calibration"
plan plan-calibrated.json

step "search: a real TRL study of $TRIALS trials"
budget=$((DEADLINE - 60 - SECONDS + t0))  # the study stops itself (report written) before the deadline
within 300 "${AT[@]}" search --time-budget "${budget}s" --backend trl --model "$MODEL" --space "$space" --search grid \
  --trials "$TRIALS" --max-steps 3 --confirm-runs 0 "${job[@]}" --out "$RUNS/trl-study" \
  || echo "search exited $?"

step "collect"
tar -czf "$OUT/gpu-runs.tar.gz" -C "$RUNS" --exclude='*.safetensors' --exclude='*.bin' --exclude='cache' . \
  2>/dev/null || true
ls -la "$OUT"
step "done"
