#!/usr/bin/env bash
# Training throughput and start-up, side by side in one run, 2 ranks x 1 thread, rounds
# interleaved so every contender sees the same machine noise:
#   python      PyTorch DDP (Debian's python3-torch, gloo) started by mpirun the SuperCloud way
#   handwritten libtorch + MPI by hand, no framework (bench/handwritten_ddp.cpp)
#   mpiddp      `mpiddp train`
#   1 process   `mpiddp train` on one rank with 2 intra-op threads and the same global batch
# Workloads: the seeds' toy (2048 x 20 regression, Linear(20, 1), SGD 1e-3, batch 32 per rank) and
# PyTorch's MNIST example CNN on the first 2560 Fashion-MNIST training images (Adam 0.002, batch
# 64 per rank). Throughput counts epochs 2..E (epoch 1 is warm-up); time to first step runs from
# just before mpirun to the end of rank 0's first optimizer step. Prints a Markdown table; raw
# JSON lines in $OUT_DIR. usage: bench/train_bench.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
rounds=${2:-3}
out=${OUT_DIR:-$build/bench-train}
mkdir -p "$out"
source scripts/env.sh
bash scripts/deps.sh python3-torch python3-h5py >&2
mpiddp=$build/mpiddp hand=$build/bench/mpiddp_handwritten_ddp

"$mpiddp" data synthetic --samples 2048 --features 20 --seed 0 --out "$out/toy.h5" >&2
[ -f "$out/fm-train.h5" ] || "$mpiddp" data fashion-mnist --out "$out/fm.h5" >&2
py=/usr/bin/python3  # Debian's, with python3-torch and python3-h5py (python3 on PATH may be another)
$py - "$out/fm-train.h5" "$out/cnn.h5" 2560 <<'PY'
import h5py, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with h5py.File(src, "r") as f, h5py.File(dst, "w") as g:
    for k, v in f.attrs.items(): g.attrs[k] = v
    for name in ("inputs", "targets"):
        d = g.create_dataset(name, data=f[name][:n])
        for k, v in f[name].attrs.items(): d.attrs[k] = v
PY

run() {  # run WORKLOAD CONTENDER ROUND: one JSON line per epoch, tagged, into results.jsonl
  local workload=$1 who=$2 round=$3 data args np=2 threads=1 batch
  if [ "$workload" = toy ]; then
    data=$out/toy.h5 batch=32 args=(--model linear --epochs 200 --lr 0.001 --optimizer sgd)
  else
    data=$out/cnn.h5 batch=64 args=(--model cnn --epochs 4 --lr 0.002 --optimizer adam)
  fi
  local log=$out/$workload.$who.$round.jsonl
  rm -f "$log"
  local t0
  t0=$(date +%s.%N)
  case $who in
    python) mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core $py bench/python_ddp.py --data "$data" \
              --batch-size $batch --threads 1 "${args[@]}" >"$log" ;;
    handwritten) mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core "$hand" --data "$data" --batch-size $batch \
              --threads 1 "${args[@]}" >"$log" ;;
    mpiddp) mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core "$mpiddp" train --data "$data" --batch-size $batch \
              --threads 1 --metrics "$log" "${args[@]}" >/dev/null ;;
    single) np=1 threads=2
            mpirun -np 1 "${MPIRUN_FLAGS[@]}" --bind-to none "$mpiddp" train --data "$data" \
              --batch-size $((2 * batch)) --threads 2 --metrics "$log" "${args[@]}" >/dev/null ;;
  esac
  python3 - "$log" "$workload" "$who" "$round" "$t0" "$np" "$threads" >>"$out/results.jsonl" <<'PY'
import json, sys
log, workload, who, rnd, t0, np, threads = sys.argv[1:]
rows = [json.loads(l) for l in open(log) if l.startswith("{")]
steady = rows[1:]
seconds = sum(r["seconds"] for r in steady)
print(json.dumps({"workload": workload, "who": who, "round": int(rnd), "ranks": int(np), "threads": int(threads),
                  "steps_per_s": sum(r["steps"] for r in steady) / seconds,
                  "samples_per_s": sum(r["samples_per_s"] * r["seconds"] for r in steady) / seconds,
                  "first_step_s": rows[0]["first_step_unix_s"] - float(t0)}))
PY
}

: >"$out/results.jsonl"
for round in $(seq 1 "$rounds"); do
  for workload in toy cnn; do
    for who in python handwritten mpiddp single; do
      echo "round $round: $workload $who" >&2
      run $workload $who "$round"
    done
  done
done

python3 - "$out/results.jsonl" <<'PY'
import json, statistics as st, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def med(workload, who, key):
    return st.median(r[key] for r in rows if r["workload"] == workload and r["who"] == who)
names = {"python": "Python DDP (gloo), 2 ranks", "handwritten": "hand-written libtorch + MPI, 2 ranks",
         "mpiddp": "mpiddp, 2 ranks", "single": "1 process, 2 threads"}
print("| workload | contender | steps/s | samples/s | time to first step (s) | mpiddp / this (throughput) | this / mpiddp (time to first step) |")
print("|---|---|---|---|---|---|---|")
for workload in ("toy", "cnn"):
    key = "steps_per_s" if workload == "toy" else "samples_per_s"
    for who in names:
        m = med(workload, "mpiddp", key) / med(workload, who, key)
        s = med(workload, who, "first_step_s") / med(workload, "mpiddp", "first_step_s")
        print(f"| {workload} | {names[who]} | {med(workload, who, 'steps_per_s'):.1f} | {med(workload, who, 'samples_per_s'):.1f} | "
              f"{med(workload, who, 'first_step_s'):.2f} | {m:.2f}x | {s:.2f}x |")
n = len({r["round"] for r in rows})
print(f"\nMedians over {n} interleaved round(s). Targets: toy steps/s >= 30x Python and >= 0.9x hand-written; "
      "CNN samples/s >= 1.0x Python and >= 0.97x hand-written; time to first step <= 0.25x Python's.")
PY
