#!/usr/bin/env bash
# `mpiddp train --model FILE.pt2` and `mpiddp export --format pt2`: torch.export programs saved from
# Python (tests/python/pt2_ref.py: the test Python's torch, 2.11 on the pip stage), trained by
# mpiddp's executor at 1, 2 and 4 ranks, equal to Python training the program's own module
# (torch.export.load(...).module(), the same ATen graph run eagerly) on the global batch; dropout
# at one rank drawing the same masks from --seed; BatchNorm's buffers; a dynamic batch at other
# sizes; cond, no_grad and autocast regions, a non-persistent buffer, parameters sharing a storage;
# nanoGPT's GPT by --loss model; ZeRO 1 and 2; accumulation, bf16, TensorBoard; bitwise
# resume; exports loaded back by torch.export; archives of other torch releases; damaged and
# foreign archives refused in one line. Where the test Python has no
# torch.export (torch < 2.6: Debian 12's 1.13, whose libtorch is the same release), only the
# refusal of a .pt2 model is checked, and the rest skips (77). usage: pt2_cli.sh MPIDDP_BINARY
source "$(dirname "$0")/lib.sh"
mpiddp=$1
ref() { py "$(dirname "$0")/../python/pt2_ref.py" "$@"; }
ref_differs() { ! ref compare "$@" >/dev/null 2>&1; }  # REF.pt STATE.pt TOL: farther apart than TOL
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
MPIDDP_TEST_DEADLINE=180

ref make-data "$tmp/train.h5" 120 1
# ---- a stack without torch.export: a .pt2 model refused in one line ----------------------------
if ! py -c 'import re, sys, torch
m = re.match(r"(\d+)\.(\d+)", torch.__version__)
sys.exit(not (m and (int(m[1]), int(m[2])) >= (2, 6) and hasattr(torch, "export")))'; then
  echo "not a torch.export program" >"$tmp/x.pt2"
  bad_input "a .pt2 model on libtorch < 2.6" "pt2" train --model "$tmp/x.pt2" --data "$tmp/train.h5" --max-steps 1
  if [ "$failed" -ne 0 ]; then
    finish
    exit
  fi
  echo "$passed passed, $failed failed; the rest skipped: $TEST_PYTHON's torch has no torch.export (2.6 or newer)"
  exit 77
fi

ref make-data "$tmp/test.h5" 64 2
ref make-data "$tmp/odd.h5" 26 6  # 13 samples a rank at 2 ranks: batches of 4, 4, 4 and 1
text_shards "$tmp/tiny" 1500 7   # byte tokens (vocabulary 256) as llm.c shards, for the GPT
ref make-models "$tmp" 3 mlp bn dropout attn dynamic gpt hop resnet18
check "the programs: mlp, bn, dropout, attn, dynamic, gpt, hop (torch.export.save)" \
  all_exist "$tmp"/{mlp,bn,dropout,attn,dynamic,gpt,hop}.pt2

# ---- equal to Python on the global batch -------------------------------------------------------
# mlp and attn were exported with every shape the example's, the batch of 4 included: every rank
# trains at --batch-size 4, and they take no --test-data (mpiddp evaluates in batches of up to 1000
# samples). bn, dropout and dynamic declare the batch dynamic and are evaluated on test.h5.
# Snapshots every 2 steps (kept): the dropout and mlp runs are also the uninterrupted runs of the
# resume below.
steps=4 batch=4 lr=0.05 momentum=0.9 seed=7
common=(--no-shuffle --batch-size $batch --max-steps $steps --epochs 1 --optimizer sgd --lr $lr --momentum $momentum
        --threads 1 --seed $seed --save-every-steps 2 --keep 0)
