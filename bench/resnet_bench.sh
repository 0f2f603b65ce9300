#!/usr/bin/env bash
# torchvision's ResNet-18 (first convolution for one channel) on Fashion-MNIST at 2 ranks x batch
# 64, one thread each, Adam 1e-3: mpiddp training the TorchScript file a Python user saved, against
# Python PyTorch DDP (gloo) training the same network eagerly. Interleaved rounds of one epoch over
# the first SAMPLES training images each; test accuracy on the 10 000 test images.
#   usage: bench/resnet_bench.sh [BUILD_DIR] [ROUNDS] [SAMPLES]
# Writes $OUT_DIR/results.jsonl (default BUILD_DIR/bench-resnet; one line per run) and prints a table.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
bench_init resnet 2 "${1:-}" "${2:-}"
samples=${3:-12800}
bash scripts/deps.sh python3-torch python3-torchvision python3-h5py >&2
py=/usr/bin/python3
rm -f "$out/results.jsonl"
train=$(workload_fm_head "$samples")
fm_train=$(workload_fm)
fm_test=${fm_train%-train.h5}-test.h5
$py tests/python/torchscript_ref.py make-model resnet18 "$out/resnet18.pt" 0
for round in $(seq 1 "$rounds"); do
  for who in python mpiddp; do
    echo "[round $round] $who" >&2
    log=$out/$who.$round.jsonl
    rm -f "$log"
    t0=$(date +%s.%N)
    if [ $who = python ]; then
      mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core $py bench/python_ddp.py --model resnet18 --data "$train" \
        --test-data "$fm_test" --batch-size 64 --lr 0.001 --optimizer adam --threads 1 --epochs 1 >"$log"
    else
      mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core "$build/mpiddp" train --model "$out/resnet18.pt" \
        --data "$train" --test-data "$fm_test" --batch-size 64 --lr 0.001 --optimizer adam --threads 1 \
        --epochs 1 --metrics "$log" >&2
    fi
    t1=$(date +%s.%N)
    $py -c 'import json,sys; r=json.loads(open(sys.argv[1]).readlines()[-1]); print(json.dumps({"who": sys.argv[2], "round": int(sys.argv[3]), "samples_per_s": r["samples_per_s"], "test_accuracy": r["test_accuracy"], "wall_s": float(sys.argv[5]) - float(sys.argv[4])}))' \
      "$log" $who "$round" "$t0" "$t1" >>"$out/results.jsonl"
  done
done
save_results "$out/results.jsonl"
$py - "$out/results.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("| contender | samples/s (median, range) | test accuracy after 1 epoch | whole run (s) |")
print("|---|---|---|---|")
med = {}
for who, label in [("python", "Python DDP (gloo), eager torchvision model"), ("mpiddp", "mpiddp, the TorchScript file")]:
    r = [x for x in rows if x["who"] == who]
    s = [x["samples_per_s"] for x in r]
    med[who] = statistics.median(s)
    print(f"| {label} | {med[who]:.1f} ({min(s):.1f}-{max(s):.1f}) | "
          + ", ".join("%.2f%%" % (100 * x["test_accuracy"]) for x in r) + " | " + ", ".join("%.0f" % x["wall_s"] for x in r) + " |")
rounds = sorted({x["round"] for x in rows})
ratios = [next(x["samples_per_s"] for x in rows if x["who"] == "mpiddp" and x["round"] == k) /
          next(x["samples_per_s"] for x in rows if x["who"] == "python" and x["round"] == k) for k in rounds]
print(f"\nmpiddp / Python samples/s per round: {', '.join(f'{r:.2f}' for r in ratios)}")
PY
