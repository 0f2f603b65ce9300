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
# contenders). Rounds are interleaved. Prints one JSON line per round and a Markdown table.
#   usage: bench/toy_floor.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-3}
out=${OUT_DIR:-$build/bench-floor}
mkdir -p "$out"
source scripts/env.sh
bash scripts/deps.sh python3-torch python3-h5py >&2
bash scripts/build.sh "$build" >&2
py=/usr/bin/python3
"$build/mpiddp" data synthetic --samples 2048 --features 20 --seed 0 --out "$out/toy.h5" >&2
mpicc -O2 -o "$out/mpi_allreduce_loop" bench/mpi_allreduce_loop.c
toy=(--data "$out/toy.h5" --batch-size 32 --threads 1 --model linear --lr 0.001 --optimizer sgd)

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

: >"$out/results.jsonl"
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
  printf '{"round": %d, "floor_us": %.2f, "floor_pair_us": %.2f, "allreduce_84B_us": %.2f, "mpiddp_1rank_us": %.2f, "mpiddp_2ranks_us": %.2f, "python_2ranks_us": %.2f}\n' \
    "$round" "$floor" "$pair" "$allreduce" "$m1" "$m2" "$p2" >>"$out/results.jsonl"
done

$py - "$out/results.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
keys = [("floor_us", "libtorch alone, 1 process (bench/step_floor.cpp)"),
        ("floor_pair_us", "libtorch alone, 2 processes at once (the slower)"),
        ("allreduce_84B_us", "MPI_Allreduce of 84 B, 2 ranks"),
        ("mpiddp_1rank_us", "mpiddp train, 1 rank"),
        ("mpiddp_2ranks_us", "mpiddp train, 2 ranks"),
        ("python_2ranks_us", "Python DDP (gloo), 2 ranks")]
print("| toy step | µs per step (median, range over %d rounds) |" % len(rows))
print("|---|---|")
for k, name in keys:
    v = sorted(r[k] for r in rows)
    print(f"| {name} | {statistics.median(v):.1f} ({v[0]:.1f}-{v[-1]:.1f}) |")
ratio = sorted(r["python_2ranks_us"] / r["mpiddp_2ranks_us"] for r in rows)
floor = sorted(r["python_2ranks_us"] / r["floor_us"] for r in rows)
print()
print("Python / mpiddp at 2 ranks, by round: " + ", ".join(f"{x:.1f}x" for x in ratio))
print("Python at 2 ranks / the 1-process floor, by round: " + ", ".join(f"{x:.1f}x" for x in floor))
PY