# train_kind KIND N DIR [ARGS...]: mpiddp train at N ranks (its stdout then in $trained), then the
# snapshot's state_dict as DIR.state.pt
train_kind() {
  local kind=$1 n=$2 d=$3
  shift 3
  run_np "$n" "$mpiddp" train --model "$tmp/$kind.pt2" --snapshot-dir "$d" "$@"
  trained=$out
  check "$kind np$n ($(basename "$d")): trains" [ "$rc" -eq 0 ]
  run_alone "$mpiddp" export "$d/latest.h5" --out "$d.state.pt" --format state-dict
  check "$kind np$n ($(basename "$d")): export --format state-dict" [ "$rc" -eq 0 ]
}
# BatchNorm (each rank's slice its own statistics, rank 0's buffers) and dropout (the masks drawn
# from --seed's generator, one rank's sequence) at one rank.
declare -A ranks=([mlp]="1 2 4" [attn]="1 2 4" [dynamic]="1 2 4" [hop]="1 2" [bn]="1" [dropout]="1")
data_of() {  # KIND: the data options of its runs, in $data
  data=(--data "$tmp/train.h5")
  case $1 in bn | dropout | dynamic | hop) data+=(--test-data "$tmp/test.h5") ;; esac
}
for kind in mlp bn dropout attn dynamic hop; do
  list=${ranks[$kind]}
  ref reference "$tmp/$kind.pt2" "$tmp/train.h5" "${list// /,}" $batch $steps $lr $momentum "$tmp/$kind-np{ranks}.ref.pt" 0 $seed
  data_of "$kind"
  for n in $list; do
    d=$tmp/$kind-np$n
    train_kind "$kind" "$n" "$d" "${data[@]}" "${common[@]}" --metrics "$d.jsonl"
    [ "$kind$n" = mlp1 ] && check "mlp np1: names the .pt2 model it trains" contains "^mpiddp train: model .*pt2" "$trained"
    check "$kind np$n: equal to Python on the global batch $n x $batch (1e-5)" ref compare "$d.ref.pt" "$d.state.pt" 1e-5
  done
