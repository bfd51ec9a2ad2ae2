#!/usr/bin/env bash
# Checkpoint save / load GB/s per rank against fio's sequential write / read of the same size in the
# same folder (buffered, fsync at the end: what the checkpoint writer does), and the decoupled
# save's stall. Prints figures; never asserts.
#
#   bench/checkpoint_io.sh [DIR] [MODEL] [RANKS] [STAGE] [DTYPE]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${BUILD:-$here/../build}"
dir="${1:-/tmp/dstrain_bench_ckpt}"
model="${2:-gpt2:L6-C512-H8-T256}"
ranks="${3:-2}"
stage="${4:-1}"
dtype="${5:-bf16}"
mkdir -p "$dir"
out="$("$build/bench/bench_checkpoint_io" --dir "$dir/ck" --model "$model" --ranks "$ranks" --stage "$stage" --dtype "$dtype")"
echo "$out"
gb="$(echo "$out" | sed -n 's/.*: \([0-9.]*\) GB per rank.*/\1/p')"
mb="$(awk -v g="$gb" 'BEGIN { printf "%d", g * 1000 + 1 }')"
echo "fio, ${ranks} job(s) of ${mb} MB each, bs 1M, buffered + fsync (as the writer):"
fio --name=ckw --directory="$dir" --rw=write --bs=1M --size="${mb}M" --numjobs="$ranks" --end_fsync=1 --group_reporting \
    --output-format=terse --terse-version=3 | awk -F';' '{ printf "  fio write: %.2f GB/s per job\n", $48 * 1024 / 1e9 / '"$ranks"' }'
fio --name=ckw --directory="$dir" --rw=read --bs=1M --size="${mb}M" --numjobs="$ranks" --group_reporting \
    --output-format=terse --terse-version=3 | awk -F';' '{ printf "  fio read:  %.2f GB/s per job\n", $7 * 1024 / 1e9 / '"$ranks"' }'
rm -rf "$dir"
