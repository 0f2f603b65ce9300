#!/usr/bin/env bash
# `mpiddp train --model FILE.pt` and `mpiddp export`: TorchScript modules saved from Python, trained
# by mpiddp at 1-3 ranks, equal to Python (the Python found here: PyTorch 1.13 on Debian 12, 2.14 in
# the sid chroot) training the same module on the global batch; exports loaded back in Python;
# bad input. usage: torchscript_cli.sh MPIDDP_BINARY
source "$(dirname "$0")/lib.sh"
mpiddp=$1
ref() { py "$(dirname "$0")/../python/torchscript_ref.py" "$@"; }
ref_differs() { ! ref compare "$@" 2>/dev/null; }  # REF.pt STATE.pt TOL: farther apart than TOL
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
MPIDDP_TEST_DEADLINE=180

ref make-data "$tmp/train.h5" 120 1
ref make-data "$tmp/test.h5" 64 2
ref make-model plain "$tmp/plain.pt" 3
ref make-model bn "$tmp/bn.pt" 4

# ---- equal to Python on the global batch -------------------------------------------------------
steps=5 batch=4 lr=0.05 momentum=0.9
# Gradient clipping (--clip-grad-norm, on the averaged gradients) against Python's
# clip_grad_norm_ on the global batch; 0.05 is well below these gradients' norm, so every step clips.
ref reference "$tmp/plain.pt" "$tmp/train.h5" 1 8 $steps $lr $momentum "$tmp/noclip.ref.pt"
for n in 1 2 3; do
  d=$tmp/clip-np$n
  run_np $n "$mpiddp" train --model "$tmp/plain.pt" --data "$tmp/train.h5" --no-shuffle --batch-size $batch \
    --max-steps $steps --epochs 1 --optimizer sgd --lr $lr --momentum $momentum --threads 1 --clip-grad-norm 0.05 \
    --snapshot-dir "$d"
  check "clip np$n: trains" [ "$rc" -eq 0 ]
  run_alone "$mpiddp" export "$d/latest.h5" --out "$d.state.pt" --format state-dict
  ref reference "$tmp/plain.pt" "$tmp/train.h5" $n $batch $steps $lr $momentum "$d.ref.pt" 0.05
  check "clip np$n: equal to Python's clip_grad_norm_ on the global batch $n x $batch (1e-5)" \
    ref compare "$d.ref.pt" "$d.state.pt" 1e-5
done
check "clip: clipping changed the result (the unclipped reference differs)" \
  ref_differs "$tmp/noclip.ref.pt" "$tmp/clip-np2.state.pt" 1e-3
# Mixed precision against Python's torch.autocast on each rank's slice (and, for fp16,
# torch.amp.GradScaler): parameters within about one ulp of the low precision (bf16 2e-3, fp16
# 1e-3: the ranks' gradients are summed in another order than Python's, and a float32 difference
# of 1e-8 can round a weight to the neighbouring bf16 value in the next forward), and for fp16 the
# same skipped steps and final loss scale exactly. The initial scale 2^24 overflows fp16 at first,
# so steps are skipped and the scale halves until it fits. fp16 on CPU needs libtorch 2.x: on
# 1.13, a one-line error instead.
amp_steps=10
ref reference "$tmp/plain.pt" "$tmp/train.h5" 2 $batch $amp_steps $lr $momentum "$tmp/fp32-np2.ref.pt"
fp16_ok=1
for precision in bf16 fp16; do
  for n in 1 2 3; do
    d=$tmp/$precision-np$n
    run_np $n "$mpiddp" train --model "$tmp/plain.pt" --data "$tmp/train.h5" --no-shuffle --batch-size $batch \
      --max-steps $amp_steps --epochs 1 --optimizer sgd --lr $lr --momentum $momentum --threads 1 \
      --precision $precision --loss-scale 16777216 --snapshot-dir "$d" --metrics "$d.jsonl"
    if [ "$precision" = fp16 ] && [ "$rc" -ne 0 ] && [ "$fp16_ok" = 1 ] && contains "fp16 loss scaling is not available on cpu" "$err"; then
      fp16_ok=0
      check "fp16 unavailable on this libtorch's CPU: a one-line error" one_line "$err"
      check "fp16 unavailable: this stack's Python has no CPU GradScaler either" \
        fails py -c 'import torch; torch.amp.GradScaler("cpu")' 2>/dev/null
      break
    fi
    check "$precision np$n: trains" [ "$rc" -eq 0 ]
    run_alone "$mpiddp" export "$d/latest.h5" --out "$d.state.pt" --format state-dict
    ref reference "$tmp/plain.pt" "$tmp/train.h5" $n $batch $amp_steps $lr $momentum "$d.ref.pt" 0 $precision 16777216
    tol=$([ "$precision" = bf16 ] && echo 2e-3 || echo 1e-3)
    check "$precision np$n: equal to Python's autocast on each rank's slice ($tol)" ref compare "$d.ref.pt" "$d.state.pt" $tol
    if [ "$precision" = fp16 ]; then
      check "fp16 np$n: the same skipped steps (some, not all) and final loss scale as torch.amp.GradScaler" \
        py - "$d.jsonl" "$d.ref.pt.json" $amp_steps <<'PY'
