#!/usr/bin/env bash
# What --prefetch and --precision cost or save, and what the defaults reach, measured on the
# Fashion-MNIST training set (60000 images) with `mpiddp train`, --threads 1 per rank.
#   prefetch   --prefetch 0 vs 2 (the default), the training set read from memory (the default
#              --cache-mb) or from the file (--cache-mb 0), MLP (one epoch: data-bound) and CNN
#              (--max-steps 80: compute-bound), at 1 rank (a core free for the reader thread) and
#              2 ranks (none free on a 2-core machine). Rounds interleave every setting.
#   precision  fp32 vs bf16 (and fp16 where this libtorch has CPU kernels): samples/s of the CNN
#              (--max-steps 40) and the MLP (one epoch), and test accuracy after 3 epochs of the MLP
#              (2 ranks, defaults otherwise).
#   defaults   `mpiddp train --model cnn --data fm-train.h5 --test-data fm-test.h5 --epochs 3`,
#              nothing else set (2 ranks): test accuracy per epoch.
# samples/s is the epoch's (reads included, evaluation excluded); wall is the whole run, from
# just before mpirun to its exit. Records in OUT_DIR/records.jsonl, tabled by bench/report.py.
#   usage: bench/options_bench.sh [BUILD_DIR] [ROUNDS] [PARTS]   PARTS: "prefetch precision defaults"
# Run it inside scripts/chroot.sh with BUILD_DIR build-sid for libtorch 2.14.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/lib.sh
bench_init options 3 "${1:-}" "${2:-}"
parts=${3:-prefetch precision defaults}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
py=/usr/bin/python3
mpiddp=$build/mpiddp
[ -x "$mpiddp" ] || bash scripts/build.sh "$build" >&2
train=$(workload_fm)
test=${train%-train.h5}-test.h5
torch_version=$($py -c 'import torch; print(torch.__version__)')

run() {  # run PART LABEL NP ARGS...: one run, one JSON line (the last epoch's metrics + wall time)
  local part=$1 label=$2 np=$3
  shift 3
  local log=$out/run.jsonl t0 t1 rc=0
  rm -f "$log"
  t0=$(date +%s.%N)
  mpirun -np "$np" "${MPIRUN_FLAGS[@]}" "$mpiddp" train --data "$train" --threads 1 --log-every 0 --metrics "$log" \
    "$@" >"$out/run.out" 2>&1 || rc=$?
  t1=$(date +%s.%N)
  if [ "$rc" -ne 0 ]; then
    echo "options_bench.sh: $part $label np$np failed (rc $rc): $(grep -m1 'error' "$out/run.out")" >&2
    return 0
  fi
  $py - "$log" "$part" "$label" "$np" "$t0" "$t1" "$round" "$torch_version" <<'PY' | record_tsv
import json, sys
log, part, label, np_, t0, t1, rnd, tv = sys.argv[1:]
rows = [r for r in map(json.loads, open(log)) if r["kind"] == "epoch"]
workload, setting = label.rsplit(" ", 1)  # "mlp memory prefetch=0": contender prefetch=0
where = f"debian12 (torch {tv})"
if part in ("prefetch", "precision"):
    print(f"{where}\t{rnd}\t{setting}\t{workload} at {np_} ranks: throughput\t{rows[-1]['samples_per_s']}\tsamples/s")
    print(f"{where}\t{rnd}\t{setting}\t{workload} at {np_} ranks: whole run\t{float(t1) - float(t0)}\ts")
else:  # accuracy, defaults: the test accuracy after each epoch
    for e in rows:
        print(f"{where}\t{rnd}\t{label}\t{part}: test accuracy after epoch {e['epoch']}\t{100 * e['test_accuracy']}\t%")
    print(f"{where}\t{rnd}\t{label}\t{part}: throughput\t{rows[-1]['samples_per_s']}\tsamples/s")
PY
}

for round in $(seq 1 "$rounds"); do
  if [[ " $parts " == *" prefetch "* ]]; then
    for np in 1 2; do
      for src in memory file; do
        cache=512
        [ "$src" = file ] && cache=0
        for prefetch in 0 2; do
          run prefetch "mlp $src prefetch=$prefetch" "$np" --model mlp --epochs 1 --cache-mb $cache --prefetch $prefetch
          [ "$np" = 2 ] && run prefetch "cnn $src prefetch=$prefetch" "$np" --model cnn --max-steps 80 \
            --cache-mb $cache --prefetch $prefetch
        done
      done
    done
  fi
  if [[ " $parts " == *" precision "* ]]; then
    for precision in fp32 bf16 fp16; do
      run precision "cnn $precision" 2 --model cnn --max-steps 40 --precision $precision
      run precision "mlp $precision" 2 --model mlp --epochs 1 --precision $precision
    done
  fi
done
round=1  # accuracy and the defaults: one run each
if [[ " $parts " == *" precision "* ]]; then
  for precision in fp32 bf16 fp16; do
    run accuracy "mlp $precision, 3 epochs" 2 --model mlp --epochs 3 --test-data "$test" --precision $precision
  done
fi
if [[ " $parts " == *" defaults "* ]]; then
  run defaults "cnn, defaults, 3 epochs" 2 --model cnn --test-data "$test" --epochs 3
fi

save_results
$py bench/report.py "$out/records.jsonl"
