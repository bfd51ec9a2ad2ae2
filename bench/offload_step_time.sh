#!/usr/bin/env bash
# Step time with the optimizer offloaded against the same run in memory (docs/offload.md §10):
# GPT-2 d12 on the CPU device, `dstrain train` with the same data, seed and batch, runs taking turns.
# Prints figures; never asserts.
#
#   bench/offload_step_time.sh [NVME_DIR] [PAIRS] [STEPS]
#   e.g. bench/offload_step_time.sh /tmp/dstrain_nvme 3 3
#   environment: MODEL (gpt2:d12), B (4), T (256), DTYPES ("fp32 bf16"), SUB_GROUP (1e7),
#                BUFFERS (4: offload_optimizer.buffer_count), COMPARE ("s3nvme s3sync s2cpu"), DSTRAIN
#
# Comparisons (each is a pair of runs: a baseline in memory and the offloaded run):
#   s3nvme  stage 3, no offload      vs  stage 3, offload_optimizer nvme, pipeline_read + pipeline_write
#   s3sync  stage 3, no offload      vs  stage 3, offload_optimizer nvme, both pipelines off: every
#           transfer waited for — its I/O wait is the time the transfers take when nothing hides them
#   s2cpu   stage 2, no offload      vs  stage 2, offload_optimizer cpu (nvme below stage 3 is cpu, as
#           in DeepSpeed: stage 3 is where the nvme figure is)
# A shared machine's load changes from minute to minute, so the two runs of a pair run back to back,
# the order alternating between pairs, and each pair gives its own ratio: median step time
# (steps 2..STEPS; step 1 pays first-touch page faults) offloaded / in memory; the table gives the
# ratios of every pair and their median. I/O: the summary's io_wait_seconds (the time the step
# blocked on NVMe, docs/offload.md §9) per step; hidden share = 1 - wait pipelined / wait synchronous
# (the same bytes; the synchronous run hides none of them).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/.."
dstrain="${DSTRAIN:-$root/build/dstrain}"
nvme_dir="${1:-/tmp/dstrain_nvme}"
pairs="${2:-3}"
steps="${3:-3}"
model="${MODEL:-gpt2:d12}"
batch="${B:-4}"
seq="${T:-256}"
dtypes="${DTYPES:-fp32 bf16}"
sub_group="${SUB_GROUP:-1e7}"
buffers="${BUFFERS:-4}"
compare="${COMPARE:-s3nvme s3sync s2cpu}"
data="${DATA:-$root/datasets/brown_train.bin}"
python="${PYTHON:-python3}"
[ -x "$dstrain" ] || { echo "no dstrain at $dstrain (build it, or set DSTRAIN)" >&2; exit 1; }
[ -f "$data" ] || { echo "no token file $data (scripts/setup.sh prepares datasets/brown_train.bin; or set DATA)" >&2; exit 1; }
mkdir -p "$nvme_dir"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

# config NAME DTYPE STAGE OFFLOAD(none|cpu|nvme|nvmesync)
config() {
  local precision="" offload=""
  [ "$2" = bf16 ] && precision='"bf16": { "enabled": true },'
  case "$4" in
    cpu) offload=", \"offload_optimizer\": { \"device\": \"cpu\", \"pin_memory\": true }" ;;
    nvme) offload=", \"offload_optimizer\": { \"device\": \"nvme\", \"nvme_path\": \"$nvme_dir\", \"buffer_count\": $buffers, \"pipeline_read\": true, \"pipeline_write\": true }" ;;
    nvmesync) offload=", \"offload_optimizer\": { \"device\": \"nvme\", \"nvme_path\": \"$nvme_dir\", \"buffer_count\": $buffers, \"pipeline_read\": false, \"pipeline_write\": false }" ;;
  esac
  cat >"$out/$1.json" <<EOF
{
  "train_micro_batch_size_per_gpu": $batch,
  "gradient_accumulation_steps": 1,
  "steps_per_print": 1,
  $precision
  "zero_optimization": { "stage": $3, "sub_group_size": $sub_group $offload },
  "aio": { "block_size": 1048576, "queue_depth": 32, "intra_op_parallelism": 1 },
  "optimizer": { "type": "AdamW", "params": { "lr": 2e-4 } }
}
EOF
}

