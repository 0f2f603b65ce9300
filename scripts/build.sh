#!/usr/bin/env bash
# Configures and builds mpiddp. usage: scripts/build.sh [BUILD_DIR] [extra cmake -D options...]
# MPIDDP_BUILD_TARGETS (space-separated) builds those targets instead of all.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# A compiler cache outside the clone (MPIDDP_CCACHE_DIR, default /var/cache/mpiddp/ccache; inside the
# sid chroot, the chroot's own): a fresh clone, CI's, recompiles nothing that a build of the same
# sources with the same flags compiled before, wherever either clone lies (paths are hashed relative
# to the clone: CCACHE_BASEDIR; the build directory is not hashed: CCACHE_NOHASHDIR). Precompiled
# headers off with it: a .gch holds its clone's paths, and ccache hashes it whole.
# Where that directory cannot be made or written (no root), ccache's own default directory.
launcher=()
if command -v ccache >/dev/null; then
  cache_dir=${MPIDDP_CCACHE_DIR:-/var/cache/mpiddp/ccache}
  if mkdir -p "$cache_dir" 2>/dev/null && [ -w "$cache_dir" ]; then export CCACHE_DIR=$cache_dir; fi
  export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
  export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-12G} CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache
            -DMPIDDP_PRECOMPILE_HEADERS=OFF)
fi
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" "${generator[@]}" "${launcher[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
elif [ $# -gt 0 ]; then
  cmake -S . -B "$build" "$@"
fi
targets=()
for t in ${MPIDDP_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" -j "$(nproc)" "${targets[@]}"
