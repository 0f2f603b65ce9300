#!/usr/bin/env bash
# Configures and builds mpiddp. usage: scripts/build.sh [BUILD_DIR] [extra cmake -D options...]
# MPIDDP_BUILD_TARGETS (space-separated) builds those targets instead of all.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
elif [ $# -gt 0 ]; then
  cmake -S . -B "$build" "$@"
fi
targets=()
for t in ${MPIDDP_BUILD_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build" -j "$(nproc)" "${targets[@]}"
