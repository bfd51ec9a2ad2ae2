#!/usr/bin/env bash
# Tensor x sequence parallelism through the CLI, on MPI processes and on local ranks: the same
# `dstrain train` run with TP 2 x SP 2 x DP 1 (4 ranks) under `mpiexec -n 4 ... --comm mpi` and with
# `--num-ranks 4` (threads of one process): tokens/s of both (steady, from --summary-json: the
# steps after the first) and whether the per-step losses are identical (they should be: the MPI
# backend reduces like the local one, fp32 in rank order). Prints; never asserts (the exit status
# is 0 whatever the comparison says).
#
#   bash bench/parallel_mpi_vs_local.sh [DATA.bin] [MODEL] [STEPS] [T] [MICRO_BATCH]
#   defaults: /tmp/fox.bin (GPT-2 tokens), gpt2:L4-C256-H8-T256, 8 steps, T 256, micro-batch 4
#   DSTRAIN_BUILD_DIR=... selects the build (default ./build); it needs the MPI backend (DSTRAIN_MPI).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${DSTRAIN_BUILD_DIR:-$repo/build}"
data="${1:-/tmp/fox.bin}"
model="${2:-gpt2:L4-C256-H8-T256}"
steps="${3:-8}"
T="${4:-256}"
mb="${5:-4}"
mpiexec=(mpiexec)
if mpiexec --version 2>&1 | grep -qE "Open MPI|OpenRTE"; then mpiexec+=(--allow-run-as-root --oversubscribe); fi
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT

cat > "$tmp/ds.json" <<JSON
{"train_micro_batch_size_per_gpu": $mb, "gradient_accumulation_steps": 1, "steps_per_print": 1000, "gradient_clipping": 1.0,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.95], "weight_decay": 0.1}},
 "zero_optimization": {"stage": 1},
 "tensor_parallel": {"autotp_size": 2}, "sequence_parallel_size": 2}
JSON
args=(train --deepspeed_config "$tmp/ds.json" --model "$model" --data "$data" --sequence-length "$T" --steps "$steps" --sample-tokens 0)

echo "== $model, T $T, micro-batch $mb, $steps steps, ZeRO 1, world 4 = data-parallel 1 x sequence-parallel 2 x tensor-parallel 2 =="
echo "\$ dstrain ${args[*]} --num-ranks 4"
"$build/dstrain" "${args[@]}" --num-ranks 4 --summary-json "$tmp/local.json" > "$tmp/local.log" 2>&1 || { cat "$tmp/local.log"; exit 1; }
grep -m1 "mesh:" "$tmp/local.log" || true
echo "\$ ${mpiexec[*]} -n 4 dstrain ${args[*]} --comm mpi"
"${mpiexec[@]}" -n 4 "$build/dstrain" "${args[@]}" --comm mpi --summary-json "$tmp/mpi.json" > "$tmp/mpi.log" 2>&1 || { cat "$tmp/mpi.log"; exit 1; }
grep -m1 "mesh:" "$tmp/mpi.log" || true

python3 - "$tmp/local.json" "$tmp/mpi.json" <<'PY'
import json, sys
loc, mpi = (json.load(open(p)) for p in sys.argv[1:3])
def line(name, s):
    t = s["step_seconds"][1:] or s["step_seconds"]
    return "%-26s %8.0f tokens/s steady (%6.3f s/step, median of steps 2..%d)  peak %6.1f MiB/rank" % (
        name, s["steady_tokens_per_s"], sorted(t)[len(t) // 2], len(s["step_seconds"]), s["peak_memory_bytes"]["total"] / 2**20)
print(line("4 local ranks (threads):", loc))
print(line("4 MPI processes:", mpi))
a, b = loc["train_losses"], mpi["train_losses"]
same = a == b
print("losses per step, local: " + " ".join("%.6f" % x for x in a))
print("losses per step, MPI:   " + " ".join("%.6f" % x for x in b))
if same:
    print("losses: identical (%d steps, bit for bit as JSON doubles)" % len(a))
else:
    d = max(abs(x - y) for x, y in zip(a, b)) if len(a) == len(b) else float("nan")
    print("losses: DIFFER (max |diff| %.3g over %d / %d steps)" % (d, len(a), len(b)))
PY
