#!/usr/bin/env bash
# Snapshots, exact resume and faults, end to end with `mpiddp train`:
#  - kill -9 of one rank at a random step, then --resume auto: the final parameters, optimizer
#    state and RNG states equal an uninterrupted run's bit for bit (h5diff, no tolerance);
#  - SIGKILL: the job ends non-zero within 30 s and the dead rank is named;
#  - SIGUSR1 to one rank / SIGTERM to all: every rank stops at the same step after a snapshot, exit
#    0, and the rerun resumes to the same final state;
#  - NaN loss (stop with the step named, or skip), unwritable directory, full disk, truncated and
#    bit-flipped snapshots (auto falls back), another model or optimizer (refused);
#  - the files read with h5ls, h5dump and h5py.
# usage: snapshot_cli.sh path/to/mpiddp path/to/make_bad_datasets
source "$(dirname "$0")/lib.sh"
mpiddp=$1 make_bad=$2
tmp=$(mktemp -d)
mounted=""
cleanup() {
  [ -n "$mounted" ] && umount "$mounted" 2>/dev/null
  pkill -9 -f "$tmp/" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
"$mpiddp" data synthetic --samples 2048 --features 20 --seed 1 --out "$tmp/syn.h5" >/dev/null
"$mpiddp" data synthetic --samples 2048 --features 30 --seed 1 --out "$tmp/syn30.h5" >/dev/null
"$make_bad" "$tmp"

# Step of the snapshot latest.h5 names in DIR (0 when none yet).
latest_step() {
  local t
  t=$(readlink "$1/latest.h5" 2>/dev/null) || { echo 0; return; }
  t=${t#snapshot-step}
  echo $((10#${t%.h5}))
}
wait_for_step() {  # wait_for_step DIR STEP: until latest.h5 reaches STEP (or the job ended)
  local i
  for i in $(seq 1 600); do
    [ "$(latest_step "$1")" -ge "$2" ] && return 0
    kill -0 "$bg" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}
same_state() {  # same_state A.h5 B.h5: parameters, buffers, optimizer state and RNG bitwise equal
  h5diff -q "$1" "$2" /model /model && h5diff -q "$1" "$2" /optimizer /optimizer && h5diff -q "$1" "$2" /rng /rng
}

# ---- exact resume after kill -9 at a random step ----------------------------------------------
if [ -f "$tmp/fm-small.h5" ]; then
  cnn=(train --model cnn --data "$tmp/fm-small.h5" --epochs 3 --batch-size 16 --optimizer adam --lr 0.001
       --lr-schedule cosine --threads 1 --save-every-steps 4 --keep 0)
  for n in 2 3; do
    run_np "$n" "$mpiddp" "${cnn[@]}" --snapshot-dir "$tmp/ref$n"
    check "cnn np$n: uninterrupted reference run" [ "$rc" -eq 0 ]
    final=$(latest_step "$tmp/ref$n")
    victim=$((n - 1)) after=$(( (RANDOM % (final / 4 - 2) + 1) * 4 ))
    start_bg "$n" "$mpiddp" "${cnn[@]}" --snapshot-dir "$tmp/kill$n"
    wait_for_step "$tmp/kill$n" "$after"
    t0=$(date +%s)
    kill -9 "$(rank_pid "$tmp/kill$n" "$victim")"
    wait_bg
    killed_at=$(latest_step "$tmp/kill$n")
    check "cnn np$n: kill -9 of rank $victim after step $after ends the job non-zero" [ "$rc" -ne 0 ]
    check "cnn np$n: ... within 30 s" [ $(( $(date +%s) - t0 )) -lt 30 ]
    # Open MPI 6 (prterun) breaks that message over two lines.
    check "cnn np$n: ... naming the dead rank" contains "rank $victim .*signal 9\|rank $victim.*Killed" "$(tr '\n' ' ' <<<"$out$err")"
    check "cnn np$n: ... before the end (newest snapshot at step $killed_at < $final)" [ "$killed_at" -lt "$final" ]
    run_np "$n" "$mpiddp" "${cnn[@]}" --snapshot-dir "$tmp/kill$n" --resume auto
    check "cnn np$n: the rerun resumes" contains "^Resuming training from snapshot at Epoch [0-9]" "$out"
    check "cnn np$n: the rerun completes" [ "$rc" -eq 0 ]
    check "cnn np$n: ... at the same step" [ "$(latest_step "$tmp/kill$n")" -eq "$final" ]
    check "cnn np$n: final state bitwise equal to the uninterrupted run" \
      same_state "$tmp/ref$n/latest.h5" "$tmp/kill$n/latest.h5"
  done
  # A mid-epoch snapshot resumed explicitly ends where the reference does too.
  mkdir -p "$tmp/mid2"
  cp "$tmp/ref2/snapshot-step0000000020.h5" "$tmp/mid2/"
  run_np 2 "$mpiddp" "${cnn[@]}" --snapshot-dir "$tmp/mid2" --resume "$tmp/mid2/snapshot-step0000000020.h5"
  check "resume FILE at a mid-epoch step: says where" contains "^Resuming training from snapshot at Epoch 2, step 8 (global step 20" "$out"
  check "resume FILE at a mid-epoch step: bitwise equal final state" same_state "$tmp/ref2/latest.h5" "$tmp/mid2/latest.h5"
  # A run that --max-steps stops inside an epoch saves that step, not the next epoch's start: rerun
  # with the whole length, it resumes there and ends where the uninterrupted run does (a constant
  # rate: a schedule follows the run's length).
  plain=(train --model cnn --data "$tmp/fm-small.h5" --epochs 2 --batch-size 16 --optimizer adam --lr 0.001 --threads 1)
  run_np 2 "$mpiddp" "${plain[@]}" --snapshot-dir "$tmp/plain"
  run_np 2 "$mpiddp" "${plain[@]}" --snapshot-dir "$tmp/maxsteps" --max-steps 18
  check "--max-steps 18 (epoch 2, step 6): the last snapshot is step 18" [ "$(latest_step "$tmp/maxsteps")" -eq 18 ]
  run_np 2 "$mpiddp" "${plain[@]}" --snapshot-dir "$tmp/maxsteps" --resume auto
  check "... rerun without the cap: resumes mid-epoch" \
    contains "^Resuming training from snapshot at Epoch 2, step 6 (global step 18" "$out"
  check "... and ends bitwise equal to the uninterrupted run" same_state "$tmp/plain/latest.h5" "$tmp/maxsteps/latest.h5"

  # Readable with the HDF5 tools and h5py.
  snap=$tmp/ref2/latest.h5
  check "h5ls lists model, optimizer and rng" bash -c 'l=$(h5ls -r "$1") && grep -q "^/model/conv1.weight " <<<"$l" &&
    grep -q "^/optimizer/conv1.weight/exp_avg_sq " <<<"$l" && grep -q "^/rng/rank1 " <<<"$l"' _ "$snap"
  check "h5dump reads the epoch attribute" bash -c 'h5dump -a /epoch "$1" | grep -q "(0): 3"' _ "$snap"
  check "h5py reads the state" py - "$snap" <<'PY'
import h5py, json, sys
f = h5py.File(sys.argv[1], "r")
assert f.attrs["format"] == "mpiddp-snapshot" and f.attrs["epoch"] == 3 and f.attrs["world_size"] == 2
assert f["model/fc1.weight"].shape == (128, 9216) and f["optimizer/fc1.weight/step"][()] == f.attrs["global_step"]
assert json.loads(f.attrs["config"])["optimizer"] == "adam"
assert "parameter conv1.weight Float[32, 1, 3, 3]" in f.attrs["model_fingerprint"]
PY

  # Corrupt snapshots: auto falls back to the previous valid one and says so; a named one is refused.
  for damage in truncate flip; do
    d=$tmp/$damage
    cp -r "$tmp/ref2" "$d"
    newest=$d/$(readlink "$d/latest.h5")
    if [ $damage = truncate ]; then
      truncate -s $(( $(stat -c %s "$newest") / 2 )) "$newest"
    else
      py - "$newest" <<'PY'
import h5py, sys
with h5py.File(sys.argv[1], "r") as f:
    at = f["model/fc1.weight"].id.get_offset() + 4096
with open(sys.argv[1], "r+b") as f:
    f.seek(at); b = f.read(1); f.seek(at); f.write(bytes([b[0] ^ 0x10]))
PY
    fi
    cp "$newest" "$tmp/$damage-bad.h5"  # the rerun below replaces the damaged file with a good one
    run_np 2 "$mpiddp" "${cnn[@]}" --snapshot-dir "$d" --resume auto
    check "$damage newest snapshot: auto says it falls back" contains "^warning: snapshot '$newest' .*; falling back to the previous snapshot" "$out"
    check "$damage newest snapshot: resumes from the previous one" contains "^Resuming training from snapshot at Epoch 3, step 8 (global step 32" "$out"
    check "$damage newest snapshot: completes" [ "$rc" -eq 0 ]
    [ $damage = flip ] && want="is corrupt: the CRC-32 of dataset /model/fc1.weight does not match" || want="is truncated: "
    run_np 2 "$mpiddp" "${cnn[@]}" --resume "$tmp/$damage-bad.h5"
    check "$damage snapshot named by --resume: refused" failed_cleanly
    check "$damage snapshot named by --resume: one line" one_line "$err"
    check "$damage snapshot named by --resume: says why" contains "cannot resume: snapshot '$tmp/$damage-bad.h5' $want" "$err"
    run_alone "$mpiddp" export "$tmp/$damage-bad.h5" --out "$tmp/$damage-bad.pt"
    check "$damage snapshot given to export: refused" failed_cleanly
    check "$damage snapshot given to export: one line" one_line "$err"
    check "$damage snapshot given to export: says why" contains "snapshot '$tmp/$damage-bad.h5' $want" "$err"
    check "$damage snapshot given to export: writes nothing" [ ! -e "$tmp/$damage-bad.pt" ]
  done
else
  echo "SKIP - cnn resume, tools and corruption tests: /usr/share/datasets/fashion-mnist is missing (dataset-fashion-mnist)"
fi

# ---- signals: stop at a step boundary on every rank, snapshot, exit 0, resume ------------------
# The signal is sent once step 250's snapshot is there: 1250 steps (over epochs) before the run's end.
mlp=(train --model mlp --data "$tmp/syn.h5" --epochs 60 --max-steps 1500 --batch-size 8 --optimizer sgd --momentum 0.9
     --lr 0.01 --threads 1 --save-every 0 --save-every-steps 125 --keep 2)
run_np 2 "$mpiddp" "${mlp[@]}" --snapshot-dir "$tmp/sref"
check "mlp reference run" [ "$rc" -eq 0 ]
for how in "usr1-one-rank 2" "term-all-ranks 4" "usr1-mpiexec 2" "usr1-one-rank 1"; do
  set -- $how
  name=$1 n=$2 d=$tmp/sig-$1-$2
  [ "$n" -ne 2 ] && { run_np "$n" "$mpiddp" "${mlp[@]}" --snapshot-dir "$d.ref"; ref=$d.ref/latest.h5; } || ref=$tmp/sref/latest.h5
  start_bg "$n" "$mpiddp" "${mlp[@]}" --snapshot-dir "$d"
  wait_for_step "$d" 250
  case $name in
    usr1-one-rank) kill -USR1 "$(rank_pid "$d" $((n - 1)))" ;;
    term-all-ranks) for r in $(seq 0 $((n - 1))); do kill -TERM "$(rank_pid "$d" "$r")"; done ;;
    usr1-mpiexec) kill -USR1 "$(pgrep -P "$bg")" ;;  # $bg is timeout(1); its child is mpiexec
  esac
  wait_bg
  stopped=$(sed -n 's/^stopped by SIG[A-Z0-9]* at global step \([0-9]*\) .*/\1/p' <<<"$out")
  check "$name np$n: every rank stops cleanly (exit 0)" [ "$rc" -eq 0 ]
  check "$name np$n: says at which step, and that a snapshot was written" [ -n "$stopped" ]
  check "$name np$n: the snapshot is that step's" [ "$(latest_step "$d")" = "${stopped:-x}" ]
  run_np "$n" "$mpiddp" "${mlp[@]}" --snapshot-dir "$d"
  check "$name np$n: rerun resumes" contains "^Resuming training from snapshot at Epoch" "$out"
  check "$name np$n: rerun completes" [ "$rc" -eq 0 ]
  check "$name np$n: final state bitwise equal to the uninterrupted run" same_state "$ref" "$d/latest.h5"
done

# ---- another world size: allowed, and said -----------------------------------------------------
run_np 2 "$mpiddp" train --model mlp --data "$tmp/syn.h5" --batch-size 8 --epochs 1 --save-every-steps 100 --snapshot-dir "$tmp/ws2"
run_np 4 "$mpiddp" train --model mlp --data "$tmp/syn.h5" --batch-size 4 --epochs 2 --snapshot-dir "$tmp/ws4" \
  --resume "$tmp/ws2/snapshot-step0000000100.h5"
check "resume at 4 ranks from a 2-rank snapshot: runs" [ "$rc" -eq 0 ]
check "resume at 4 ranks from a 2-rank snapshot: says what holds" \
  contains "^note: the snapshot was taken at 2 rank(s) x batch 8; continuing at 4 x 4 (same global batch: same global data order)" "$out"

# ---- NaN / Inf loss ----------------------------------------------------------------------------
run_np 2 "$mpiddp" train --model linear --data "$tmp/nan.h5" --no-shuffle --batch-size 4 --epochs 2
check "NaN loss: non-zero exit, no hang" failed_cleanly
check "NaN loss: one line" one_line "$err"
check "NaN loss: names the step and the rank" contains "loss is NaN or Inf at global step 2 (epoch 1, step 2) on rank 1; stopping" "$err"
run_np 2 "$mpiddp" train --model linear --data "$tmp/nan.h5" --no-shuffle --batch-size 4 --epochs 2 --on-nan skip \
  --snapshot-dir "$tmp/nan"
check "--on-nan skip: completes" [ "$rc" -eq 0 ]
check "--on-nan skip: warns at each bad step" [ "$(grep -c "^warning: loss is NaN or Inf at global step \(2\|10\) .* on rank 1; update skipped" <<<"$out")" -eq 2 ]
check "--on-nan skip: counts them per epoch" contains "^epoch 2: .*, 1 step(s) skipped" "$out"
check "--on-nan skip: the parameters stay finite" py -c '
import h5py, numpy, sys
f = h5py.File(sys.argv[1], "r")
assert all(numpy.isfinite(f["model"][k][()]).all() for k in f["model"])' "$tmp/nan/latest.h5"

# ---- snapshot directory that cannot be written ---------------------------------------------------
echo x >"$tmp/a-file"
run_np 2 "$mpiddp" train --model linear --data "$tmp/syn.h5" --snapshot-dir "$tmp/a-file/sub"
check "unwritable snapshot directory: non-zero exit before training" failed_cleanly
check "unwritable snapshot directory: one line" one_line "$err"
check "unwritable snapshot directory: says so" contains "snapshot directory '$tmp/a-file/sub' cannot be created" "$err"

# Full disk: one snapshot fits, the next does not. A small tmpfs where mounts are allowed, else a
# file-size limit (ulimit -f) on the resumed run.
full=$tmp/full
mkdir -p "$full"
adam=(train --model mlp --data "$tmp/syn.h5" --batch-size 32 --optimizer adam --lr 0.001 --threads 1)
run_np 2 "$mpiddp" "${adam[@]}" --epochs 1 --snapshot-dir "$tmp/size"
size=$(stat -L -c %s "$tmp/size/latest.h5")
limit=""
if mount -t tmpfs -o size=$(( size * 3 / 2 / 4096 * 4096 + 4096 )) tmpfs "$full" 2>/dev/null; then
  mounted=$full
  how="a tmpfs of 1.5 snapshots"
else
  limit="ulimit -f $(( size / 2 / 1024 ))"
  how="ulimit -f (tmpfs mounts are not allowed here)"
fi
run_np 2 "$mpiddp" "${adam[@]}" --epochs 1 --snapshot-dir "$full"
first=$(readlink "$full/latest.h5")
check "full disk ($how): the first snapshot fits" [ "$rc" -eq 0 ]
check "full disk ($how): latest.h5 names it" [ -n "$first" ]
( trap '' XFSZ; $limit; run_np 2 "$mpiddp" "${adam[@]}" --epochs 3 --snapshot-dir "$full"; echo "$rc" >"$tmp/full.rc"; echo "$err" >"$tmp/full.err" )
rc=$(cat "$tmp/full.rc") err=$(cat "$tmp/full.err")
check "full disk ($how): non-zero exit, no hang" failed_cleanly
check "full disk ($how): one line" one_line "$err"
check "full disk ($how): says the write failed and the previous snapshot is intact" \
  contains "cannot write snapshot '$full/snapshot-step[0-9]*.h5': .*(the previous snapshot is intact)" "$err"
check "full disk ($how): latest.h5 still names the first snapshot" [ "$(readlink "$full/latest.h5")" = "$first" ]
check "full disk ($how): which still resumes" bash -c '"$@" >/dev/null 2>&1' _ "$MPIEXEC" -n 1 $MPIEXEC_FLAGS \
  "$mpiddp" "${adam[@]}" --epochs 1 --resume "$full/latest.h5"
check "full disk ($how): no temporary file left" [ -z "$(ls -A "$full" | grep tmp)" ]

# ---- snapshots of another model or optimizer ---------------------------------------------------
snap=$tmp/sref/latest.h5
bad_resume() { bad_input "$1" "$2" train "${@:3}" --resume "$snap"; }  # bad_resume "description" "expected text" args...
bad_resume "another model" "cannot resume from snapshot '$snap': it is of another model: it has model mlp where this model has model linear" \
  --model linear --data "$tmp/syn.h5"
bad_resume "another input width" "it has parameter fc1.weight Float\[128, 20\] where this model has parameter fc1.weight Float\[128, 30\]" \
  --model mlp --data "$tmp/syn30.h5"
bad_resume "another optimizer" "it was trained with optimizer sgd, this run uses adam" --model mlp --data "$tmp/syn.h5" --optimizer adam
run_np 2 "$mpiddp" train --model linear --data "$tmp/syn.h5" --resume "$tmp/none.h5"
check "missing --resume file: one-line error" one_line "$err"
check "missing --resume file: says so" contains "snapshot '$tmp/none.h5' does not exist" "$err"
finish
