#!/usr/bin/env bash
# An elastic run under torchrun's agents on the CPU (Gloo backend), a node lost mid-run:
#   two agents on this machine ("nodes" A and B, c10d rendezvous, --nnodes=1:2), two dstrain
#   processes each (world 4), checkpoints every 3 steps, --resume auto; node B (its agent and
#   workers: one process group) is SIGKILLed after step 5; A's workers fail at once (their Gloo
#   connections to B close), A's agent re-rendezvouses alone and relaunches them at world 2, they
#   resume from the newest checkpoint with the same global batch and finish; A exits 0.
# Checked against an uninterrupted run that changes world size at the same step (4 ranks to step
# N, then 2 from N's checkpoint; ranks as threads, which the Gloo backend matches bit for bit): the
# losses after N and the final weights are the same bits, and the samples the job trained on
# (the first round's up to step N, then the second round's) are exactly one uninterrupted run's.
# Prints the recovery time split (kill -> failure noticed -> relaunched -> first step).
#
# Usage: torchrun_elastic.sh <dstrain binary> <scratch folder>. Needs Debian's python3-torch
# (torchrun); torch 1.13 on Python 3.11 needs tests/integration/torchrun.py's fix to start at all.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/shell_test_common.sh" "$1" "$2"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
py=/usr/bin/python3
"$py" -c 'import torch.distributed.run' 2>/dev/null || fail "no torch.distributed.run in $py: install python3-torch (scripts/setup.sh)"

steps=14
cat > "$scratch/ds.json" <<'JSON'
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
 "bf16": {"enabled": true}, "zero_optimization": {"stage": 2},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
 "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 3, "total_num_steps": 14}}}
JSON
train=(train --deepspeed_config "$scratch/ds.json" --model gpt2:L2-C32-H2-V256-T32 --tokenizer bytes --data "$scratch/t_train.bin"
       --sample-tokens 0 --val-interval 0 --seed 9)
S="$scratch/elastic"; mkdir -p "$S"

# What torchrun starts on each node: dstrain with the round's sample log (a round = a world size
# and a MASTER_PORT, which the agent picks afresh each round). Rank 0 sleeps 250 ms a step
# (--inject-slow-rank) so that the kill lands mid-run.
cat > "$S/worker.sh" <<EOF
#!/usr/bin/env bash
exec "$dstrain" ${train[*]} --steps $steps --save-dir "$S/ck" --save-interval 3 --resume auto \\
  --inject-slow-rank 0:250 --straggler-factor 0 --save-weights "$S/final.safetensors" \\
  --log-samples "$S/samples_w\${WORLD_SIZE}_p\${MASTER_PORT}.txt"
EOF
chmod +x "$S/worker.sh"

