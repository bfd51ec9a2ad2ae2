#!/usr/bin/env python3
# Usage: python3 bench/corpus_census.py build/dstrain [DS_CONFIG_DIR]   (default: ../shared/ds_configs)
# Quick corpus census: like ../shared/tools/corpus_train.py, but train is given 8 s: a config that
# is still training then (or finished) counts as "starts training"; exit 2 is a refusal before step 1.
import os, sys, subprocess, tempfile, collections, json
D = sys.argv[1]; CORPUS = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "ds_configs")
tmp = tempfile.mkdtemp(prefix="qc-")
data = os.path.join(tmp, "tok.bin")
# a small byte-token file from prepare-data
txt = os.path.join(tmp, "t.txt"); open(txt, "w").write(("the quick brown fox jumps over the lazy dog. " * 4000))
subprocess.run([D, "prepare-data", txt, "-o", data, "--tokenizer", "bytes"], capture_output=True)
files = []
for root, _, names in os.walk(CORPUS):
    for nm in sorted(names):
        if nm.endswith(".json"): files.append(os.path.join(root, nm))
files.sort()
counts = collections.Counter(); reasons = collections.Counter()
for path in files:
    world = None
    for w in (1, 2, 4, 8):
        r = subprocess.run([D, "check-config", path, "--world-size", str(w), "--json"], capture_output=True, text=True, timeout=60)
        if r.returncode == 0: world = w; break
    if world is None: counts["invalid"] += 1; continue
    cmd = [D, "train", "--deepspeed_config", path, "--model", "gpt2:L2-C64-H2-T32", "--data", data, "--steps", "1",
           "--val-interval", "0", "--val-batches", "1", "--sample-tokens", "0", "--num-ranks", str(world), "--warmup-steps", "1", "--tokenizer", "bytes"]
    cwd = tempfile.mkdtemp(dir=tmp)
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=8, cwd=cwd); rc, err = r.returncode, r.stderr
    except subprocess.TimeoutExpired:
        rc, err = "running", ""
    if rc == 0 or rc == "running": counts["trains"] += 1
    elif rc == 2:
        counts["refused"] += 1
        line = next((l for l in err.splitlines() if "error" in l.lower()), err.strip().splitlines()[0] if err.strip() else "")
        reasons[line[:150]] += 1
    else:
        counts["broken"] += 1; reasons["BROKEN rc=%s %s" % (rc, err.strip()[-150:])] += 1
print("census: %d trains / %d accepted (%d refused, %d broken); %d invalid; of %d" % (counts["trains"], counts["trains"]+counts["refused"]+counts["broken"], counts["refused"], counts["broken"], counts["invalid"], len(files)))
for k, v in reasons.most_common(): print("  %3d  %s" % (v, k))
import shutil
shutil.rmtree(tmp, ignore_errors=True)
