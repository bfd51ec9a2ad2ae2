#!/usr/bin/env bash
# Faults of `mpiexec -n 2 dstrain train` (the MPI backend), as a user would meet them:
#   killed: rank 1 is killed (SIGKILL) in the middle of training -> the launcher ends the job with a
#           non-zero status naming rank 1;
#   stuck:  rank 1 stops (SIGSTOP) and never reaches its next collective, or stops inside one ->
#           rank 0 fails within DSTRAIN_COMM_TIMEOUT with an Error naming rank 1, and ends the job
#           (MPI_Abort) with a non-zero status.
# In both cases no process of the job may be left. Exit status 0 when all holds, 1 otherwise.
#
#   mpi_faults.sh <dstrain binary> <scratch folder> <mpiexec and its flags...>
set -uo pipefail
# shellcheck source=shell_test_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/shell_test_common.sh" "$@"
cat > "$scratch/ds.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 2}}
JSON

# The pid of MPI rank `rank` among the launcher's children (its environment says which rank it is).
rank_pid() {
  local launcher="$1" rank="$2" p
  for p in $(pgrep -P "$launcher"); do
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$rank\|PMI_RANK=$rank"; then echo "$p"; return; fi
  done
}

# run_fault <name> <signal>: starts a long run, waits for step 2, sends <signal> to rank 1, then
# checks how the job ended; prints the job's output on failure.
run_fault() {
  local name="$1" signal="$2" out="$scratch/$1.txt"
  DSTRAIN_COMM_TIMEOUT=5 OMP_NUM_THREADS=1 "${mpiexec[@]}" 2 "$dstrain" train --deepspeed_config "$scratch/ds.json" \
    --model gpt2:L2-C32-H2-V256-T32 --tokenizer bytes --data "$scratch/t_train.bin" --sample-tokens 0 --steps 1000000 >"$out" 2>&1 &
  local launcher=$!
  local waited=0
  until grep -q '^step 2/' "$out"; do
    sleep 0.2; waited=$((waited + 1))
    [ "$waited" -lt 600 ] || { kill -9 "$launcher"; cat "$out"; fail "$name: training did not reach step 2"; }
  done
  # Looked up again for up to 5 s: once (CI, 2026-12-02, under ASan on a loaded machine) a rank was
  # not found right after step 2 although the job was running; the tree is printed if it never is.
  local r0="" r1="" tries=0
  until [ -n "$r0" ] && [ -n "$r1" ]; do
    r0=$(rank_pid "$launcher" 0); r1=$(rank_pid "$launcher" 1)
    [ -n "$r0" ] && [ -n "$r1" ] && break
    tries=$((tries + 1))
    if [ "$tries" -ge 25 ]; then
      ps -ef --forest >&2 || true
      kill -9 "$launcher"; fail "$name: cannot find the ranks' processes among the children of $launcher: $(pgrep -P "$launcher" | tr '\n' ' ')"
    fi
    sleep 0.2
  done
  kill "-$signal" "$r1"
  # The job must end on its own: within the timeout (5 s) plus the launcher's clean-up.
  local t=0
  while kill -0 "$launcher" 2>/dev/null; do
    sleep 0.2; t=$((t + 1))
    [ "$t" -lt 300 ] || { kill -9 "$launcher" "$r0" "$r1"; cat "$out"; fail "$name: the job did not end within 60 s"; }
  done
  wait "$launcher"; local status=$?
  [ "$status" -ne 0 ] || { cat "$out"; fail "$name: the job ended with status 0"; }
  sleep 0.5
  for p in "$r0" "$r1"; do
    if [ -d "/proc/$p" ] && ! grep -q '^State:.*Z' "/proc/$p/status" 2>/dev/null; then
      cat "$out"; kill -9 "$p"; fail "$name: process $p of the job is still running"
    fi
  done
}

run_fault killed KILL
out="$scratch/killed.txt"
grep -q 'rank 1' "$out" || { cat "$out"; fail "killed: the launcher's message does not name rank 1"; }
echo "killed: ok (job ended non-zero, rank 1 named, no process left)"

run_fault stuck STOP
out="$scratch/stuck.txt"
grep -q 'rank(s) 1 of 2 did not' "$out" || { cat "$out"; fail "stuck: rank 0's error does not name rank 1"; }
grep -q 'dstrain: error (MPI rank 0 of 2)' "$out" || { cat "$out"; fail "stuck: no error from rank 0"; }
echo "stuck: ok (rank 0 named rank 1 within the timeout, job ended non-zero, no process left)"
rm -rf "$scratch"
