#!/usr/bin/env bash
# dstrain train over Gloo under the launchers that are not mpirun, on the CPU:
#   1. plain `torchrun --nproc_per_node 2` (the static rendezvous: torchrun's agent holds
#      MASTER_PORT with its own store, TORCHELASTIC_USE_AGENT_STORE=True, so dstrain's store takes
#      MASTER_PORT + 1);
#   2. srun's variables without MPI (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, the launch node's
#      address), as `srun dstrain train` gives each task;
# each trains the losses of --num-ranks 2, bit for bit; then
#   3. a rank whose group never forms (rank 1 of 2 alone) fails within DSTRAIN_COMM_TIMEOUT,
#      before step 1, naming the address and MASTER_PORT.
# Usage: gloo_launchers.sh <dstrain binary> <scratch folder>
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/shell_test_common.sh" "$1" "$2"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
py=/usr/bin/python3
cat > "$scratch/ds.json" <<'JSON'
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1, "fp16": {"enabled": true},
 "zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}}}
JSON
train=(train --deepspeed_config "$scratch/ds.json" --model gpt2:L2-C32-H2-V256-T32 --tokenizer bytes --data "$scratch/t_train.bin"
       --sample-tokens 0 --val-interval 0 --seed 5 --steps 4)
losses() { grep '^step [0-9]*/[0-9]* | loss' "$1" | cut -d'|' -f1,2; }
free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

OMP_NUM_THREADS=1 "$dstrain" "${train[@]}" --num-ranks 2 >"$scratch/local.txt" 2>&1 || { cat "$scratch/local.txt"; fail "--num-ranks 2"; }
[ "$(losses "$scratch/local.txt" | wc -l)" = 4 ] || { cat "$scratch/local.txt"; fail "the reference printed no losses"; }

# 1. torchrun, static rendezvous
if "$py" -c 'import torch.distributed.run' 2>/dev/null; then
  OMP_NUM_THREADS=1 timeout 120 "$py" "$here/torchrun.py" --no_python --nnodes=1 --nproc_per_node=2 --master_port="$(free_port)" \
    "$dstrain" "${train[@]}" >"$scratch/torchrun.txt" 2>&1 || { cat "$scratch/torchrun.txt"; fail "torchrun --nproc_per_node 2"; }
  grep -q 'comm: gloo, 2 processes' "$scratch/torchrun.txt" || { cat "$scratch/torchrun.txt"; fail "torchrun's processes did not train over Gloo"; }
  diff <(losses "$scratch/torchrun.txt") <(losses "$scratch/local.txt") || fail "torchrun's losses differ from --num-ranks 2"
else
  fail "no torch.distributed.run in $py: install python3-torch (scripts/setup.sh)"
fi

# 2. srun's variables
port=$(free_port)
pids=()
for r in 0 1; do
  env -u RANK -u WORLD_SIZE -u MASTER_ADDR SLURM_PROCID=$r SLURM_NTASKS=2 SLURM_LOCALID=$r SLURM_NTASKS_PER_NODE=2 \
    SLURM_LAUNCH_NODE_IPADDR=127.0.0.1 MASTER_PORT="$port" OMP_NUM_THREADS=1 timeout 120 "$dstrain" "${train[@]}" >"$scratch/srun$r.txt" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || { cat "$scratch"/srun*.txt; fail "a task of the srun-style launch failed"; }; done
grep -q 'comm: gloo, 2 processes.*via srun' "$scratch/srun0.txt" || { cat "$scratch/srun0.txt"; fail "srun's tasks did not train over Gloo"; }
diff <(losses "$scratch/srun0.txt") <(losses "$scratch/local.txt") || fail "srun's losses differ from --num-ranks 2"

# 3. a group that never forms: rank 1 alone
port=$(free_port)
start=$(date +%s)
RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" DSTRAIN_COMM_TIMEOUT=2 OMP_NUM_THREADS=1 timeout 60 \
  "$dstrain" "${train[@]}" >"$scratch/alone.txt" 2>&1 && { cat "$scratch/alone.txt"; fail "rank 1 of 2 alone trained"; }
took=$(($(date +%s) - start))
grep -q "127.0.0.1:$port" "$scratch/alone.txt" && grep -q MASTER_PORT "$scratch/alone.txt" ||
  { cat "$scratch/alone.txt"; fail "the error does not name the store's address and MASTER_PORT"; }
! grep -q '^step ' "$scratch/alone.txt" || fail "the lone rank trained a step"
[ "$took" -le 20 ] || fail "the lone rank took $took s to fail (DSTRAIN_COMM_TIMEOUT=2)"
echo PASS
