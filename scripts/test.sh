#!/usr/bin/env bash
# Sets up, builds and runs dstrain's tests. GPU tests (CTest label gpu) run only where a GPU is
# visible; elsewhere they are listed as excluded, never silently passed.
#
# The CPU suite (every test not labelled gpu) is compiled and run once, under AddressSanitizer +
# UndefinedBehaviorSanitizer (scripts/gates.sh asan, in build-asan/), not a second time at -O3: the
# Release build in build/ holds the libraries, the `dstrain` CLI, the benchmarks, the CUDA backend and
# the tests that need it, and the install check (-DDSTRAIN_CPU_TESTS=OFF). DSTRAIN_GATES=0 skips the
# gates and runs the CPU suite in the Release build instead (a quick local run).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${DSTRAIN_BUILD_DIR:-$repo/build}"
gates="${DSTRAIN_GATES:-1}"

if [ "$gates" != 0 ]; then
  DSTRAIN_CMAKE_ARGS="-DDSTRAIN_CPU_TESTS=OFF ${DSTRAIN_CMAKE_ARGS:-}" bash "$repo/scripts/setup.sh"
else
  bash "$repo/scripts/setup.sh"
fi

labels=(-LE gpu)
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  labels=()
  echo "[test] GPU found: running the gpu-labelled tests too"
else
  echo "[test] no GPU visible: gpu-labelled tests are excluded (run 'ctest -L gpu' on a GPU machine)"
fi
if [ "$gates" != 0 ]; then
  echo "[test] Release build: the install check and the CUDA tests; the CPU suite runs under ASan+UBSan below"
fi
(cd "$build_dir" && ctest --output-on-failure -j "$(nproc 2>/dev/null || echo 2)" "${labels[@]}")

# ---- gates (README "Gates"; scripts/gates.sh): sanitizers and fuzzing, after the Release tests ---
# CI's budget is 45 minutes on 2 cores for all of .ci/run (hard limit 90). CPU seconds (user + sys)
# measured on the 2-core development machine, 2026-11-27 (wall on 2 free cores is about half;
# figures marked ~ are estimates from sampled files):
#   Release build (-O3, CUDA): the CPU test programs no longer built here: 115 test files at
#     ~5.5 s (sampled: 0.5-0.65 of their -O1 ASan time) ~ 630 s + ~35 links, and the suite's run
#     (~250 s, the sum of ctest's recorded times) — about 900 s less than before.
#   ASan+UBSan (-O1 libraries, -Og test files: tests/CMakeLists.txt), the whole CPU suite:
#     build: 165 library files ~ 700 s (103 measured from scratch: 399 s) + 115 test files 6.5 s
#     each (73 measured: 473 s) ~ 750 s, so ~1450 s against 920 s for the 11 programs before;
#     run: each program run whole once, 415 s summed (test_data 83 s, most of it node;
#     test_checkpoint 64; test_zero_equivalence 55; test_zero_optimizer_rules 33), plus ctest's
#     one process per test (~2500, a few hundredths of a second each under ASan): ~550 s, so the
#     ASan gate ~ (1450 + 550) / 2 ~ 17 min wall. NOT YET PASSING: see the WIP commit message.
#   TSan, 4 test programs: build 102 + 141 s; run 15 s (unchanged)
#   fuzz: build 200 s (clang; the four first readers; not re-measured for the 8 targets, and
#         fuzz_checkpoint links the engine, so more); run 8 x 60000 inputs from seed 1 (`fuzz-fixed`:
#         15-40 s a target). A fixed seed and count, not a time: a timed run tries different inputs
#         on every machine, so CI could fail on a bug no developer run had met (2026-11-27: a zip64
#         overflow found at CI's 30 s).
# Not in CI: the activation-transfer tests of test_engine under TSan. Run every gate alone:
# `bash scripts/gates.sh asan`, `... tsan`, `... fuzz 300` (timed, random: hunting new bugs).
if [ "$gates" != 0 ]; then
  bash "$repo/scripts/gates.sh" asan
  DSTRAIN_GATES_TARGETS="test_zero_comm test_zero_parts test_zero_engine_comm test_zero_reduce_scatter_off" \
    bash "$repo/scripts/gates.sh" tsan
  bash "$repo/scripts/gates.sh" fuzz-fixed "${DSTRAIN_FUZZ_RUNS:-60000}"
fi
