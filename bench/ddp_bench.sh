#!/usr/bin/env bash
# DDP overhead at 2 ranks, side by side in one run: the MNIST example CNN (batch 64 per rank) and a
# ~20 M-parameter MLP (batch 32 per rank). Each run alternates blocks of DDP steps with blocks of
# the same steps under no_sync (same compute, no communication); the overhead is the median over
# rounds of (DDP block / local block - 1). The share of all-reduce time hidden behind backward comes
# from the DDP steps' timeline. Prints a Markdown table; raw output in $OUT_DIR.
# usage: bench/ddp_bench.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-12}
out=${OUT_DIR:-$build/bench-ddp}
mkdir -p "$out"
source scripts/env.sh
: >"$out/results.jsonl"
for model in cnn mlp; do
  steps=4 batch=64
  [ $model = mlp ] && steps=2 batch=32
  echo "$model: $rounds rounds of $steps-step blocks" >&2
  mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core "$build/bench/mpiddp_ddp_bench" --model $model --batch $batch \
    --steps $steps --rounds "$rounds" --warmup 2 --timeline "$out/timeline.$model.json" >>"$out/results.jsonl"
done
python3 - "$out" <<'PY'
import json, statistics as st, sys
out = sys.argv[1]
def hidden_share(path):
    ev = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    backward = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"] == "backward"]
    comm = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e["name"].startswith("allreduce bucket")]
    total = sum(b - a for a, b in comm)
    hidden = sum(max(0.0, min(b, t) - max(a, s)) for a, b in comm for s, t in backward)
    return hidden / total, total / len(backward) / 1000
print("| model | parameters | batch/rank | buckets | step without communication (ms, median) | step with DDP (ms, median) | DDP overhead (median of rounds) | quartiles of the overhead | all-reduce span per step (ms) | share of it hidden behind backward |")
print("|---|---|---|---|---|---|---|---|---|---|")
for line in open(f"{out}/results.jsonl"):
    d = json.loads(line)
    ratios = sorted(b / a - 1 for a, b in zip(d["local_ms"], d["ddp_ms"]))
    q = st.quantiles(ratios, n=4)
    share, span = hidden_share(f"{out}/timeline.{d['model']}.rank0.json")
    print(f"| {d['model']} | {d['params']:,} | {d['batch_per_rank']} | {d['buckets']} | {st.median(d['local_ms']):.1f} | "
          f"{st.median(d['ddp_ms']):.1f} | {st.median(ratios):+.1%} | {q[0]:+.1%} .. {q[2]:+.1%} | {span:.1f} | {share:.0%} |")
PY
