#!/usr/bin/env bash
# The main job, from a fresh clone: install what is missing, build, and run mpiddp on 2 ranks.
# usage: scripts/main.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
bash scripts/build.sh build
source scripts/env.sh
set -x
mpirun -np 2 "${MPIRUN_FLAGS[@]}" -x NCCL_DEBUG=INFO build/mpiddp info
