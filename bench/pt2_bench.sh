#!/usr/bin/env bash
# What mpiddp's torch.export executor costs a step (issue 61): `mpiddp train` on one model three
# ways, with the same data and options, at 1 and 2 ranks, rounds interleaved:
#   built-in (C++)       --model cnn: PyTorch's MNIST example Net written in C++ (src/models)
#   TorchScript          the same Net from Python, torch.jit.script(net).save: libtorch's interpreter
#   torch.export (.pt2)  the same Net, torch.export.export(net.train(), batch dynamic),
#                        torch.export.save: mpiddp's executor runs the training-IR graph node by
#                        node through the dispatcher (src/pt2/pt2_program.cpp)
# (bench/pt2_models.py makes both files with the stack's own torch). Data: the first SAMPLES
# (19 200) Fashion-MNIST training images, one epoch at batch 64 per rank (300 steps at 1 rank, 150 at
# 2), the trainer's defaults otherwise (Adam, lr auto, shuffle, --threads: the cores a rank owns: 2
# at 1 rank, 1 at 2 ranks bound to a core each), a snapshot at the epoch's end in a fresh
# --snapshot-dir (MPIDDP_PT2_SNAPSHOTS=0: none). The part "gpt" does the same for nanoGPT's GPT
# (built-in --model gpt against nanoGPT's model.py as TorchScript and as .pt2, both --loss model)
# at lm_bench.sh's shape (4 layers x 4 heads x 256, block 128, bytes) on workload_text, batch 8 per
# rank, MPIDDP_PT2_GPT_STEPS (60) steps. The part "mlp" is the floor where per-op costs show: the
# built-in --model mlp (Linear 20-128-64-1, ReLUs; 5 nodes a forward) against the same module from
# Python, on the seeds' toy (2048 x 20 regression), batch 32, MPIDDP_PT2_MLP_EPOCHS (100) epochs.
# The contenders' order rotates by round.
# Metrics, from mpiddp's own --metrics file (rank 0), per part and rank count:
#   throughput          the epochs' samples (tokens: gpt) over their seconds (first step included)
#   step time           the median of the progress windows' seconds per step, the first window
#                       (warm-up) left out: the steady step (mlp, whose epochs are too short for
#                       progress windows: the median of its epochs' seconds per step, the first left out)
#   time to first step  from just before mpirun to the end of rank 0's first step (loading the model
#                       file, compiling the graph, the first step itself)
# A run that fails keeps its error (results.jsonl, and at the end); its records are null.
# Stacks: the .pt2 path needs libtorch >= 2.6: pip (default; torch 2.11 wheel, build-pip) and/or sid
# (MPIDDP_BENCH_STACKS="pip sid"; libtorch 2.14 in the chroot, build-sid). A stack's mpiddp is
# built (build_stacks) only where its build directory has none.
# Environment: MPIDDP_PT2_PARTS ("cnn mlp gpt"), MPIDDP_PT2_RANKS ("1 2"), MPIDDP_PT2_SNAPSHOTS (1),
# MPIDDP_PT2_GPT_STEPS (60), MPIDDP_PT2_MLP_EPOCHS (100), MPIDDP_BENCH_PAUSE_WHILE (a pgrep -f
# pattern, e.g. "cmake --build|ninja|ctest": before each run, wait while a process matches it, and
# run again one that ends while one does; after 3 tries it is kept as "disturbed" in results.jsonl,
# its records null: a shared machine's builds and tests stay out of the runs).
# Records (bench/lib.sh) in $OUT_DIR/records.jsonl (default BUILD_DIR/bench-pt2), the runs in
# results.jsonl (both saved to bench/results/), each run's metrics and output in runs/; the models
# in models-STACK/ (models.json: each program's nodes); the table by bench/report.py, each
# contender against the built-in model and TorchScript (step time: a ratio above 1 is slower).
#   usage: bench/pt2_bench.sh [BUILD_DIR] [ROUNDS] [SAMPLES]
#   (inside a stack, called by itself: bench/pt2_bench.sh --round STACK STACK_BUILD ROUND OUT_DIR)
set -euo pipefail
cd "$(dirname "$0")/.."

