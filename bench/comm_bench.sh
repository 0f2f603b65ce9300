#!/usr/bin/env bash
# Side by side, in one run, at 2 ranks: float32 allreduce from 8 B to 256 MiB with
#   mpiddp bench --backend mpi, a plain C loop of MPI_Allreduce (bench/mpi_allreduce_loop.c),
#   and mpiddp bench --backend gloo,
# interleaved over REPS repetitions (median per size), then the ratios as a Markdown table
# (bench/report.py --comm).
# MPIDDP_BENCH_BEFORE=PATH/mpiddp adds an earlier build's mpi backend, interleaved the same way, to
# tell a regression from the machine's noise; the per-repetition ratios at each size from 1 MiB show
# the spread.
# usage: bench/comm_bench.sh [BUILD_DIR] [REPS]   (prints the table; raw data in $OUT_DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
bench_init comm 3 "$@"
reps=$rounds
mpicc -O2 -o "$out/mpi_allreduce_loop" bench/mpi_allreduce_loop.c
min=8 max=$((256 << 20)) warmup=5 iters=20
have_gloo=0
"$build/mpiddp" info --json | python3 -c 'import json,sys; sys.exit(0 if "gloo" in json.load(sys.stdin)["ranks"][0]["versions"]["backends"] else 1)' && have_gloo=1
for ((r = 1; r <= reps; r++)); do
  echo "repetition $r/$reps" >&2
  mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core "$build/mpiddp" bench --backend mpi -b $min -e $max -f 2 \
    -w $warmup -n $iters -c 0 --json "$out/mpi.$r.json" >/dev/null
  mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core "$out/mpi_allreduce_loop" $min $max 2 $warmup $iters >"$out/plain.$r.txt"
  if [ -n "${MPIDDP_BENCH_BEFORE:-}" ]; then
    mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core "$MPIDDP_BENCH_BEFORE" bench --backend mpi -b $min -e $max -f 2 \
      -w $warmup -n $iters -c 0 --json "$out/before.$r.json" >/dev/null
  fi
  if [ $have_gloo = 1 ]; then
    mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core "$build/mpiddp" bench --backend gloo -b $min -e $max -f 2 \
      -w $warmup -n $iters -c 0 --json "$out/gloo.$r.json" >/dev/null
  fi
done
# The raw numbers as records (bench/lib.sh), saved to bench/results/, then the table from them
# (bench/report.py --comm: a row per size, medians over the repetitions, the ratios between them).
python3 - "$out" "$reps" <<'PY' | sed 's/^/debian12\t/' | record_tsv
import json, os, sys
out, reps = sys.argv[1], int(sys.argv[2])
for r in range(1, reps + 1):
    for l in open(f"{out}/plain.{r}.txt"):
        size, t, bw = l.split()[:3]
        print(f"{r}\tplain MPI_Allreduce loop\tallreduce float32 {size} B: time\t{t}\tus")
        print(f"{r}\tplain MPI_Allreduce loop\tallreduce float32 {size} B: busbw\t{bw}\tGB/s")
    for name, who in (("mpi", "mpiddp mpi"), ("gloo", "mpiddp gloo"), ("before", "mpiddp mpi, before (MPIDDP_BENCH_BEFORE)")):
        p = f"{out}/{name}.{r}.json"
        if not os.path.exists(p):
            continue
        for x in json.load(open(p))["results"]:
            o = x["out_of_place"]
            print(f"{r}\t{who}\tallreduce float32 {x['size_bytes']} B: time\t{o['time_us']}\tus")
            print(f"{r}\t{who}\tallreduce float32 {x['size_bytes']} B: busbw\t{o['busbw_gbps']}\tGB/s")
PY
save_results
python3 bench/report.py --comm "$out/records.jsonl"
