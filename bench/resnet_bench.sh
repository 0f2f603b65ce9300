#!/usr/bin/env bash
# torchvision's ResNet-18 (first convolution for one channel) on Fashion-MNIST at 2 ranks x batch
# 64, one thread each, Adam 1e-3: mpiddp training the TorchScript file a Python user saved, against
# Python PyTorch DDP (gloo) training the same network eagerly. Interleaved rounds of one epoch over
# the first SAMPLES training images each; test accuracy on the 10 000 test images.
#   usage: bench/resnet_bench.sh [BUILD_DIR] [ROUNDS] [SAMPLES]
# Records in $OUT_DIR/records.jsonl (default BUILD_DIR/bench-resnet), tabled by bench/report.py.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
bench_init resnet 2 "${1:-}" "${2:-}"
samples=${3:-12800}
bash scripts/deps.sh python3-torch python3-torchvision python3-h5py >&2
py=/usr/bin/python3
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
    $py - "$log" "$who" "$round" "$t0" "$t1" <<'PY' | record_tsv
import json, sys
log, who, rnd, t0, t1 = sys.argv[1:]
r = json.loads(open(log).readlines()[-1])
name = {"python": "Python DDP (gloo), eager torchvision model", "mpiddp": "mpiddp, the TorchScript file"}[who]
for metric, value, unit in (("throughput", r["samples_per_s"], "samples/s"),
                            ("test accuracy after 1 epoch", 100 * r["test_accuracy"], "%"),
                            ("whole run", float(t1) - float(t0), "s")):
    print(f"debian12\t{rnd}\t{name}\t{metric}\t{value}\t{unit}")
PY
  done
done
save_results
$py bench/report.py "$out/records.jsonl"