CONTENDERS=(builtin torchscript pt2)

pause_while() {  # waits while a process matches MPIDDP_BENCH_PAUSE_WHILE (pgrep -f)
  local pattern=${MPIDDP_BENCH_PAUSE_WHILE:-} said=
  [ -n "$pattern" ] || return 0
  while pgrep -f "$pattern" >/dev/null; do
    [ -n "$said" ] || echo "pt2_bench: paused while '$pattern' runs" >&2
    said=1
    sleep 30
  done
}
paused_for() {  # true while a process matches MPIDDP_BENCH_PAUSE_WHILE
  [ -n "${MPIDDP_BENCH_PAUSE_WHILE:-}" ] && pgrep -f "$MPIDDP_BENCH_PAUSE_WHILE" >/dev/null
}

# One round on one stack, where the stack lives (on_stack): each part, rank count and contender one
# run; one JSON line per run in OUT/results.jsonl. The settings come from OUT/round.env (the sid
# chroot starts from an empty environment).
# shellcheck disable=SC2154  # round.env's variables
round() {
  local stack=$1 build=$2 round=$3 out=$4
  source scripts/env.sh
  source "$out/round.env"  # parts ranks cnn_h5 toy_h5 text snapshots mlp_epochs gpt_steps gpt_shape gpt_batch
  local py=${MPIDDP_BENCH_PYTHON:-/usr/bin/python3} models=$out/models-$stack torch_version
  torch_version=$($py -c 'import torch; print(torch.__version__)')
  mkdir -p "$out/runs"
  local part n k who model args bind log txt t0 t1 rc snap error order batch per_sample disturbed tries
  for part in $parts; do
    for n in $ranks; do
      # the contenders' order rotates by round, so none is always first after the other part
      order=()
      for k in 0 1 2; do order+=("${CONTENDERS[$(((k + round - 1) % 3))]}"); done
      for who in "${order[@]}"; do
        if [ "$part" = cnn ]; then
          batch=64 per_sample=1 model=cnn
          args=(--data "$cnn_h5" --batch-size $batch --epochs 1)
        elif [ "$part" = mlp ]; then
          batch=32 per_sample=1 model=mlp
          args=(--data "$toy_h5" --batch-size $batch --epochs "$mlp_epochs")
        else
          read -r L H C T V <<<"${gpt_shape//,/ }"
          batch=$gpt_batch per_sample=$T model=gpt
          args=(--data "$text" --block-size "$T" --batch-size $batch --max-steps "$gpt_steps")
          [ "$who" = builtin ] && args+=(--n-layer "$L" --n-head "$H" --n-embd "$C" --vocab-size "$V")
          [ "$who" = builtin ] || args+=(--loss model)
        fi
        case $who in
          torchscript) model=$models/$part.pt ;;
          pt2) model=$models/$part.pt2 ;;
        esac
        bind=(--bind-to core)
        [ "$n" = 1 ] && bind=(--bind-to none)  # one rank owns both cores (--threads 0: 2 threads)
        snap=()
        [ "$snapshots" = 0 ] || snap=(--snapshot-dir "$out/snap-$stack")
        log=$out/runs/$stack.$part.$who.np$n.r$round.jsonl txt=$out/runs/$stack.$part.$who.np$n.r$round.txt
        # A run that ends while a process of MPIDDP_BENCH_PAUSE_WHILE runs was disturbed: run again
        # after the pause (3 tries, then kept and marked)
        tries=0
        while :; do
          rm -rf "$log" "$out/snap-$stack"
          pause_while
          echo "[$stack round $round] $part $who, $n rank(s)" >&2
          rc=0
          t0=$(date +%s.%N)
          mpirun -np "$n" "${MPIRUN_FLAGS[@]}" "${bind[@]}" "$build/mpiddp" train --model "$model" "${args[@]}" \
            "${snap[@]}" --metrics "$log" >"$txt" 2>&1 || rc=$?
          t1=$(date +%s.%N)
          disturbed=0
          paused_for && disturbed=1
          [ "$disturbed" = 1 ] && [ "$tries" -lt 3 ] || break
          tries=$((tries + 1))
          echo "[$stack round $round] disturbed by '$MPIDDP_BENCH_PAUSE_WHILE': again" >&2
        done
        error=
        if [ "$rc" != 0 ]; then
          error=$(grep -m 1 "error:" "$txt" || tail -n 1 "$txt")
          echo "[$stack round $round] $part $who, $n rank(s): failed ($rc): $error" >&2
        fi
        $py - "$log" "$stack" "$torch_version" "$part" "$who" "$n" "$round" "$t0" "$t1" "$rc" "$error" \
          "$batch" "$per_sample" "$disturbed" >>"$out/results.jsonl" <<'PY'
