#!/usr/bin/env bash
# The MPI gtest main must report failures of ranks other than 0 through rank 0, and every rank
# must exit non-zero, even though rank 0's own assertions passed.
# usage: harness_reports.sh path/to/test_harness_mpi
source "$(dirname "$0")/lib.sh"
exe=$1

run_np 3 "$exe" --gtest_also_run_disabled_tests --gtest_filter='HarnessSelfTest.*'
check "non-zero exit when only ranks 1 and 2 fail" failed_cleanly
check "rank 1's failure printed by rank 0" contains "^\[rank 1\] FAILED HarnessSelfTest.DISABLED_FailsOnNonZeroRanks" "$out"
check "rank 2's failure printed by rank 0" contains "^\[rank 2\] FAILED HarnessSelfTest.DISABLED_FailsOnNonZeroRanks" "$out"
check "with the failure text" contains "deliberate failure on rank 2" "$out"
check "closing verdict FAILED" [ "$(last_line "$out")" = "FAILED on 3 ranks" ]

run_np 3 "$exe" --gtest_filter='Harness.*'
check "passing run exits 0" [ "$rc" -eq 0 ]
check "closing verdict PASSED" [ "$(last_line "$out")" = "PASSED on 3 ranks" ]
check "only rank 0 prints gtest's banner" [ "$(grep -c '^\[==========\] Running' <<<"$out")" -eq 1 ]
finish
