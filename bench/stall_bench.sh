#!/usr/bin/env bash
# The stall monitor's cost in a healthy run: the seeds' toy (Linear(20, 1), batch 32 per rank, 2
# ranks x 1 thread, SGD), the workload where a per-collective cost shows most (~10 000 steps/s, two
# small all-reduces per step). Rounds alternate the monitor on (the default) and off
# (MPIDDP_STALL_WARNING=off: no monitor object, nothing on the collective path), so both see the
# same machine noise. Each run is timed as the user waits for it (mpirun to exit) at two lengths;
# steps/s = (steps of the long - steps of the short) / (wall of the long - wall of the short).
# Records (bench/lib.sh) in $OUT_DIR/records.jsonl, saved to bench/results/; table by bench/report.py.
#   usage: bench/stall_bench.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
bench_init stall 5 "$@"
toy=$(workload_toy)
wall() {  # wall EPOCHS MONITOR -> seconds from mpirun to exit
  local t0 t1
  t0=$(date +%s.%N)
  if [ "$2" = on ]; then
    mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core "$build/mpiddp" train --model linear --data "$toy" \
      --batch-size 32 --threads 1 --optimizer sgd --lr 0.001 --epochs "$1" >/dev/null
  else
    MPIDDP_STALL_WARNING=off mpirun -np 2 "${MPIRUN_FLAGS[@]}" -x MPIDDP_STALL_WARNING --bind-to core "$build/mpiddp" \
      train --model linear --data "$toy" --batch-size 32 --threads 1 --optimizer sgd --lr 0.001 \
      --epochs "$1" >/dev/null
  fi
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc -l
}
short=100 long=1500 steps_per_epoch=32
for round in $(seq 1 "$rounds"); do
  for monitor in on off; do
    ws=$(wall $short $monitor)
    wl=$(wall $long $monitor)
    rate=$(echo "($long - $short) * $steps_per_epoch / ($wl - $ws)" | bc -l)
    printf '%s %s %.1f\n' "$round" "$monitor" "$rate" >&2
    label="monitor on (default)"
    [ $monitor = off ] && label="monitor off (MPIDDP_STALL_WARNING=off)"
    record debian12 "$round" "$label" "toy steps/s" "$rate" steps/s
  done
done
save_results
# on / off per round is the monitor's cost: 1 - that ratio.
python3 bench/report.py --ref "monitor off (MPIDDP_STALL_WARNING=off)" "$out/records.jsonl"
