# Shared helpers for the system tests (bash). Each test prints "ok"/"FAIL" lines and ends with
# "N passed, N failed"; the script's exit status is non-zero on any failure.
set -u
passed=0
failed=0
: "${MPIEXEC:=mpiexec}"
: "${MPIEXEC_FLAGS:=}"
# The Python with torch, h5py and protobuf (CMake's MPIDDP_TEST_PYTHON): Debian's by default, the
# venv's on the pip stack, the GPU image's in scripts/gpu.sh (python3 on PATH may be another installation).
TEST_PYTHON=${MPIDDP_TEST_PYTHON:-/usr/bin/python3}
[ -x "$TEST_PYTHON" ] || TEST_PYTHON=python3
# Every command gets a deadline: a hang is a failure, not a stuck CI job.
: "${MPIDDP_TEST_DEADLINE:=90}"
lib_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# py ARGS...: what "$TEST_PYTHON" ARGS... does (its standard input when that is a file or a pipe,
# its output, error and exit status; the caller's environment and directory), run in a child of one
# Python started on the first call that imported torch once (tests/python/pyserver.py: a fresh
# Python takes 1-2 s to import torch, and a test makes tens of calls). Within the deadline.
py() {
  if [ -z "${py_dir:-}" ]; then
    py_dir=$(mktemp -d)
    coproc PY_SERVER { exec "$TEST_PYTHON" "$lib_dir/../python/pyserver.py" 2>"$py_dir/server.err"; }
    # Copies that subshells keep too (bash closes a coprocess's own descriptors in pipelines and ( )).
    exec {py_to}>&"${PY_SERVER[1]}" {py_from}<&"${PY_SERVER[0]}"
  fi
  local call status
  call=$(mktemp -d "$py_dir/call.XXXXXX")
  printf '%s\0' "$@" >"$call/argv"
  env -0 >"$call/env"
  printf '%s' "$PWD" >"$call/cwd"
  if [ -f /dev/stdin ] || [ -p /dev/stdin ]; then
    timeout "$MPIDDP_TEST_DEADLINE" cat >"$call/stdin"
  else
    : >"$call/stdin"
  fi
  echo "$MPIDDP_TEST_DEADLINE $call" >&"$py_to"
  read -r status <&"$py_from" || status=125  # the server is gone: $py_dir/server.err says why
  cat "$call/stdout"
  cat "$call/stderr" >&2
  rm -rf "$call"
  return "$status"
}

# Each result line ends with the seconds since the previous one (the runs that check and its own
# command took): where a test's time goes.
check_clock=$SECONDS
check() {  # check "description" command...
  local desc=$1 ok=0
  shift
  "$@" || ok=$?
  desc+=" [$((SECONDS - check_clock)) s]"
  check_clock=$SECONDS
  if [ $ok = 0 ]; then
    echo "ok   - $desc"
    passed=$((passed + 1))
  else
    echo "FAIL - $desc"
    [ -n "${err:-}" ] && echo "       last stderr: $(head -c 1500 <<<"$err")"
    failed=$((failed + 1))
  fi
}

# run_np N cmd... : runs cmd on N ranks; stdout in $out, stderr in $err, status in $rc.
run_np() {
  local n=$1
  shift
  local o e
  o=$(mktemp) e=$(mktemp)
  # shellcheck disable=SC2086
  env -u SLURM_NTASKS -u SLURM_STEP_NUM_TASKS -u PMI_SIZE timeout -k 5 "$MPIDDP_TEST_DEADLINE" \
    "$MPIEXEC" -n "$n" $MPIEXEC_FLAGS "$@" >"$o" 2>"$e"
  rc=$?
  out=$(cat "$o") err=$(cat "$e")
  rm -f "$o" "$e"
}

