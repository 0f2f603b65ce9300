#!/usr/bin/env bash
# `mpiddp train --model gpt` on llm.c token shards against nanoGPT's loop written in Python
# (tests/python/nanogpt_ref.py, the test Python's torch: Debian's, the chroot's or the pip venv's): at 1-4 ranks x micro-batch
# x accumulation, AdamW with nanoGPT's groups, warmup + cosine to a floor, clipping; the tied
# weight stays tied; the export loads strictly into nanoGPT's GPT and its loss there is mpiddp's
# test loss. usage: gpt_cli.sh MPIDDP_BINARY
source "$(dirname "$0")/lib.sh"
mpiddp=$1
ref() { py "$(dirname "$0")/../python/nanogpt_ref.py" "$@"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
MPIDDP_TEST_DEADLINE=180

# A byte-level corpus (vocabulary 256) as llm.c shards.
text_shards "$tmp/tiny" 1500 7
check "data text writes the shards" [ -f "$tmp/tiny_train_000001.bin" -a -f "$tmp/tiny_val_000000.bin" ]
train=$tmp/tiny_train_000001.bin val=$tmp/tiny_val_000000.bin

# nanoGPT's shape, small: 2 layers, 2 heads, 32 wide, block 16; the same initial weights for both.
shape=(2 2 32 16 256 true)
ref init "$tmp/init.pt" 3 "${shape[@]}"
gpt=(--model gpt --n-layer 2 --n-head 2 --n-embd 32 --block-size 16 --vocab-size 256 --init-from "$tmp/init.pt")
steps=6 lr=0.003 min_lr=0.0003 warmup=2 wd=0.1 clip=1.0
opt=(--optimizer adamw --lr $lr --lr-schedule cosine --warmup-steps $warmup --min-lr $min_lr --betas 0.9,0.95
     --weight-decay $wd --weight-decay-params matrices --clip-grad-norm $clip)
for case in "1 4 1" "2 2 2" "3 2 1" "4 1 3"; do
  read -r n b k <<<"$case"
  d=$tmp/np$n
  run_np "$n" "$mpiddp" train "${gpt[@]}" "${opt[@]}" --data "$train" --test-data "$val" --no-shuffle \
    --batch-size "$b" --grad-accum "$k" --max-steps $steps --threads 1 --snapshot-dir "$d" --metrics "$d.json"
  check "np$n x batch $b x accum $k: trains" [ "$rc" -eq 0 ]
  run_alone "$mpiddp" export "$d/latest.h5" --out "$d.state.pt" --format state-dict
  ref train "$tmp/init.pt" "$train" "$n" "$b" "$k" $steps $lr $min_lr $warmup $wd 0.9 0.95 $clip "$d.ref.pt"
  check "np$n x batch $b x accum $k: equal to nanoGPT's loop on one process (2e-5), lm_head tied to wte" \
    ref compare "$d.ref.pt" "$d.state.pt" 2e-5
done
check "accumulation matters: 2 x 2 x 2 differs from 1 x 4 x 1 (other windows per step)" \
  fails ref compare "$tmp/np1.ref.pt" "$tmp/np2.ref.pt" 1e-4

# nanoGPT's headerless train.bin (--data-format raw-uint16: the same tokens without llm.c's 1024-byte
# header) trains bitwise as the shard does.
tail -c +1025 "$train" >"$tmp/train.bin"
run_np 1 "$mpiddp" train "${gpt[@]}" "${opt[@]}" --data "$tmp/train.bin" --data-format raw-uint16 --no-shuffle \
  --batch-size 4 --max-steps $steps --threads 1 --snapshot-dir "$tmp/raw"
run_alone "$mpiddp" export "$tmp/raw/latest.h5" --out "$tmp/raw.state.pt" --format state-dict
check "raw-uint16 train.bin trains bitwise as the llm.c shard of the same tokens" ref compare "$tmp/np1.state.pt" "$tmp/raw.state.pt" 0
run_np 1 "$mpiddp" train "${gpt[@]}" --data "$tmp/train.bin" --max-steps 1
check "a headerless file is not guessed: llm.c's format is refused by name" bash -c "[ $rc -ne 0 ] && grep -q 'train.bin' <<<\"\$0\"" "$err"

# Resume: a run stopped after 3 of 6 steps and resumed (shuffled windows, accumulation, the
# schedule's position, AdamW's moments, the RNG) ends bitwise where the uninterrupted run ends.
resume_run() {  # DIR STEPS
  run_np 2 "$mpiddp" train "${gpt[@]}" "${opt[@]}" --data "$train" --batch-size 2 --grad-accum 2 --max-steps "$2" \
    --threads 1 --snapshot-dir "$1" --save-every-steps 3 --keep 0 --dropout 0.1 --seed 4
}
resume_run "$tmp/whole" 6
run_alone "$mpiddp" export "$tmp/whole/latest.h5" --out "$tmp/whole.pt" --format state-dict
cp -r "$tmp/whole" "$tmp/part"
rm "$tmp/part/snapshot-step0000000006.h5"  # as if stopped after step 3's snapshot
resume_run "$tmp/part" 6
check "resumed run: 'Resuming' said" contains "Resuming training from snapshot at Epoch 1, step 3" "$out"
run_alone "$mpiddp" export "$tmp/part/latest.h5" --out "$tmp/part.pt" --format state-dict
check "stopped at step 3 and resumed: bitwise the uninterrupted run (dropout on), still tied" ref compare "$tmp/whole.pt" "$tmp/part.pt" 0

# Export: loads strictly into nanoGPT's GPT; its loss on the validation windows there equals
# mpiddp's final test loss (the mean over every position of every window, whatever the ranks).
check "export loads strictly into nanoGPT's GPT" ref strict-load "$tmp/np3.state.pt"
want=$(ref loss "$tmp/np3.state.pt" "$val" 16)
got=$(py -c "import json,sys; print([json.loads(l) for l in open(sys.argv[1]) if '\"epoch\"' in l][-1]['test_loss'])" "$tmp/np3.json")
check "np3: mpiddp's test loss $got = Python's loss of the export $want (1e-4)" \
  py -c "import sys; sys.exit(abs(float(sys.argv[1]) - float(sys.argv[2])) > 1e-4)" "$got" "$want"

# Generation: nanoGPT's rule, token for token. Greedy (--top-k 1) and drawn (top-k 5, temperature
# 0.8, the same seed: the same generator draws in the same order) against the Python reference's
# generate() on the exported weights; at 2 ranks rank 0 alone writes it.
want=$(ref generate "$tmp/np3.state.pt" "the quick" 40)
run_np 2 "$mpiddp" generate "$tmp/np3/latest.h5" --prompt "the quick" --max-new-tokens 40 --top-k 1
check "generate --top-k 1 equals the reference's greedy generate(), token for token" [ "$rc" -eq 0 -a "$out" = "$want" ]
check "generate: the prompt comes first, then 40 new bytes" [ "${#out}" -eq 49 -a "${out:0:9}" = "the quick" ]
check "the snapshot records the GPT's shape itself (gpt_config, what generate reads), equal to the run's" \
  py - "$tmp/np3/latest.h5" <<'PY'
import h5py, json, sys
f = h5py.File(sys.argv[1], "r")
shape, options = json.loads(f.attrs["gpt_config"]), json.loads(f.attrs["config"])["gpt"]
assert shape == options and shape["n_layer"] >= 1, (shape, options)
PY
# --tokenizer: an llm.c tokenizer file (version 2, 256 tokens) that decodes token i as its two hex
# digits: the greedy text above, spelled in hex.
py - "$tmp/hex_tokenizer.bin" <<'PY'
import struct, sys
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256I", *([20240328, 2, 256, 0] + [0] * 252)))
    for i in range(256):
        f.write(bytes([2]) + b"%02x" % i)
PY
run_alone "$mpiddp" generate "$tmp/np3/latest.h5" --prompt "the quick" --max-new-tokens 40 --top-k 1 \
  --tokenizer "$tmp/hex_tokenizer.bin"
check "generate --tokenizer decodes every token through llm.c's tokenizer table" \
  [ "$rc" -eq 0 -a "$out" = "$(printf '%s' "$want" | od -An -v -tx1 | tr -d ' \n')" ]
printf 'nope' >"$tmp/bad_tokenizer.bin"
run_alone "$mpiddp" generate "$tmp/np3/latest.h5" --prompt "a" --tokenizer "$tmp/bad_tokenizer.bin"
check "generate: a file that is not an llm.c tokenizer is named" \
  bash -c "[ $rc -ne 0 ] && grep -q 'is not an llm.c tokenizer file' <<<\"\$0\"" "$err"
want=$(ref generate "$tmp/np3.state.pt" "fox" 40 5 0.8 11)
run_alone "$mpiddp" generate "$tmp/np3/latest.h5" --prompt "fox" --max-new-tokens 40 --top-k 5 --temperature 0.8 --seed 11
check "generate --top-k 5 --temperature 0.8 --seed 11 draws what the reference draws" [ "$rc" -eq 0 -a "$out" = "$want" ]
run_alone "$mpiddp" generate "$tmp/np3/latest.h5" --prompt-tokens 300 --max-new-tokens 1
check "generate: a prompt token outside the vocabulary is a one-line error" \
  bash -c "[ $rc -ne 0 ] && grep -q 'outside the model.s vocabulary of 256' <<<\"\$0\"" "$err"

# nanoGPT's own GPT, scripted in Python, trained by --loss model on the loss its forward returns.
ref script "$tmp/scripted.pt" 5 "${shape[@]}"
for n in 1 2; do
  d=$tmp/script-np$n
  run_np "$n" "$mpiddp" train --model "$tmp/scripted.pt" --loss model --block-size 16 "${opt[@]}" --data "$train" \
    --no-shuffle --batch-size 2 --grad-accum 2 --max-steps $steps --threads 1 --snapshot-dir "$d"
  check "TorchScript GPT np$n --loss model: trains" [ "$rc" -eq 0 ]
  run_alone "$mpiddp" export "$d/latest.h5" --out "$d.state.pt" --format state-dict
  ref train "$tmp/scripted.pt.init" "$train" "$n" 2 2 $steps $lr $min_lr $warmup $wd 0.9 0.95 $clip "$d.ref.pt"
  check "TorchScript GPT np$n: equal to the same Python training (2e-5), still tied" ref compare "$d.ref.pt" "$d.state.pt" 2e-5
done

# --activation-checkpointing: each block recomputed in backward (dropout drawing the same masks),
# at ZeRO stages 0, 2 and 3, with accumulation: the same parameters as the run without it (1e-6).
for stage in 0 2 3; do
  for ac in off on; do
    flag=()
    [ $ac = on ] && flag=(--activation-checkpointing)
    run_np 2 "$mpiddp" train "${gpt[@]}" "${opt[@]}" --data "$train" --batch-size 2 --grad-accum 2 --max-steps 3 \
      --threads 1 --dropout 0.1 --zero-stage $stage --snapshot-dir "$tmp/ac-$stage-$ac" "${flag[@]}"
    check "activation checkpointing $ac, stage $stage: trains" [ "$rc" -eq 0 ]
    run_alone "$mpiddp" export "$tmp/ac-$stage-$ac/latest.h5" --out "$tmp/ac-$stage-$ac.pt" --format state-dict
  done
  check "activation checkpointing, stage $stage: equal to the run without it (1e-6)" \
    ref compare "$tmp/ac-$stage-off.pt" "$tmp/ac-$stage-on.pt" 1e-6
done
check "stage 3 (blocks sharded, each rank writing its slices): equal to stage 0 (1e-6)" \
  ref compare "$tmp/ac-0-off.pt" "$tmp/ac-3-on.pt" 1e-6
# generate from the stage-3 snapshot: the exported weights' greedy continuation.
want=$(ref generate "$tmp/ac-3-on.pt" "the quick" 20)
run_np 2 "$mpiddp" generate "$tmp/ac-3-on/latest.h5" --prompt "the quick" --max-new-tokens 20 --top-k 1
check "generate from a stage-3 snapshot equals the reference's greedy generate()" [ "$rc" -eq 0 -a "$out" = "$want" ]

# Bad input: one line from every rank, nothing hung.
printf 'not a shard' >"$tmp/bad.bin"
for n in 1 3; do
  run_np "$n" "$mpiddp" train "${gpt[@]}" --data "$tmp/bad.bin" --max-steps 1
  check "np$n: a malformed shard is a one-line error naming it" \
    bash -c "[ $rc -ne 0 ] && grep -q 'bad.bin' <<<\"\$0\"" "$err"
  not_timed_out
  run_np "$n" "$mpiddp" train --model gpt --n-layer 1 --n-head 2 --n-embd 8 --block-size 16 --vocab-size 100 \
    --data "$train" --max-steps 1
  check "np$n: a token outside --vocab-size is named" bash -c "[ $rc -ne 0 ] && grep -q 'outside a vocabulary of 100' <<<\"\$0\"" "$err"
  run_np "$n" "$mpiddp" train --model gpt --n-head 3 --n-embd 32 --data "$train" --max-steps 1
  check "np$n: n_embd not a multiple of n_head" bash -c "[ $rc -ne 0 ] && grep -q 'multiple of its heads' <<<\"\$0\"" "$err"
done

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