import json, sys
got = [r for r in map(json.loads, open(sys.argv[1])) if r["kind"] == "epoch"][-1]
want = json.load(open(sys.argv[2]))
print("mpiddp:", got["overflow_steps"], got["loss_scale"], " python:", want["skipped_steps"], want["loss_scale"])
assert 0 < want["skipped_steps"] < int(sys.argv[3]), want
assert got["overflow_steps"] == want["skipped_steps"] and got["loss_scale"] == want["loss_scale"]
PY
    fi
  done
done
check "bf16 differs from fp32 (autocast took effect): the fp32 reference is more than 4e-3 away" \
  ref_differs "$tmp/fp32-np2.ref.pt" "$tmp/bf16-np2.state.pt" 4e-3
for kind in plain bn; do
  for n in 1 2 3; do
    d=$tmp/$kind-np$n
    run_np $n "$mpiddp" train --model "$tmp/$kind.pt" --data "$tmp/train.h5" --test-data "$tmp/test.h5" \
      --no-shuffle --batch-size $batch --max-steps $steps --epochs 1 --optimizer sgd --lr $lr --momentum $momentum \
      --threads 1 --snapshot-dir "$d" --metrics "$d.jsonl"
    check "$kind np$n: trains" [ "$rc" -eq 0 ]
    check "$kind np$n: names the TorchScript module" contains "^mpiddp train: model torchscript __torch__\." "$out"
    run_alone "$mpiddp" export "$d/latest.h5" --out "$d.state.pt" --format state-dict
    check "$kind np$n: export state-dict" [ "$rc" -eq 0 ]
    ref reference "$tmp/$kind.pt" "$tmp/train.h5" $n $batch $steps $lr $momentum "$d.ref.pt"
    check "$kind np$n: equal to Python on the global batch $n x $batch (1e-5)" ref compare "$d.ref.pt" "$d.state.pt" 1e-5
    # Evaluation runs in eval mode (BatchNorm on its running statistics): the test loss mpiddp
    # reports is Python's eval-mode loss of the reference parameters.
    want=$(ref eval-loss "$d.ref.pt" "$tmp/$kind.pt" "$tmp/test.h5")
    got=$(py -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])["test_loss"])' "$d.jsonl")
    check "$kind np$n: test loss in eval mode equals Python's ($got vs $want)" \
      py -c 'import sys; a,b=map(float,sys.argv[1:]); sys.exit(abs(a-b) > 1e-5*max(1,abs(b)))' "$got" "$want"
  done
done

# ---- the snapshot: the module's own names under /model, resume, export as TorchScript ----------
d=$tmp/bn-np2
check "snapshot holds the module's own parameter and buffer names" py - "$d/latest.h5" <<'PY'
import h5py, sys
f = h5py.File(sys.argv[1], "r")
names = set(f["model"].keys())
assert names == {"conv.weight", "conv.bias", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var",
                 "bn.num_batches_tracked", "fc.weight", "fc.bias"}, names
assert f["model/bn.num_batches_tracked"][()] == 5
assert "torchscript" in f
PY
run_alone "$mpiddp" export "$d/latest.h5" --out "$tmp/bn-trained.pt"
check "export (auto) of a TorchScript run writes the module" contains "torchscript __torch__\..* as a TorchScript module" "$out"
check "the exported module loads with torch.jit.load, with the trained tensors" ref check-script "$d.ref.pt" "$tmp/bn-trained.pt" "$tmp/test.h5"
run_np 2 "$mpiddp" train --model "$tmp/bn.pt" --data "$tmp/train.h5" --no-shuffle --batch-size $batch --epochs 2 \
  --optimizer sgd --lr $lr --momentum $momentum --threads 1 --snapshot-dir "$tmp/bn-full"
run_np 2 "$mpiddp" train --model "$tmp/bn.pt" --data "$tmp/train.h5" --no-shuffle --batch-size $batch --epochs 1 \
  --optimizer sgd --lr $lr --momentum $momentum --threads 1 --snapshot-dir "$tmp/bn-half"
run_np 2 "$mpiddp" train --model "$tmp/bn.pt" --data "$tmp/train.h5" --no-shuffle --batch-size $batch --epochs 2 \
  --optimizer sgd --lr $lr --momentum $momentum --threads 1 --snapshot-dir "$tmp/bn-half"
check "resume of a TorchScript run: says so" contains "^Resuming training from snapshot at Epoch 2" "$out"
run_alone "$mpiddp" export "$tmp/bn-full/latest.h5" --out "$tmp/full.pt" --format state-dict
run_alone "$mpiddp" export "$tmp/bn-half/latest.h5" --out "$tmp/half.pt" --format state-dict
check "resume of a TorchScript run: bitwise equal to the uninterrupted run" ref compare "$tmp/full.pt" "$tmp/half.pt" 0

