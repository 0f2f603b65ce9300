#!/usr/bin/env bash
# `mpiddp data`: Fashion-MNIST conversion (checked against the IDX bytes), the seeds' synthetic
# set (reproducible by seed), text to llm.c token shards (read back as llm.c reads them), and bad
# input. usage: data_cli.sh path/to/mpiddp
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

# Text to llm.c shards, read back as llm.c's loader reads them (1024-byte header of int32, then
# uint16 tokens), independently of mpiddp's reader: the bytes of the files in order, the last tenth
# in the val shard.
printf 'First Citizen:\nBefore we proceed any further, hear me speak.\n' >"$tmp/a.txt"
head -c 3000 /dev/urandom >"$tmp/b.txt"
run_np 2 "$mpiddp" data text --in "$tmp/a.txt" "$tmp/b.txt" --out "$tmp/corpus"
check "text: exit 0" [ "$rc" -eq 0 ]
check "text: names the train shard" contains "wrote $tmp/corpus_train_000001.bin" "$out"
check "text: shards hold the bytes, llm.c's header" python3 - "$tmp" <<'PY'
import struct, sys
tmp = sys.argv[1]
data = open(f"{tmp}/a.txt", "rb").read() + open(f"{tmp}/b.txt", "rb").read()
def shard(path):
    raw = open(path, "rb").read()
    magic, version, n = struct.unpack("<3i", raw[:12])
    assert (magic, version) == (20240520, 1) and len(raw) == 1024 + 2 * n, (magic, version, n, len(raw))
    return list(struct.unpack(f"<{n}H", raw[1024:]))
train, val = shard(f"{tmp}/corpus_train_000001.bin"), shard(f"{tmp}/corpus_val_000000.bin")
assert len(val) == int(len(data) * 0.1) and train + val == list(data), (len(train), len(val), len(data))
PY
for bad in "text --out $tmp/y" "text --in $tmp/none.txt --out $tmp/y" "text --in $tmp/a.txt --out $tmp/y --val-fraction 1" \
           "text --in $tmp/a.txt --out /nonexistent/dir/y"; do
  # shellcheck disable=SC2086
  run_np 2 "$mpiddp" data $bad
  check "bad input '$bad': non-zero exit, no hang" failed_cleanly
  check "bad input '$bad': one line" one_line "$err"
done

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
