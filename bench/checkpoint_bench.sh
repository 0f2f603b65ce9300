#!/usr/bin/env bash
# What activation checkpointing saves at long contexts and what its recompute costs: the built-in
# GPT of 6 layers x 6 heads x 384 (vocabulary 256; bench/zero_bench.sh's), micro-batch 8, AdamW, 2 ranks x 1 thread,
# snapshots on (a snapshot directory, the default cadence), at block sizes 128 and 512, trained
# without and with --activation-checkpointing in one call, rounds interleaved. Per run: each rank's
# peak RSS (GNU time) in the long run; tokens/s as the wall-clock marginal of two run lengths
# (start-up cancels). Records (bench/lib.sh); the table by bench/report.py, against the plain run.
#   usage: bench/checkpoint_bench.sh [BUILD_DIR] [ROUNDS] [BLOCKS]   (BLOCKS default "128 512")
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
bench_init checkpoint 2 "${1:-}" "${2:-}"
blocks=${3:-128 512}
bash scripts/deps.sh time >&2
bash scripts/build.sh "$build" >&2
text=$(workload_text)
layers=6 heads=6 width=384 vocab=256 batch=8 ranks=2
: >"$out/results.jsonl"
for round in $(seq 1 "$rounds"); do
  for block in $blocks; do
    for who in plain checkpointed; do
      flag=()
      [ $who = checkpointed ] && flag=(--activation-checkpointing)
      for steps in 2 5; do
        rss=$(mktemp)
        rm -rf "$out/snapshots"
        t0=$(date +%s.%N)
        mpirun -np $ranks "${MPIRUN_FLAGS[@]}" --bind-to core /usr/bin/time -a -o "$rss" -f %M "$build/mpiddp" train \
          --model gpt --n-layer $layers --n-head $heads --n-embd $width --block-size "$block" --vocab-size $vocab \
          --data "$text" --batch-size $batch --max-steps $steps --optimizer adamw --lr 6e-4 --betas 0.9,0.95 \
          --weight-decay 0.1 --weight-decay-params matrices --clip-grad-norm 1.0 --threads 1 --log-every 0 \
          --snapshot-dir "$out/snapshots" "${flag[@]}" >/dev/null
        t1=$(date +%s.%N)
        /usr/bin/python3 -c 'import json, sys
print(json.dumps({"round": int(sys.argv[1]), "block": int(sys.argv[2]), "who": sys.argv[3], "steps": int(sys.argv[4]),
                  "tokens": int(sys.argv[4]) * int(sys.argv[5]), "seconds": float(sys.argv[7]) - float(sys.argv[6]),
                  "rss_kib": [int(l) for l in open(sys.argv[8]) if l.strip().isdigit()]}))' \
          "$round" "$block" $who $steps $((ranks * batch * block)) "$t0" "$t1" "$rss" >>"$out/results.jsonl"
        rm -f "$rss"
      done
    done
  done
done
rm -rf "$out/snapshots"
/usr/bin/python3 - "$out/results.jsonl" <<'PY' | record_tsv
import json, sys
NAMES = {"plain": "plain", "checkpointed": "--activation-checkpointing"}
runs = {}
for r in map(json.loads, open(sys.argv[1])):
    runs.setdefault((r["round"], r["block"], r["who"]), []).append(r)
for (rnd, block, who), pair in runs.items():
    short, long = sorted(pair, key=lambda r: r["steps"])
    rate = (long["tokens"] - short["tokens"]) / (long["seconds"] - short["seconds"])
    print(f"debian12\t{rnd}\t{NAMES[who]}\tblock {block}: peak RSS per rank\t{max(long['rss_kib']) / 1024}\tMiB")
    print(f"debian12\t{rnd}\t{NAMES[who]}\tblock {block}: throughput\t{rate}\ttokens/s")
PY
save_results
save_results "$out/results.jsonl"
python3 bench/report.py --ref plain "$out/records.jsonl"
