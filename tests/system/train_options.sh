#!/usr/bin/env bash
# `mpiddp train`'s options, which only mpiddp's own code decides (label own: the Debian 12 stage):
# where an option comes from (command line > --config > MPIDDP_* environment), --max-steps without
# --epochs, --log-every's progress lines, and bad values (one line from rank 0, non-zero exit on
# every rank, no hang). What a stack decides (data, models, the profiler): train_cli.sh.
# usage: train_options.sh path/to/mpiddp
source "$(dirname "$0")/lib.sh"
mpiddp=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$mpiddp" data synthetic --samples 2048 --features 20 --seed 1 --out "$tmp/syn.h5" >/dev/null

# Option sources: command line > --config > MPIDDP_* environment.
printf 'epochs = 2\nbatch-size = 64\n' >"$tmp/run.cfg"
MPIDDP_BATCH_SIZE=16 MPIDDP_LR=0.05 run_np 2 "$mpiddp" train --model linear --data "$tmp/syn.h5" --config "$tmp/run.cfg" \
  --batch-size 128
check "config + env + flag: exit 0" [ "$rc" -eq 0 ]
check "the flag wins over the config file" contains "^\[RANK 1\] Epoch 2 | Batchsize: 128 | Steps: 8$" "$out"
MPIDDP_BATCH_SIZE=16 run_np 2 "$mpiddp" train --model linear --data "$tmp/syn.h5" --max-steps 2
check "the environment applies when nothing else sets it" contains "Batchsize: 16 " "$out"
# --max-steps without --epochs: as many passes as it takes (16 steps a pass here), the last cut short.
run_np 2 "$mpiddp" train --model linear --data "$tmp/syn.h5" --max-steps 20
check "--max-steps 20 alone: a second pass, cut at step 20" contains "^\[RANK 0\] Epoch 2 | Batchsize: 64 | Steps: 4$" "$out"
check "--max-steps 20 alone: ... and no third" lacks "Epoch 3" "$out"

# Progress lines: 2048 samples / (2 ranks x 16) = 64 steps per epoch; every 16 steps -> steps 16,
# 32 and 48 of each epoch (the epoch's end has its own line), from rank 0 only, on stdout.
run_np 2 "$mpiddp" train --model linear --data "$tmp/syn.h5" --epochs 2 --batch-size 16 --log-every 16
check "--log-every 16: trains" [ "$rc" -eq 0 ]
check "--log-every 16: three lines per epoch, at steps 16, 32, 48 of 64" \
  [ "$(grep -o "^epoch [12]/2, step [0-9]*/64" <<<"$out" | tr '\n' ' ')" = "epoch 1/2, step 16/64 epoch 1/2, step 32/64 epoch 1/2, step 48/64 epoch 2/2, step 16/64 epoch 2/2, step 32/64 epoch 2/2, step 48/64 " ]
check "--log-every 16: loss, samples/s and ETAs" \
  contains "^epoch 1/2, step 32/64 (50%): loss [0-9.]* (rank 0, mean of the last 16 steps), [0-9.]* samples/s, ETA epoch [0-9]*:[0-9][0-9], run [0-9]*:[0-9][0-9]$" "$out"
check "--log-every 16: an epoch's progress lines come before its summary" \
  bash -c '[ "$(grep -n "^epoch 2/2, step 48/64" <<<"$1" | cut -d: -f1)" -lt "$(grep -n "^epoch 2: " <<<"$1" | cut -d: -f1)" ] &&
           [ "$(grep -n "^epoch 1: " <<<"$1" | cut -d: -f1)" -lt "$(grep -n "^epoch 2/2, step 16/64" <<<"$1" | cut -d: -f1)" ]' _ "$out"
run_np 2 "$mpiddp" train --model linear --data "$tmp/syn.h5" --epochs 1 --batch-size 16 --log-every 0
check "--log-every 0: no progress lines" bash -c '! grep -q "^epoch 1/1, step" <<<"$1"' _ "$out"

bad_input "unknown option" "unrecognised option '--frobnicate'" train --data "$tmp/syn.h5" --frobnicate 1
bad_input "zero batch" "--batch-size must be > 0" train --model linear --data "$tmp/syn.h5" --batch-size 0
bad_input "negative batch" "--batch-size must be > 0" train --model linear --data "$tmp/syn.h5" --batch-size -3
bad_input "negative epochs" "--epochs must be >= 0" train --model linear --data "$tmp/syn.h5" --epochs -1
bad_input "negative lr" "--lr must be > 0" train --model linear --data "$tmp/syn.h5" --lr -0.1
bad_input "zero lr" "--lr must be > 0" train --model linear --data "$tmp/syn.h5" --lr 0
bad_input "not a number" "invalid" train --model linear --data "$tmp/syn.h5" --batch-size lots
MPIDDP_MOMENTUM=x bad_input "bad number in the environment" "invalid" train --model linear --data "$tmp/syn.h5"
bad_input "unknown model" "unknown --model 'resnet'" train --model resnet --data "$tmp/syn.h5"
bad_input "bad --log-every" "--log-every takes auto, N (steps), Ns (seconds) or 0 (off), got '10m'" train --model linear --data "$tmp/syn.h5" --log-every 10m
bad_input "negative --clip-grad-norm" "--clip-grad-norm must be >= 0" train --model linear --data "$tmp/syn.h5" --clip-grad-norm -1
bad_input "--step-size 0" "--step-size must be > 0, got 0" train --model linear --data "$tmp/syn.h5" --lr-schedule step --step-size 0
bad_input "negative --warmup-steps" "--warmup-steps must be >= 0, got -1" train --model linear --data "$tmp/syn.h5" --warmup-steps -1
bad_input "--min-lr above --lr" "--min-lr / --lr must be in \[0, 1\], got 2" train --model linear --data "$tmp/syn.h5" --lr 0.01 --min-lr 0.02
bad_input "negative --prefetch" "--prefetch must be >= 0" train --model linear --data "$tmp/syn.h5" --prefetch -1
bad_input "--profile-steps 0" "--profile-steps must be > 0" train --model linear --data "$tmp/syn.h5" --profile "$tmp/p.json" --profile-steps 0
bad_input "negative --profile-from" "--profile-from must be >= 0" train --model linear --data "$tmp/syn.h5" --profile "$tmp/p.json" --profile-from -1
finish
