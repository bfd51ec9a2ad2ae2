#!/usr/bin/env bash
# The MPI backend measured on this machine (docs/mpi.md quotes the figures):
#   1. bench_mpi_allreduce: MPI_Allreduce against MpiCommunicator::all_reduce, OSU-style;
#   2. the step time of `dstrain train` with 2 MPI processes (mpiexec -n 2) against 2 local ranks
#      (--num-ranks 2, threads of one process), same config, same global batch: GPT-2 L4-C256
#      (and d12 with --d12). Mean of the steps after the first 2 (warm-up), from --summary-json.
# Never asserts.
#
#   bash bench/mpi_vs_local.sh [--d12]        (after a build in ./build and scripts/setup.sh's data)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DSTRAIN_BUILD_DIR:-$repo/build}"
data="$repo/datasets/brown_train.bin"
mpiexec=(mpiexec)
if mpiexec --version 2>&1 | grep -qE "Open MPI|OpenRTE"; then mpiexec+=(--allow-run-as-root --oversubscribe); fi
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT

echo "== all-reduce: mpiexec -n 2 bench_mpi_allreduce =="
"${mpiexec[@]}" -n 2 "$build/bench/bench_mpi_allreduce" $((64 << 20)) 20

# mean_step <summary.json>: mean seconds of the steps after the first 2, and tokens/s.
mean_step() {
  python3 -c "
import json,sys
s=json.load(open(sys.argv[1])); t=s['step_seconds'][2:] or s['step_seconds']
print('%.3f s/step  %8.0f tokens/s' % (sum(t)/len(t), s['steady_tokens_per_s']))" "$1"
}

# step <label> <model> <micro-batch> <T> <steps> <stage>
step() {
  local label="$1" model="$2" mb="$3" T="$4" steps="$5" stage="$6"
  cat > "$tmp/ds.json" <<JSON
{"train_micro_batch_size_per_gpu": $mb, "gradient_accumulation_steps": 1, "steps_per_print": 1000, "gradient_clipping": 1.0,
 "optimizer": {"type": "AdamW", "params": {"lr": 2e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
 "zero_optimization": {"stage": $stage}}
JSON
  local args=(train --deepspeed_config "$tmp/ds.json" --model "$model" --data "$data" --sequence-length "$T" --steps "$steps" --sample-tokens 0)
  "$build/dstrain" "${args[@]}" --num-ranks 2 --summary-json "$tmp/local.json" >/dev/null
  "${mpiexec[@]}" -n 2 "$build/dstrain" "${args[@]}" --summary-json "$tmp/mpi.json" >/dev/null
  printf '%-34s stage %d | 2 local ranks: %s | 2 MPI processes: %s\n' "$label" "$stage" "$(mean_step "$tmp/local.json")" "$(mean_step "$tmp/mpi.json")"
}

echo "== step time, same config and global batch (micro-batch per rank x 2 ranks) =="
for stage in 0 3; do step "gpt2:L4-C256-H4-T128 B=8 T=128" gpt2:L4-C256-H4-T128 8 128 8 "$stage"; done
if [ "${1:-}" = "--d12" ]; then
  step "gpt2:d12 B=2 T=128" gpt2:d12 2 128 5 2
fi
