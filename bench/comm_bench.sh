#!/usr/bin/env bash
# Side by side, in one run, at 2 ranks: float32 allreduce from 8 B to 256 MiB with
#   mpiddp bench --backend mpi, a plain C loop of MPI_Allreduce (bench/mpi_allreduce_loop.c),
#   and mpiddp bench --backend gloo,
# interleaved over REPS repetitions (median per size), then the ratios as a Markdown table.
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
python3 - "$out" "$reps" <<'PY'
import json, statistics, sys, os
out, reps = sys.argv[1], int(sys.argv[2])
def med(xs): return statistics.median(xs)
def load_json(name):
    runs = []
    for r in range(1, reps + 1):
        p = f"{out}/{name}.{r}.json"
        if os.path.exists(p):
            runs.append({x["size_bytes"]: x["out_of_place"] for x in json.load(open(p))["results"]})
    return runs
mpi, gloo, before = load_json("mpi"), load_json("gloo"), load_json("before")
plain = []
for r in range(1, reps + 1):
    plain.append({int(l.split()[0]): (float(l.split()[1]), float(l.split()[2])) for l in open(f"{out}/plain.{r}.txt")})
sizes = sorted(plain[0])
def human(b):
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= k: return f"{b // k} {unit}"
    return f"{b} B"
print("| size | plain MPI time (us) | mpiddp mpi time (us) | Δ time (us) | plain busbw (GB/s) | mpiddp mpi busbw | mpi / plain busbw | gloo busbw | gloo / plain busbw |")
print("|---|---|---|---|---|---|---|---|---|")
rows = []
for s in sizes:
    pt, pb = med([p[s][0] for p in plain]), med([p[s][1] for p in plain])
    mt, mb = med([m[s]["time_us"] for m in mpi]), med([m[s]["busbw_gbps"] for m in mpi])
    g = f"{med([x[s]['busbw_gbps'] for x in gloo]):.3f}" if gloo else "n/a"
    gr = f"{med([x[s]['busbw_gbps'] for x in gloo]) / pb:.2f}" if gloo and pb > 0 else "n/a"
    rows.append((s, pt, mt, pb, mb))
    print(f"| {human(s)} | {pt:.2f} | {mt:.2f} | {mt - pt:+.2f} | {pb:.3f} | {mb:.3f} | {mb / pb if pb else 0:.2f} | {g} | {gr} |")
big = [mb / pb for s, pt, mt, pb, mb in rows if s >= (1 << 20)]
small = [mt - pt for s, pt, mt, pb, mb in rows if s <= 4096]
print()
print(f"From 1 MiB up, mpiddp mpi / plain MPI busbw: min {min(big):.3f}, median {med(big):.3f} (target >= 0.95).")
print(f"Up to 4 KiB, mpiddp mpi time - plain MPI time: max {max(small):+.2f} us, median {med(small):+.2f} us (target <= 2 us).")
def per_rep(runs, s):  # each repetition's busbw over the same repetition's plain MPI
    return " ".join(f"{runs[r][s]['busbw_gbps'] / plain[r][s][1]:.2f}" for r in range(len(runs)))
print("\nPer repetition, busbw / plain MPI busbw of the same repetition (plain MPI's own busbw, GB/s):")
for s, pt, mt, pb, mb in rows:
    if s >= (1 << 20):
        line = f"- {human(s)}: mpiddp {per_rep(mpi, s)}"
        if before:
            line += f"; before {per_rep(before, s)}"
        print(line + "; plain " + " ".join(f"{plain[r][s][1]:.2f}" for r in range(len(plain))))
if before:
    bb = [med([b[s]["busbw_gbps"] for b in before]) / pb for s, pt, mt, pb, mb in rows if s >= (1 << 20)]
    print(f"From 1 MiB up, the earlier build's mpi / plain MPI busbw: min {min(bb):.3f}, median {med(bb):.3f}.")
if gloo:
    gl = [med([x[s]['busbw_gbps'] for x in gloo]) / pb for s, pt, mt, pb, mb in rows if s >= (1 << 20)]
    print(f"From 1 MiB up, gloo / plain MPI busbw: median {med(gl):.3f}.")
PY
# The raw numbers as records (bench/lib.sh), saved to bench/results/.
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
