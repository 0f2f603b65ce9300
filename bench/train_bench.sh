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
# the end of rank 0's first optimizer step. Records in OUT_DIR/records.jsonl (the runs in results.jsonl),
# tabled by bench/report.py.
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
# Records: per round, each contender's throughput from its two lengths (start-up cancels) and its
# time to first step (the short run's).
/usr/bin/python3 - "$out/results.jsonl" <<'PY' | record_tsv
import json, sys
NAMES = {"python": "Python DDP (gloo), 2 ranks", "handwritten": "hand-written libtorch + MPI, 2 ranks",
         "mpiddp": "mpiddp, 2 ranks", "single": "1 process, 2 threads",
         "python_fused": "Python DDP (gloo), Adam(fused=True), 2 ranks",
         "mpiddp_before": "mpiddp before a change, 2 ranks"}
runs = {}
for r in map(json.loads, open(sys.argv[1])):
    runs.setdefault((r["stack"], r["torch"], r["workload"], r["who"], r["round"]), []).append(r)
for (stack, torch, workload, who, rnd), pair in runs.items():
    if len(pair) != 2:
        continue
    short, long = sorted(pair, key=lambda r: r["epochs"])
    unit = "steps" if workload == "toy" else "samples"
    rate = (long[unit] - short[unit]) / (long["wall_s"] - short["wall_s"])
    where = f"{stack} (torch {torch})"
    print(f"{where}\t{rnd}\t{NAMES[who]}\t{workload} throughput\t{rate}\t{unit}/s")
    print(f"{where}\t{rnd}\t{NAMES[who]}\t{workload} time to first step\t{short['first_step_s']}\ts")
PY
save_results
/usr/bin/python3 bench/report.py "$out/records.jsonl"
