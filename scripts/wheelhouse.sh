#!/usr/bin/env bash
# Build a wheelhouse: autotune and everything it needs, as wheels in one folder, for a GPU node without
# internet. Run it on a connected machine; copy the folder to the node; install there with
#     pip install --no-index --find-links WHEELHOUSE 'autotune-grpo[EXTRAS]'
#
# Usage: scripts/wheelhouse.sh OUT_DIR [options] [-- more pip download arguments]
#   --extras trl,deepspeed   autotune's extras to include (default: none, the core only)
#   --python-version 3.11    the node's Python (default: this interpreter's)
#   --platform manylinux2014_x86_64
#                            the node's platform tag (default: this machine's; repeatable as pip's)
#   --python PYTHON          the interpreter whose pip downloads (default: python3)
#   --no-build-isolation     build autotune's wheel with that interpreter's setuptools and wheel
#                            (faster; they must be installed there)
# After --, arguments go to `pip download` as they are, e.g. a CUDA build of torch:
#   scripts/wheelhouse.sh wh --extras trl -- --extra-index-url https://download.pytorch.org/whl/cu124
#
# With --python-version or --platform, pip takes wheels only (--only-binary=:all:): a package without a
# wheel for the node must be built there or on a machine like it. Nothing is installed here.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
if [ $# -lt 1 ] || [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  usage
  [ $# -lt 1 ] && exit 2 || exit 0
fi
out=$1
shift
extras=""
py=${PYTHON:-python3}
target=()
isolation=()
while [ $# -gt 0 ]; do
  case "$1" in
    --extras) extras=$2; shift 2 ;;
    --python-version) target+=(--python-version "$2"); shift 2 ;;
    --platform) target+=(--platform "$2"); shift 2 ;;
    --python) py=$2; shift 2 ;;
    --no-build-isolation) isolation=(--no-build-isolation); shift ;;
    --) shift; break ;;
    *) echo "error: unknown option $1. Run scripts/wheelhouse.sh --help" >&2; exit 2 ;;
  esac
done

mkdir -p "$out"
out=$(cd "$out" && pwd)
# 1. autotune's own wheel (built from this checkout)
"$py" -m pip wheel -q --no-deps "${isolation[@]}" --wheel-dir "$out" .
wheel=$(ls -t "$out"/autotune_grpo-*.whl | head -n 1)
spec="$wheel"
[ -n "$extras" ] && spec="autotune-grpo[$extras] @ file://$wheel"
# 2. every dependency, as the node will need it
only_binary=()
[ ${#target[@]} -gt 0 ] && only_binary=(--only-binary=:all:)
"$py" -m pip download -q --dest "$out" "${only_binary[@]}" "${target[@]}" "$spec" "$@"
n=$(ls "$out" | wc -l)
echo "wheelhouse $out: $n file(s). On the node:"
echo "  pip install --no-index --find-links $out 'autotune-grpo${extras:+[$extras]}'"
