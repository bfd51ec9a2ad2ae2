#!/usr/bin/env bash
# Issue 7's headline table: GPT-2 124M (gpt2:d12), T=1024, bf16, one GPU. For each micro-batch B
# and activation checkpointing off/on: dstrain's tokens/s, MFU, peak memory, and the PyTorch peer's
# (bench/pytorch_gpt2_gpu.py: bf16 autocast, fused AdamW, SDPA flash attention, torch.compile) on
# the same machine, and the ratio; first the bf16 GEMM peak this GPU reaches (bench_gemm_peak).
#
#   bash bench/gpu_gpt2.sh [OUT_DIR] [--batches "8 16 32 64"] [--ckpt "off on"] [--steps 20]
#                          [--warmup 5] [--data FILE] [--no-peer] [--no-ours] [--no-compile]
#                          [--budget-min 8] [--fresh] [--retry-failed] [--build-dir build]
#
# OUT_DIR: where the table, logs and JSON go (default: $OUT if set, else build/gpu_bench/out).
# Every point's raw files are kept in BUILD_DIR/gpu_bench/ (git-ignored, survives between calls on
# the same machine) and a point already there is not run again (--fresh: run everything again); a
# point that failed (not for time) is not retried either (--retry-failed: retry those).
# A call stops starting new points after --budget-min minutes (default 8) and prints the table of
# what is done: run the same command again to finish. Expected time on one H100: building dstrain
# (only when BUILD_DIR has no CUDA build) 3-6 min at -j16; then per point ~15-60 s for dstrain
# (d12, 25 steps) and ~40-90 s for PyTorch (mostly torch.compile); the GEMM peak ~10 s. The full
# 4 x 2 grid with the peer takes ~10-15 min: two calls (or --ckpt off, then --ckpt on).
#
# Data: --data FILE (an llm.c token file, `dstrain prepare-data`), else datasets/brown_train.bin when
# present (scripts/setup.sh makes it; carry it to a machine without internet: 2.5 MB), else a
# file of random GPT-2 token ids written here (throughput does not depend on the tokens).
# Needs: nvcc, CMake, an NVIDIA GPU; python3 with torch (CUDA) for the peer (PYTHON=... to choose).
# Prints timings; asserts none.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ in the checkout

usage() { sed -n '7,9p' "$0" | sed 's/^# \{0,1\}//' >&2; }
say() { printf '[gpu_gpt2] %s\n' "$*"; }
die() { printf '[gpu_gpt2] error: %s\n' "$*" >&2; exit 1; }

out_dir="" batches="8 16 32 64" ckpts="off on" steps=20 warmup=5 data="" peer=1 ours=1 compile=1 budget_min=8 fresh=0 retry=0
build_dir="build"
while (($#)); do
  case "$1" in
    --batches) batches="$2"; shift 2 ;;
    --ckpt) ckpts="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --no-peer) peer=0; shift ;;
    --no-ours) ours=0; shift ;;
    --no-compile) compile=0; shift ;;
    --budget-min) budget_min="$2"; shift 2 ;;
    --fresh) fresh=1; shift ;;
    --retry-failed) retry=1; shift ;;
    --build-dir) build_dir="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) usage; die "unknown option $1" ;;
    *) [ -z "$out_dir" ] || { usage; die "one OUT_DIR only (got $out_dir and $1)"; }; out_dir="$1"; shift ;;
  esac
done
for c in $ckpts; do [ "$c" = off ] || [ "$c" = on ] || die "--ckpt takes off and/or on, not '$c'"; done
[[ "$steps" =~ ^[0-9]+$ && "$warmup" =~ ^[0-9]+$ && "$steps" -ge 1 ]] || die "--steps must be >= 1 and --warmup >= 0"
out_dir="${out_dir:-${OUT:-$build_dir/gpu_bench/out}}"
start_s=$SECONDS
budget_s=$((budget_min * 60))
T=1024

# ---- the GPU ----
# shellcheck source=bench/gpu_common.sh
. "$repo/bench/gpu_common.sh"
require_gpu
mkdir -p "$out_dir"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,clocks.max.mem,power.limit,driver_version --format=csv > "$out_dir/gpu.txt" 2>&1 || true
say "GPU: $(sed -n 2p "$out_dir/gpu.txt")"

# ---- build (only what is missing) ----
ensure_cuda_build dstrain_cli bench_gemm_peak
dstrain="$build_dir/dstrain"
if [ "$ours" = 1 ]; then
  [ -x "$dstrain" ] || die "$dstrain is missing: build it (cmake --build $build_dir --target dstrain_cli) or drop DSTRAIN_BENCH_NO_BUILD"
fi