# ---- bad input: one line from every rank, no hang ----------------------------------------------
echo "not a model" >"$tmp/junk.pt"
bad_input "a file that is not TorchScript" "is not a TorchScript module" train --model "$tmp/junk.pt" --data "$tmp/train.h5"
bad_input "no such model file" "unknown --model '$tmp/none.pt'" train --model "$tmp/none.pt" --data "$tmp/train.h5"
ref make-bad "$tmp"
bad_input "a module without forward" "has no forward method" train --model "$tmp/noforward.pt" --data "$tmp/train.h5"
bad_input "outputs of fewer classes than the labels" "labels range over \[0, 3\] but the model has 3 classes" \
  train --model "$tmp/three.pt" --data "$tmp/train.h5"
bad_input "outputs of the wrong shape for the targets" "the model's outputs for 2 samples are \[2\]; class labels need \[2, classes\]" \
  train --model "$tmp/flat.pt" --data "$tmp/train.h5"
bad_input "inputs the model cannot take" "fails on inputs of \[2, 1, 8, 8\]" train --model "$tmp/other.pt" --data "$tmp/train.h5"
bad_input "activation checkpointing of a TorchScript module" "activation checkpointing: the model (torchscript" \
  train --model "$tmp/plain.pt" --data "$tmp/train.h5" --activation-checkpointing
bad_input "activation checkpointing of the built-in mlp" "the model (mlp) cannot be split into blocks" \
  train --model mlp --data "$tmp/train.h5" --activation-checkpointing
# A model whose parameters differ across ranks: each rank loads its own file.
cat >"$tmp/per_rank.sh" <<EOF
#!/usr/bin/env bash
r=\${OMPI_COMM_WORLD_RANK:-\${PMI_RANK:-0}}
m=$tmp/plain.pt; [ "\$r" = 1 ] && m=$tmp/bn.pt
exec "$mpiddp" train --model "\$m" --data "$tmp/train.h5" --batch-size 4 --max-steps 1
EOF
chmod +x "$tmp/per_rank.sh"
run_np 2 "$tmp/per_rank.sh"
check "different models on different ranks: refused, no hang" failed_cleanly
check "different models on different ranks: one line" one_line "$err"
check "different models on different ranks: names the mismatch" contains "model mismatch across ranks" "$err"
cp "$d/latest.h5" "$tmp/corrupt.h5"
py - "$tmp/corrupt.h5" <<'PY'
import h5py, sys
with h5py.File(sys.argv[1], "r") as f:
    at = f["model/fc.weight"].id.get_offset() + 16
with open(sys.argv[1], "r+b") as f:
    f.seek(at); b = f.read(1); f.seek(at); f.write(bytes([b[0] ^ 0x01]))
PY
bad_input "export of a corrupt snapshot" "CRC-32" export "$tmp/corrupt.h5" --out "$tmp/x.pt"
check "export of a corrupt snapshot: writes nothing" [ ! -e "$tmp/x.pt" ]
run_np 1 "$mpiddp" train --model linear --data "$tmp/train.h5" --max-steps 2 --snapshot-dir "$tmp/linear"
bad_input "export --format torchscript of a C++ model's snapshot" "is of a C++ model" \
  export "$tmp/linear/latest.h5" --out "$tmp/y.pt" --format torchscript
run_alone "$mpiddp" export "$tmp/linear/latest.h5" --out "$tmp/linear.pt"
check "export of a C++ model: a state_dict that torch.load reads" py -c '
import sys, torch
sd = torch.load(sys.argv[1], weights_only=True)
assert sorted(sd) == ["fc.bias", "fc.weight"] and sd["fc.weight"].shape == (4, 64), sd.keys()
m = torch.nn.Module(); m.fc = torch.nn.Linear(64, 4); m.load_state_dict(sd)' "$tmp/linear.pt"
# The built-in cnn's names are those of PyTorch's examples/mnist Net: its export loads there.
ref make-data "$tmp/img28.h5" 64 5 28
run_np 2 "$mpiddp" train --model cnn --data "$tmp/img28.h5" --test-data "$tmp/img28.h5" --batch-size 8 --max-steps 2 \
  --threads 1 --snapshot-dir "$tmp/cnn" --metrics "$tmp/cnn.jsonl"
run_alone "$mpiddp" export "$tmp/cnn/latest.h5" --out "$tmp/cnn-state.pt"
loss=$(py -c 'import json,sys; print(json.loads(open(sys.argv[1]).readlines()[-1])["test_loss"])' "$tmp/cnn.jsonl")
check "the built-in cnn's export loads into examples/mnist's Net (strict) and scores mpiddp's test loss" \
  ref check-mnist-net "$tmp/cnn-state.pt" "$tmp/img28.h5" "$loss"
finish
