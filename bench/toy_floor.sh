#!/usr/bin/env bash
# Where the toy's step goes, on this machine, now: µs per optimizer step of
#   floor      bench/step_floor.cpp: the toy step in libtorch alone (1 process, 1 thread, no MPI)
#   floor x2   two of them at once, one per core (do two processes slow each other down?)
#   allreduce  a plain blocking MPI_Allreduce of the toy's 84-byte gradient bucket, 2 ranks
#   mpiddp 1   `mpiddp train` on one rank, from the wall time of a 50- and a 500-epoch run
#   mpiddp 2   the same on two ranks (100 and 1000 epochs: the same 28 800 steps in between)
#   python 2   Python DDP (gloo) on two ranks, 10 and 150 epochs (4 480 steps in between), the
#              lengths of bench/train_bench.sh
# and Python's step over mpiddp's (the toy ratio of bench/train_bench.sh, without the other
# contenders). Rounds are interleaved. Records (bench/lib.sh) in $OUT_DIR/records.jsonl, saved to
# bench/results/; the table by bench/report.py.
#   usage: bench/toy_floor.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
bench_init floor 3 "$@"
bash scripts/deps.sh python3-torch python3-h5py >&2
build_stacks debian12
py=/usr/bin/python3
mpicc -O2 -o "$out/mpi_allreduce_loop" bench/mpi_allreduce_loop.c
toy_h5=$(workload_toy)
toy=(--data "$toy_h5" --batch-size 32 --threads 1 --model linear --lr 0.001 --optimizer sgd)

wall() {  # wall COMMAND...: seconds from start to exit
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >/dev/null 2>&1
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}
per_step() {  # per_step SHORT_S LONG_S STEPS -> µs
  echo "($2 - $1) * 1000000 / $3" | bc -l
}

for round in $(seq 1 "$rounds"); do
  echo "[round $round]" >&2
  floor=$("$build/bench/mpiddp_step_floor" 30000 | $py -c 'import json,sys; print(json.load(sys.stdin)["us_per_step"])')
  pair=$( (taskset -c 0 "$build/bench/mpiddp_step_floor" 30000 & taskset -c 1 "$build/bench/mpiddp_step_floor" 30000; wait) |
         $py -c 'import json,sys; v=[json.loads(l)["us_per_step"] for l in sys.stdin]; print(max(v))')
  allreduce=$(mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core "$out/mpi_allreduce_loop" 84 84 2 1000 50000 | awk 'NF==3{print $2}')
  m1=$(per_step "$(wall mpirun -np 1 "${MPIRUN_FLAGS[@]}" --bind-to core "$build/mpiddp" train "${toy[@]}" --epochs 50)" \
                "$(wall mpirun -np 1 "${MPIRUN_FLAGS[@]}" --bind-to core "$build/mpiddp" train "${toy[@]}" --epochs 500)" 28800)
  m2=$(per_step "$(wall mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core "$build/mpiddp" train "${toy[@]}" --epochs 100)" \
                "$(wall mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core "$build/mpiddp" train "${toy[@]}" --epochs 1000)" 28800)
  p2=$(per_step "$(wall mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core $py bench/python_ddp.py "${toy[@]}" --epochs 10)" \
                "$(wall mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core $py bench/python_ddp.py "${toy[@]}" --epochs 150)" 4480)
  for c in "libtorch alone, 1 process (bench/step_floor.cpp):$floor" \
           "libtorch alone, 2 processes at once (the slower):$pair" "MPI_Allreduce of 84 B, 2 ranks:$allreduce" \
           "mpiddp train, 1 rank:$m1" "mpiddp train, 2 ranks:$m2" "Python DDP (gloo), 2 ranks:$p2"; do
    record debian12 "$round" "${c%:*}" "toy step" "${c##*:}" us
  done
done
save_results
# Python / mpiddp at 2 ranks (the toy ratio of bench/train_bench.sh), and Python / the 1-process floor.
$py bench/report.py "$out/records.jsonl"
