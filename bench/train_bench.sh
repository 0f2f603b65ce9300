#!/usr/bin/env bash
# Training throughput and start-up, side by side in one call, on three software stacks:
#   debian12  Debian 12's libtorch/python3-torch 1.13 (this machine), mpiddp built in BUILD_DIR
#   sid       Debian sid's libtorch/python3-torch 2.14 in the chroot of scripts/chroot.sh,
#             mpiddp built against it in build-sid
#   pip       PyTorch's own wheel from PyPI (torch 2.11, CUDA 13 build, run on the CPU) in the venv
#             of scripts/build_pip.sh, mpiddp built against it in build-pip; Python DDP runs that
#             same venv's torch
# (MPIDDP_BENCH_STACKS="debian12 pip" picks stacks; the default is all three)
# Contenders on each stack, 2 ranks x 1 thread, rounds interleaved (stack by stack inside a round)
# so every contender sees the same machine noise:
#   python      PyTorch DDP (that stack's python3-torch, gloo) started by mpirun the SuperCloud way
#   handwritten libtorch + MPI by hand, no framework (bench/handwritten_ddp.cpp)
#   mpiddp      `mpiddp train`
#   single      `mpiddp train` on one rank with 2 intra-op threads and the same global batch
# Workloads: the seeds' toy (2048 x 20 regression, Linear(20, 1), SGD 1e-3, batch 32 per rank) and
# PyTorch's MNIST example CNN on the first 2560 Fashion-MNIST training images (Adam 0.002, batch
# 64 per rank). Each contender runs a short and a long job (bench/train_round.sh); throughput is
# (work of the long - work of the short) / (wall time of the long - wall time of the short), so
# start-up cancels and per-epoch costs count; time to first step runs from just before mpirun to
# the end of rank 0's first optimizer step. Prints Markdown tables; raw JSON lines in OUT_DIR.
# MPIDDP_BENCH_BEFORE=PATH/mpiddp adds that earlier build as the contender mpiddp_before (Debian 12
# stack), to compare a change before and after in the same rounds.
#   usage: bench/train_bench.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
bench_init train 3 "$@"
bash scripts/deps.sh python3-torch python3-h5py >&2
# shellcheck disable=SC2086  # the list of stacks
build_stacks $stacks
toy=$(workload_toy)
cnn=$(workload_fm_head 2560)

: >"$out/results.jsonl"
for round in $(seq 1 "$rounds"); do
  for stack in $stacks; do
    on_stack "$stack" bash bench/train_round.sh "$stack" "$(stack_dir "$stack" "$build")" "$round" "$out" "$toy" "$cnn"
  done
done
save_results "$out/results.jsonl"

/usr/bin/python3 bench/train_report.py "$out/results.jsonl"
