#!/usr/bin/env bash
# A character-level GPT on a public-domain English text that Debian ships: the King James Bible
# (bible-kjv, 4.3 MB), in nanoGPT's small CPU shape (4 layers, 4 heads, 128 wide, block 64, as its
# README's shakespeare_char run on a laptop), trained by mpiddp on 2 ranks, then a sample of text.
# usage: examples/gpt_kjv.sh [BUILD_DIR [STEPS]]   (default build, 2000 steps)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-2000}
bash scripts/deps.sh bible-kjv
[ -x "$build/mpiddp" ] || bash scripts/build.sh "$build"
source scripts/env.sh
out=$build/gpt-kjv
mkdir -p "$out"
[ -s "$out/kjv.txt" ] || bible -f "Gen1:1-Rev22:21" >"$out/kjv.txt"
"$build/mpiddp" data text --in "$out/kjv.txt" --out "$out/kjv" --val-fraction 0.1
rm -rf "$out/snaps" "$out/metrics.jsonl"
mpirun -np 2 "${MPIRUN_FLAGS[@]}" --bind-to core "$build/mpiddp" train --model gpt \
  --n-layer 4 --n-head 4 --n-embd 128 --block-size 64 --vocab-size 256 --dropout 0 \
  --data "$out/kjv_train_000001.bin" --test-data "$out/kjv_val_000000.bin" \
  --batch-size 6 --grad-accum 1 --max-steps "$steps" --optimizer adamw --lr 1e-3 --betas 0.9,0.99 \
  --weight-decay 0.1 --weight-decay-params matrices --lr-schedule cosine --warmup-steps 100 --min-lr 1e-4 \
  --clip-grad-norm 1.0 --log-every 200 --metrics "$out/metrics.jsonl" --snapshot-dir "$out/snaps" --save-every-steps 1000
"$build/mpiddp" generate "$out/snaps/latest.h5" --prompt "And the LORD said" --max-new-tokens 300 \
  --temperature 0.8 --top-k 20 --seed 1
echo
