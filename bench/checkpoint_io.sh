#!/usr/bin/env bash
# Checkpoint save / load GB/s per rank for the engine's default writer and the buffered "python"
# writer, beside fio's sequential write / read of the same bytes in the same folder: buffered
# (psync, 1 MiB, fsync at the end), O_DIRECT psync with the writer's request size (32 MiB: one half
# of the default 64 MiB io_buffer_size) and O_DIRECT io_uring with two such requests in flight.
# The CI VM's disk moves between 1 and 6 GB/s within an hour and its 2 cores are shared with other
# builds, so dstrain and fio run in turn, REPEAT rounds (default 3) of one run each, and each
# round's dstrain figure is set beside fio's of the same round; the best round of each is printed
# last. Loads are cold (the checkpoint's files are dropped from the page cache first), as fio's
# reads are (fio invalidates its file's cache). The default writer's runs also time training
# steps and the stall of a synchronous and a decoupled save after them (bench_checkpoint_io
# --steps; STEPS rounds, default 1), each beside a copy of the same bytes in the same round.
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
  "$build/bench/bench_checkpoint_io" --dir "$dir/ck" --model "$model" --ranks "$ranks" --stage "$stage" --dtype "$dtype" --repeat 1 "$@" 2>/dev/null
}
# GB/s per rank of a bench line "save ...: T s  -> X GB/s per rank".
rate() { sed -n "s/^$1 .*-> \([0-9.]*\) GB\/s per rank.*/\1/p"; }
# GB/s per job of one fio run; $1: terse field (48 write bw KiB/s, 7 read).
fio_run() {
  local field="$1"
  shift
  fio --name=ck --directory="$dir" --size="${mb}M" --numjobs="$ranks" --group_reporting --output-format=terse --terse-version=3 "$@" |
    awk -F';' -v f="$field" -v n="$ranks" '{ printf "%.2f", $f * 1024 / 1e9 / n }'
}
pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f%%", (b > 0 ? 100 * a / b : 0) }'; }
max() { awk -v a="$1" -v b="$2" 'BEGIN { print (b > a ? b : a) }'; }
best_save=0 best_load=0 best_py_save=0 best_py_load=0 best_fio_w=0 best_fio_r=0
for r in $(seq "$repeat"); do
  echo "== round $r of $repeat ($(date +%T))"
  echo "-- dstrain, no checkpoint.writer block (the engine's choice: fast, O_DIRECT through io_uring, 2 x 32 MiB)"
  out="$(bench --steps "${STEPS:-1}")"
  echo "$out"
  echo "-- dstrain, checkpoint.writer.type \"python\" (buffered, 2 x 32 MiB)"
  py="$(bench --writer python --steps 0)"
  echo "$py" | grep -E '^(save|load) '
  gb="$(echo "$out" | sed -n 's/.*: \([0-9.]*\) GB per rank.*/\1/p')"
  mb="$(awk -v g="$gb" 'BEGIN { printf "%d", g * 1000 / 1.048576 + 1 }')"
  echo "-- fio, ${ranks} job(s) of ${mb} MiB each (the bytes of one rank's files), GB/s per job"
  printf '  write buffered psync 1M + fsync:         %s\n' "$(fio_run 48 --rw=write --bs=1M --end_fsync=1)"
  printf '  write O_DIRECT psync 32M + fsync:        %s\n' "$(fio_run 48 --rw=write --bs=32M --direct=1 --end_fsync=1)"
  fw="$(fio_run 48 --rw=write --bs=32M --direct=1 --ioengine=io_uring --iodepth=2 --end_fsync=1)"
  printf '  write O_DIRECT io_uring 32M x2 + fsync:  %s\n' "$fw"
  printf '  read buffered psync 1M (cold):           %s\n' "$(fio_run 7 --rw=read --bs=1M)"
  printf '  read O_DIRECT psync 32M:                 %s\n' "$(fio_run 7 --rw=read --bs=32M --direct=1)"
  fr="$(fio_run 7 --rw=read --bs=32M --direct=1 --ioengine=io_uring --iodepth=2)"
  printf '  read O_DIRECT io_uring 32M x2:           %s\n' "$fr"
  s="$(echo "$out" | rate save)" l="$(echo "$out" | rate load)"
  ps="$(echo "$py" | rate save)" pl="$(echo "$py" | rate load)"
  echo "-- round $r: save $s GB/s = $(pct "$s" "$fw") of fio's O_DIRECT io_uring write; load $l GB/s = $(pct "$l" "$fr") of its read (python writer: $(pct "$ps" "$fw"), $(pct "$pl" "$fr"))"
  best_save="$(max "$best_save" "$s")" best_load="$(max "$best_load" "$l")"
  best_py_save="$(max "$best_py_save" "$ps")" best_py_load="$(max "$best_py_load" "$pl")"
  best_fio_w="$(max "$best_fio_w" "$fw")" best_fio_r="$(max "$best_fio_r" "$fr")"
done
echo "== best of $repeat rounds, GB/s per rank: save $best_save (python writer $best_py_save), fio O_DIRECT io_uring write $best_fio_w;" \
  "load $best_load (python writer's checkpoint $best_py_load), fio read $best_fio_r"
rm -rf "$dir"