# ---- points are cached per settings ----
cache="$build_dir/gpu_bench/gpt2_s${steps}_w${warmup}$([ "$compile" = 1 ] || echo _eager)"
[ "$fresh" = 0 ] || rm -rf "$cache"
[ "$retry" = 0 ] || rm -f "$cache"/*.failed
mkdir -p "$cache/configs"
export TORCHINDUCTOR_CACHE_DIR="$build_dir/gpu_bench/inductor"  # compiled kernels reused by later points and calls

# ---- data ----
[ -n "$data" ] || data=$(bench_data)
[ -f "$data" ] || die "--data $data: no such file"
say "data: $data"

# ---- the peer's python ----
py=""
if [ "$peer" = 1 ]; then
  for cand in "${PYTHON:-}" python3 /usr/bin/python3 python; do
    [ -n "$cand" ] || continue
    if "$cand" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then py="$cand"; break; fi
  done
  if [ -z "$py" ]; then
    say "warning: no python with a CUDA torch found (tried \$PYTHON, python3, /usr/bin/python3, python): the PyTorch columns stay empty"
    peer=0
  else
    say "peer: $py, torch $("$py" -c 'import torch; print(torch.__version__)')"
  fi
fi

# ---- 1. the bf16 GEMM peak ----
if [ ! -s "$cache/gemm_peak.json" ]; then
  say "bench_gemm_peak (bf16, cuBLASLt, fp32 accumulation)"
  if "$build_dir/bench/bench_gemm_peak" --bt 16384 2>&1 | tee "$cache/gemm_peak.txt"; then
    tail -n 1 "$cache/gemm_peak.txt" > "$cache/gemm_peak.json"
  else
    say "warning: bench_gemm_peak failed (see $cache/gemm_peak.txt); MFU against the measured peak stays empty"
  fi
fi

left() { echo $((budget_s - (SECONDS - start_s))); }
point_timeout() { local l; l=$(left); l=$((l + 30)); ((l > 420)) && l=420; ((l < 60)) && l=60; echo "$l"; }
skipped=0

run_ours() {  # B ckpt
  local B="$1" ck="$2" tag="B$1_ckpt$2" extra=()
  [ "$ck" = on ] && extra+=(--checkpoint-activations)
  python3 "$repo/bench/gpu_bench.py" ds-config "$repo/examples/ds_configs/gpt2_d12_bf16_gpu.json" "$cache/configs/d12_B$B.json" \
    --micro-batch "$B" --stage 0
  say "dstrain  B=$B ckpt=$ck ($((warmup + steps)) steps)"
  local rc=0
  timeout "$(point_timeout)" "$dstrain" train --deepspeed_config "$cache/configs/d12_B$B.json" --model gpt2:d12 --data "$data" \
    --sequence-length "$T" --steps $((warmup + steps)) --device cuda --seed 42 --sample-tokens 0 --val-interval 0 \
    --summary-json "$cache/ours_$tag.json" "${extra[@]}" > "$cache/ours_$tag.log" 2>&1 || rc=$?
  ((rc == 0)) || say "  dstrain B=$B ckpt=$ck failed (exit $rc$([ $rc = 124 ] && echo ', timed out')): $(tail -n 1 "$cache/ours_$tag.log")"
  # A failure other than the time limit is not retried by the next call (--retry-failed does).
  ((rc == 0 || rc == 124)) || echo "$rc" > "$cache/ours_$tag.failed"
}

run_peer() {  # B ckpt
  local B="$1" ck="$2" tag="B$1_ckpt$2" extra=()
  [ "$ck" = on ] && extra+=(--checkpoint)
  [ "$compile" = 1 ] || extra+=(--no-compile)
  say "pytorch  B=$B ckpt=$ck ($warmup + $steps steps)"
  local rc=0
  timeout "$(point_timeout)" "$py" "$repo/bench/pytorch_gpt2_gpu.py" --batch "$B" --seq "$T" --steps "$steps" --warmup "$warmup" \
    --data "$data" "${extra[@]}" > "$cache/torch_$tag.json" 2> "$cache/torch_$tag.log" || rc=$?
  ((rc == 0)) || say "  pytorch B=$B ckpt=$ck: exit $rc$([ $rc = 124 ] && echo ', timed out')$([ $rc = 3 ] && echo ', out of memory'): $(tail -n 1 "$cache/torch_$tag.log")"
  ((rc == 0 || rc == 124)) || echo "$rc" > "$cache/torch_$tag.failed"
}

# ---- 2. the grid: per point dstrain then the peer, so a partial run has whole rows ----
for ck in $ckpts; do
  for B in $batches; do
    tag="B${B}_ckpt$ck"
    if [ "$ours" = 1 ] && [ ! -s "$cache/ours_$tag.json" ] && [ ! -f "$cache/ours_$tag.failed" ]; then
      if (($(left) > 0)); then run_ours "$B" "$ck"; else skipped=$((skipped + 1)); fi
    fi
    if [ "$peer" = 1 ] && ! grep -q tokens_per_s "$cache/torch_$tag.json" 2>/dev/null && [ ! -f "$cache/torch_$tag.failed" ]; then
      if (($(left) > 0)); then run_peer "$B" "$ck"; else skipped=$((skipped + 1)); fi
    fi
  done
done

# ---- 3. the table ----
python3 "$repo/bench/gpu_bench.py" gpt2-table "$cache" --batches "$batches" --ckpt "$ckpts" --warmup "$warmup" \
  --gemm "$cache/gemm_peak.json"
if [ "$(cd "$cache" && pwd)" != "$(cd "$out_dir" && pwd)" ]; then cp -r "$cache/." "$out_dir/"; fi
cp "$out_dir/gpu.txt" "$cache/gpu.txt" 2>/dev/null || true
say "files: $out_dir (table_gpt2.md, results_gpt2.json, gemm_peak.txt, per-point logs and JSON); took $((SECONDS - start_s)) s"
if ((skipped > 0)); then
  say "$skipped run(s) not started: the $budget_min-minute budget is spent. Run the same command again to finish (done points are kept in $cache)."
fi
