#!/usr/bin/env bash
# Issue 7's ZeRO table: stages 0-3 of `dstrain train --device cuda` on one GPU, step time of each
# stage against stage 0 of the same backend, peak memory per rank and bytes sent per step:
#   nccl  — one process as rank 0 of a launcher world of 1 (RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 ...):
#           with --device cuda, dstrain train joins the launcher's NCCL group;
#   local — --num-ranks 2: two ranks as threads of one process sharing the GPU, the local
#           communicator on device memory.
#
#   bash bench/gpu_zero.sh [OUT_DIR] [--model gpt2:d12] [--batch 8] [--seq 1024] [--steps 10]
#                          [--warmup 3] [--backends "nccl local"] [--data FILE] [--budget-min 8]
#                          [--fresh] [--build-dir build]
#
# OUT_DIR: default $OUT if set, else build/gpu_bench/out. --batch is the micro-batch per rank (the
# local world of 2 trains 2x the tokens per step; compare stages within a backend). Raw files are
# kept in BUILD_DIR/gpu_bench/ and a run already there is not repeated (--fresh: again). Expected
# time on one H100: ~10-40 s per run at d12 B=8 (8 runs: 2-5 min), plus the build when BUILD_DIR
# has no CUDA build (3-6 min). Data as bench/gpu_gpt2.sh (--data, datasets/brown_train.bin, or random
# tokens). Prints timings; asserts none.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ in the checkout

usage() { sed -n '9,11p' "$0" | sed 's/^# \{0,1\}//' >&2; }
say() { printf '[gpu_zero] %s\n' "$*"; }
die() { printf '[gpu_zero] error: %s\n' "$*" >&2; exit 1; }

out_dir="" model="gpt2:d12" batch=8 T=1024 steps=10 warmup=3 backends="nccl local" data="" budget_min=8 fresh=0 build_dir="build"
while (($#)); do
  case "$1" in
    --model) model="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --seq) T="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --warmup) warmup="$2"; shift 2 ;;
    --backends) backends="$2"; shift 2 ;;
    --data) data="$2"; shift 2 ;;
    --budget-min) budget_min="$2"; shift 2 ;;
    --fresh) fresh=1; shift ;;
    --build-dir) build_dir="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) usage; die "unknown option $1" ;;
    *) [ -z "$out_dir" ] || { usage; die "one OUT_DIR only (got $out_dir and $1)"; }; out_dir="$1"; shift ;;
  esac
done
for b in $backends; do [ "$b" = nccl ] || [ "$b" = local ] || die "--backends takes nccl and/or local, not '$b'"; done
[[ "$steps" =~ ^[0-9]+$ && "$warmup" =~ ^[0-9]+$ && "$steps" -ge 1 ]] || die "--steps must be >= 1 and --warmup >= 0"
out_dir="${out_dir:-${OUT:-$build_dir/gpu_bench/out}}"
start_s=$SECONDS
budget_s=$((budget_min * 60))

# shellcheck source=bench/gpu_common.sh
. "$repo/bench/gpu_common.sh"
require_gpu
mkdir -p "$out_dir"

ensure_cuda_build dstrain_cli
dstrain="$build_dir/dstrain"
[ -x "$dstrain" ] || die "$dstrain is missing: build it (cmake --build $build_dir --target dstrain_cli) or drop DSTRAIN_BENCH_NO_BUILD"

cache="$build_dir/gpu_bench/zero_$(echo "$model" | tr -c 'A-Za-z0-9\n' '_')_B${batch}_T${T}_s${steps}_w${warmup}"
[ "$fresh" = 0 ] || rm -rf "$cache"
mkdir -p "$cache/configs"

[ -n "$data" ] || data=$(bench_data)
[ -f "$data" ] || die "--data $data: no such file"
say "model $model, micro-batch $batch per rank, T=$T, $warmup + $steps steps, data $data"

left() { echo $((budget_s - (SECONDS - start_s))); }
point_timeout() { local l; l=$(left); l=$((l + 30)); ((l > 420)) && l=420; ((l < 60)) && l=60; echo "$l"; }
skipped=0

for backend in $backends; do
  for stage in 0 1 2 3; do
    tag="zero_${backend}_s$stage"
    [ ! -s "$cache/$tag.json" ] || continue
    if (($(left) <= 0)); then skipped=$((skipped + 1)); continue; fi
    python3 "$repo/bench/gpu_bench.py" ds-config "$repo/examples/ds_configs/gpt2_d12_bf16_gpu.json" "$cache/configs/s$stage.json" \
      --micro-batch "$batch" --stage "$stage"
    args=(train --deepspeed_config "$cache/configs/s$stage.json" --model "$model" --data "$data" --sequence-length "$T"
          --steps $((warmup + steps)) --device cuda --seed 42 --sample-tokens 0 --val-interval 0 --summary-json "$cache/$tag.json")
    say "$backend stage $stage"
    rc=0
    if [ "$backend" = nccl ]; then
      # One process as the whole launcher world (what torchrun --nproc_per_node 1 exports): with
      # --device cuda, dstrain train joins the launcher's NCCL group, here of world size 1.
      env RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT="${MASTER_PORT:-29533}" \
        timeout "$(point_timeout)" "$dstrain" "${args[@]}" > "$cache/$tag.log" 2>&1 || rc=$?
      grep -q 'nccl' "$cache/$tag.log" || say "  warning: the log does not mention nccl: did the run join the launcher's NCCL group?"
    else
      timeout "$(point_timeout)" "$dstrain" "${args[@]}" --num-ranks 2 > "$cache/$tag.log" 2>&1 || rc=$?
    fi
    ((rc == 0)) || say "  $backend stage $stage failed (exit $rc$([ $rc = 124 ] && echo ', timed out')): $(tail -n 1 "$cache/$tag.log")"
  done
done

python3 "$repo/bench/gpu_bench.py" zero-table "$cache" --warmup "$warmup"
if [ "$(cd "$cache" && pwd)" != "$(cd "$out_dir" && pwd)" ]; then cp -r "$cache/." "$out_dir/"; fi
say "files: $out_dir (table_zero.md, results_zero.json, per-run logs and summaries); took $((SECONDS - start_s)) s"
if ((skipped > 0)); then
  say "$skipped run(s) not started: the $budget_min-minute budget is spent. Run the same command again to finish (done runs are kept in $cache)."
fi
