#!/usr/bin/env bash
# `mpiddp data`: Fashion-MNIST conversion (checked against the IDX bytes), the seeds' synthetic
# set (reproducible by seed), and bad input. usage: data_cli.sh path/to/mpiddp
source "$(dirname "$0")/lib.sh"
mpiddp=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
src=/usr/share/datasets/fashion-mnist

if [ -f "$src/train-images-idx3-ubyte.gz" ]; then
  run_np 2 "$mpiddp" data fashion-mnist --out "$tmp/fm.h5"
  check "fashion-mnist: exit 0" [ "$rc" -eq 0 ]
  check "fashion-mnist: train summary" contains "wrote $tmp/fm-train.h5: 60000 samples of \[1, 28, 28\] uint8, 10 classes" "$out"
  check "fashion-mnist: test summary" contains "wrote $tmp/fm-test.h5: 10000 samples of \[1, 28, 28\] uint8, 10 classes" "$out"
  check "fashion-mnist: pixels equal the IDX bytes" python3 - "$src" "$tmp/fm-train.h5" <<'PY'
import gzip, subprocess, sys
src, h5 = sys.argv[1], sys.argv[2]
raw = gzip.open(f"{src}/train-images-idx3-ubyte.gz").read()[16:16 + 2 * 784]
labels = gzip.open(f"{src}/train-labels-idx1-ubyte.gz").read()[8:8 + 2]
dump = subprocess.run(["h5dump", "-d", "/inputs[0,0,0,0;;2,1,28,28]", "-y", "-w", "0", h5],
                      capture_output=True, text=True, check=True).stdout
nums = [int(v) for v in dump.split("DATA {")[1].split("}")[0].replace(",", " ").split()]
assert nums == list(raw), (nums[:10], list(raw)[:10])
tdump = subprocess.run(["h5dump", "-d", "/targets[0;;2]", "-y", "-w", "0", h5], capture_output=True, text=True, check=True).stdout
assert [int(v) for v in tdump.split("DATA {")[1].split("}")[0].replace(",", " ").split()] == list(labels)
PY
else
  echo "SKIP - fashion-mnist conversion: $src is missing (Debian package dataset-fashion-mnist)"
fi

run_np 1 "$mpiddp" data synthetic --samples 2048 --features 20 --seed 7 --out "$tmp/a.h5"
check "synthetic: exit 0" [ "$rc" -eq 0 ]
check "synthetic: summary" contains "2048 samples of \[20\] float32, regression targets of 1" "$out"
run_np 2 "$mpiddp" data synthetic --seed 7 --out "$tmp/b.h5"
run_alone "$mpiddp" data synthetic --seed 8 --out "$tmp/c.h5"
check "synthetic: same seed, same data (any rank count)" h5diff "$tmp/a.h5" "$tmp/b.h5" /inputs
check "synthetic: another seed, other data" bash -c "! h5diff -q '$tmp/a.h5' '$tmp/c.h5' /inputs"

for bad in "bogus --out $tmp/x.h5" "synthetic" "synthetic --samples 0 --out $tmp/x.h5" \
           "synthetic --samples many --out $tmp/x.h5" "mnist --out $tmp/x.h5" \
           "fashion-mnist --source /nonexistent --out $tmp/x.h5" "synthetic --out /nonexistent/dir/x.h5" \
           "synthetic --bogus 1 --out $tmp/x.h5"; do
  # shellcheck disable=SC2086
  run_np 2 "$mpiddp" data $bad
  check "bad input '$bad': non-zero exit, no hang" failed_cleanly
  check "bad input '$bad': one line" one_line "$err"
done
finish
