#!/usr/bin/env bash
# Everything issue 7 measures on one GPU, in one command that can be repeated until it says done:
#   1. build dstrain, bench_gemm_peak and the GPU test of the local communicator (CUDA, Release);
#   2. run that test (ranks sharing the GPU: every collective bit for bit against the host path);
#   3. bench/gpu_gpt2.sh --ckpt off   (GEMM peak, dstrain vs PyTorch at B = 8..64);
#   4. bench/gpu_zero.sh              (ZeRO stages 0-3: NCCL world 1, 2 local ranks);
#   5. bench/gpu_gpt2.sh --ckpt "off on" (the checkpointing rows; the done rows are kept).
#
#   bash bench/gpu_all.sh [OUT_DIR] [--budget-min 8] [--build-dir build]
#
# Each step keeps its results in BUILD_DIR/gpu_bench/ and is skipped (or resumes) when run again;
# a call stops starting work after --budget-min minutes (default 8: under a 10-minute command
# limit). On one H100: the build 3-6 min (16 cores), the test ~1 min, the d12 grid with the peer
# ~10-15 min, ZeRO 2-5 min: expect three calls. Everything goes to OUT_DIR (default $OUT, else
# build/gpu_bench/out): gpu_all.md (both tables and the test's result), and each script's files.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
export PYTHONDONTWRITEBYTECODE=1

say() { printf '[gpu_all] %s\n' "$*"; }
die() { printf '[gpu_all] error: %s\n' "$*" >&2; exit 1; }

out_dir="" budget_min=8 build_dir="build"
while (($#)); do
  case "$1" in
    --budget-min) budget_min="$2"; shift 2 ;;
    --build-dir) build_dir="$2"; shift 2 ;;
    -h|--help) sed -n '9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 0 ;;
    -*) die "unknown option $1 (usage: bash bench/gpu_all.sh [OUT_DIR] [--budget-min 8] [--build-dir build])" ;;
    *) out_dir="$1"; shift ;;
  esac
done
out_dir="${out_dir:-${OUT:-$build_dir/gpu_bench/out}}"
start_s=$SECONDS
left_min() { echo $(((budget_min * 60 - (SECONDS - start_s)) / 60)); }
mkdir -p "$out_dir"

# shellcheck source=bench/gpu_common.sh
. "$repo/bench/gpu_common.sh"
require_gpu
ensure_cuda_build dstrain_cli bench_gemm_peak
# The local communicator's GPU test, when the build has the tests (configured with them when it can).
if grep -q '^DSTRAIN_BUILD_TESTS:BOOL=ON' "$build_dir/CMakeCache.txt"; then ensure_cuda_build test_gpu_local_comm; fi
export DSTRAIN_BENCH_NO_BUILD=1  # built above, for the scripts below

state="$build_dir/gpu_bench"
mkdir -p "$state"
test_bin="$build_dir/tests/gpu/test_gpu_local_comm"
if [ -x "$test_bin" ] && [ ! -s "$state/test_gpu_local_comm.txt" ]; then
  say "test_gpu_local_comm (local communicator on device memory)"
  rc=0
  timeout 300 "$test_bin" > "$state/test_gpu_local_comm.log" 2>&1 || rc=$?
  tail -n 3 "$state/test_gpu_local_comm.log"
  { echo "test_gpu_local_comm: exit $rc"; grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$state/test_gpu_local_comm.log" || true; } > "$state/test_gpu_local_comm.txt"
elif [ ! -x "$test_bin" ]; then
  say "no $test_bin (this build has no tests): skipping the local communicator's GPU test"
fi

run_step() {  # name command...
  local m; m=$(left_min)
  if ((m < 1)); then say "budget spent before $1: run the same command again"; return 0; fi
  say "$1 (budget $m min)"
  "${@:2}" --budget-min "$m" --build-dir "$build_dir" "$out_dir" || say "$1 exited with $? (see its output above)"
}
run_step "gpu_gpt2.sh --ckpt off" bash "$repo/bench/gpu_gpt2.sh" --ckpt off
run_step "gpu_zero.sh" bash "$repo/bench/gpu_zero.sh"
run_step "gpu_gpt2.sh --ckpt \"off on\"" bash "$repo/bench/gpu_gpt2.sh" --ckpt "off on"

{
  echo "# Issue 7 on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  echo
  [ -s "$state/test_gpu_local_comm.txt" ] && { echo '```'; cat "$state/test_gpu_local_comm.txt"; echo '```'; echo; }
  [ -s "$out_dir/table_gpt2.md" ] && { cat "$out_dir/table_gpt2.md"; echo; }
  [ -s "$out_dir/table_zero.md" ] && cat "$out_dir/table_zero.md"
} > "$out_dir/gpu_all.md"
cp "$state"/test_gpu_local_comm.* "$out_dir/" 2>/dev/null || true
say "summary: $out_dir/gpu_all.md; took $((SECONDS - start_s)) s"
