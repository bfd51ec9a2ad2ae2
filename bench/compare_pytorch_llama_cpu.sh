#!/usr/bin/env bash
# dstrain's CPU training step on a Llama model against PyTorch's (bench/pytorch_llama_cpu.py), at
# the same shape, threads and optimizer (forward + backward + AdamW, fp32): tokens/s, ms/step, ratio.
#
#   bash bench/compare_pytorch_llama_cpu.sh [--steps N] [--threads N] [--batch B] [--seq T] [--repeat R]
#
# Shape: SmolLM-135M's (L30 C576 H9 KV3 I1536 V49152, tied). Each side runs --repeat times
# (default 2), alternating, and the best is kept: on a machine shared with other work the fastest
# run is the one least disturbed. A second row compares CPU seconds per step (all threads, user +
# system), which a loaded machine inflates far less than wall time (the ratio is PyTorch's CPU
# time over dstrain's, so above 1 means dstrain needs less). Needs build/bench/bench_train_cpu (cmake --build build --target bench_train_cpu)
# and /usr/bin/python3 with torch (bench/setup_peer.sh). The load average is printed with the row.
set -euo pipefail
cd "$(dirname "$0")/.."

steps=3 threads=2 batch=4 seq=256 repeat=2
while (($#)); do
  case "$1" in
    --steps) steps="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --batch) batch="$2"; shift 2 ;;
    --seq) seq="$2"; shift 2 ;;
    --repeat) repeat="$2"; shift 2 ;;
    *) echo "compare_pytorch_llama_cpu.sh: unknown option $1 (--steps N, --threads N, --batch B, --seq T, --repeat R)" >&2; exit 2 ;;
  esac
done

ours=build/bench/bench_train_cpu
[ -x "$ours" ] || { echo "compare_pytorch_llama_cpu.sh: $ours is missing; build it: cmake --build build --target bench_train_cpu" >&2; exit 1; }
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "compare_pytorch_llama_cpu.sh: /usr/bin/python3 has no torch: run bash bench/setup_peer.sh" >&2; exit 1; }
export OMP_NUM_THREADS="$threads" OPENBLAS_NUM_THREADS="$threads" OMP_WAIT_POLICY=passive

L=30 C=576 H=9 KV=3 I=1536 V=49152
best() {  # best() JSON...: the largest tokens_per_s
  /usr/bin/python3 -c "import json,sys; print(max((json.loads(l) for l in sys.argv[1:]), key=lambda j: j['tokens_per_s'])['tokens_per_s'])" "$@"
}
least_cpu() {  # least_cpu() JSON...: the smallest CPU seconds per step (all threads, user + system)
  /usr/bin/python3 -c "import json,sys; print(min(json.loads(l)['cpu_s_per_step'] for l in sys.argv[1:]))" "$@"
}
load0=$(cut -d' ' -f1 /proc/loadavg)
ds=() pt=()
for ((r = 0; r < repeat; ++r)); do
  ds+=("$("$ours" --model "llama:L$L-C$C-H$H-KV$KV-I$I-V$V-T$seq-tied" --batch "$batch" --seq "$seq" --steps "$steps" --warmup 1)")
  echo "  dstrain: ${ds[-1]}"
  pt+=("$(/usr/bin/python3 bench/pytorch_llama_cpu.py --layers $L --channels $C --heads $H --kv-heads $KV --intermediate $I \
        --vocab $V --batch "$batch" --seq "$seq" --steps "$steps" --warmup 1 --threads "$threads")")
  echo "  pytorch: ${pt[-1]}"
done
load1=$(cut -d' ' -f1 /proc/loadavg)
ta=$(best "${ds[@]}") tb=$(best "${pt[@]}")
printf '%-44s %14s %14s %8s  %s\n' "SmolLM-135M shape, B T, threads" "dstrain tok/s" "pytorch tok/s" ratio "load (1 min) before/after"
printf '%-44s %14.1f %14.1f %7.2fx  %s/%s\n' "L$L C$C H$H KV$KV I$I V$V tied, $batch $seq, $threads" "$ta" "$tb" \
  "$(/usr/bin/python3 -c "print($ta/$tb)")" "$load0" "$load1"
ca=$(least_cpu "${ds[@]}") cb=$(least_cpu "${pt[@]}")
printf '%-44s %14.2f %14.2f %7.2fx\n' "CPU s per step (all threads; less load-bound)" "$ca" "$cb" "$(/usr/bin/python3 -c "print($cb/$ca)")"
echo "(best of $repeat runs of $steps steps after 1 warm-up step, each side; the runs alternate between the two)"
