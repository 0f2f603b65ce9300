#!/usr/bin/env bash
# The stall monitor's cost in a healthy run: the seeds' toy (Linear(20, 1), batch 32 per rank, 2
# ranks x 1 thread, SGD), the workload where a per-collective cost shows most (~10 000 steps/s, two
# small all-reduces per step). Rounds alternate the monitor on (the default) and off
# (MPIDDP_STALL_WARNING=off: no monitor object, nothing on the collective path), so both see the
# same machine noise. Each run is timed as the user waits for it (mpirun to exit) at two lengths;
# steps/s = (steps of the long - steps of the short) / (wall of the long - wall of the short).
#   usage: bench/stall_bench.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-5}
out=${OUT_DIR:-$build/bench-stall}
mkdir -p "$out"
source scripts/env.sh
"$build/mpiddp" data synthetic --samples 2048 --features 20 --seed 0 --out "$out/toy.h5" >/dev/null
wall() {  # wall EPOCHS MONITOR -> seconds from mpirun to exit
  local t0 t1
  t0=$(date +%s.%N)
  if [ "$2" = on ]; then
    mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core "$build/mpiddp" train --model linear --data "$out/toy.h5" \
      --batch-size 32 --threads 1 --optimizer sgd --lr 0.001 --epochs "$1" >/dev/null
  else
    MPIDDP_STALL_WARNING=off mpirun -np 2 "${MPIRUN_FLAGS[@]}" -x MPIDDP_STALL_WARNING --bind-to core "$build/mpiddp" \
      train --model linear --data "$out/toy.h5" --batch-size 32 --threads 1 --optimizer sgd --lr 0.001 \
      --epochs "$1" >/dev/null
  fi
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}
short=100 long=1500 steps_per_epoch=32
: >"$out/results.txt"
for round in $(seq 1 "$rounds"); do
  for monitor in on off; do
    ws=$(wall $short $monitor)
    wl=$(wall $long $monitor)
    rate=$(echo "($long - $short) * $steps_per_epoch / ($wl - $ws)" | bc -l)
    printf '%s %s %.1f\n' "$round" "$monitor" "$rate" | tee -a "$out/results.txt" >&2
  done
done
python3 - "$out/results.txt" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
on = {r[0]: float(r[2]) for r in rows if r[1] == "on"}
off = {r[0]: float(r[2]) for r in rows if r[1] == "off"}
ratios = sorted(on[k] / off[k] for k in on if k in off)
print(f"| monitor | toy steps/s (median, range over {len(on)} rounds) |")
print("|---|---|")
print(f"| on (default) | {statistics.median(on.values()):.0f} ({min(on.values()):.0f}-{max(on.values()):.0f}) |")
print(f"| off (MPIDDP_STALL_WARNING=off) | {statistics.median(off.values()):.0f} ({min(off.values()):.0f}-{max(off.values()):.0f}) |")
print(f"on / off per round, sorted: {', '.join(f'{r:.3f}' for r in ratios)}; median {statistics.median(ratios):.3f} "
      f"(cost {100 * (1 - statistics.median(ratios)):+.1f}%)")
PY
