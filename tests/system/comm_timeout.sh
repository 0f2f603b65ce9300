#!/usr/bin/env bash
# The timeout path: ranks that never arrive at a collective are named by the others, and the
# whole job ends well inside the deadline instead of hanging.
# usage: comm_timeout.sh path/to/comm_timeout_probe
source "$(dirname "$0")/lib.sh"
probe=$1

elapsed() { echo $(( $(date +%s) - t0 )); }

t0=$(date +%s)
run_np 3 "$probe" --backend mpi --late 0 --timeout-ms 1000 --check 1
check "one late rank: job ends non-zero, no hang" failed_cleanly
check "one late rank: ended within 30 s" [ "$(elapsed)" -lt 30 ]
check "one late rank: waiting ranks name it, the op and the sequence number" \
  contains "allreduce #2 (float32\[8\], sum) did not complete within 1 s: rank 0 has not arrived" "$err"
check "one late rank: the caller catches the timeout (dropping the handle does not abort first)" \
  contains "mpiddp: error: \[rank [12]\] .*did not complete within 1 s" "$err"  # ranks write at once: no ^
check "one late rank: no abort from a discarded handle" bash -c '! grep -q "while discarding its handle" <<<"$1"' _ "$err"

t0=$(date +%s)
run_np 4 "$probe" --backend mpi --late 0,2 --timeout-ms 1500 --check 1
check "two late ranks: job ends non-zero" failed_cleanly
check "two late ranks: ended within 30 s" [ "$(elapsed)" -lt 30 ]
check "two late ranks: both named" contains "did not complete within 1.5 s: ranks 0,2 have not arrived" "$err"

run_np 2 "$probe" --backend mpi --late 1 --timeout-ms 1000 --check 0
check "without check mode: job ends non-zero" failed_cleanly
check "without check mode: the stall monitor names the late rank" \
  contains "allreduce #2 (float32\[8\], sum) did not complete within 1 s: stalled: rank 1 (not waiting in any collective" "$err"

# The Runtime's own collectives (snapshots' agreements and transfers, gathers of text) are watched
# too: every waiting rank warns, naming the late rank, and the timeout names it.
t0=$(date +%s)
MPIDDP_COMM_TIMEOUT=3 MPIDDP_STALL_WARNING=1 run_np 3 "$probe" --backend mpi --late 1 --in step
check "a Runtime step: job ends non-zero" failed_cleanly
check "a Runtime step: ended within 30 s" [ "$(elapsed)" -lt 30 ]
for r in 0 2; do
  check "a Runtime step: rank $r warned, naming the late rank and its own wait" \
    contains "^mpiddp: warning: \[rank $r\] agreement of all ranks #[0-9]* has waited 1 s: stalled: rank 1 (.*); ranks 0,2 wait in it" "$err"
done
check "a Runtime step: one error line, naming the step, the timeout and the late rank" \
  bash -c '[ "$(grep -c "^mpiddp: error:" <<<"$1")" -eq 1 ] && grep -q "^mpiddp: error: .*agreement of all ranks #[0-9]* did not complete within 3 s (MPIDDP_COMM_TIMEOUT): stalled: rank 1 (not waiting" <<<"$1"' _ "$err"

# A blocking call inside HDF5 (the collective MPI-IO open of a dataset; also a parallel snapshot's
# writes): no step to time out, so a watchdog names the call and ends the job.
t0=$(date +%s)
hdf5_dir=$(mktemp -d)
MPIDDP_COMM_TIMEOUT=3 run_np 3 "$probe" --backend mpi --late 2 --in hdf5 --dir "$hdf5_dir"
if contains "no parallel HDF5" "$out"; then
  echo "skip: a blocking call inside HDF5 (this mpiddp's HDF5 is not parallel)"
else
  check "inside HDF5: job ends non-zero" failed_cleanly
  check "inside HDF5: ended within 30 s" [ "$(elapsed)" -lt 30 ]
  check "inside HDF5: a waiting rank names the call and the timeout" \
    contains "^mpiddp: error: \[rank [01]\] collective open of '$hdf5_dir/probe.h5' (HDF5 MPI-IO) did not complete within 3 s (MPIDDP_COMM_TIMEOUT): a rank has stopped, hung or died" "$err"
fi
rm -rf "$hdf5_dir"

if [[ " ${MPIDDP_BACKENDS:-} " == *" gloo "* ]]; then
  run_np 2 "$probe" --backend gloo --late 1 --timeout-ms 1000 --check 1
  check "gloo: job ends non-zero" failed_cleanly
  check "gloo: late rank named" contains "rank 1 has not arrived" "$err"
fi
finish