run() {  # run NAME: one training run, its summary in $out/NAME.summary.json
  "$dstrain" train --deepspeed_config "$out/$1.json" --model "$model" --sequence-length "$seq" --data "$data" \
    --steps "$steps" --val-interval 0 --sample-tokens 0 --summary-json "$out/$1.summary.json" >"$out/$1.log" 2>&1 ||
    { echo "run $1 failed:" >&2; tail -20 "$out/$1.log" >&2; exit 1; }
  "$python" -c 'import json,sys; j=json.load(open(sys.argv[1])); print(" ".join(f"{x:.2f}" for x in j["step_seconds"]))' \
    "$out/$1.summary.json" | sed "s/^/  $1: step seconds /"
}

echo "$model B $batch T $seq, $steps steps a run, $pairs pairs, sub_group_size $sub_group, buffer_count $buffers, nvme_path $nvme_dir ($(findmnt -no SOURCE,FSTYPE -T "$nvme_dir"))"
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the start"
for dtype in $dtypes; do
  for c in $compare; do
    case "$c" in
      s3nvme) config "${c}_${dtype}_base" "$dtype" 3 none; config "${c}_${dtype}_off" "$dtype" 3 nvme ;;
      s3sync) config "${c}_${dtype}_base" "$dtype" 3 none; config "${c}_${dtype}_off" "$dtype" 3 nvmesync ;;
      s2cpu) config "${c}_${dtype}_base" "$dtype" 2 none; config "${c}_${dtype}_off" "$dtype" 2 cpu ;;
      *) echo "unknown comparison $c (s3nvme, s3sync, s2cpu)" >&2; exit 2 ;;
    esac
  done
done
for p in $(seq 1 "$pairs"); do
  for dtype in $dtypes; do
    for c in $compare; do
      echo "pair $p, $c $dtype (load average $(cut -d' ' -f1 /proc/loadavg))"
      if [ $((p % 2)) = 1 ]; then order="base off"; else order="off base"; fi
      for side in $order; do
        name="${c}_${dtype}_${side}"
        run "$name"
        cp "$out/$name.summary.json" "$out/${name}_$p.summary.json"
      done
    done
  done
done
echo "load average $(cut -d' ' -f1-3 /proc/loadavg) at the end"

"$python" - "$out" "$pairs" "$dtypes" "$compare" <<'PY'
import json, os, statistics, sys
out, pairs, dtypes, compare = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
label = {"s3nvme": "stage 3, nvme pipelined vs in memory", "s3sync": "stage 3, nvme synchronous vs in memory",
         "s2cpu": "stage 2, cpu offload vs in memory"}

def load(c, dtype, side, p):
    return json.load(open(os.path.join(out, f"{c}_{dtype}_{side}_{p}.summary.json")))

def step_time(j):  # median of the steps after the first
    s = j["step_seconds"]
    return statistics.median(s[1:] if len(s) > 1 else s)

def wait_per_step(j):
    o = j.get("offload") or {}
    return o.get("io_wait_seconds", 0.0) / j["steps"]

waits = {}
for dtype in dtypes:
    for c in compare:
        ratios, rows = [], []
        for p in range(1, pairs + 1):
            b, o = load(c, dtype, "base", p), load(c, dtype, "off", p)
            if b["train_losses"] != o["train_losses"]:
                print(f"  note: pair {p} {c} {dtype}: losses differ: {b['train_losses']} vs {o['train_losses']}")
            tb, to = step_time(b), step_time(o)
            ratios.append(to / tb)
            w = wait_per_step(o)
            waits.setdefault((c, dtype), []).append(w)
            off = o.get("offload") or {}
            io = (off.get("nvme_bytes_read_per_step", 0) + off.get("nvme_bytes_written_per_step", 0)) / 1e9
            rows.append(f"    pair {p}: in memory {tb:7.2f} s  offloaded {to:7.2f} s  ratio {to / tb:5.3f}  "
                        f"nvme {io:5.2f} GB/step, I/O wait {w:6.3f} s/step ({100 * w / to:4.1f}% of the step)")
        print(f"{dtype}, {label[c]}: median ratio {statistics.median(ratios):.3f} (pairs: "
              f"{', '.join(f'{r:.3f}' for r in ratios)})")
        print("\n".join(rows))
for dtype in dtypes:
    if ("s3nvme", dtype) in waits and ("s3sync", dtype) in waits:
        wp, ws = statistics.median(waits[("s3nvme", dtype)]), statistics.median(waits[("s3sync", dtype)])
        print(f"{dtype}: I/O wait per step pipelined {wp:.3f} s, synchronous {ws:.3f} s -> hidden share "
              f"{100 * (1 - wp / ws) if ws > 0 else 0:.0f}% (medians over the pairs)")
print("ratio = median step time (steps 2..N) offloaded / in memory, the two runs of a pair back to back.")
PY
