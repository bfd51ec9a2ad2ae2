#!/usr/bin/env bash
# Capacity: a model whose training state does not fit in this machine's memory trains with the
# optimizer and the parameters offloaded to NVMe (docs/offload.md §10). GPT-2 XL (gpt2:d48, 1.56 B
# parameters), bf16, ZeRO stage 3, offload_optimizer and offload_param on nvme, B 1, T 128; prints
# the run's peak resident memory beside what the same config without offload needs (dstrain's own
# pre-flight estimate). Prints figures; never asserts.
#
#   bench/offload_capacity.sh [NVME_DIR] [STEPS]
#   e.g. bench/offload_capacity.sh /tmp/dstrain_nvme 2
#   environment: MODEL (gpt2:d48), T (128), SUB_GROUP (5e7: sub_group_size), OPT_BUFFERS (4),
#                PARAM_BUFFERS (5), PARAM_BUFFER_SIZE (1e8), MAX_IN_CPU (1e8), MIN_FREE_GIB (1.5), DSTRAIN
#
# Host memory the offloaded state keeps (docs/offload.md §5, §6): OPT_BUFFERS slots of one sub-group
# (masters + 2 Adam moments, fp32: 12 B x SUB_GROUP each), PARAM_BUFFERS parameter buffers of
# PARAM_BUFFER_SIZE 16-bit elements, and the first MAX_IN_CPU parameter elements; the rest of the
# state is in the swap files. The machine is shared, so a watchdog ends the run (its own process,
# by id) if MemAvailable falls below MIN_FREE_GIB, rather than let the kernel's OOM killer choose.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/.."
dstrain="${DSTRAIN:-$root/build/dstrain}"
nvme_dir="${1:-/tmp/dstrain_nvme}"
steps="${2:-2}"
model="${MODEL:-gpt2:d48}"
seq="${T:-128}"
sub_group="${SUB_GROUP:-5e7}"
opt_buffers="${OPT_BUFFERS:-4}"
param_buffers="${PARAM_BUFFERS:-5}"
param_buffer_size="${PARAM_BUFFER_SIZE:-1e8}"
max_in_cpu="${MAX_IN_CPU:-1e8}"
min_free_gib="${MIN_FREE_GIB:-1.5}"
data="${DATA:-$root/datasets/brown_train.bin}"
python="${PYTHON:-python3}"
[ -x "$dstrain" ] || { echo "no dstrain at $dstrain (build it, or set DSTRAIN)" >&2; exit 1; }
[ -f "$data" ] || { echo "no token file $data (scripts/setup.sh prepares datasets/brown_train.bin; or set DATA)" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "/usr/bin/time is not installed (Debian: apt-get install time)" >&2; exit 1; }
mkdir -p "$nvme_dir"
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

offload="\"offload_optimizer\": { \"device\": \"nvme\", \"nvme_path\": \"$nvme_dir\", \"buffer_count\": $opt_buffers, \"pipeline_read\": true, \"pipeline_write\": true },
    \"offload_param\": { \"device\": \"nvme\", \"nvme_path\": \"$nvme_dir\", \"buffer_count\": $param_buffers, \"buffer_size\": $param_buffer_size, \"max_in_cpu\": $max_in_cpu },"
for kind in offload none; do
  [ "$kind" = none ] && offload=""
  cat >"$out/$kind.json" <<EOF
{
  "train_micro_batch_size_per_gpu": 1,
  "gradient_accumulation_steps": 1,
  "steps_per_print": 1,
  "bf16": { "enabled": true },
  "zero_optimization": {
    "stage": 3,
    $offload
    "sub_group_size": $sub_group
  },
  "aio": { "block_size": 1048576, "queue_depth": 32, "intra_op_parallelism": 1 },
  "optimizer": { "type": "AdamW", "params": { "lr": 1e-4 } }
}
EOF
done
args=(--model "$model" --sequence-length "$seq" --data "$data" --steps "$steps" --val-interval 0 --sample-tokens 0)

