#!/usr/bin/env bash
# Configures and builds mpiddp. usage: scripts/build.sh [BUILD_DIR] [extra cmake -D options...]
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
cmake --build "$build" -j "$(nproc)"
