#!/usr/bin/env bash
# `mpiddp train --tensorboard DIR`: the event files are read back by tb_read.py, independently of
# the writer (python3-protobuf over the same .proto, its own CRC-32C), and every scalar is compared
# with the run's JSON-lines metrics; a resumed run marks where it restarted; bad directories give
# one line and a non-zero exit on every rank.
# usage: tensorboard.sh path/to/mpiddp path/to/tensorboard.proto
source "$(dirname "$0")/lib.sh"
mpiddp=$1 proto=$2
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
protoc --proto_path="$(dirname "$proto")" --python_out="$tmp" "$proto"
read_back() { py "$here/tb_read.py" "$tmp" "$@"; }
fails() { ! "$@" 2>/dev/null; }

# A classification set small enough for several epochs: the first 1536 Fashion-MNIST training images.
src=/usr/share/datasets/fashion-mnist
if [ -f "$src/train-images-idx3-ubyte.gz" ]; then
  "$mpiddp" data fashion-mnist --out "$tmp/fm.h5" >/dev/null
  py - "$tmp/fm-train.h5" "$tmp/small.h5" <<'PY'
import sys, h5py
with h5py.File(sys.argv[1], "r") as a, h5py.File(sys.argv[2], "w") as b:
    for k, v in a.attrs.items():
        b.attrs[k] = v
    for name in ("inputs", "targets"):
        d = b.create_dataset(name, data=a[name][:1536])
        for k, v in a[name].attrs.items():
            d.attrs[k] = v
PY
  train=(--model linear --data "$tmp/small.h5" --test-data "$tmp/fm-test.h5")
else
  echo "note: $src is missing (dataset-fashion-mnist): a regression set instead (no test accuracy)"
  "$mpiddp" data synthetic --samples 1536 --seed 1 --out "$tmp/small.h5" >/dev/null
  "$mpiddp" data synthetic --samples 512 --seed 2 --out "$tmp/test.h5" >/dev/null
  train=(--model linear --data "$tmp/small.h5" --test-data "$tmp/test.h5")
fi

for n in 1 2 3 4; do
  run_np "$n" "$mpiddp" train "${train[@]}" --epochs 3 --batch-size 16 --log-every 7 --lr-schedule cosine \
    --tensorboard "$tmp/tb$n" --metrics "$tmp/m$n.jsonl"
  check "np$n: exit 0" [ "$rc" -eq 0 ]
  check "np$n: every scalar read back equals the JSON metrics, CRCs ok" \
    read_back "$tmp/tb$n" "$tmp/m$n.jsonl" --expect-text "| batch_size | 16 |" --expect-text "| world_size | $n |"
  check "np$n: one event file (rank 0 writes)" [ "$(ls "$tmp/tb$n" | wc -l)" -eq 1 ]
  check "np$n: a progress line per log record" \
    [ "$(grep -c '^epoch [0-9]*/3, step ' <<<"$out")" -eq "$(grep -c '"kind":"log"' "$tmp/m$n.jsonl")" ]
done
# Model FLOP/s: a model that does not count its FLOPs has none (nor MFU) unless --flops-per-sample
# gives them; then FLOP/s = samples/s x that figure in every record, train/ and epoch/.
check "linear: no FLOP/s without --flops-per-sample" bash -c "! grep -q -e flops_per_s -e mfu \"\$0\"" "$tmp/m1.jsonl"
run_np 1 "$mpiddp" train "${train[@]}" --epochs 1 --batch-size 16 --log-every 7 --flops-per-sample 1e6 \
  --tensorboard "$tmp/tbf" --metrics "$tmp/f.jsonl"
check "linear --flops-per-sample 1e6: exit 0, progress lines show FLOP/s and, on the CPU, no MFU" \
  bash -c "[ $rc -eq 0 ] && grep -q ' [0-9.]* [kMGTP]\?FLOP/s, ETA ' <<<\"\$0\" && ! grep -q MFU <<<\"\$0\"" "$out"
check "linear --flops-per-sample 1e6: every scalar read back equals the JSON metrics" read_back "$tmp/tbf" "$tmp/f.jsonl"
check "linear --flops-per-sample 1e6: flops_per_s = samples/s x 1e6 in every record, no mfu" py - "$tmp/f.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert {r["kind"] for r in rows} == {"log", "epoch"}, rows
assert all(abs(r["flops_per_s"] - 1e6 * r["samples_per_s"]) <= 1e-9 * r["flops_per_s"] and "mfu" not in r
           for r in rows), rows
