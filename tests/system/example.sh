#!/usr/bin/env bash
# examples/custom_model.cpp trains its own module with the public API: the MSE falls each epoch.
# usage: example.sh path/to/mpiddp path/to/custom_model
source "$(dirname "$0")/lib.sh"
mpiddp=$1 example=$2
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
finish