import json, os, statistics, sys
log, stack, torch_version, part, who, n, rnd, t0, t1, rc, error, batch, per_sample, disturbed = sys.argv[1:]
n, batch, per_sample = int(n), int(batch), int(per_sample)
rows = [json.loads(l) for l in open(log) if l.startswith("{")] if os.path.exists(log) else []
epochs = [r for r in rows if r.get("kind", "epoch") == "epoch"]
windows = [r for r in rows if r.get("kind") == "log"][1:]  # the first: warm-up
steps = sum(r["steps"] for r in epochs)
step_s = [n * batch / r["samples_per_s"] for r in windows if r.get("samples_per_s")]
if not step_s:  # epochs too short for progress windows: the epochs after the first
    step_s = [r["seconds"] / r["steps"] for r in epochs[1:] if r["steps"] > 0]
print(json.dumps({
    "stack": stack, "torch": torch_version, "part": part, "who": who, "ranks": n, "round": int(rnd),
    "rc": int(rc), "error": error or None, "disturbed": disturbed == "1", "steps": steps, "samples": steps * n * batch,
    "units_per_sample": per_sample, "epoch_seconds": sum(r["seconds"] for r in epochs),
    "wall_s": float(t1) - float(t0),
    "first_step_s": epochs[0]["first_step_unix_s"] - float(t0) if epochs and "first_step_unix_s" in epochs[0] else None,
    "window_step_s": step_s, "step_s": statistics.median(step_s) if step_s else None}))
PY
      done
    done
  done
  rm -rf "$out/snap-$stack"
}

if [ "${1:-}" = --round ]; then
  shift
  round "$@"
  exit
fi

source bench/lib.sh
bench_init pt2 3 "${1:-}" "${2:-}"
out=$(realpath "$out")  # the round runs from the repository root on the host and in the chroot alike
samples=${3:-19200}
stacks=${MPIDDP_BENCH_STACKS:-pip}
parts=${MPIDDP_PT2_PARTS:-cnn mlp gpt}
for stack in $stacks; do
  stack_check "$stack" || exit 2
  if [ "$stack" = debian12 ]; then
    echo "pt2_bench: the debian12 stack's libtorch 1.13 has no torch.export (2.6 or newer): pip or sid" >&2
    exit 2
  fi
  dir=$(stack_dir "$stack" "$build")
  [ -x "$dir/mpiddp" ] || build_stacks "$stack"
  [ "$stack" = sid ] && bash scripts/chroot.sh --suite sid -- bash scripts/deps.sh python3-torch python3-h5py >&2
  # the models, saved by the stack's own torch (the one its mpiddp links)
  gpt_shape=4,4,256,128,256
  model_parts=()
  for part in $parts; do
    case $part in
      cnn) model_parts+=(cnn) ;;
      mlp) model_parts+=(mlp:20,1) ;;
      gpt) model_parts+=("gpt:$gpt_shape") ;;
      *) echo "pt2_bench: unknown part '$part' (cnn, mlp, gpt)" >&2; exit 2 ;;
    esac
  done
  on_stack "$stack" "$(stack_python "$stack")" bench/pt2_models.py make "$out/models-$stack" 0 "${model_parts[@]}"