PY
# Token data (the built-in GPT on llm.c shards): tokens/s, in the JSON lines and the event files,
# is samples/s times the block size.
printf 'the quick brown fox jumps over the lazy dog %.0s' $(seq 1 60) >"$tmp/text.txt"
"$mpiddp" data text --in "$tmp/text.txt" --out "$tmp/tok" >/dev/null
run_np 2 "$mpiddp" train --model gpt --n-layer 1 --n-head 2 --n-embd 16 --block-size 16 --vocab-size 256 \
  --data "$tmp/tok_train_000001.bin" --test-data "$tmp/tok_val_000000.bin" --batch-size 4 --epochs 2 --log-every 2 \
  --threads 1 --tensorboard "$tmp/tbg" --metrics "$tmp/g.jsonl"
check "gpt np2: exit 0" [ "$rc" -eq 0 ]
gpt_out=$out
check "gpt np2: every scalar read back equals the JSON metrics (tokens/s among them)" read_back "$tmp/tbg" "$tmp/g.jsonl"
check "gpt np2: tokens/s = samples/s x block size in every record, train/ and epoch/" py - "$tmp/g.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
kinds = {r["kind"] for r in rows if "tokens_per_s" in r}
ok = all(abs(r["tokens_per_s"] - 16 * r["samples_per_s"]) <= 1e-6 * r["tokens_per_s"] for r in rows)
sys.exit(0 if ok and kinds == {"log", "epoch"} and all("tokens_per_s" in r for r in rows) else 1)
PY
check "gpt np2: FLOP/s = samples/s x nanoGPT's (6N + 12 L C T) T in every record; no MFU on the CPU" \
  py - "$tmp/g.jsonl" <<'PY'
import json, sys
V, L, C, T = 256, 1, 16, 16
# Parameters without wpe (nanoGPT's non_embedding count): wte (tied to lm_head, once); per block two
# LayerNorms, c_attn, attn.c_proj, c_fc, mlp.c_proj with biases; ln_f.
N = V * C + L * (2 * 2 * C + (C * 3 * C + 3 * C) + (C * C + C) + (C * 4 * C + 4 * C) + (4 * C * C + C)) + 2 * C
per_sample = (6 * N + 12 * L * C * T) * T
rows = [json.loads(l) for l in open(sys.argv[1])]
assert {r["kind"] for r in rows} == {"log", "epoch"}, rows
for r in rows:
    assert abs(r["flops_per_s"] - per_sample * r["samples_per_s"]) <= 1e-9 * r["flops_per_s"], (r, per_sample)
    assert "mfu" not in r, r
PY
check "gpt np2: progress lines show FLOP/s, and no MFU on the CPU" \
  bash -c "grep -q '^epoch .* tokens/s), [0-9.]* [kMGTP]\?FLOP/s, ETA ' <<<\"\$0\" && ! grep -q MFU <<<\"\$0\"" "$gpt_out"

# The reader is not blind: one flipped bit in the middle of the file fails its CRC check.
cp -r "$tmp/tb2" "$tmp/tbx"
py -c 'import sys; p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[len(b) // 2] ^= 4; open(p, "wb").write(b)' \
  "$(ls "$tmp"/tbx/events.out.tfevents.*)"
check "a flipped bit is caught by the reader's CRC-32C" fails read_back "$tmp/tbx" "$tmp/m2.jsonl"

# Stopped at step 20 by --max-steps, resumed from that step's snapshot: the second run's file starts
# with a SessionLog START at step 20, so TensorBoard drops what the first wrote past it.
run_np 2 "$mpiddp" train "${train[@]}" --epochs 2 --batch-size 16 --log-every 5 --max-steps 20 --save-every-steps 20 \
  --snapshot-dir "$tmp/snap" --tensorboard "$tmp/tbr" --metrics "$tmp/r.jsonl"
check "resume: first part exit 0" [ "$rc" -eq 0 ]
run_np 2 "$mpiddp" train "${train[@]}" --epochs 2 --batch-size 16 --log-every 5 \
  --snapshot-dir "$tmp/snap" --tensorboard "$tmp/tbr2" --metrics "$tmp/r2.jsonl"
check "resume: second part exit 0, resumed" contains "^Resuming training from snapshot" "$out"
check "resume: a START marker at the resumed step, scalars = JSON" read_back "$tmp/tbr2" "$tmp/r2.jsonl" --expect-start 20

# Bad directories: one line from rank 0, non-zero exit everywhere, nothing hangs.
touch "$tmp/a-file"
for n in 1 3; do
  run_np "$n" "$mpiddp" train "${train[@]}" --tensorboard "$tmp/a-file/tb"
  check "np$n: --tensorboard under a file: fails cleanly" failed_cleanly
  check "np$n: ... with one line naming the directory" one_line "$err"
  check "np$n: ... that says what" contains "cannot create the TensorBoard directory '$tmp/a-file/tb'" "$err"
done
mkdir "$tmp/ro" && chmod 500 "$tmp/ro"
if [ "$(id -u)" -ne 0 ]; then
  run_np 2 "$mpiddp" train "${train[@]}" --tensorboard "$tmp/ro"
  check "read-only --tensorboard: one line" one_line "$err"
fi
finish
