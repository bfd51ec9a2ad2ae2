#!/usr/bin/env bash
# The libraries dstrain builds against, for a GPU machine that has the CUDA toolkit, CMake and a
# compiler but no package registry (and none of Debian's -dev packages): fetch their Debian 12
# packages here, carry the folder, unpack them there into a private prefix (never into /).
#
#   bash scripts/gpu_deps.sh fetch            # here (apt-get reachable): .gpu_deps/debs/*.deb, ~20 MB
#   bash scripts/gpu_deps.sh unpack           # there: .gpu_deps/root/, writes .gpu_deps/env.sh
#   bash scripts/gpu_deps.sh ensure           # there: unpack unless done (or nothing was carried)
#   . .gpu_deps/env.sh                        # there: CMAKE_PREFIX_PATH, PKG_CONFIG_PATH, LD_LIBRARY_PATH,
#                                             # NCCL_ROOT (the toolkit's NCCL, or the nvidia-nccl wheel's)
#
# unpack rewrites the packages' pkg-config files and CMake configs from /usr to the prefix (they
# name absolute paths), adds the links Debian's alternatives system would have made (OpenBLAS),
# and the libnccl.so link the NCCL wheel lacks. .gpu_deps/ is git-ignored: carry it to the device
# machine as an ignored path.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="$repo/.gpu_deps"
say() { printf '[gpu_deps] %s\n' "$*"; }
die() { printf '[gpu_deps] error: %s\n' "$*" >&2; exit 1; }

# Header-only and static libraries, and the shared libraries the build links (with the ones they
# need that a CUDA image may lack: libgfortran for OpenBLAS, pkgconf for pkg_check_modules).
packages=(
  libfmt-dev libfmt9 nlohmann-json3-dev libcli11-dev
  libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libopenblas0 libgfortran5
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libgtest-dev libgmock-dev googletest
  pkgconf pkgconf-bin libpkgconf3
)

fetch() {
  command -v apt-get >/dev/null || die "apt-get not found: fetch runs on a Debian 12 machine with its package registry"
  mkdir -p "$deps/debs"
  (cd "$deps/debs" && { apt-get download "${packages[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true; })
  local n; n=$(find "$deps/debs" -name '*.deb' | wc -l)
  ((n >= ${#packages[@]})) || die "only $n of ${#packages[@]} packages downloaded into $deps/debs (apt-get update first?)"
  say "$n packages, $(du -sh "$deps/debs" | cut -f1) in $deps/debs: carry .gpu_deps to the GPU machine, then run: bash scripts/gpu_deps.sh unpack"
}

# The directory holding nccl.h: the CUDA toolkit's, else the nvidia-nccl wheel's (PyTorch's).
find_nccl_root() {
  local d
  for d in "${NCCL_ROOT:-}" /usr/local/cuda /usr/local/cuda-*; do
    [ -n "$d" ] && [ -f "$d/include/nccl.h" ] && { echo "$d"; return; }
  done
  d=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null || true)
  [ -n "$d" ] && [ -f "$d/include/nccl.h" ] && { echo "$d"; return; }
  echo ""
}

unpack() {
  [ -d "$deps/debs" ] || die "no $deps/debs: run 'bash scripts/gpu_deps.sh fetch' on a machine with apt-get, and carry .gpu_deps"
  command -v dpkg-deb >/dev/null || command -v ar >/dev/null || die "neither dpkg-deb nor ar found to unpack the packages"
  local root="$deps/root"
  rm -rf "$root"
  mkdir -p "$root"
  local f
  for f in "$deps"/debs/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$f" "$root"
    else  # ar + tar: a .deb is an ar archive holding data.tar.*
      (cd "$(mktemp -d)" && ar x "$f" && tar -xf data.tar.* -C "$root")
    fi
  done
  local lib="$root/usr/lib/x86_64-linux-gnu"
  # Debian's alternatives links for OpenBLAS (dpkg-deb -x does not run maintainer scripts).
  ln -sf openblas-pthread/libopenblas.so.0 "$lib/libopenblas.so.0"
  ln -sf openblas-pthread/libopenblas.so "$lib/libopenblas.so"
  mkdir -p "$lib/pkgconfig" "$lib/cmake/openblas"
  ln -sf ../openblas-pthread/pkgconfig/openblas.pc "$lib/pkgconfig/openblas.pc"
  ln -sf ../../openblas-pthread/cmake/openblas/OpenBLASConfig.cmake "$lib/cmake/openblas/OpenBLASConfig.cmake"
  ln -sf ../../openblas-pthread/cmake/openblas/OpenBLASConfigVersion.cmake "$lib/cmake/openblas/OpenBLASConfigVersion.cmake"
  # Absolute /usr paths in pkg-config files and CMake configs point into the prefix instead.
  find "$root" \( -name '*.pc' -o -name '*.cmake' \) -type f -print0 |
    xargs -0 sed -i -e "s#\([= \"(]\)/usr/#\1$root/usr/#g" -e "s#=/usr\$#=$root/usr#"

  local nccl; nccl=$(find_nccl_root)
  if [ -n "$nccl" ] && [ ! -e "$nccl/lib/libnccl.so" ] && [ -e "$nccl/lib/libnccl.so.2" ]; then
    # The wheel ships libnccl.so.2 only; find_library wants libnccl.so.
    mkdir -p "$deps/nccl"
    ln -sfn "$nccl/include" "$deps/nccl/include"
    mkdir -p "$deps/nccl/lib"
    ln -sf "$nccl/lib/libnccl.so.2" "$deps/nccl/lib/libnccl.so"
    ln -sf "$nccl/lib/libnccl.so.2" "$deps/nccl/lib/libnccl.so.2"
    nccl="$deps/nccl"
  fi
  [ -n "$nccl" ] || say "warning: no nccl.h found (CUDA toolkit or the nvidia-nccl wheel); set NCCL_ROOT before configuring"
  local nccl_lib=""
  for f in "$nccl/lib64" "$nccl/lib"; do [ -n "$nccl" ] && [ -d "$f" ] && { nccl_lib="$f"; break; }; done

  cat > "$deps/env.sh" <<EOF
# Written by scripts/gpu_deps.sh unpack: source it before configuring or running dstrain here.
export CMAKE_PREFIX_PATH="$root/usr\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}"
export PKG_CONFIG_PATH="$lib/pkgconfig:$root/usr/share/pkgconfig\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}"
export PKG_CONFIG="\${PKG_CONFIG:-\$(command -v pkg-config || echo $root/usr/bin/pkgconf)}"
export PATH="\$PATH:$root/usr/bin"
export LD_LIBRARY_PATH="$lib:$lib/openblas-pthread${nccl_lib:+:$nccl_lib}\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export OpenBLAS_DIR="$lib/openblas-pthread/cmake/openblas"
${nccl:+export NCCL_ROOT="$nccl"}
EOF
  say "unpacked $(find "$deps/debs" -name '*.deb' | wc -l) packages into $root; now: . .gpu_deps/env.sh"
}

case "${1:-}" in
  fetch) fetch ;;
  unpack) unpack ;;
  ensure) if [ -d "$deps/debs" ] && [ ! -f "$deps/env.sh" ]; then unpack; fi ;;
  *) die "usage: bash scripts/gpu_deps.sh fetch|unpack|ensure" ;;
esac
