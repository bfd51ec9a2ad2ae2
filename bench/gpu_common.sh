# shellcheck shell=bash
# Sourced by bench/gpu_gpt2.sh, bench/gpu_zero.sh and bench/gpu_all.sh: the CUDA Release build they need, the GPU
# check and the data.
#
# ensure_cuda_build TARGET...: makes sure $build_dir (a global the caller sets, as it sets $repo,
# say and die) is a CUDA build of this checkout and that TARGET... are up to date (an incremental
# build: seconds when nothing changed). Configures it when it has no CMakeCache.txt: Release,
# DSTRAIN_CUDA=ON, the tests when GoogleTest is found, CMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-native}
# (this machine's GPU). Switches to ${build_dir}-gpu when $build_dir is a build of another source
# folder (a copied build tree) or a CPU-only build, and says so. Uses every core.
# DSTRAIN_BENCH_NO_BUILD=1: use $build_dir as it is (built by hand).

ensure_cuda_build() {
  : "${repo:?}" "${build_dir:?}"
  # The carried libraries of a machine without Debian's -dev packages (scripts/gpu_deps.sh): the
  # build links them and the programs load them, so the environment is set also without a build.
  bash "$repo/scripts/gpu_deps.sh" ensure
  # shellcheck source=/dev/null
  if [ -f "$repo/.gpu_deps/env.sh" ]; then . "$repo/.gpu_deps/env.sh"; fi
  if [ "${DSTRAIN_BENCH_NO_BUILD:-0}" = 1 ]; then
    say "DSTRAIN_BENCH_NO_BUILD=1: using $build_dir as it is"
    return 0
  fi
  local cache="$build_dir/CMakeCache.txt" home jobs
  if [ -f "$cache" ]; then
    home=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$cache")
    if [ "$home" != "$repo" ]; then
      say "$build_dir was configured for $home, not $repo: building in ${build_dir}-gpu instead"
      build_dir="${build_dir}-gpu"
    elif ! grep -q '^DSTRAIN_CUDA:BOOL=ON' "$cache"; then
      say "$build_dir is a CPU-only build (DSTRAIN_CUDA off): building in ${build_dir}-gpu instead"
      build_dir="${build_dir}-gpu"
    fi
    cache="$build_dir/CMakeCache.txt"
  fi
  command -v cmake >/dev/null 2>&1 || die "cmake not found"
  if [ ! -f "$cache" ]; then
    command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] || die "nvcc not found: the CUDA build needs the CUDA toolkit"
    mkdir -p "$build_dir"
    say "configuring $build_dir (Release, CUDA arch ${CUDA_ARCH:-native})"
    # With the tests (bench/gpu_all.sh runs the GPU ones) when GoogleTest is found, else without.
    if ! cmake -S "$repo" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DDSTRAIN_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-native}" > "$build_dir/dstrain_configure.log" 2>&1; then
      say "configure with the tests failed (no GoogleTest?); configuring without them"
      rm -f "$build_dir/CMakeCache.txt"
      cmake -S "$repo" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DDSTRAIN_CUDA=ON -DDSTRAIN_BUILD_TESTS=OFF \
        -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-native}" > "$build_dir/dstrain_configure.log" 2>&1 ||
        { tail -n 30 "$build_dir/dstrain_configure.log" >&2; die "cmake configure failed (full log: $build_dir/dstrain_configure.log)"; }
    fi
  fi
  jobs=$(nproc 2>/dev/null || echo 8)
  say "building $* in $build_dir (-j$jobs; nothing to do when up to date)"
  local t0=$SECONDS
  cmake --build "$build_dir" --target "$@" -j "$jobs" > "$build_dir/dstrain_build.log" 2>&1 ||
    { tail -n 40 "$build_dir/dstrain_build.log" >&2; die "build failed (full log: $build_dir/dstrain_build.log)"; }
  say "build done in $((SECONDS - t0)) s"
}

# require_gpu: dies unless nvidia-smi sees a GPU.
require_gpu() {
  command -v nvidia-smi >/dev/null 2>&1 || die "nvidia-smi not found: this script needs a machine with an NVIDIA GPU"
  nvidia-smi -L >/dev/null 2>&1 || die "nvidia-smi sees no GPU ($(nvidia-smi -L 2>&1 | head -1))"
}

# bench_data: the token file to train on when --data is not given: the Brown corpus prepared by
# scripts/setup.sh if this checkout has it, else 4M random GPT-2 token ids written once (the
# throughput does not depend on the tokens). Prints the path.
bench_data() {
  if [ -f "$repo/datasets/brown_train.bin" ]; then
    echo "$repo/datasets/brown_train.bin"
    return
  fi
  local f="$build_dir/gpu_bench/random_tokens.bin"
  if [ ! -f "$f" ]; then
    mkdir -p "$(dirname "$f")"
    say "no datasets/brown_train.bin: writing $f (4M random GPT-2 token ids; throughput does not depend on them)" >&2
    python3 "$repo/bench/gpu_bench.py" random-tokens "$f" 4194304 50257 >&2
  fi
  echo "$f"
}