done
# Evaluation runs the archive's "eval" program (BatchNorm on its running statistics, no dropout):
# the test loss mpiddp reports is Python's eval-mode loss of the reference's tensors.
for kind in bn dropout; do
  d=$tmp/$kind-np1
  want=$(ref eval-loss "$d.ref.pt" "$tmp/$kind.pt2" "$tmp/test.h5")
  got=$(py -c 'import json, sys
print([r for r in map(json.loads, open(sys.argv[1])) if r["kind"] == "epoch"][-1]["test_loss"])' "$d.jsonl")
  check "$kind np1: test loss of the eval program equals Python's ($got vs $want)" \
    py -c 'import sys; a,b=map(float,sys.argv[1:]); sys.exit(abs(a-b) > 1e-5*max(1,abs(b)))' "$got" "$want"
done
ref reference "$tmp/dropout.pt2" "$tmp/train.h5" 1 $batch $steps $lr $momentum "$tmp/dropout-seed8.ref.pt" 0 8 >/dev/null
check "dropout took effect (the masks matter): Python drawing from --seed 8 is more than 1e-3 away" \
  ref_differs "$tmp/dropout-seed8.ref.pt" "$tmp/dropout-np1.state.pt" 1e-3
check "bn: the snapshot holds the module's own parameter and buffer names" py - "$tmp/bn-np1/latest.h5" $steps <<'PY'
import h5py, sys
f = h5py.File(sys.argv[1], "r")
names = set(f["model"].keys())
assert names == {"conv.weight", "conv.bias", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var",
                 "bn.num_batches_tracked", "fc.weight", "fc.bias"}, names
assert f["model/bn.num_batches_tracked"][()] == int(sys.argv[2])
PY

# A dynamic batch (exported with an example batch of 3): batches of 4 in training (13 samples a rank:
# 3 steps, the partial batch dropped as mpiddp's sampler does) and one of 13 in evaluation.
d=$tmp/dynamic-tail
ref reference "$tmp/dynamic.pt2" "$tmp/odd.h5" 2 $batch 3 $lr $momentum "$d.ref.pt" 0 $seed
train_kind dynamic 2 "$d" --data "$tmp/odd.h5" --test-data "$tmp/odd.h5" --no-shuffle --batch-size $batch --epochs 1 \
  --optimizer sgd --lr $lr --momentum $momentum --threads 1 --metrics "$d.jsonl"
check "dynamic np2, other batch sizes: equal to Python (1e-5)" ref compare "$d.ref.pt" "$d.state.pt" 1e-5
check "dynamic np2, other batch sizes: 3 steps, a finite test loss" py - "$d.jsonl" <<'PY'
import json, math, sys
last = [r for r in map(json.loads, open(sys.argv[1])) if r["kind"] == "epoch"][-1]
assert last["global_step"] == 3 and math.isfinite(last["test_loss"]), last
PY

# ---- archives another torch release saved: 2.11's (the pip stack's) and 2.14's (sid's) -----------
# tests/data/pt2/dynamic-torch*.pt2: pt2_ref.py's `dynamic` kind (seed 3) saved by each; schema 8.17
# and 8.20. Each trains on this stack equal to this stack's Python training it.
for f in "$(dirname "$0")"/../data/pt2/dynamic-torch*.pt2; do
  v=$(basename "$f" .pt2)
  d=$tmp/$v
  cp "$f" "$tmp/$v.pt2"
  ref reference "$tmp/$v.pt2" "$tmp/train.h5" 2 $batch $steps $lr $momentum "$d.ref.pt" 0 $seed
  train_kind "$v" 2 "$d" --data "$tmp/train.h5" "${common[@]}"
  check "${v#dynamic-} archive np2: equal to Python on this stack (1e-5)" ref compare "$d.ref.pt" "$d.state.pt" 1e-5
done

# ---- nanoGPT's GPT by --loss model: forward(idx, targets) -> (logits, loss), batch dynamic ------
gpt_batch=2 clip=0.5
ref reference "$tmp/gpt.pt2" "$tmp/tiny_train_000001.bin" 1,2,4 $gpt_batch $steps $lr $momentum "$tmp/gpt-np{ranks}.ref.pt" $clip $seed
for n in 1 2 4; do
  d=$tmp/gpt-np$n
  train_kind gpt "$n" "$d" --loss model --block-size 16 --data "$tmp/tiny_train_000001.bin" --no-shuffle \
    --batch-size $gpt_batch --max-steps $steps --optimizer sgd --lr $lr --momentum $momentum --clip-grad-norm $clip \
    --threads 1 --seed $seed
  check "gpt np$n --loss model: equal to Python on the global batch $n x $gpt_batch windows (1e-5)" \
    ref compare "$d.ref.pt" "$d.state.pt" 1e-5
done
check "gpt: lm_head.weight still tied to transformer.wte.weight (one tensor in the archive, two names)" \
  py -c 'import sys, torch; sd = torch.load(sys.argv[1], weights_only=True)
sys.exit(not torch.equal(sd["lm_head.weight"], sd["transformer.wte.weight"]))' "$tmp/gpt-np2.state.pt"

# ---- ZeRO stages 1 and 2 equal DDP -------------------------------------------------------------
for stage in 1 2; do
  train_kind mlp 2 "$tmp/zero$stage" --data "$tmp/train.h5" "${common[@]}" --zero-stage $stage
  check "mlp np2 --zero-stage $stage: equal to DDP (1e-6)" ref compare "$tmp/mlp-np2.state.pt" "$tmp/zero$stage.state.pt" 1e-6
done

# ---- accumulation, precision, TensorBoard: the Trainer's options on a program ------------------
# Two micro-batches of 4 at one rank are the 8 samples a step of 4 at each of 2 ranks takes (rank r
# takes samples r, r + 2, ...): the same mean gradient.
train_kind mlp 1 "$tmp/accum" --data "$tmp/train.h5" "${common[@]}" --grad-accum 2
check "mlp np1 --grad-accum 2: equal to np2 (1e-5)" ref compare "$tmp/mlp-np2.state.pt" "$tmp/accum.state.pt" 1e-5
# bf16 autocast over the program's ops: close to float32's result, and not it.
train_kind mlp 2 "$tmp/bf16" --data "$tmp/train.h5" "${common[@]}" --precision bf16 --tensorboard "$tmp/tb"
check "mlp np2 --precision bf16: within 2e-2 of float32" ref compare "$tmp/mlp-np2.state.pt" "$tmp/bf16.state.pt" 2e-2
check "mlp np2 --precision bf16: autocast applied (not float32's result)" \
  ref_differs "$tmp/mlp-np2.state.pt" "$tmp/bf16.state.pt" 1e-7
check "mlp np2 --tensorboard: rank 0's event file" [ "$(ls "$tmp/tb" | grep -c '^events\.out\.tfevents')" -eq 1 ]

# The higher-order ops' program under --precision bf16: its own .float() after an autocast region
# (export's dtype assertion before the cast is not run), its test set evaluated once with no eval
# program (said once).
run_np 2 "$mpiddp" train --model "$tmp/hop.pt2" --data "$tmp/train.h5" --test-data "$tmp/test.h5" "${common[@]}" \
  --precision bf16 --snapshot-dir "$tmp/hop-bf16" --metrics "$tmp/hop-bf16.jsonl"
check "hop np2 --precision bf16: trains" [ "$rc" -eq 0 ]
check "hop: no eval program, said once" [ "$(grep -c "holds no eval program" <<<"$out")" -eq 1 ]
check "hop np2 --precision bf16: a finite test loss" py - "$tmp/hop-bf16.jsonl" <<'PY'
import json, math, sys
last = [r for r in map(json.loads, open(sys.argv[1])) if r["kind"] == "epoch"][-1]
assert math.isfinite(last["test_loss"]) and math.isfinite(last["train_loss"]), last
PY

# ---- resume: stopped after step 2 of 4 (the last snapshot removed) and resumed: bitwise ---------
for run in "dropout 1" "mlp 2"; do
  read -r kind n <<<"$run"
  cp -r "$tmp/$kind-np$n" "$tmp/$kind-part"
  rm "$tmp/$kind-part/snapshot-step0000000004.h5"
  data_of "$kind"
  train_kind "$kind" "$n" "$tmp/$kind-part" "${data[@]}" "${common[@]}" --metrics "$tmp/$kind-part.jsonl"
  check "$kind np$n resumed: says so" contains "Resuming training from snapshot at Epoch 1, step 2" "$trained"
  check "$kind np$n stopped at step 2 and resumed: bitwise the uninterrupted run" \
    ref compare "$tmp/$kind-np$n.state.pt" "$tmp/$kind-part.state.pt" 0
done

# ---- export as a .pt2 archive: torch.export.load reads the trained tensors in every program ------
run_alone "$mpiddp" export "$tmp/mlp-np2/latest.h5" --format pt2 --out "$tmp/mlp-trained.pt2"
check "export --format pt2 of an mlp run" [ "$rc" -eq 0 ]
check "the exported mlp loads with torch.export.load and holds the snapshot's tensors exactly" \
  ref check-export "$tmp/mlp-np2.state.pt" "$tmp/mlp-trained.pt2" 0
run_alone "$mpiddp" export "$tmp/bn-np1/latest.h5" --out "$tmp/bn-trained.pt2"
check "export (auto) of a .pt2 run's snapshot writes a .pt2 archive" [ "$rc" -eq 0 ]
check "the exported bn: its train and eval programs hold the snapshot's tensors exactly" \
  ref check-export "$tmp/bn-np1.state.pt" "$tmp/bn-trained.pt2" 0
run_alone "$mpiddp" export "$tmp/gpt-np2/latest.h5" --format pt2 --out "$tmp/gpt-trained.pt2"
check "export --format pt2 of the GPT" [ "$rc" -eq 0 ]
check "the exported GPT (two inputs, dynamic batch, tied weight) loads, holds the tensors and runs" \
  ref check-export "$tmp/gpt-np2.state.pt" "$tmp/gpt-trained.pt2" 0
run_alone "$mpiddp" export "$tmp/hop-np2/latest.h5" --format pt2 --out "$tmp/hop-trained.pt2"
check "export --format pt2 of the higher-order ops' program" [ "$rc" -eq 0 ]
check "the exported hop: two parameters in one blob each trained, the non-persistent buffer kept" \
  ref check-export "$tmp/hop-np2.state.pt" "$tmp/hop-trained.pt2" 0

# ---- torchvision's resnet18, where the test Python has torchvision ------------------------------
if [ -f "$tmp/resnet18.pt2" ]; then
  ref reference "$tmp/resnet18.pt2" "$tmp/train.h5" 1 $batch 2 $lr $momentum "$tmp/resnet18-np1.ref.pt" 0 $seed
  train_kind resnet18 1 "$tmp/resnet18-np1" --data "$tmp/train.h5" --no-shuffle --batch-size $batch --max-steps 2 \
    --optimizer sgd --lr $lr --momentum $momentum --threads 1 --seed $seed
  check "resnet18 np1: equal to Python (1e-4)" ref compare "$tmp/resnet18-np1.ref.pt" "$tmp/resnet18-np1.state.pt" 1e-4
else
  echo "skip - resnet18: $TEST_PYTHON has no torchvision"
fi

# ---- bad input: one line from every rank, no hang ----------------------------------------------
ref make-bad "$tmp" "$tmp/mlp.pt2" >/dev/null
run_np 2 "$mpiddp" train --model "$tmp/control.pt2" --data "$tmp/train.h5" --batch-size 4 --max-steps 1 --threads 1
# control.pt2: mlp.pt2 rewritten as the damaged ones are (zipfile, ZIP_STORED, unaligned), unchanged.
check "an archive rewritten by Python's zipfile trains: the ones below differ only by their damage" [ "$rc" -eq 0 ]
bad_input "a truncated archive" "truncated.pt2" train --model "$tmp/truncated.pt2" --data "$tmp/train.h5"
bad_input "a newer schema (major + 1)" "major.pt2" train --model "$tmp/major.pt2" --data "$tmp/train.h5"
check "a newer schema: says version" contains "version" "$err"
bad_input "an operator this libtorch lacks" "unknown_op.pt2" train --model "$tmp/unknown_op.pt2" --data "$tmp/train.h5"
check "an operator this libtorch lacks: names it" contains "no_such_op" "$err"
bad_input "a weight's blob missing" "missing_blob.pt2" train --model "$tmp/missing_blob.pt2" --data "$tmp/train.h5"
check "a weight's blob missing: names it" contains "weight_0" "$err"
bad_input "a zip that is no torch.export archive" "other.pt2" train --model "$tmp/other.pt2" --data "$tmp/train.h5"
bad_input "no such .pt2 file" "none.pt2" train --model "$tmp/none.pt2" --data "$tmp/train.h5"
bad_input "a static batch of 4 at --batch-size 3" "batches of exactly 4" train --model "$tmp/mlp.pt2" --data "$tmp/train.h5" \
  --batch-size 3 --max-steps 1
bad_input "ZeRO stage 3 of a program (no units)" "ZeRO stage 3" train --model "$tmp/mlp.pt2" --data "$tmp/train.h5" \
  --batch-size 4 --zero-stage 3 --max-steps 1
bad_input "--loss model on a program that returns no loss" "mlp.pt2" train --model "$tmp/mlp.pt2" \
  --data "$tmp/train.h5" --batch-size 4 --loss model --max-steps 1
finish
