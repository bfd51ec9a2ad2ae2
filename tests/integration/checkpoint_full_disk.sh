#!/usr/bin/env bash
# A save that meets a full disk (docs/checkpoints.md "Atomicity"): the checkpoints go to a small tmpfs,
# mounted in a private user + mount namespace (unshare -Urm, no root needed), with room for four
# checkpoints and a half.
# 1. Known at the start: a run that would keep six checkpoints there is refused before step 1,
#    naming --save-dir, the bytes it needs and the free space (exit 2, nothing written).
# 2. Found late: a run that keeps four starts, and after its first save another file takes all but
#    half a checkpoint's room. The save of step 2 runs out of space; the run ends with an error
#    naming the file and "no space left"; no `.partial` folder is left; `latest` still names
#    global_step1; and a run resumed from it trains on.
# Exit 0 when all holds, 1 when not, 77 (ctest: skipped) where user namespaces are not allowed.
#
#   checkpoint_full_disk.sh <dstrain binary> <scratch folder>
set -uo pipefail
dstrain="$1"; scratch="$2"

fail() { echo "FAIL: $*" >&2; exit 1; }
if ! unshare -Urm true 2>/dev/null; then
  echo "SKIP: this system does not allow unprivileged user namespaces (unshare -Urm), so no private tmpfs can be mounted"
  exit 77
fi
rm -rf "$scratch"; mkdir -p "$scratch/text" "$scratch/disk"
for d in 0 1 2; do
  for i in $(seq 1 60); do printf 'A full disk is met at step %d, word %d, and the run must say so. ' "$d" "$i"; done > "$scratch/text/doc$d.txt"
done
"$dstrain" prepare-data --tokenizer bytes "$scratch/text" -o "$scratch/t.bin" --val-fraction 0.3 >/dev/null 2>&1 || fail "prepare-data"
cat > "$scratch/ds.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "steps_per_print": 1,
 "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}, "zero_optimization": {"stage": 1}}
JSON
train=("$dstrain" train --deepspeed_config "$scratch/ds.json" --model gpt2:L2-C32-H2-V256-T32 --tokenizer bytes
       --data "$scratch/t_train.bin" --sample-tokens 0)

# How big one checkpoint is, on the real disk.
OMP_NUM_THREADS=1 "${train[@]}" --steps 1 --save-dir "$scratch/probe" >"$scratch/probe.txt" 2>&1 || { cat "$scratch/probe.txt"; fail "probe run"; }
bytes=$(du -sb "$scratch/probe/global_step1" | cut -f1)
[ "$bytes" -gt 0 ] || fail "probe checkpoint is empty"
room=$(( (bytes * 9 / 2 + 4095) / 4096 * 4096 ))
echo "one checkpoint: $bytes bytes; tmpfs of $room bytes"

# Everything on the small disk happens inside one namespace: the tmpfs ends with it.
export dstrain scratch room bytes
unshare -Urm bash -c '
  set -uo pipefail
  mount -t tmpfs -o size="$room" tmpfs "$scratch/disk" || exit 77
  ck="$scratch/disk/ck"
  OMP_NUM_THREADS=1 "$@" --steps 6 --save-interval 1 --save-dir "$ck" >"$scratch/early.txt" 2>&1
  echo "$?" >"$scratch/early.status"
  # The second run pauses before each file of a save (the test hook), so the filler lands between
  # the commit of step 1 and the first file of step 2.
  DSTRAIN_TEST_CHECKPOINT_PAUSE_MS=400 OMP_NUM_THREADS=1 "$@" --steps 4 --save-interval 1 --save-dir "$ck" >"$scratch/full.txt" 2>&1 &
  run=$!
  n=0; while [ ! -e "$ck/latest" ] && [ $n -lt 1200 ] && kill -0 $run 2>/dev/null; do sleep 0.05; n=$((n+1)); done
  free=$(df --output=avail -B1 "$scratch/disk" | tail -1 | tr -d " ")
  fill=$(( free - bytes / 2 ))
  [ "$fill" -gt 0 ] && head -c "$fill" /dev/zero >"$scratch/disk/filler" 2>/dev/null
  wait $run
  echo "$?" >"$scratch/full.status"
  ls -a "$ck" >"$scratch/full.ls"
  cat "$ck/latest" >"$scratch/full.latest" 2>/dev/null
  OMP_NUM_THREADS=1 "$@" --steps 2 --resume "$ck" >"$scratch/resume.txt" 2>&1
  echo "$?" >"$scratch/resume.status"
' bash "${train[@]}"
ns=$?
[ "$ns" -ne 77 ] || { echo "SKIP: tmpfs cannot be mounted in a user namespace here"; exit 77; }

[ "$(cat "$scratch/early.status")" -eq 2 ] || { cat "$scratch/early.txt"; fail "six checkpoints on a disk with room for 4.5 were not refused with exit 2"; }
grep -q "will not fit" "$scratch/early.txt" && grep -q -- "--save-dir" "$scratch/early.txt" ||
  { cat "$scratch/early.txt"; fail "the refusal does not name --save-dir and the room"; }
grep -q "| loss" "$scratch/early.txt" && { cat "$scratch/early.txt"; fail "the run trained before refusing"; }
status=$(cat "$scratch/full.status")
[ "$status" -ne 0 ] || { cat "$scratch/full.txt"; fail "the run on a full disk ended with status 0"; }
grep -q "no space left" "$scratch/full.txt" || { cat "$scratch/full.txt"; fail "the error does not say 'no space left'"; }
grep -q "global_step2" "$scratch/full.txt" || { cat "$scratch/full.txt"; fail "the error does not name the checkpoint being written"; }
grep -q "\.partial" "$scratch/full.ls" && { cat "$scratch/full.ls"; fail "a .partial folder was left on the full disk"; }
[ "$(cat "$scratch/full.latest")" = global_step1 ] || fail "latest is '$(cat "$scratch/full.latest")', not global_step1"
[ "$(cat "$scratch/resume.status")" -eq 0 ] || { cat "$scratch/resume.txt"; fail "resuming from global_step1 failed"; }
grep -q '^step 2/' "$scratch/resume.txt" || { cat "$scratch/resume.txt"; fail "the resumed run did not train step 2"; }
echo "PASS: refused at the start: $(grep -m1 'will not fit' "$scratch/early.txt")"
echo "PASS: full disk at the second save: $(grep -m1 'no space left' "$scratch/full.txt")"
rm -rf "$scratch"
