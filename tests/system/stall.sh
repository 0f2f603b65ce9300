#!/usr/bin/env bash
# A stalled rank in a normal run (no check mode): SIGSTOP one rank of a training job at 2, 3 and 4
# ranks (a hung node or a stuck file system looks like this). Every waiting rank must log, after
# MPIDDP_STALL_WARNING seconds, which rank is stalled and in which collective it waits; at
# MPIDDP_COMM_TIMEOUT the job must end with one error line naming the stalled rank, non-zero,
# within the timeout + 30 s of the stop. MPIDDP_STALL_WARNING=0 silences the warnings but not the
# naming. (A rank late for the runtime's own collectives: comm_timeout.sh.)
# usage: stall.sh path/to/mpiddp
source "$(dirname "$0")/lib.sh"
mpiddp=$1
tmp=$(mktemp -d /tmp/mpiddp-stall-XXXXXX)
trap 'pkill -9 -f "$tmp/" 2>/dev/null; rm -rf "$tmp"' EXIT
"$mpiddp" data synthetic --samples 2048 --features 20 --seed 1 --out "$tmp/toy.h5" >/dev/null
warn=2 timeout_s=6

# stall_case N VICTIM [WARNING]: train, stop VICTIM once training runs, wait for the end.
stall_case() {
  local n=$1 victim=$2 warning=${3:-$warn} i pid
  rm -f "$tmp/m.jsonl"
  MPIDDP_STALL_WARNING=$warning MPIDDP_COMM_TIMEOUT=$timeout_s start_bg "$n" "$mpiddp" train --model linear \
    --data "$tmp/toy.h5" --epochs 100000 --batch-size 32 --threads 1 --metrics "$tmp/m.jsonl"
  for i in $(seq 1 200); do [ "$(wc -l 2>/dev/null <"$tmp/m.jsonl" || echo 0)" -ge 3 ] && break; sleep 0.1; done
  pid=$(rank_pid "$tmp/toy.h5" "$victim")
  stopped_at=$(date +%s)
  kill -STOP "$pid"
  wait_bg
  elapsed=$(( $(date +%s) - stopped_at ))
  kill -9 "$pid" 2>/dev/null
}

for n in 2 3 4; do
  victim=$((n - 1)); [ "$n" -eq 4 ] && victim=1
  stall_case "$n" "$victim"
  check "np$n, rank $victim stopped: the job ends non-zero" failed_cleanly
  check "np$n: within the timeout + 30 s of the stop (took ${elapsed} s)" [ "$elapsed" -le $((timeout_s + 30)) ]
  for r in $(seq 0 $((n - 1))); do
    [ "$r" -eq "$victim" ] && continue
    check "np$n: rank $r warned, naming rank $victim as stalled and its own collective" \
      contains "^mpiddp: warning: \[rank $r\] [a-z_]* #[0-9]* (.*) has waited $warn s: stalled: rank $victim (" "$err"
  done
  check "np$n: one error line" [ "$(grep -c "^mpiddp: error:" <<<"$err")" -eq 1 ]
  check "np$n: the error names the collective, the timeout and the stalled rank" \
    contains "^mpiddp: error: \[rank [0-9]\] .*[a-z_]* #[0-9]* (.*) did not complete within $timeout_s s: stalled: rank $victim (not waiting in any collective" "$err"
  check "np$n: no second wait on a discarded handle" bash -c '! grep -q "while discarding its handle" <<<"$1"' _ "$err"
done

stall_case 3 0 0
check "MPIDDP_STALL_WARNING=0: no warnings" bash -c '! grep -q "^mpiddp: warning:" <<<"$1"' _ "$err"
check "MPIDDP_STALL_WARNING=0: the error still names the stalled rank" contains "stalled: rank 0 (" "$err"
check "MPIDDP_STALL_WARNING=0: ends within the timeout + 30 s" [ "$elapsed" -le $((timeout_s + 30)) ]

MPIDDP_STALL_WARNING=-1 run_np 2 "$mpiddp" train --model linear --data "$tmp/toy.h5" --epochs 1
check "a bad MPIDDP_STALL_WARNING is refused" failed_cleanly
check "a bad MPIDDP_STALL_WARNING: says why" contains "MPIDDP_STALL_WARNING must be a number of seconds >= 0" "$err"
finish
