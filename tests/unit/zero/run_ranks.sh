#!/usr/bin/env bash
# Starts N processes of a program as torchrun would — RANK, WORLD_SIZE, LOCAL_RANK,
# LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a free MASTER_PORT — and fails when any of them fails.
# How the Gloo backend's tests run without torchrun:  run_ranks.sh N program [args...]
set -uo pipefail
n="$1"; shift
# A free port with room above it: the tests give each group MASTER_PORT + its number. Below the
# kernel's ephemeral range (32768-60999 on Linux), which the connections of tests running beside
# this one draw from: a port picked there may be taken by one of them before a group binds it.
port=$(python3 -c 'import socket,random
while True:
    p = random.randrange(20000, 32000, 100); ok = True
    for q in (p, p + 1):
        s = socket.socket()
        try: s.bind(("127.0.0.1", q))
        except OSError: ok = False
        finally: s.close()
    if ok: print(p); break')
pids=()
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
for ((r = 0; r < n; r++)); do
  RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$@" &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
exit $status
