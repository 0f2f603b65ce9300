#!/usr/bin/env bash
# Nothing grows in a long run: trains the seeds' toy (Linear(20, 1), SGD, batch 32 per rank) at 2
# ranks for STEPS steps (default 300000) with a snapshot every 2000 steps, the metrics file and
# progress lines (every 200 steps) on, samples rank 0's resident memory (VmRSS) every 0.5 s and
# reports its growth from the 20% mark to the end, and the slope of a least-squares line through
# those samples in bytes per step. Target: growth under 8 MiB (a leak of 30 B/step would show as
# ~7 MiB over the last 240k steps).
#   usage: bench/soak.sh [BUILD_DIR] [STEPS]   (raw samples in $OUT_DIR/rss.tsv; records in
#   $OUT_DIR/records.jsonl, tabled by bench/report.py)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
bench_init soak 1 "${1:-}"
steps=${2:-300000}
rm -rf "$out/snaps" "$out/rss.tsv" "$out/metrics.jsonl"
mpiddp=$build/mpiddp
# A larger set than the seeds' 2048 samples: epochs (their all-reduce, metrics line and rank lines)
# come every several hundred steps, and progress lines within them.
toy=$(workload_toy 102400)
mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core "$mpiddp" train --model linear --optimizer sgd --lr 0.001 \
  --data "$toy" --batch-size 32 --threads 1 --epochs 1000000 --max-steps "$steps" \
  --snapshot-dir "$out/snaps" --save-every 0 --save-every-steps 2000 --keep 3 \
  --metrics "$out/metrics.jsonl" --log-every 200 >"$out/train.log" 2>&1 &
launcher=$!
rank0=
for _ in $(seq 1 200); do  # rank 0: the mpiddp process whose environment says rank 0
  for pid in $(pgrep -f "$mpiddp train" || true); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=0'; then rank0=$pid; fi
  done
  [ -n "$rank0" ] && break
  sleep 0.1
done
[ -n "$rank0" ] || { echo "soak.sh: error: rank 0 not found" >&2; kill $launcher; exit 1; }
t0=$(date +%s.%N)
: >"$out/rss.tsv"
while kill -0 "$rank0" 2>/dev/null; do
  kb=$(awk '/^VmRSS:/ {print $2}' "/proc/$rank0/status" 2>/dev/null || true)
  [ -n "$kb" ] && echo "$(echo "$(date +%s.%N) - $t0" | bc) $kb" >>"$out/rss.tsv"
  sleep 0.5
done
wait $launcher
python3 - "$out" "$steps" <<'PY' | record_tsv
import json, statistics, sys
out, steps = sys.argv[1], int(sys.argv[2])
rows = [tuple(map(float, l.split())) for l in open(f"{out}/rss.tsv") if l.strip()]
epochs = [json.loads(l) for l in open(f"{out}/metrics.jsonl") if '"kind": "epoch"' in l or '"kind":"epoch"' in l]
logs = sum(1 for l in open(f"{out}/metrics.jsonl") if '"kind":"log"' in l)
done = epochs[-1]["global_step"]
assert done == steps, f"the run stopped at step {done}, not {steps}"
t_end = rows[-1][0]
# Steps are taken at a steady rate after start-up: time maps to steps linearly.
late = [(t, kb) for t, kb in rows if t >= 0.2 * t_end]
def at(frac):  # median RSS over the samples within 2% of the run around a time fraction
    xs = [kb for t, kb in rows if abs(t / t_end - frac) <= 0.02]
    xs = xs or [min(rows, key=lambda r: abs(r[0] / t_end - frac))[1]]
    return statistics.median(xs) * 1024
growth = at(0.98) - at(0.2)
n = len(late)
mt = sum(t for t, _ in late) / n
mk = sum(k for _, k in late) / n
slope_kb_per_s = sum((t - mt) * (k - mk) for t, k in late) / sum((t - mt) ** 2 for t, _ in late)
bytes_per_step = slope_kb_per_s * 1024 * t_end / steps
print(f"soak: {steps} steps at 2 ranks in {t_end:.0f} s, {len(rows)} RSS samples, {done // 2000} snapshots due, "
      f"{len(epochs)} epoch lines, {logs} progress lines", file=sys.stderr)
who = "mpiddp train, 2 ranks, snapshot every 2000 steps"
for metric, value, unit in (("throughput", steps / t_end, "steps/s"),
                            ("rank 0 RSS at 20% of the run", at(0.2) / 2**20, "MiB"),
                            ("rank 0 RSS growth, 20% to the end (target < 8 MiB)", growth / 2**20, "MiB"),
                            ("least-squares slope of rank 0 RSS", bytes_per_step, "B/step")):
    print(f"debian12\t1\t{who}\t{metric}\t{value}\t{unit}")
PY
save_results
python3 bench/report.py "$out/records.jsonl"
