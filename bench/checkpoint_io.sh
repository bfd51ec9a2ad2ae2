#!/usr/bin/env bash
# Checkpoint save / load GB/s per rank for the engine's default writer and the buffered "python"
# writer, beside fio's sequential write / read of the same bytes in the same folder: buffered
# (psync, 1 MiB, fsync at the end), O_DIRECT psync with the writer's request size (32 MiB: one half
# of the default 64 MiB io_buffer_size) and O_DIRECT io_uring with two such requests in flight.
# Every figure is the best of REPEAT runs (default 3): the CI VM's disk and 2 cores are shared
# with other builds and any one run moves by 2x. Loads are cold (the checkpoint's files are
# dropped from the page cache first), as fio's reads are (fio invalidates its file's cache).
# The default writer's run also times a training step and the stall of a synchronous and a
# decoupled save after it (bench_checkpoint_io --steps; STEPS rounds, default 1).
# Prints figures; never asserts.
#
#   bench/checkpoint_io.sh [DIR] [MODEL] [RANKS] [STAGE] [DTYPE]      (REPEAT=3 STEPS=1 BUILD=build)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${BUILD:-$here/../build}"
dir="${1:-/tmp/dstrain_bench_ckpt}"
model="${2:-gpt2:L6-C512-H8-T256}"
ranks="${3:-2}"
stage="${4:-1}"
dtype="${5:-bf16}"
repeat="${REPEAT:-3}"
mkdir -p "$dir"
bench() {
  "$build/bench/bench_checkpoint_io" --dir "$dir/ck" --model "$model" --ranks "$ranks" --stage "$stage" --dtype "$dtype" --repeat "$repeat" "$@" 2>/dev/null
}
echo "== dstrain, no checkpoint.writer block (the engine's choice: fast, O_DIRECT through io_uring, 2 x 32 MiB), best of $repeat =="
out="$(bench --steps "${STEPS:-1}")"
echo "$out"
echo "== dstrain, checkpoint.writer.type \"python\" (buffered, 2 x 32 MiB), best of $repeat =="
bench --writer python --steps 0
gb="$(echo "$out" | sed -n 's/.*: \([0-9.]*\) GB per rank.*/\1/p')"
mb="$(awk -v g="$gb" 'BEGIN { printf "%d", g * 1000 / 1.048576 + 1 }')"
# best-of-$repeat GB/s per job of one fio job line; $1: terse field (48 write bw KiB/s, 7 read).
fio_best() {
  local field="$1"
  shift
  local best=0
  for _ in $(seq "$repeat"); do
    local v
    v="$(fio --name=ck --directory="$dir" --size="${mb}M" --numjobs="$ranks" --group_reporting --output-format=terse --terse-version=3 "$@" |
      awk -F';' -v f="$field" -v n="$ranks" '{ printf "%.3f", $f * 1024 / 1e9 / n }')"
    best="$(awk -v a="$best" -v b="$v" 'BEGIN { print (b > a ? b : a) }')"
  done
  echo "$best"
}
echo "== fio, ${ranks} job(s) of ${mb} MiB each (the bytes of one rank's files), best of $repeat, GB/s per job =="
printf '  write buffered psync 1M + fsync:         %.2f\n' "$(fio_best 48 --rw=write --bs=1M --end_fsync=1)"
printf '  write O_DIRECT psync 32M + fsync:        %.2f\n' "$(fio_best 48 --rw=write --bs=32M --direct=1 --end_fsync=1)"
printf '  write O_DIRECT io_uring 32M x2 + fsync:  %.2f\n' "$(fio_best 48 --rw=write --bs=32M --direct=1 --ioengine=io_uring --iodepth=2 --end_fsync=1)"
printf '  read buffered psync 1M (cold):           %.2f\n' "$(fio_best 7 --rw=read --bs=1M)"
printf '  read O_DIRECT psync 32M:                 %.2f\n' "$(fio_best 7 --rw=read --bs=32M --direct=1)"
printf '  read O_DIRECT io_uring 32M x2:           %.2f\n' "$(fio_best 7 --rw=read --bs=32M --direct=1 --ioengine=io_uring --iodepth=2)"
rm -rf "$dir"
