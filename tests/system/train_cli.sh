#!/usr/bin/env bash
# `mpiddp train` end to end: the seeds' regression set (MSE falls), reading the data (from memory,
# the file, a reader thread), a short CNN run on Fashion-MNIST with evaluation, the profiler, and bad
# data (one line from rank 0, non-zero exit on every rank, no hang). The options themselves:
# train_options.sh.
# usage: train_cli.sh path/to/mpiddp path/to/make_bad_datasets
source "$(dirname "$0")/lib.sh"
mpiddp=$1 make_bad=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$mpiddp" data synthetic --samples 2048 --features 20 --seed 1 --out "$tmp/syn.h5" >/dev/null
"$make_bad" "$tmp"

for n in 1 2 3 4; do
  run_np "$n" "$mpiddp" train --model linear --data "$tmp/syn.h5" --epochs 4 --batch-size 32 --optimizer sgd --lr 0.05 \
    --metrics "$tmp/m$n.jsonl"
  check "synthetic np$n: exit 0" [ "$rc" -eq 0 ]
  check "synthetic np$n: the seeds' line from every rank" \
    [ "$(grep -c "^\[RANK [0-9]*\] Epoch 4 | Batchsize: 32 | Steps: $(( (2048 + n - 1) / n / 32 ))\$" <<<"$out")" -eq "$n" ]
  check "synthetic np$n: MSE falls epoch over epoch" python3 - "$tmp/m$n.jsonl" "$n" <<'PY'
import json, sys
rows = [r for r in map(json.loads, open(sys.argv[1])) if r["kind"] == "epoch"]
assert len(rows) == 4 and all(r["world_size"] == int(sys.argv[2]) for r in rows)
losses = [r["train_loss"] for r in rows]
assert all(b < a for a, b in zip(losses, losses[1:])), losses
assert losses[-1] < 0.1, losses  # targets are uniform in [0, 1): the best constant predictor has MSE 1/12
PY
done

# Reading every batch from the file (by the reader thread; or, with --prefetch 0, by the training
# thread, through collective MPI-IO where HDF5 is parallel) trains exactly as the in-memory copy
# does, and so does the in-memory copy without the reader thread or with a deeper queue, and with
# --deterministic (the CPU's kernels are deterministic already: nothing changes).
parallel_hdf5=0
grep -q "HDF5 *: .*(parallel)" <<<"$("$mpiddp" info)" && parallel_hdf5=1
for n in 1 3; do  # one rank, and uneven shards
  run_np "$n" "$mpiddp" train --model mlp --data "$tmp/syn.h5" --epochs 2 --batch-size 16 --snapshot-dir "$tmp/mem$n"
  for variant in "file:--cache-mb 0" "file0:--cache-mb 0 --prefetch 0" "mem0:--prefetch 0" "mem5:--prefetch 5" \
                 "det:--deterministic"; do
    name=${variant%%:*}
    # shellcheck disable=SC2086
    run_np "$n" "$mpiddp" train --model mlp --data "$tmp/syn.h5" --epochs 2 --batch-size 16 --snapshot-dir "$tmp/$name$n" \
      ${variant#*:}
    check "np$n ${variant#*:}: exit 0" [ "$rc" -eq 0 ]
    check "np$n ${variant#*:}: same final parameters as from memory with the reader thread (bitwise)" \
      h5diff -q "$tmp/mem$n/latest.h5" "$tmp/$name$n/latest.h5" /model /model
    case $name in
      file) check "np$n --cache-mb 0: batches read from the file by the reader thread" \
              contains "^data: '$tmp/syn.h5' is larger than the cache limit: read per batch, 2 batch(es) ahead by a reader thread" "$out" ;;
      file0) if [ "$parallel_hdf5" = 1 ]; then
               check "np$n --prefetch 0, parallel HDF5: the reads are collective MPI-IO" contains "one collective MPI-IO read per step" "$out"
             else
               check "np$n --prefetch 0: read per batch on the training thread" contains "read per batch\$" "$out"
             fi ;;
    esac
  done
done

# A batch that cannot be read (row 41's chunk is damaged) ends the run with an error naming its
# step, from the rank that read it, with the reader thread and without (collective reads included:
# the failing rank must not wait in a collective file close for ranks inside the next read).
for n in 1 2 3; do
  step=$(( 41 / (4 * n) ))
  for prefetch in 2 0; do
    run_np "$n" "$mpiddp" train --model linear --data "$tmp/damaged_row.h5" --no-shuffle --batch-size 4 --cache-mb 0 \
      --prefetch "$prefetch"
    check "damaged row np$n --prefetch $prefetch: non-zero exit, no hang" failed_cleanly
    check "damaged row np$n --prefetch $prefetch: the step is named, by the reading rank" \
      contains "\[rank $(( 41 % n ))\] .*cannot read the batch of global step $step (epoch 1, step $step) from '$tmp/damaged_row.h5': .*inflate" "$err"
  done
