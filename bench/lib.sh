# shellcheck shell=bash
# The benchmarks' shared preamble, sourced by bench/*.sh after `cd` to the repository root.
#   bench_init NAME DEFAULT_ROUNDS [BUILD_DIR] [ROUNDS]
#       bench=NAME; build=BUILD_DIR (default build); rounds=ROUNDS (default DEFAULT_ROUNDS);
#       out=$OUT_DIR (default $build/bench-NAME, made); data=$build/bench-data (the workloads, made
#       once and shared by every benchmark); stacks=$MPIDDP_BENCH_STACKS (default all three);
#       MPIRUN_FLAGS (scripts/env.sh); the stacks' functions (scripts/stacks.sh); a fresh
#       $out/records.jsonl
#   build_stacks STACK...        mpiddp with its bench programs on each stack (stack_build)
#   workload_toy [SAMPLES]       -> the seeds' toy: SAMPLES x 20 synthetic regression, seed 0 (2048)
#   workload_fm                  -> Fashion-MNIST's training set as HDF5 (fm-test.h5 beside it)
#   workload_fm_head N           -> its first N training images
#   workload_text                -> the training shard of llm.c token shards (bytes) of the GPL-3,
#                                   Apache-2.0 and GFDL-1.3 texts Debian ships (the val shard beside it)
#   record STACK ROUND CONTENDER METRIC VALUE UNIT    one result, one line of $out/records.jsonl
#   record_tsv                   record, for each tab-separated line of standard input (the results a
#                                bench's own Python derives from its runs)
#   save_results [FILE]          copies FILE (default $out/records.jsonl) into bench/results/
# The record format, one JSON object a line (bench/report.py reads it):
#   {"bench", "commit", "date", "machine", "stack", "round", "contender", "metric", "value", "unit"}
# value is a number (null where a run gave none); round counts from 1; a contender is what is
# compared (a program, a setting); metric says what was measured, unit in what.

source scripts/env.sh
source scripts/stacks.sh

# shellcheck disable=SC2034  # its variables are the callers'
bench_init() {
  bench=$1
  build=${3:-build}
  rounds=${4:-$2}
  out=${OUT_DIR:-$build/bench-$bench}
  data=$build/bench-data
  stacks=${MPIDDP_BENCH_STACKS:-$MPIDDP_STACKS}
  mkdir -p "$out" "$data"
  : >"$out/records.jsonl"
  bench_commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
  git diff --quiet HEAD 2>/dev/null || bench_commit+=-dirty
  bench_machine="$(hostname), $(nproc) x $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)"
}

build_stacks() {  # build_stacks STACK...: a test run may have configured a build without bench/
  local stack
  for stack in "$@"; do
    stack_check "$stack" || exit 2
    case $stack in
      # the Python side in the chroot: its torch and h5py, and GNU time for peak RSS
      sid) bash scripts/chroot.sh --suite sid -- bash -c 'bash scripts/deps.sh python3-torch python3-h5py time &&
             bash scripts/build.sh build-sid -DMPIDDP_BUILD_BENCH=ON' >&2 ;;
      *) stack_build "$stack" "$(stack_dir "$stack" "$build")" -DMPIDDP_BUILD_BENCH=ON >&2 ;;
    esac
  done
}

# _make_once FILE COMMAND...: runs COMMAND unless FILE exists; one maker at a time (two benchmarks
# may start together), the mpiddp of BUILD_DIR (built if missing) making the data.
_make_once() {
  local file=$1
  shift
  [ -s "$file" ] && return 0
  [ -x "$build/mpiddp" ] || bash scripts/build.sh "$build" >&2
  (
    flock 9
    [ -s "$file" ] || "$@" >&2
  ) 9>"$data/.lock"
}

workload_toy() {
  local samples=${1:-2048} file=$data/toy.h5
  [ "$samples" = 2048 ] || file=$data/toy-$samples.h5
  _make_once "$file" "$build/mpiddp" data synthetic --samples "$samples" --features 20 --seed 0 --out "$file"
  echo "$file"
}

workload_fm() {
  _make_once "$data/fm-test.h5" "$build/mpiddp" data fashion-mnist --out "$data/fm.h5"
  echo "$data/fm-train.h5"
}

workload_fm_head() {  # the attributes of the file and of each dataset come along (uint8 scale, classes)
  local n=$1 file=$data/fm-train-$1.h5 train
  train=$(workload_fm)
  _make_once "$file" /usr/bin/python3 -c '
import h5py, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
with h5py.File(src, "r") as f, h5py.File(dst + ".tmp", "w") as g:
    for k, v in f.attrs.items(): g.attrs[k] = v
    for name in ("inputs", "targets"):
        d = g.create_dataset(name, data=f[name][:n])
        for k, v in f[name].attrs.items(): d.attrs[k] = v
import os; os.replace(dst + ".tmp", dst)' "$train" "$file" "$n"
  echo "$file"
}

workload_text() {
  _make_once "$data/text_val_000000.bin" "$build/mpiddp" data text --in /usr/share/common-licenses/GPL-3 \
    /usr/share/common-licenses/Apache-2.0 /usr/share/common-licenses/GFDL-1.3 --out "$data/text"
  echo "$data/text_train_000001.bin"
}

_json_string() { local s=${1//\\/\\\\}; printf '"%s"' "${s//\"/\\\"}"; }

record() {  # record STACK ROUND CONTENDER METRIC VALUE UNIT
  local value
  value=$(LC_NUMERIC=C printf '%.10g' "$5" 2>/dev/null) || value=null
  case $value in *nan*|*inf*|'') value=null ;; esac
  printf '{"bench": %s, "commit": %s, "date": %s, "machine": %s, "stack": %s, "round": %d, "contender": %s, "metric": %s, "value": %s, "unit": %s}\n' \
    "$(_json_string "$bench")" "$(_json_string "$bench_commit")" "$(_json_string "$(date -u +%FT%TZ)")" \
    "$(_json_string "$bench_machine")" "$(_json_string "$1")" "$2" "$(_json_string "$3")" "$(_json_string "$4")" \
    "$value" "$(_json_string "$6")" >>"$out/records.jsonl"
}

record_tsv() {
  local stack round contender metric value unit
  while IFS=$'\t' read -r stack round contender metric value unit; do
    record "$stack" "$round" "$contender" "$metric" "$value" "$unit"
  done
}

# save_results [FILE]: the raw results of this run into bench/results/bench-NAME-DATE-COMMIT.EXT (a
# number added where that exists), so they stay with the code that made them (bench/results/README.md
# lists them). MPIDDP_BENCH_SAVE=0: not.
save_results() {
  local file=${1:-$out/records.jsonl} dest ext n=1
  [ "${MPIDDP_BENCH_SAVE:-1}" != 0 ] && [ -s "$file" ] || return 0
  ext=${file##*.}
  dest=bench/results/bench-$bench-$(date +%F)-$bench_commit
  while [ -e "$dest.$ext" ]; do n=$((n + 1)); dest=bench/results/bench-$bench-$(date +%F)-$bench_commit-$n; done
  mkdir -p bench/results
  cp "$file" "$dest.$ext"
  echo "bench: results saved in $dest.$ext" >&2
}
