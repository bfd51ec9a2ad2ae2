#!/usr/bin/env bash
# A periodic save that meets a really full disk (docs/checkpoints.md "Atomicity"): the checkpoints go
# to a small tmpfs, mounted in a private user + mount namespace (unshare -Urm, no root needed), with
# room for one checkpoint and a half. The save of step 1 fits; the save of step 2 runs out of space.
# What must hold: the run ends with an error naming the file and "no space left"; no `.partial`
# folder is left; `latest` still names global_step1; and a run resumed from it trains on.
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
room=$(( (bytes * 3 / 2 + 4095) / 4096 * 4096 ))
echo "one checkpoint: $bytes bytes; tmpfs of $room bytes"

# Everything on the small disk happens inside one namespace: the tmpfs ends with it.
export dstrain scratch room
unshare -Urm bash -c '
  set -uo pipefail
  mount -t tmpfs -o size="$room" tmpfs "$scratch/disk" || exit 77
  ck="$scratch/disk/ck"
  OMP_NUM_THREADS=1 "$@" --steps 4 --save-interval 1 --save-dir "$ck" >"$scratch/full.txt" 2>&1
  echo "$?" >"$scratch/full.status"
  ls -a "$ck" >"$scratch/full.ls"
  cat "$ck/latest" >"$scratch/full.latest" 2>/dev/null
  OMP_NUM_THREADS=1 "$@" --steps 2 --resume "$ck" >"$scratch/resume.txt" 2>&1
  echo "$?" >"$scratch/resume.status"
' bash "${train[@]}"
ns=$?
[ "$ns" -ne 77 ] || { echo "SKIP: tmpfs cannot be mounted in a user namespace here"; exit 77; }

status=$(cat "$scratch/full.status")
[ "$status" -ne 0 ] || { cat "$scratch/full.txt"; fail "the run on a full disk ended with status 0"; }
grep -q "no space left" "$scratch/full.txt" || { cat "$scratch/full.txt"; fail "the error does not say 'no space left'"; }
grep -q "global_step2" "$scratch/full.txt" || { cat "$scratch/full.txt"; fail "the error does not name the checkpoint being written"; }
grep -q "\.partial" "$scratch/full.ls" && { cat "$scratch/full.ls"; fail "a .partial folder was left on the full disk"; }
[ "$(cat "$scratch/full.latest")" = global_step1 ] || fail "latest is '$(cat "$scratch/full.latest")', not global_step1"
[ "$(cat "$scratch/resume.status")" -eq 0 ] || { cat "$scratch/resume.txt"; fail "resuming from global_step1 failed"; }
grep -q '^step 2/' "$scratch/resume.txt" || { cat "$scratch/resume.txt"; fail "the resumed run did not train step 2"; }
echo "PASS: full disk at the second save: $(grep -m1 'no space left' "$scratch/full.txt")"
rm -rf "$scratch"