done

src=/usr/share/datasets/fashion-mnist
if [ -f "$src/train-images-idx3-ubyte.gz" ]; then
  "$mpiddp" data fashion-mnist --out "$tmp/fm.h5" >/dev/null
  run_np 2 "$mpiddp" train --model cnn --data "$tmp/fm-train.h5" --test-data "$tmp/fm-test.h5" --max-steps 4 \
    --batch-size 16 --optimizer adam --lr 0.001
  check "cnn on fashion-mnist: exit 0" [ "$rc" -eq 0 ]
  check "cnn on fashion-mnist: evaluated" contains "^epoch 1: train loss [0-9.]*, test loss [0-9.]*, test accuracy [0-9.]*%" "$out"
else
  echo "SKIP - cnn on fashion-mnist: $src is missing (Debian package dataset-fashion-mnist)"
fi

# Bad data: one line from rank 0, non-zero exit on every rank, no hang.
bad_input "missing file" "does not exist" train --model linear --data "$tmp/nope.h5"
bad_input "missing dataset" "has no dataset /targets" train --model linear --data "$tmp/no_targets.h5"
bad_input "inputs and targets of different lengths" "/inputs has 8 samples but /targets has 7" train --model linear --data "$tmp/mismatch.h5"
bad_input "labels out of the model's range" "labels range over \[0, 9\] but the model has 5 classes" train --model mlp --data "$tmp/labels.h5"
bad_input "empty dataset" "empty dataset" train --model linear --data "$tmp/empty.h5"
bad_input "fewer samples than ranks x batch" "fewer samples than ranks x batch" train --model linear --data "$tmp/three.h5" --batch-size 4
bad_input "cnn on 20 features" "--model cnn needs inputs of \[1, 28, 28\]" train --model cnn --data "$tmp/syn.h5"

# --profile: PyTorch's profiler over the window only, one Chrome trace per rank. The mlp's three
# linear layers give three AddmmBackward0 evaluations a step: the window's count is its steps x 3.
# 2048 samples / (2 ranks x 64) = 16 steps; a window past the run's end writes what it holds. A
# libtorch without Kineto (Debian's 1.13: the test Python's torch, the same build, says which)
# cannot save a trace: every rank says so before training.
backward_addmms() { py - "$1" <<'PY'
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
print(sum(1 for e in events if e.get("ph") == "X" and "AddmmBackward0" in e.get("name", "") and "evaluate_function" in e["name"]))
PY
}
if [ "$(py -c 'import torch; print(torch.autograd.kineto_available())')" = True ]; then
  for w in "4 2" "3 1" "14 5"; do
    read -r from steps <<<"$w"
    rm -f "$tmp"/prof.*
    run_np 2 "$mpiddp" train --model mlp --data "$tmp/syn.h5" --epochs 1 --batch-size 64 --profile "$tmp/prof.json" \
      --profile-from "$from" --profile-steps "$steps"
    taken=$(( steps < 16 - from ? steps : 16 - from ))
    check "--profile-from $from --profile-steps $steps: trains, says where it wrote" \
      bash -c '[ "$1" -eq 0 ] && grep -q "^profile written: $2\.rank0\.json$" <<<"$3"' _ "$rc" "$tmp/prof" "$out"
    for r in 0 1; do
      check "--profile-from $from --profile-steps $steps: rank $r's trace holds $taken steps' backward" \
        [ "$(backward_addmms "$tmp/prof.rank$r.json")" = $((3 * taken)) ]
    done
  done
  run_np 2 "$mpiddp" train --model mlp --data "$tmp/syn.h5" --epochs 1 --batch-size 64 --profile "$tmp/late.json" \
    --profile-from 16
  check "--profile-from past the run's end: trains, writes nothing" \
    bash -c '[ "$1" -eq 0 ] && ! ls "$2"/late.* 2>/dev/null' _ "$rc" "$tmp"
else
  bad_input "--profile without Kineto" "--profile needs libtorch's profiler with Kineto (USE_KINETO=1)" \
    train --model mlp --data "$tmp/syn.h5" --profile "$tmp/prof.json"
fi
[[ " ${MPIDDP_BACKENDS:-} " == *" nccl "* ]] && bad_input "nccl without a cuda device" "goes with --device cuda" train --model linear --data "$tmp/syn.h5" --backend nccl
finish