port=$("$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
declare -A pid
cleanup() { for n in "${!pid[@]}"; do kill -KILL -- "-${pid[$n]}" 2>/dev/null; done; }
trap cleanup EXIT
# Each agent leads its own process group (setsid), its workers in it: killing the group is a node
# dying. A hosts the rendezvous (losing the host ends a c10d job). last_call_timeout 3: both agents
# join the first round; TORCHRUN_KEEP_ALIVE 1,3: a dead node is dropped after 3 s, not torch's 15 s.
# ELASTIC_KEEP_ALIVE (bench/elastic_recovery.sh): another "SECONDS,ATTEMPTS", or "" for torch's 5 s x 3.
start_agent() {
  TORCHRUN_KEEP_ALIVE=${ELASTIC_KEEP_ALIVE-1,3} DSTRAIN_COMM_TIMEOUT=20 OMP_NUM_THREADS=1 setsid "$py" "$here/torchrun.py" --no_python --nnodes=1:2 \
    --nproc_per_node=2 --max_restarts=2 --monitor_interval=0.5 --rdzv_backend=c10d --rdzv_endpoint="127.0.0.1:$port" \
    --rdzv_id="dstrain$$" --rdzv_conf="join_timeout=60,last_call_timeout=3,close_timeout=5,is_host=$2" --log_dir="$S/log$1" \
    "$S/worker.sh" >"$S/agent$1.log" 2>&1 &
  pid[$1]=$!
}
now() { date +%s.%N; }
t0=$(now)
start_agent A true
start_agent B false
waited=0
until grep -q '^step 5/' "$S/agentA.log" "$S/agentB.log" 2>/dev/null; do
  sleep 0.05; waited=$((waited + 1))
  kill -0 "${pid[A]}" 2>/dev/null || { cat "$S/agentA.log"; fail "agent A ended before step 5"; }
  [ "$waited" -lt 1800 ] || { cat "$S/agentA.log" "$S/agentB.log"; fail "the job did not reach step 5 within 90 s"; }
done
grep -q 'comm: gloo, 4 processes' "$S/agentA.log" "$S/agentB.log" ||
  { cat "$S/agentA.log" "$S/agentB.log"; fail "the first round is not the 4 processes of both nodes"; }
t_kill=$(now)
kill -KILL -- "-${pid[B]}"; { wait "${pid[B]}"; } 2>/dev/null
# Failure noticed: a worker of A names the lost connection; relaunched: the 2-process round starts.
t_fail=""; t_relaunch=""
while kill -0 "${pid[A]}" 2>/dev/null; do
  [ -n "$t_fail" ] || ! grep -q 'Gloo communicator:.*failed' "$S/agentA.log" || t_fail=$(now)
  [ -n "$t_relaunch" ] || ! grep -q 'comm: gloo, 2 processes' "$S/agentA.log" || t_relaunch=$(now)
  sleep 0.05
  [ "$(echo "$(now) - $t_kill < 120" | bc)" = 1 ] || { cat "$S/agentA.log"; fail "agent A did not finish within 120 s of the kill"; }
done
wait "${pid[A]}"; status=$?
[ "$status" = 0 ] || { cat "$S/agentA.log"; fail "agent A ended with status $status"; }
[ -n "$t_fail" ] || { cat "$S/agentA.log"; fail "no worker of A reported the lost node"; }
log="$S/agentA.log"
resumed=$(sed -n 's/^resumed from checkpoint .*global_step\([0-9]*\) at step.*/\1/p' "$log" | tail -1)
[ -n "$resumed" ] || { cat "$log"; fail "the relaunched round did not resume from a checkpoint"; }
grep -q "^batch: train_batch_size 8 = micro-batch 2 x gradient_accumulation_steps 2 x world size 2" "$log" ||
  { cat "$log"; fail "the relaunched round does not keep the global batch by gradient accumulation"; }
grep -q "^step $steps/$steps" "$log" || { cat "$log"; fail "the relaunched round did not reach step $steps"; }

# ---- the same run without torchrun: 4 ranks to step $resumed, then 2 from its checkpoint ----
R="$scratch/reference"
OMP_NUM_THREADS=1 "$dstrain" "${train[@]}" --num-ranks 4 --steps "$resumed" --save-dir "$R/ck" >"$R.first.txt" 2>&1 ||
  { cat "$R.first.txt"; fail "reference run to step $resumed"; }
OMP_NUM_THREADS=1 "$dstrain" "${train[@]}" --num-ranks 2 --steps $steps --save-dir "$R/ck" --resume auto \
  --save-weights "$R/final.safetensors" >"$R.second.txt" 2>&1 || { cat "$R.second.txt"; fail "reference run from step $resumed"; }
losses() { sed -n 's/^step \([0-9]*\)\/[0-9]* | loss \([^ ]*\) .*/\1 \2/p' "$1" | awk -v n="$resumed" '$1 > n'; }
# The relaunched round's lines: after its "resumed from" line.
awk '/^resumed from checkpoint/ {on = 1} on' "$log" > "$S/second_round.txt"
diff <(losses "$S/second_round.txt") <(losses "$R.second.txt") >/dev/null ||
  { diff <(losses "$S/second_round.txt") <(losses "$R.second.txt"); fail "losses after step $resumed differ from the reference"; }
cmp -s "$S/final.safetensors" "$R/final.safetensors" || fail "the final weights differ from the reference's"

# ---- the samples: round 1's up to step $resumed, then round 2's, are one uninterrupted run's ----
OMP_NUM_THREADS=1 "$dstrain" "${train[@]}" --num-ranks 2 --steps $steps --log-samples "$scratch/one_run.txt" >"$scratch/one_run.out" 2>&1 ||
  fail "uninterrupted run"
shopt -s nullglob
first=("$S"/samples_w4_*.txt); second=("$S"/samples_w2_*.txt)
[ "${#first[@]}" = 1 ] && [ "${#second[@]}" = 1 ] || fail "expected one round of 4 and one of 2 processes, found: $(ls "$S"/samples_*)"
seen() { awk -v n="$resumed" -v part="$2" '(part == 1 && $2 <= n) || part == 2 {print $2, $4, $6}' "$1"; }
diff <({ seen "${first[0]}" 1; seen "${second[0]}" 2; } | sort) <(awk '{print $2, $4, $6}' "$scratch/one_run.txt" | sort) >/dev/null ||
  fail "the samples trained on are not those of one uninterrupted run (none twice, none skipped)"

startup=$(grep '^startup:' "$log" | tail -1)
echo "recovery (checkpoint every 3 steps, node B killed after step 5, resumed from step $resumed):"
printf '  kill -> failure noticed by the survivors: %.2f s\n' "$(echo "$t_fail - $t_kill" | bc)"
printf '  kill -> relaunched round running:          %.2f s (torchrun: re-rendezvous after the dead node expires)\n' \
  "$(echo "$t_relaunch - $t_kill" | bc)"
echo "  $startup"
echo "  work lost: the steps after $resumed that ran before the kill"
echo "PASS (total $(printf '%.1f' "$(echo "$(now) - $t0" | bc)") s)"
