#!/usr/bin/env bash
# The main job, from a fresh clone: install what is missing, build, check the MPI job with
# `mpiddp info`, convert the bundled Fashion-MNIST (Debian's dataset-fashion-mnist) to HDF5, and
# train PyTorch's MNIST example CNN on 2 ranks with DDP, evaluating after every epoch.
# usage: scripts/main.sh [extra `mpiddp train` options, e.g. --epochs 1]
# Builds only what it runs: the mpiddp executable (target mpiddp_cli). A new build/ is configured
# without tests and benchmarks; scripts/test.sh turns them on in the same build/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
new=()
[ -f build/CMakeCache.txt ] || new=(-DMPIDDP_BUILD_TESTS=OFF -DMPIDDP_BUILD_BENCH=OFF)
MPIDDP_BUILD_TARGETS=mpiddp_cli bash scripts/build.sh build "${new[@]}"
source scripts/env.sh
data=${MPIDDP_DATA_DIR:-build/data}
mkdir -p "$data"
set -x
mpirun -np 2 "${MPIRUN_FLAGS[@]}" -x NCCL_DEBUG=INFO build/mpiddp info
[ -f "$data/fashion-mnist-test.h5" ] || build/mpiddp data fashion-mnist --out "$data/fashion-mnist.h5"
rm -f "$data/metrics.jsonl"
mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core build/mpiddp train --model cnn \
  --data "$data/fashion-mnist-train.h5" --test-data "$data/fashion-mnist-test.h5" \
  --epochs 4 --batch-size 64 --optimizer adam --lr 0.002 --lr-schedule cosine --seed 0 \
  --metrics "$data/metrics.jsonl" "$@"
set +x
python3 -c '
import json, sys
last = [json.loads(l) for l in open(sys.argv[1])][-1]
accuracy, epochs = last["test_accuracy"], last["epoch"]
print(f"main job: test accuracy {100 * accuracy:.2f}% after {epochs} epoch(s)")' "$data/metrics.jsonl"
