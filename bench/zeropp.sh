#!/usr/bin/env bash
# ZeRO++ and MiCS measured (docs/zero.md §10): for plain ZeRO-3, qwZ, hpZ, qgZ, all three, MiCS and
# MiCS with the hierarchical gather, the step time and the bytes one rank sends per step — in all
# and across the node boundary — of `dstrain train` on
#   1. 8 local ranks modelled as 2 nodes of 4 (--num-ranks 8 --ranks-per-node 4), and
#   2. 4 MPI processes as 2 nodes of 2 (mpiexec -n 4, --ranks-per-node 2),
# same config and global batch, a Llama shape on Brown, every layer partitioned and released after
# each call (persistence threshold 0, reuse distance 0: a model too large to keep gathered from its
# forward to its backward, where the backward's gathers are hpZ's to take off the nodes' link). The bytes are counted by the communicators
# (--summary-json's step_comm, rank 0, the last step); the last column sets the inter-node bytes
# against the ZeRO++ paper's claim of 4x less than ZeRO-3. On one machine the "nodes" share memory,
# so the step times show the cost of the extra work (quantization, the two-level collectives), not
# the saving a slow inter-node link would give. Never asserts.
#
#   bash bench/zeropp.sh [STEPS]        (after a build in ./build and scripts/setup.sh's data)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DSTRAIN_BUILD_DIR:-$repo/build}"
data="$repo/datasets/brown_train.bin"
steps="${1:-6}"
model="llama:L4-C256-H4-KV2-I688-V50304-T128"
mpiexec=(mpiexec)
if mpiexec --version 2>&1 | grep -qE "Open MPI|OpenRTE"; then mpiexec+=(--allow-run-as-root --oversubscribe); fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# figures <summary.json>: "s/step total-bytes cross-node-bytes" (steps after the first 2; rank 0's last step).
figures() {
  python3 -c "
import json,sys
s=json.load(open(sys.argv[1])); t=s['step_seconds'][2:] or s['step_seconds']
c=s['zero']['ranks'][0]['step_comm']['total']
print('%.3f %d %d' % (sum(t)/len(t), c['bytes'], c['cross_node_bytes']))" "$1"
}

variants=(
  "ZeRO-3|"
  "qwZ|\"zero_quantized_weights\": true,"
  "hpZ|\"zero_hpz_partition_size\": PER_NODE,"
  "qgZ|\"zero_quantized_gradients\": true,"
  "qwZ+hpZ+qgZ|\"zero_quantized_weights\": true, \"zero_hpz_partition_size\": PER_NODE, \"zero_quantized_gradients\": true,"
  "MiCS (s = node)|\"mics_shard_size\": PER_NODE,"
  "MiCS hierarchical (s = W)|\"mics_shard_size\": WORLD, \"mics_hierarchical_params_gather\": true,"
)

# run <label> <world> <per-node> <launch: local|mpi>
run_all() {
  local world="$1" per_node="$2" launch="$3" base_cross=""
  printf '%-28s %10s %14s %14s %12s\n' "variant" "s/step" "bytes/step" "cross-node" "vs ZeRO-3"
  for v in "${variants[@]}"; do
    local label="${v%%|*}" keys="${v#*|}"
    keys="${keys//PER_NODE/$per_node}"
    keys="${keys//WORLD/$world}"
    cat > "$tmp/ds.json" <<JSON
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": 1000, "gradient_clipping": 1.0,
 "bf16": {"enabled": true},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
 "zero_optimization": {$keys "stage": 3, "stage3_param_persistence_threshold": 0, "stage3_max_reuse_distance": 0}}
JSON
    local args=(train --deepspeed_config "$tmp/ds.json" --model "$model" --data "$data" --sequence-length 128 --steps "$steps" --sample-tokens 0
                --ranks-per-node "$per_node" --summary-json "$tmp/s.json")
    if [ "$launch" = local ]; then
      "$build/dstrain" "${args[@]}" --num-ranks "$world" >/dev/null 2>"$tmp/err" || { echo "$label: failed"; cat "$tmp/err"; continue; }
    else
      "${mpiexec[@]}" -n "$world" "$build/dstrain" "${args[@]}" >/dev/null 2>"$tmp/err" || { echo "$label: failed"; cat "$tmp/err"; continue; }
    fi
    read -r sec bytes cross < <(figures "$tmp/s.json")
    [ -z "$base_cross" ] && base_cross="$cross"
    printf '%-28s %10s %14d %14d %11.2fx\n' "$label" "$sec" "$bytes" "$cross" "$(python3 -c "print(($base_cross or 1)/max($cross,1))")"
  done
  echo "(the ZeRO++ paper: qwZ + hpZ + qgZ send 4x less than ZeRO-3 across nodes)"
}

echo "== $model, bf16, micro-batch 2 x T 128 per rank: 8 local ranks as 2 nodes of 4 =="
run_all 8 4 local
if command -v mpiexec >/dev/null; then
  echo
  echo "== the same: mpiexec -n 4 as 2 nodes of 2 =="
  run_all 4 2 mpi
fi
