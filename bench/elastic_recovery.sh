#!/usr/bin/env bash
# The recovery time of an elastic run under torchrun on the CPU (docs/elastic.md "Recovery time"):
# runs tests/integration/torchrun_elastic.sh — two agents of two Gloo processes, node B SIGKILLed
# after step 5, the survivor relaunched at world 2 from the newest checkpoint — a few times with
# the test's 1 s x 3 rendezvous heartbeat and once with torch's own 5 s x 3, and prints each run's
# split: kill -> failure noticed (dstrain), kill -> relaunched (torchrun's re-rendezvous), then
# dstrain's startup line (joining the group, loading the checkpoint, the first step).
#   bash bench/elastic_recovery.sh [build/dstrain] [runs=3]
set -uo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dstrain=${1:-$repo/build/dstrain}
runs=${2:-3}
scratch=$(mktemp -d /tmp/elastic_recovery.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
for keep_alive in "1,3" ""; do
  n=$([ -n "$keep_alive" ] && echo "$runs" || echo 1)
  label=${keep_alive:-"5,3 (torch default)"}
  echo "== torchrun heartbeat $label (seconds, misses), $n run(s)"
  for ((i = 1; i <= n; i++)); do
    ELASTIC_KEEP_ALIVE="$keep_alive" bash "$repo/tests/integration/torchrun_elastic.sh" "$dstrain" "$scratch/run" 2>&1 |
      grep -E '^  |^recovery|^PASS|^FAIL'
  done
done
