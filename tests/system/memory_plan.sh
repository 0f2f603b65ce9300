#!/usr/bin/env bash
# The memory plan of `mpiddp train` against the peak each rank then reaches: within 20% for the
# built-in GPT at ZeRO stages 0-3 with and without activation checkpointing, with snapshots on,
# and for the MLP and the CNN; its parts follow ZeRO's sharding (optimizer state 1/N at stage 1,
# gradients too at stage 2, the units' parameters too at stage 3) and checkpointing (fewer activations); `--dry-run` prints the plan and
# trains nothing. usage: memory_plan.sh MPIDDP_BINARY
source "$(dirname "$0")/lib.sh"
mpiddp=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
MPIDDP_TEST_DEADLINE=180

text_shards "$tmp/tiny" 12000 5
"$mpiddp" data synthetic --samples 4096 --features 20 --seed 1 --out "$tmp/syn.h5" >/dev/null
py "$(dirname "$0")/../python/torchscript_ref.py" make-data "$tmp/img.h5" 512 1 28  # 28 x 28 images (the cnn's MNIST shape)
# Activations the plan must get right: 4 blocks x 256 wide over windows of 256 tokens.
gpt=(train --model gpt --n-layer 4 --n-head 4 --n-embd 256 --block-size 256 --vocab-size 256
     --data "$tmp/tiny_train_000001.bin" --batch-size 4 --max-steps 4 --threads 1 --optimizer adamw --log-every 0)

part() {  # part NAME: that part of the plan in $out, MiB
  sed -n "s/.*memory plan per rank: .* $1 \([0-9]*\).*/\1/p" <<<"$out" | head -n 1
}
within_20_percent() {  # the measured peak against the plan in $out
  local ratio
  ratio=$(sed -n 's/.*, \([0-9.]*\) x the plan.s .*/\1/p' <<<"$out")
  echo "       $(grep -m1 'memory plan' <<<"$out" | cut -c1-160)"
  echo "       $(grep -m1 'measured peak' <<<"$out")"
  [ -n "$ratio" ] && awk -v r="$ratio" 'BEGIN { exit !(r >= 0.8 && r <= 1.2) }'
}
plan_case() {  # plan_case NAME ARGS...: trains, and the measured peak is within 20% of the plan
  local name=$1
  shift
  run_np 2 "$mpiddp" "$@"
  check "$name: trains" [ "$rc" -eq 0 ]
  check "$name: prints the plan" contains "^memory plan per rank: peak" "$out"
  check "$name: measured peak within 20% of the plan" within_20_percent
}

for stage in 0 1 2 3; do
  plan_case "gpt stage $stage" "${gpt[@]}" --zero-stage $stage --snapshot-dir "$tmp/s$stage" --save-every-steps 2
  declare "optimizer_$stage=$(part 'optimizer state')" "gradients_$stage=$(part gradients)" \
    "plain_$stage=$(part activations)" "parameters_$stage=$(part parameters)"
  # (stage 3 without prefetch here: one unit gathered at a time, the head with the embeddings)
  plan_case "gpt stage $stage, activation checkpointing" "${gpt[@]}" --zero-stage $stage --activation-checkpointing \
    $([ $stage = 3 ] && echo --zero-no-prefetch)
  declare "checkpointed_$stage=$(part activations)" "checkpointed_parameters_$stage=$(part parameters)"
done
# Checkpointing's recomputed buffers would stay in malloc's heap beside the next ones (27% above the
# plan at a 1024-token context): such a run maps buffers above 4 MiB, and says so; the others do not.
check "checkpointing: malloc maps buffers above 4 MiB, and says so" \
  contains "^malloc: mmap threshold 4 MiB, trim threshold 512 MiB (activation checkpointing)$" "$out"
# At 2 ranks: stage 1 holds half the optimizer state; stage 2's gradients are its owned half, the
# bucket being filled and two being reduce-scattered, each with Open MPI's two copies of it while
# reduced: 15/16 of stage 0's at the bucket cap of a 16th, no more than stage 0's.
check "stage 1: half the optimizer state of stage 0 ($optimizer_1 vs $optimizer_0 MiB)" \
  [ $((2 * optimizer_1)) -ge $((optimizer_0 - 1)) -a $((2 * optimizer_1)) -le $((optimizer_0 + 1)) ]
check "stage 2: no more gradients than stage 0 ($gradients_2 vs $gradients_0 MiB)" [ "$gradients_2" -le "$gradients_0" ]
# Stage 3 at 2 ranks: half of every unit and the units gathered (one without prefetch): fewer
# parameters than stage 2's whole model.
check "stage 3 without prefetch: fewer parameters than stage 2 ($checkpointed_parameters_3 vs $parameters_2 MiB)" \
  [ "$checkpointed_parameters_3" -lt "$parameters_2" ]
check "checkpointing: fewer activations ($checkpointed_0 vs $plain_0 MiB)" [ "$checkpointed_0" -lt "$plain_0" ]

plan_case "mlp" train --model mlp --data "$tmp/syn.h5" --batch-size 64 --max-steps 4 --threads 1 --log-every 0
plan_case "cnn, stage 1" train --model cnn --data "$tmp/img.h5" --batch-size 32 --max-steps 4 --threads 1 \
  --log-every 0 --zero-stage 1

# --dry-run: the plan, nothing trained, nothing written.
run_np 2 "$mpiddp" "${gpt[@]}" --dry-run --snapshot-dir "$tmp/dry"
check "--dry-run: exits 0" [ "$rc" -eq 0 ]
check "--dry-run: prints the plan" contains "^memory plan per rank: peak [0-9]* MiB = process" "$out"
check "--dry-run: no step, no snapshot" bash -c '! grep -q "^Epoch\|measured peak" <<<"$1" && [ ! -e "$2/latest.h5" ]' _ "$out" "$tmp/dry"
# At stage 3 the GPT is deferred (initialised by ZeRO unit by unit): the dry run shards it to plan,
# the same plan as the run's.
run_np 2 "$mpiddp" "${gpt[@]}" --zero-stage 3 --dry-run
dry=$(grep -m1 '^memory plan' <<<"$out")
check "--dry-run, stage 3: prints the plan" [ "$rc" -eq 0 -a -n "$dry" ]
check "stage 3 without checkpointing: malloc as set at start-up" lacks "^malloc:" "$out"
run_np 2 "$mpiddp" "${gpt[@]}" --zero-stage 3
sharded_parts() { sed 's/.*\(parameters .* optimizer state [0-9]*\).*/\1/' <<<"$1"; }  # what ZeRO's rule sets
check "--dry-run, stage 3: the training run's parameters, gradients and optimizer state ($(sharded_parts "$dry"))" \
  [ "$(sharded_parts "$(grep -m1 '^memory plan' <<<"$out")")" = "$(sharded_parts "$dry")" ]

finish
