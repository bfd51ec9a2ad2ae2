#!/usr/bin/env bash
# DeepSpeed checkpoints from and to dstrain (issue 27's figure): the save and load time of a d12
# (GPT-2 124M) checkpoint in DeepSpeed's save_checkpoint layout and in the universal layout
# (bench_deepspeed_checkpoint: what `dstrain export` / `train --save-format deepspeed` and
# `train --resume-deepspeed` pay), beside dstrain's own format for the same model on one rank
# (bench_checkpoint_io --ranks 1: one process writing and reading every byte, as the DeepSpeed
# writer's rank 0 does) and fio's sequential write / read of the DeepSpeed folder's bytes in the
# same folder, in the same round. REPEAT rounds (default 2). Prints figures; never asserts.
#
#   bench/deepspeed_checkpoint.sh [DIR] [MODEL] [STAGE] [DP] [DTYPE]      (REPEAT=2 BUILD=build)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${BUILD:-$here/../build}"
dir="${1:-/tmp/dstrain_bench_dsckpt}"
model="${2:-gpt2:d12}"
stage="${3:-2}"
dp="${4:-2}"
dtype="${5:-bf16}"
repeat="${REPEAT:-2}"
command -v fio > /dev/null || apt-get install -y fio > /dev/null  # the peer of the disk (Debian's fio)
rm -rf "$dir" && mkdir -p "$dir"
# The dstrain checkpoint to start from: one step of the model on a few bytes of text.
head -c 200000 /usr/share/common-licenses/GPL-3 > "$dir/text.txt"
"$build/dstrain" prepare-data "$dir/text.txt" -o "$dir/text.bin" --tokenizer bytes > /dev/null
prec='"bf16": {"enabled": true},'
[ "$dtype" = fp16 ] && prec='"fp16": {"enabled": true, "loss_scale": 0},'
[ "$dtype" = fp32 ] && prec=''
echo "{\"train_batch_size\": 1, \"train_micro_batch_size_per_gpu\": 1, $prec \"zero_optimization\": {\"stage\": $stage},
 \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": 1e-4, \"weight_decay\": 0.1}}}" > "$dir/ds.json"
echo "== the starting checkpoint: $model, 1 step (dstrain train --save-dir)"
"$build/dstrain" train --model "$model" --data "$dir/text.bin" --deepspeed_config "$dir/ds.json" --steps 1 --sequence-length 64 \
  --save-dir "$dir/ck" > "$dir/train.log" 2>&1 || { cat "$dir/train.log"; exit 1; }
for r in $(seq "$repeat"); do
  echo "== round $r of $repeat ($(date +%T))"
  echo "-- dstrain's own format, 1 rank, ZeRO stage $stage, $dtype (bench_checkpoint_io)"
  "$build/bench/bench_checkpoint_io" --dir "$dir/own" --model "$model" --ranks 1 --stage "$stage" --dtype "$dtype" --repeat 1 2>/dev/null |
    grep -E '^(save|load) '
  echo "-- DeepSpeed layouts (bench_deepspeed_checkpoint)"
  out="$("$build/bench/bench_deepspeed_checkpoint" --from "$dir/ck" --dir "$dir/ds" --stage "$stage" --dp "$dp" --dtype "$dtype" --repeat 1)"
  echo "$out"
  gb="$(echo "$out" | sed -n 's/^save  DeepSpeed layout.* \([0-9.]*\) GB .*/\1/p')"
  mb="$(awk -v g="$gb" 'BEGIN { printf "%d", g * 1000 / 1.048576 + 1 }')"
  echo "-- fio, 1 job of ${mb} MiB (the DeepSpeed folder's bytes)"
  for spec in "write buffered psync 1M + fsync:48:--rw=write --bs=1M --end_fsync=1" \
              "read buffered psync 1M (cold):7:--rw=read --bs=1M"; do
    IFS=: read -r name field args <<< "$spec"
    # shellcheck disable=SC2086
    printf '  %-34s %s GB/s\n' "$name" "$(fio --name=ds --directory="$dir" --size="${mb}M" --output-format=terse --terse-version=3 $args |
      awk -F';' -v f="$field" '{ printf "%.2f", $f * 1024 / 1e9 }')"
  done
done
rm -rf "$dir"
