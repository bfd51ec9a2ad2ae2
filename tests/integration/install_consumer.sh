#!/usr/bin/env bash
# Installs the built tree into a fresh prefix and builds examples/consumer against it with
# find_package(dstrain): proves the installed headers, libraries and CMake package are complete.
# Usage: install_consumer.sh <source dir> <build dir> <scratch dir>
set -euo pipefail
src="$1"; build="$2"; scratch="$3"
rm -rf "$scratch"; mkdir -p "$scratch"
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
cmake -S "$src/examples/consumer" -B "$scratch/build" -DCMAKE_PREFIX_PATH="$scratch/prefix" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$scratch/build" -j 2 >/dev/null
out="$("$scratch/build/dstrain_consumer" "$src/examples/ds_configs/zero2_fp16_offload_cpu.json")"
echo "$out"
# The config as DeepSpeed reads it for 2 ranks (TBS 32, GAS 4 -> micro-batch 4), and a training loop
# through the installed engine whose loss fell (the program exits non-zero otherwise).
grep -q "zero stage 2, precision fp16, train_batch_size 32 = 4 x 4 x 2" <<<"$out"
grep -q "embedded engine: 20 optimizer steps" <<<"$out"
# The Trainer's whole run on 2 local ranks through the installed library.
grep -q "trainer: 10 steps on 2 ranks" <<<"$out"
# A model family of the program's own, registered and trained by the Trainer at ZeRO stage 2 on 2 ranks.
grep -q "own family: bigram model: vocab 7, width 16; 231 parameters, ZeRO stage 2 on 2 ranks, 30 steps" <<<"$out"
