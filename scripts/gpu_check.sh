#!/usr/bin/env bash
# The CUDA backend's checks on a GPU machine, in one command: build (Release, this GPU's
# architecture, with the tests), then every gpu-labelled test (each CUDA kernel against the CPU
# reference, the allocators and transfers, both communicators on device memory, the engine's
# training steps against the CPU backend, a GPT-2 d12 run whose loss falls).
#
#   bash scripts/gpu_check.sh [OUT_DIR]     # default $OUT, else build-gpu/
#
# On a machine without Debian's -dev packages, carry .gpu_deps/debs (bash scripts/gpu_deps.sh
# fetch, on a machine with apt-get): it is unpacked into a private prefix first. The build folder
# (build-gpu) is kept between runs on the same machine, so a second call only rebuilds what
# changed. Writes OUT_DIR/gpu_tests.log (the whole ctest output, the measured GPU-vs-CPU figures
# printed by DSTRAIN_GPU_VERBOSE=1 included) and OUT_DIR/gpu_build.log.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$repo/build-gpu"
out="${1:-${OUT:-$build}}"
mkdir -p "$out" "$build"
say() { printf '[gpu_check] %s\n' "$*"; }

bash "$repo/scripts/gpu_deps.sh" ensure
# shellcheck source=/dev/null
if [ -f "$repo/.gpu_deps/env.sh" ]; then . "$repo/.gpu_deps/env.sh"; fi
nvidia-smi -L || say "nvidia-smi -L failed: the tests will say why they skip"

jobs=$(nproc 2>/dev/null || echo 8)
t0=$SECONDS
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release -DDSTRAIN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-native}" > "$out/gpu_build.log" 2>&1 ||
    { tail -n 40 "$out/gpu_build.log"; exit 1; }
fi
cmake --build "$build" -j "$jobs" >> "$out/gpu_build.log" 2>&1 || { grep -E "error|Error" "$out/gpu_build.log" | head -40; exit 1; }
say "built in $((SECONDS - t0)) s"

t0=$SECONDS
rc=0
(cd "$build" && DSTRAIN_GPU_VERBOSE=1 ctest -L gpu -V --timeout 900) > "$out/gpu_tests.log" 2>&1 || rc=$?
grep -E "^\[gpu-vs-cpu\]|^\[d12\]" "$out/gpu_tests.log" || true
tail -n 25 "$out/gpu_tests.log"
say "ctest -L gpu: exit $rc in $((SECONDS - t0)) s (whole log: $out/gpu_tests.log)"
exit "$rc"
