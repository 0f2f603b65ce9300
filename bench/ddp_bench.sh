#!/usr/bin/env bash
# DDP overhead at 2 ranks, side by side in one run: the MNIST example CNN (batch 64 per rank) and a
# ~20 M-parameter MLP (batch 32 per rank). Each run alternates blocks of DDP steps with blocks of
# the same steps under no_sync (same compute, no communication); the overhead is the median over
# rounds of (DDP block / local block - 1). The share of all-reduce time hidden behind backward comes
# from the DDP steps' timeline. Records (bench/lib.sh; a round is one block) in
# $OUT_DIR/records.jsonl, saved to bench/results/; the tables by bench/report.py (the overhead is the
# ratio to the steps without communication, minus 1); the programs' own output in $OUT_DIR too.
# usage: bench/ddp_bench.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
bench_init ddp 12 "$@"
[ -x "$build/bench/mpiddp_ddp_bench" ] || build_stacks debian12
: >"$out/results.jsonl"
for model in cnn mlp; do
  steps=4 batch=64
  [ $model = mlp ] && steps=2 batch=32
  echo "$model: $rounds rounds of $steps-step blocks" >&2
  mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core "$build/bench/mpiddp_ddp_bench" --model $model --batch $batch \
    --steps $steps --rounds "$rounds" --warmup 2 --timeline "$out/timeline.$model.json" >>"$out/results.jsonl"
done
python3 - "$out" <<'PY' | while IFS=$'\t' read -r round contender metric value unit; do
import json, sys
out = sys.argv[1]
def hidden_share(path):
    ev = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    backward = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"] == "backward"]
    comm = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"].startswith("allreduce bucket")]
    total = sum(b - a for a, b in comm)
    hidden = sum(max(0.0, min(b, t) - max(a, s)) for a, b in comm for s, t in backward)
    return hidden / total, total / len(backward) / 1000
for line in open(f"{out}/results.jsonl"):
    d = json.loads(line)
    what = f"{d['model']} step ({d['params']:,} parameters, batch {d['batch_per_rank']}/rank, {d['buckets']} buckets)"
    for k, (local, ddp) in enumerate(zip(d["local_ms"], d["ddp_ms"]), 1):
        print(f"{k}\twithout communication (no_sync)\t{what}\t{local}\tms")
        print(f"{k}\twith DDP\t{what}\t{ddp}\tms")
    share, span = hidden_share(f"{out}/timeline.{d['model']}.rank0.json")
    print(f"1\twith DDP\t{d['model']}: all-reduce span per step\t{span}\tms")
    print(f"1\twith DDP\t{d['model']}: share of the all-reduce span hidden behind backward\t{100 * share}\t%")
PY
  record debian12 "$round" "$contender" "$metric" "$value" "$unit"
done
save_results
python3 bench/report.py "$out/records.jsonl"
