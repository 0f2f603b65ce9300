#!/usr/bin/env bash
# Snapshots as a user gets them, and their I/O against plain MPI-IO.
#  1. A real run: the built-in GPT of 6 layers x 6 heads x 384 (block 256, vocabulary 256: 10.84 M
#     parameters), AdamW, micro-batch 4, 2 ranks x 1 thread, default options (the bucket cap by the
#     reduction's rule), 9 steps with a snapshot every 3, at --zero-stage 0, 1, 2, 3. Per stage: each
#     rank's peak RSS (GNU time) with and without snapshots, the growth while snapshotting as a share
#     of the file's size, the saving against stage 0 and its share of the ideal saving
#     (stage 1: 8 B/param x (N-1)/N, Adam's two moments; stage 2: 12 B/param x (N-1)/N, with the
#     gradient; stage 3: 16 B/param x (N-1)/N, with the parameters); the training stall per snapshot: (seconds of the run - seconds of the same run
#     without snapshots) / 3. MPIDDP_BENCH_BEFORE=PATH/mpiddp runs an earlier build the same way,
#     interleaved, as the contenders "... before".
#  2. I/O (mpiddp_snapshot_io, snapshot_io.cpp): a 130 MB trainer-like state in 228 tensors written
#     as one snapshot and read back (verified) at 2 and 4 ranks, against MPI_File_write_at_all /
#     read_at_all of the same bytes on the same file system (BUILD_DIR's), 3 repetitions each.
# Records (bench/lib.sh) in $OUT_DIR/records.jsonl; tables by bench/report.py on stdout.
#   usage: bench/snapshot_bench.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
bench_init snapshot 2 "${1:-}" "${2:-}"
bash scripts/deps.sh time >&2
bash scripts/build.sh "$build" -DMPIDDP_BUILD_BENCH=ON >&2
text=$(workload_text)
layers=6 heads=6 width=384 block=256 vocab=256 batch=4 ranks=2
params=$(( layers * (12 * width * width + 13 * width) + vocab * width + block * width + 2 * width ))
work=$(mktemp -d -p "$build")
trap 'rm -rf "$work"' EXIT

run() {  # run ROUND CONTENDER BINARY STAGE SNAPSHOTS(0|1): records its seconds and peak RSS
  local round=$1 who=$2 bin=$3 stage=$4 snaps=$5 rss t0 t1 flags=()
  rss=$(mktemp -p "$work")
  rm -rf "$work/snaps"
  [ "$snaps" = 1 ] && flags=(--snapshot-dir "$work/snaps" --save-every-steps 3)
  t0=$(date +%s.%N)
  mpirun -np $ranks "${MPIRUN_FLAGS[@]}" --bind-to core /usr/bin/time -a -o "$rss" -f %M "$bin" train \
    --model gpt --n-layer $layers --n-head $heads --n-embd $width --block-size $block --vocab-size $vocab \
    --data "$text" --batch-size $batch --max-steps 9 --epochs 1000 --optimizer adamw --lr 6e-4 --betas 0.9,0.95 \
    --weight-decay 0.1 --weight-decay-params matrices --clip-grad-norm 1.0 --zero-stage "$stage" --threads 1 \
    --log-every 0 "${flags[@]}" >/dev/null
  t1=$(date +%s.%N)
  local suffix=
  [ "$snaps" = 1 ] || suffix=", no snapshots"
  record debian12 "$round" "$who$suffix" "seconds, 9 steps" "$(echo "$t1 - $t0" | bc -l)" s
  record debian12 "$round" "$who$suffix" "peak RSS per rank" "$(sort -n "$rss" | tail -n 1 | awk '{print $1 / 1024}')" MiB
  [ "$snaps" = 1 ] && record debian12 "$round" "$who" "snapshot file" "$(stat -L -c %s "$work/snaps/latest.h5" | awk '{print $1 / 1048576}')" MiB
  rm -f "$rss"
}

for round in $(seq 1 "$rounds"); do
  for stage in 0 1 2 3; do
    for snaps in 1 0; do
      run "$round" "stage $stage" "$build/mpiddp" $stage $snaps
      [ -n "${MPIDDP_BENCH_BEFORE:-}" ] && run "$round" "stage $stage, before" "$MPIDDP_BENCH_BEFORE" $stage $snaps
    done
  done
done

for n in 2 4; do
  mpirun -np $n "${MPIRUN_FLAGS[@]}" --oversubscribe "$build/bench/mpiddp_snapshot_io" "$work" 32.5 228 3 >"$work/io$n.jsonl"
  round=0
  while read -r line; do
    kind=$(sed -n 's/.*"kind": "\([^"]*\)".*/\1/p' <<<"$line")
    [ "$kind" = "snapshot write" ] && round=$((round + 1))
    bytes=$(sed -n 's/.*"bytes": \([0-9]*\).*/\1/p' <<<"$line")
    seconds=$(sed -n 's/.*"seconds": \([0-9.]*\).*/\1/p' <<<"$line")
    record debian12 "$round" "$kind, $n ranks" bandwidth "$(echo "$bytes / $seconds / 1000000" | bc -l)" MB/s
  done <"$work/io$n.jsonl"
done

# Derived, round by round: the saving against stage 0 and its share of the ideal; the stall.
/usr/bin/python3 - "$out/records.jsonl" "$params" "$ranks" >>"$out/records.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
params, n = int(sys.argv[2]), int(sys.argv[3])
ideal = {s: b * params * (n - 1) / n / 2**20 for s, b in ((1, 8), (2, 12), (3, 16))}
def value(rnd, who, metric):
    return next((r["value"] for r in rows if r["round"] == rnd and r["contender"] == who and r["metric"] == metric), None)
for r in rows:
    if r["metric"] != "peak RSS per rank" or r["contender"].endswith("no snapshots"):
        continue
    who, rnd = r["contender"], r["round"]
    stage = int(who.split()[1].rstrip(","))
    out = dict(r)
    with_snaps, without = value(rnd, who, "seconds, 9 steps"), value(rnd, who + ", no snapshots", "seconds, 9 steps")
    if with_snaps is not None and without is not None:
        print(json.dumps({**out, "metric": "stall per snapshot", "value": (with_snaps - without) / 3, "unit": "s"}))
    base = value(rnd, who.replace(f"stage {stage}", "stage 0"), "peak RSS per rank")
    alone = value(rnd, who + ", no snapshots", "peak RSS per rank")
    size = value(rnd, who, "snapshot file")
    if alone is not None and size:
        print(json.dumps({**out, "metric": "RSS growth while snapshotting, share of the file", "value": 100 * (r["value"] - alone) / size, "unit": "%"}))
    if stage > 0 and base is not None:
        print(json.dumps({**out, "metric": "share of ideal saving", "value": 100 * (base - r["value"]) / ideal[stage], "unit": "%"}))
PY
save_results
python3 bench/report.py --bench snapshot --ref "stage 0" "$out/records.jsonl"
