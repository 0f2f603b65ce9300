#!/usr/bin/env bash
# examples/custom_model.cpp trains its own module with the public API: the MSE falls each epoch.
# examples/resnet_trainer.cpp trains a ResNet-style module with the library Trainer at 1-3 ranks:
# accuracy rises, and a run stopped after one epoch and resumed ends bitwise equal to one that was not.
# usage: example.sh path/to/mpiddp path/to/custom_model path/to/resnet_trainer
source "$(dirname "$0")/lib.sh"
mpiddp=$1 example=$2 resnet=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$mpiddp" data synthetic --samples 1024 --seed 2 --out "$tmp/syn.h5" >/dev/null
for n in 1 2 3; do
  run_np "$n" "$example" "$tmp/syn.h5"
  check "np$n: exit 0" [ "$rc" -eq 0 ]
  check "np$n: three epochs reported once" [ "$(grep -c '^epoch [0-2] mse ' <<<"$out")" -eq 3 ]
  check "np$n: MSE falls" python3 -c '
import sys; m = [float(l.split()[-1]) for l in sys.stdin if l.startswith("epoch")]
assert m[2] < m[0], m' <<<"$out"
done

py "$(dirname "$0")/../python/torchscript_ref.py" make-data "$tmp/img.h5" 384 1
py "$(dirname "$0")/../python/torchscript_ref.py" make-data "$tmp/img-test.h5" 128 2
MPIDDP_TEST_DEADLINE=300
for n in 1 2 3; do
  run_np "$n" "$resnet" "$tmp/img.h5" "$tmp/img-test.h5" 3 "$tmp/full$n"
  check "resnet np$n: exit 0" [ "$rc" -eq 0 ]
  check "resnet np$n: three epochs" [ "$(grep -c '^epoch [1-3] loss ' <<<"$out")" -eq 3 ]
  check "resnet np$n: test accuracy rises above chance (0.25)" py -c '
import sys; a = [float(l.split()[-1]) for l in sys.stdin if l.startswith("epoch")]
assert a[-1] > 0.4 and a[-1] > a[0], a' <<<"$out"
  run_np "$n" "$resnet" "$tmp/img.h5" "$tmp/img-test.h5" 1 "$tmp/half$n"
  run_np "$n" "$resnet" "$tmp/img.h5" "$tmp/img-test.h5" 3 "$tmp/half$n"
  check "resnet np$n: resumed run reports epochs 2 and 3 only" [ "$(grep -c '^epoch [23] loss ' <<<"$out")" -eq 2 ]
  # The optimizer's archive is a zip whose bytes vary with more than the state; the model's tensors
  # after two more epochs of RMSprop depend on that state, so they are what is compared.
  check "resnet np$n: resumed run ends bitwise equal (every tensor but the optimizer's archive)" py - "$tmp/full$n/latest.h5" "$tmp/half$n/latest.h5" <<'PY'
import h5py, sys
a, b = h5py.File(sys.argv[1], "r"), h5py.File(sys.argv[2], "r")
names = []
a.visititems(lambda k, v: names.append(k) if isinstance(v, h5py.Dataset) else None)
assert any(k.startswith("model/block2.bn2.running_var") for k in names) and "optimizer/archive" in names, names
for k in names:
    if k != "optimizer/archive":
        assert a[k].shape == b[k].shape and (a[k][()] == b[k][()]).all(), k
PY
done
finish