done
cnn_h5=
case " $parts " in *" cnn "*) cnn_h5=$(workload_fm_head "$samples") ;; esac
toy_h5=
case " $parts " in *" mlp "*) toy_h5=$(workload_toy) ;; esac
text=
case " $parts " in *" gpt "*) text=$(workload_text) ;; esac
abs() { [ -z "$1" ] || realpath "$1"; }
cat >"$out/round.env" <<EOF
parts="$parts"
ranks="${MPIDDP_PT2_RANKS:-1 2}"
cnn_h5="$(abs "$cnn_h5")"
toy_h5="$(abs "$toy_h5")"
text="$(abs "$text")"
snapshots=${MPIDDP_PT2_SNAPSHOTS:-1}
mlp_epochs=${MPIDDP_PT2_MLP_EPOCHS:-100}
gpt_steps=${MPIDDP_PT2_GPT_STEPS:-60}
gpt_shape=$gpt_shape
gpt_batch=8
EOF

: >"$out/results.jsonl"
for round in $(seq 1 "$rounds"); do
  for stack in $stacks; do
    pause_while
    on_stack "$stack" bash bench/pt2_bench.sh --round "$stack" "$(stack_dir "$stack" "$build")" "$round" "$out"
  done
done
# Records: per run, its throughput, steady step time and time to first step; the rank count in the
# metric, so that each table compares the three at one rank count.
/usr/bin/python3 - "$out/results.jsonl" <<'PY' | record_tsv
import json, sys
NAMES = {"builtin": "built-in (C++)", "torchscript": "TorchScript", "pt2": "torch.export (.pt2)"}
for r in map(json.loads, open(sys.argv[1])):
    ok = r["rc"] == 0 and r["steps"] > 0 and not r.get("disturbed")  # disturbed after 3 tries: null
    where = f"{r['stack']} (torch {r['torch']})"
    ranks = f"{r['ranks']} rank{'s' if r['ranks'] > 1 else ''}"
    unit = "tokens/s" if r["part"] == "gpt" else "samples/s"
    rate = r["samples"] * r["units_per_sample"] / r["epoch_seconds"] if ok and r["epoch_seconds"] > 0 else None
    step = 1000 * r["step_s"] if ok and r["step_s"] else None
    first = r["first_step_s"] if ok else None
    for metric, value, u in (("throughput", rate, unit), ("step time", step, "ms"), ("time to first step", first, "s")):
        value = "nan" if value is None else value
        print(f"{where}\t{r['round']}\t{NAMES[r['who']]}\t{r['part']} {metric}, {ranks}\t{value}\t{u}")
PY
save_results
save_results "$out/results.jsonl"
/usr/bin/python3 bench/report.py --ref "built-in (C++)" --ref "TorchScript" "$out/records.jsonl"
/usr/bin/python3 - "$out/results.jsonl" "$out"/models-*/models.json <<'PY'
import json, sys
for path in sys.argv[2:]:
    for part, m in json.load(open(path)).items():
        print(f"{path.split('/')[-2]}: {part}.pt2 has {m['forward_nodes']} call_function nodes in its training forward "
              f"({m['ops']} ops), {m['parameters']:,} parameters")
failed = [r for r in map(json.loads, open(sys.argv[1])) if r["rc"] != 0]
for r in failed:
    print(f"FAILED: {r['stack']} round {r['round']} {r['part']} {r['who']}, {r['ranks']} rank(s): "
          f"rc {r['rc']}: {r['error']}")
for r in map(json.loads, open(sys.argv[1])):
    if r.get("disturbed"):
        print(f"DISTURBED (no record): {r['stack']} round {r['round']} {r['part']} {r['who']}, "
              f"{r['ranks']} rank(s)")
PY
