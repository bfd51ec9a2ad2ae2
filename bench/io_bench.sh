#!/usr/bin/env bash
# dstrain io-bench against fio (io_uring and libaio engines, O_DIRECT) on the same file, with the same
# transfer size, block sizes and queue depths, one job each; prints one side-by-side table
# (docs/offload.md §3). Prints figures; never asserts.
#
#   bench/io_bench.sh [DIR] [SIZE] [BLOCK_SIZES] [QUEUE_DEPTHS] [ROUNDS]
#   e.g. bench/io_bench.sh /nvme/bench 1G 128K,1M,8M 8,32,128 3
#
# dstrain moves SIZE bytes as one request, cut into BLOCK_SIZE pieces with QUEUE_DEPTH in flight
# (how the swappers use it); fio moves the same bytes with bs=BLOCK_SIZE, iodepth=QUEUE_DEPTH. Both:
# sequential, O_DIRECT, one thread, the same preallocated and written file. dstrain runs twice:
#   "dstrain"   as the swappers run it: a buffer of 2 MiB transparent huge pages, registered
#               (fixed) with io_uring;
#   "d. as fio" on fio's terms: 4 KiB pages (fio mallocs its buffers), not registered (fio's
#               io_uring engine without fixedbufs). This is the like-for-like column. A shared or virtual disk varies from second to second, so every
# cell is measured ROUNDS times, the three programs taking turns, and the table gives the median.
# CPU s/GB: user + system CPU time of the process (fio: of its job) per GB moved.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
dstrain="${DSTRAIN:-$here/../build/dstrain}"
dir="${1:-/tmp/dstrain_io_bench}"
size="${2:-1G}"
blocks="${3:-128K,1M,8M}"
depths="${4:-8,32,128}"
rounds="${5:-3}"
python="${PYTHON:-python3}"
command -v fio >/dev/null || { echo "fio is not installed (Debian: apt-get install fio)" >&2; exit 1; }
mkdir -p "$dir"
out="$(mktemp -d)"
# dstrain io-bench writes a scratch file of its own (dstrain_io_bench.<pid>.dat); --keep leaves it
# for fio, which then measures the same file, and this script removes it.
trap 'rm -rf "$out"; rm -f "$dir"/dstrain_io_bench.*.dat' EXIT

echo "folder $dir: $(df --output=source "$dir" | tail -1), $(findmnt -no FSTYPE -T "$dir"); $size per transfer; $rounds rounds"
IFS=, read -r -a block_list <<<"$blocks"
IFS=, read -r -a depth_list <<<"$depths"
for round in $(seq 1 "$rounds"); do
  for bs in "${block_list[@]}"; do
    for qd in "${depth_list[@]}"; do
      "$dstrain" io-bench --path "$dir" --size "$size" --block-size "$bs" --queue-depth "$qd" --json --keep \
        >"$out/dstrain_${bs}_${qd}_${round}.json"
      file="$("$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))["file"])' "$out/dstrain_${bs}_${qd}_${round}.json")"
      "$dstrain" io-bench --path "$dir" --size "$size" --block-size "$bs" --queue-depth "$qd" --json \
        --pages base --no-fixed-buffers >"$out/dstrainbase_${bs}_${qd}_${round}.json"
      for engine in io_uring libaio; do
        for rw in write read; do
          fio --name=bench --filename="$file" --rw="$rw" --bs="$bs" --iodepth="$qd" --direct=1 --ioengine="$engine" \
            --size="$size" --numjobs=1 --output-format=json >"$out/fio_${engine}_${rw}_${bs}_${qd}_${round}.json"
        done
      done
      rm -f "$file"
    done
  done
done

"$python" - "$out" "$blocks" "$depths" "$rounds" <<'PY'
import json, os, statistics, sys
out, blocks, depths, rounds = sys.argv[1], sys.argv[2].split(","), sys.argv[3].split(","), int(sys.argv[4])

def fio(engine, rw, bs, qd, r):
    j = json.load(open(os.path.join(out, f"fio_{engine}_{rw}_{bs}_{qd}_{r}.json")))["jobs"][0]
    side = j[rw]
    gb = side["io_bytes"] / 1e9
    cpu = (j["usr_cpu"] + j["sys_cpu"]) / 100.0 * j["job_runtime"] / 1000.0
    return gb / (side["runtime"] / 1000.0), cpu / gb

def dstrain(rw, bs, qd, r, kind="dstrain"):
    d = json.load(open(os.path.join(out, f"{kind}_{bs}_{qd}_{r}.json")))["rows"][0]
    return d[f"{rw}_gbps"], d[f"{rw}_cpu_s_per_gb"]

def dstrain_base(rw, bs, qd, r):
    return dstrain(rw, bs, qd, r, "dstrainbase")

def median(f, *a):
    runs = [f(*a, r) for r in range(1, rounds + 1)]
    return statistics.median(x[0] for x in runs), statistics.median(x[1] for x in runs)

print(f"{'block':>6} {'qd':>4} {'op':>5} | {'dstrain':>8} {'d. as fio':>9} {'fio uring':>9} {'fio aio':>8} | "
      f"{'vs best fio':>11} {'as fio':>6} | {'cpu s/GB: dstrain':>17} {'as fio':>6} {'uring':>6} {'aio':>6}")
ratios = {(rw, k): [] for rw in ("write", "read") for k in ("dstrain", "as fio")}
for bs in blocks:
    for qd in depths:
        for rw in ("write", "read"):
            ds, dcpu = median(dstrain, rw, bs, qd)
            db, dbcpu = median(dstrain_base, rw, bs, qd)
            u, ucpu = median(fio, "io_uring", rw, bs, qd)
            a, acpu = median(fio, "libaio", rw, bs, qd)
            best = max(u, a)
            ratios[(rw, "dstrain")].append(ds / best)
            ratios[(rw, "as fio")].append(db / best)
            print(f"{bs:>6} {qd:>4} {rw:>5} | {ds:8.3f} {db:9.3f} {u:9.3f} {a:8.3f} | {100 * ds / best:10.0f}% "
                  f"{100 * db / best:5.0f}% | {dcpu:17.4f} {dbcpu:6.4f} {ucpu:6.4f} {acpu:6.4f}")
for (rw, k), r in ratios.items():
    print(f"{rw:>5} {k:>7}: dstrain / best fio engine, median over cells {100 * statistics.median(r):.0f}%, "
          f"lowest {100 * min(r):.0f}%")
print("GB/s = 1e9 bytes per second, median of the rounds; 'vs best fio' = dstrain / the faster fio engine.")
PY
