#!/usr/bin/env bash
# One round of bench/train_bench.sh on one software stack (called by it, on the host or inside the
# chroot of scripts/chroot.sh): every contender, both workloads, each at two lengths; appends one
# JSON line per run to OUT/results.jsonl.
#   usage: bench/train_round.sh STACK BUILD_DIR ROUND OUT_DIR TOY_H5 CNN_H5
# A run's wall time is taken from just before mpirun to its exit: what the user waits for.
set -euo pipefail
cd "$(dirname "$0")/.."
stack=$1 build=$2 round=$3 out=$4 toy=$5 cnn=$6
source scripts/env.sh
# The stack's Python with torch and h5py: Debian's by default (python3 on PATH may be another), the
# venv's on the pip stack (MPIDDP_BENCH_PYTHON, set by on_stack of scripts/stacks.sh).
py=${MPIDDP_BENCH_PYTHON:-/usr/bin/python3}
torch_version=$($py -c 'import torch; print(torch.__version__)')
mpiddp=$build/mpiddp hand=$build/bench/mpiddp_handwritten_ddp

# Epochs of the short and the long run of each workload and contender. The difference between
# the two is what throughput is measured on, so start-up cancels and every per-epoch cost counts;
# the toy's lengths differ by contender so that each pair differs by several seconds of work. The
# CNN's pair is 1 and 5 epochs (80 steps apart, ~15 s): with 1 and 3, Python's start-up on sid,
# which varies by +-0.4 s run to run, moved a round's ratio by +-5%.
lengths() {  # lengths WORKLOAD CONTENDER -> "SHORT LONG"
  case $1/$2 in
    toy/python) echo "10 150" ;;
    toy/*) echo "100 1500" ;;
    cnn/*) echo "1 5" ;;
  esac
}

run() {  # run WORKLOAD CONTENDER EPOCHS
  local workload=$1 who=$2 epochs=$3 data batch args np=2
  if [ "$workload" = toy ]; then
    data=$toy batch=32 args=(--model linear --lr 0.001 --optimizer sgd)
  else
    data=$cnn batch=64 args=(--model cnn --lr 0.002 --optimizer adam)
  fi
  args+=(--epochs "$epochs")
  local log=$out/$stack.$workload.$who.$epochs.$round.jsonl
  rm -f "$log"
  local t0 t1
  t0=$(date +%s.%N)
  case $who in
    python|python_fused) [ "$who" = python_fused ] && args+=(--fused)
            mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core $py bench/python_ddp.py --data "$data" \
              --batch-size $batch --threads 1 "${args[@]}" >"$log" ;;
    handwritten) mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core "$hand" --data "$data" --batch-size $batch \
              --threads 1 "${args[@]}" >"$log" ;;
    mpiddp|mpiddp_before) local exe=$mpiddp; [ "$who" = mpiddp_before ] && exe=$MPIDDP_BENCH_BEFORE
            mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core "$exe" train --data "$data" --batch-size $batch \
              --threads 1 --metrics "$log" "${args[@]}" >/dev/null ;;
    single) np=1
            mpirun -np 1 "${MPIRUN_FLAGS[@]}" --bind-to none "$mpiddp" train --data "$data" \
              --batch-size $((2 * batch)) --threads 2 --metrics "$log" "${args[@]}" >/dev/null ;;
  esac
  t1=$(date +%s.%N)
  $py - "$log" "$stack" "$torch_version" "$workload" "$who" "$round" "$epochs" "$t0" "$t1" "$np" "$batch" \
    >>"$out/results.jsonl" <<'PY'
import json, sys
log, stack, torch_version, workload, who, rnd, epochs, t0, t1, np, batch = sys.argv[1:]
rows = [r for r in (json.loads(l) for l in open(log) if l.startswith("{")) if r.get("kind", "epoch") == "epoch"]
steps = sum(r["steps"] for r in rows)
print(json.dumps({"stack": stack, "torch": torch_version, "workload": workload, "who": who, "round": int(rnd),
                  "epochs": int(epochs), "steps": steps, "samples": steps * int(batch) * int(np),
                  "wall_s": float(t1) - float(t0), "first_step_s": rows[0]["first_step_unix_s"] - float(t0),
                  "epoch_seconds": sum(r["seconds"] for r in rows)}))
PY
}

# Where this stack's PyTorch has a CPU kernel for Adam(fused=True) (2.4+), the CNN also runs with
# it: mpiddp's Adam is fused there (mpiddp::FusedAdam), Python's default is not.
fused=
$py -c 'import torch; torch.optim.Adam([torch.zeros(1, requires_grad=True)], fused=True)' 2>/dev/null &&
  fused=python_fused
for workload in toy cnn; do
  contenders="python handwritten mpiddp single"
  # Before/after a change, in the same rounds: MPIDDP_BENCH_BEFORE names the earlier build's mpiddp
  # (the host's stack only: the chroot's environment does not carry it).
  [ -n "${MPIDDP_BENCH_BEFORE:-}" ] && contenders+=" mpiddp_before"
  [ "$workload" = cnn ] && [ -n "$fused" ] && contenders+=" $fused"
  for who in $contenders; do
    for epochs in $(lengths $workload $who); do
      echo "[$stack round $round] $workload $who $epochs epochs" >&2
      run $workload $who "$epochs"
    done
  done
done