echo "$model, bf16, ZeRO stage 3, B 1, T $seq, $steps steps; sub_group_size $sub_group, optimizer buffer_count $opt_buffers," \
  "param buffer_count $param_buffers x buffer_size $param_buffer_size, max_in_cpu $max_in_cpu"
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg); memory $(free -g | awk '/Mem:/ {print $2 " GiB total, " $7 " GiB available"}')"
echo "nvme_path $nvme_dir: $(findmnt -no SOURCE,FSTYPE -T "$nvme_dir"), $(df -h --output=avail "$nvme_dir" | tail -1 | tr -d ' ') free"

# Without offload: dstrain's pre-flight estimate (train/memory_estimate.h), printed when it refuses
# the run; a 3 GB address-space limit makes sure it refuses (and that nothing is built) whatever
# this machine has free.
none_line="$( (ulimit -v 3000000; "$dstrain" train --deepspeed_config "$out/none.json" "${args[@]}" 2>&1) | grep -o 'per rank at least.*= [0-9.]* [KMGT]iB' || true)"
echo "without offload: ${none_line:-(no estimate printed: the run was not refused under a 3 GB limit)}"

# With offload, under /usr/bin/time -v (peak RSS of the process) and the memory watchdog.
/usr/bin/time -v -o "$out/time.txt" "$dstrain" train --deepspeed_config "$out/offload.json" "${args[@]}" \
  --summary-json "$out/summary.json" >"$out/run.log" 2>&1 &
timer=$!
sleep 1
child="$(pgrep -P "$timer" || true)"
min_avail=999999999
killed=""
while kill -0 "$timer" 2>/dev/null; do
  avail_kib="$(awk '/MemAvailable:/ {print $2}' /proc/meminfo)"
  [ "$avail_kib" -lt "$min_avail" ] && min_avail="$avail_kib"
  if "$python" -c "import sys; sys.exit(0 if $avail_kib / 2**20 < $min_free_gib else 1)"; then
    killed="MemAvailable fell to $((avail_kib / 1024)) MiB: the run was ended by the watchdog"
    [ -n "$child" ] && kill "$child" 2>/dev/null || true
    break
  fi
  sleep 1
done
rc=0
wait "$timer" || rc=$?
grep -E '^step |^done:|^peak memory|^offload|^  (device|host|nvme) |^nvme per step|swap|error' "$out/run.log" || true
[ -n "$killed" ] && echo "$killed"
echo "exit status $rc; lowest MemAvailable during the run $((min_avail / 1024)) MiB"
peak_kib="$(awk -F': ' '/Maximum resident set size/ {print $2}' "$out/time.txt")"
echo "peak resident memory (RSS, /usr/bin/time -v): $("$python" -c "print(f'{$peak_kib / 2**20:.2f} GiB')");" \
  "wall time $(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$out/time.txt") (initialisation included)"
[ -f "$out/summary.json" ] && "$python" - "$out/summary.json" "$peak_kib" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
gib = lambda b: f"{b / 2**30:.2f} GiB"
p = j["peak_memory_bytes"]
print("allocator's peak: " + ", ".join(f"{k} {gib(v)}" for k, v in p.items()))
o = j.get("offload") or {}
held = o.get("bytes_held", {})
for where in ("device", "host", "nvme"):
    if where in held:
        print(f"held between steps, {where}: " + ", ".join(f"{k} {gib(v)}" for k, v in held[where].items() if v))
print(f"steps {j['steps']}, step seconds {', '.join(f'{s:.1f}' for s in j['step_seconds'])}; losses {j['train_losses']}")
if o:
    print(f"nvme read {o['nvme_bytes_read'] / 1e9:.1f} GB, written {o['nvme_bytes_written'] / 1e9:.1f} GB over the steps; "
          f"I/O wait {o['io_wait_seconds']:.1f} s ({100 * o['io_wait_share']:.0f}% of training time)")
PY
exit "$rc"
