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
build_dir="$repo/build-gpu"
out="${1:-${OUT:-$build_dir}}"
mkdir -p "$out"
say() { printf '[gpu_check] %s\n' "$*"; }
die() { printf '[gpu_check] error: %s\n' "$*" >&2; exit 1; }

# The build bench/ uses (configure for this GPU when missing, carried libraries, every core).
# shellcheck source=bench/gpu_common.sh
. "$repo/bench/gpu_common.sh"
nvidia-smi -L || say "nvidia-smi -L failed: the tests will say why they skip"
ensure_cuda_build all
grep -q '^DSTRAIN_BUILD_TESTS:BOOL=ON' "$build_dir/CMakeCache.txt" ||
  die "$build_dir was configured without the tests (GoogleTest not found: carry .gpu_deps/debs, see scripts/gpu_deps.sh)"
cp "$build_dir/dstrain_build.log" "$out/gpu_build.log" 2>/dev/null || true

t0=$SECONDS
rc=0
(cd "$build_dir" && DSTRAIN_GPU_VERBOSE=1 ctest -L gpu -V --timeout 900) > "$out/gpu_tests.log" 2>&1 || rc=$?
grep -E "^\[gpu-vs-cpu\]|^\[d12\]" "$out/gpu_tests.log" || true
tail -n 25 "$out/gpu_tests.log"
say "ctest -L gpu: exit $rc in $((SECONDS - t0)) s (whole log: $out/gpu_tests.log)"
exit "$rc"
