#!/usr/bin/env bash
# The Slurm-requeue / mpirun relaunch (docs/elastic.md): `mpiexec -n 4 dstrain train --save-dir D
# --save-interval 2` loses a rank (kill -9) after its step 3, with the step-4 save slowed down by the
# test hook so the kill lands before it commits; the same command relaunched as `mpiexec -n 2 ...
# --resume auto` resumes from the newest COMPLETE checkpoint (the one `latest` names; the killed
# save's .partial folder is removed) on 2 ranks and finishes, and its losses are the reference's bit
# for bit: --num-ranks 4 to the same step, saved, resumed on --num-ranks 2 (the MPI backend equals
# local ranks, test_train_mpi_cli); and its samples after that step (--log-samples) are those an
# uninterrupted run reads. Exit status 0 when all holds, 1 otherwise.
#
#   mpi_elastic_relaunch.sh <dstrain binary> <scratch folder> <mpiexec and its flags...>
set -uo pipefail
# shellcheck source=shell_test_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/shell_test_common.sh" "$@"
# train_batch_size 8: GAS 1 on 4 ranks, GAS 2 on 2 (bf16, ZeRO 2, a schedule: what a resume restores).
cat > "$scratch/ds.json" <<'JSON'
{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "steps_per_print": 1,
 "bf16": {"enabled": true}, "zero_optimization": {"stage": 2},
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "weight_decay": 0.1}},
 "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 3, "total_num_steps": 12}}}
JSON
train=(train --deepspeed_config "$scratch/ds.json" --model gpt2:L2-C32-H2-V256-T32 --tokenizer bytes --data "$scratch/t_train.bin"
       --sample-tokens 0 --val-interval 0 --seed 9)
D="$scratch/ck"

rank_pid() {
  local launcher="$1" rank="$2" p
  for p in $(pgrep -P "$launcher"); do
    if tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$rank\|PMI_RANK=$rank"; then echo "$p"; return; fi
  done
}

# 1. Four processes, a checkpoint every 2 steps; each save pauses 400 ms before each file and rename.
out="$scratch/first.txt"
DSTRAIN_TEST_CHECKPOINT_PAUSE_MS=400 DSTRAIN_COMM_TIMEOUT=5 OMP_NUM_THREADS=1 "${mpiexec[@]}" 4 "$dstrain" "${train[@]}" \
  --steps 8 --save-dir "$D" --save-interval 2 >"$out" 2>&1 &
launcher=$!
waited=0
until grep -q '^step 3/' "$out"; do
  sleep 0.05; waited=$((waited + 1))
  kill -0 "$launcher" 2>/dev/null || { cat "$out"; fail "the 4-rank run ended before step 3"; }
  [ "$waited" -lt 1200 ] || { kill -9 "$launcher"; cat "$out"; fail "the 4-rank run did not reach step 3"; }
done
r2=""; tries=0
until [ -n "$r2" ]; do
  r2=$(rank_pid "$launcher" 2); tries=$((tries + 1))
  [ -n "$r2" ] || [ "$tries" -lt 50 ] || { kill -9 "$launcher"; fail "cannot find rank 2 among the children of $launcher"; }
  [ -n "$r2" ] || sleep 0.05
done
kill -9 "$r2"
t=0
while kill -0 "$launcher" 2>/dev/null; do
  sleep 0.2; t=$((t + 1))
  [ "$t" -lt 150 ] || { kill -9 "$launcher"; cat "$out"; fail "the job did not end within 30 s of the kill"; }
done
wait "$launcher" && { cat "$out"; fail "the killed job ended with status 0"; }
[ -f "$D/latest" ] || { cat "$out"; ls -la "$D"; fail "no checkpoint committed before the kill"; }
tag=$(cat "$D/latest")
[ -f "$D/$tag/checkpoint.json" ] || fail "latest names $tag, which has no manifest"
saved=${tag#global_step}
[ "$saved" -ge 2 ] && [ "$saved" -lt 8 ] || fail "latest names $tag; expected a step from 2 to 7"
echo "killed after step 3: latest names $tag ($(ls "$D" | tr '\n' ' '))"

# 2. Relaunched on 2 processes, unchanged but for the count: resumes from $tag and finishes.
out2="$scratch/relaunch.txt"
DSTRAIN_COMM_TIMEOUT=30 OMP_NUM_THREADS=1 "${mpiexec[@]}" 2 "$dstrain" "${train[@]}" --steps 8 --save-dir "$D" --save-interval 2 --resume auto \
  --summary-json "$scratch/relaunch.json" --log-samples "$scratch/relaunch.samples" >"$out2" 2>&1 || { cat "$out2"; fail "the relaunch on 2 ranks failed"; }
grep -q "resumed from checkpoint $D/$tag at step $saved" "$out2" || { cat "$out2"; fail "the relaunch did not resume from $tag"; }
grep -q '^step 8/8' "$out2" || { cat "$out2"; fail "the relaunch did not finish step 8"; }
ls "$D" | grep -q '\.partial$' && fail "a .partial folder is left: $(ls "$D")"

# 3. The reference: 4 local ranks to the same step, saved, resumed on 2.
"$dstrain" "${train[@]}" --num-ranks 4 --steps "$saved" --save-dir "$scratch/ref" >"$scratch/ref1.txt" 2>&1 ||
  { cat "$scratch/ref1.txt"; fail "reference (4 ranks)"; }
"$dstrain" "${train[@]}" --num-ranks 2 --steps 8 --resume "$scratch/ref" --summary-json "$scratch/ref.json" >"$scratch/ref2.txt" 2>&1 ||
  { cat "$scratch/ref2.txt"; fail "reference (2 ranks)"; }
losses() { tr -d ' \n' < "$1" | grep -o '"train_losses":\[[^]]*\]'; }
a=$(losses "$scratch/relaunch.json"); b=$(losses "$scratch/ref.json")
[ -n "$a" ] && [ "$a" = "$b" ] || fail "losses differ: relaunch $a, reference $b"
# 4. The data order, independently of the reference's code path: the relaunch reads, step by step,
# the windows an uninterrupted run on 2 local ranks reads after step $saved (a lost data position
# fails here even where the reference would lose it too).
"$dstrain" "${train[@]}" --num-ranks 2 --steps 8 --log-samples "$scratch/whole.samples" >"$scratch/whole.txt" 2>&1 ||
  { cat "$scratch/whole.txt"; fail "uninterrupted run (2 ranks)"; }
after() { awk -v s="$saved" '$2 > s {print $2, $4, $6}' "$1" | sort; }
[ "$(after "$scratch/relaunch.samples" | wc -l)" -eq $(((8 - saved) * 8)) ] || fail "the relaunch logged $(after "$scratch/relaunch.samples" | wc -l) samples"
[ "$(after "$scratch/relaunch.samples")" = "$(after "$scratch/whole.samples")" ] ||
  fail "the relaunch read other samples after step $saved than the uninterrupted run"
echo "relaunch on 2 ranks from $tag: steps $((saved + 1))-8, losses equal to the reference's: $a"
rm -rf "$scratch"