# run_alone cmd... : runs cmd as a singleton (no mpiexec), same outputs as run_np.
run_alone() {
  local o e
  o=$(mktemp) e=$(mktemp)
  timeout -k 5 "$MPIDDP_TEST_DEADLINE" "$@" >"$o" 2>"$e"
  rc=$?
  out=$(cat "$o") err=$(cat "$e")
  rm -f "$o" "$e"
}

# text_shards PREFIX WORDS SEED: llm.c token shards (bytes) of WORDS words drawn (seeded) from a
# fixed list: PREFIX_train_000001.bin and PREFIX_val_000000.bin (a tenth), by the script's $mpiddp.
text_shards() {
  py - "$1.txt" "$2" "$3" <<'PY'
import random, sys
random.seed(int(sys.argv[3]))
words = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex junk and fog".split()
open(sys.argv[1], "w").write(" ".join(random.choice(words) for _ in range(int(sys.argv[2]))))
PY
  "$mpiddp" data text --in "$1.txt" --out "$1" --val-fraction 0.1 >/dev/null
}

count_lines() { grep -c -x -- "$1" <<<"$2"; }   # exact whole-line matches
contains() { grep -q -- "$1" <<<"$2"; }
lacks() { ! grep -q -- "$1" <<<"$2"; }
fails() { ! "$@"; }  # fails command...: the command exits non-zero
all_exist() { local f; for f in "$@"; do [ -e "$f" ] || return 1; done; }
last_line() { tail -n 1 <<<"$1"; }
# Exactly one line from mpiddp on stderr (the launcher may add its own banner about the exit code:
# Open MPI 4's mpirun, or Open MPI 5/6's prterun, "... detected that one or more processes exited").
one_line() { [ "$(grep -c -v -E '^(-+|mpiexec|mpirun|prterun|Primary job|a non-zero exit|the job to be|thus causing the job|The first process| +(Process name|Exit code):|$)' <<<"$1")" -eq 1 ]; }
# line_after "A" "B" text: the line right after the line A is B.
line_after() { grep -A1 -x -- "$1" <<<"$3" | tail -n 1 | grep -q -x -- "$2"; }
not_timed_out() { [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ]; }
failed_cleanly() { [ "$rc" -ne 0 ] && not_timed_out; }
# bad_input "description" "expected text" args...: `mpiddp ARGS` on 2 ranks (the script's $mpiddp)
# must end non-zero without hanging, with one line that says the expected text.
bad_input() {
  local desc=$1 want=$2
  shift 2
  run_np 2 "$mpiddp" "$@"
  check "$desc: non-zero exit, no hang" failed_cleanly
  check "$desc: one line" one_line "$err"
  check "$desc: says '$want'" contains "$want" "$err"
}

# PID of world rank R among the processes whose command line mentions MARK (mpirun excluded:
# only ranks carry OMPI_COMM_WORLD_RANK, or PMI_RANK under other launchers).
rank_pid() {
  local mark=$1 r=$2 pid
  for pid in $(pgrep -f -- "$mark"); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -q -x -E "(OMPI_COMM_WORLD_RANK|PMI_RANK)=$r"; then
      echo "$pid"
      return 0
    fi
  done
  return 1
}
# (these two and rank_pid use the script's $tmp)
# start_bg N args...: mpiexec in the background; its output in $tmp/bg.out/.err, PID in $bg
start_bg() {
  local n=$1
  shift
  # shellcheck disable=SC2086
  env -u SLURM_NTASKS -u SLURM_STEP_NUM_TASKS -u PMI_SIZE timeout -k 5 "$MPIDDP_TEST_DEADLINE" \
    "$MPIEXEC" -n "$n" $MPIEXEC_FLAGS "$@" >"$tmp/bg.out" 2>"$tmp/bg.err" &
  bg=$!
}
wait_bg() {
  wait "$bg"
  rc=$?
  out=$(cat "$tmp/bg.out") err=$(cat "$tmp/bg.err")
}

finish() {
  echo "$passed passed, $failed failed"
  [ "$failed" -eq 0 ]
}
