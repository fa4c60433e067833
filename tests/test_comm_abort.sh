#!/bin/sh
# A collective whose peer never comes, in blocking mode (the default): rank 1 never calls it.
# Rank 0's synchronous all-reduce must return MPT_ETIMEOUT naming the collective, the deadline
# and the rank; mpt_comm_free must return although the comm's worker is stuck inside
# MPI_Allreduce; mpt_comm_finalize must refuse; rank 0 then ends the job with
# mpt_comm_abort(..., 3) (tests/test_comm_progress.c, "missing-peer"). Passes when the job exits
# with status 3 and rank 0 printed that it passed every check; a hang is killed after 60 s.
set -u
unset MPT_CHECK_COLLECTIVES
dir=$(dirname "$0")
out=$("$dir/mpirun.sh" 2 60 ./tests/test_comm_progress missing-peer 2>&1)
rc=$?
printf '%s\n' "$out"
[ "$rc" -ne 77 ] || exit 77
fail=0
[ "$rc" -eq 3 ] || { echo "FAIL: the job exited with status $rc, not 3 (rank 0's mpt_comm_abort)"; fail=1; }
printf '%s\n' "$out" | grep -q "MPT_ETIMEOUT: .*all-reduce #0 (count 4 float32 sum) did not complete within 1 s on rank 0" ||
  { echo "FAIL: no timeout message naming all-reduce #0 and rank 0"; fail=1; }
printf '%s\n' "$out" | grep -q "rank 0: mpt_comm_free returned" ||
  { echo "FAIL: mpt_comm_free did not return"; fail=1; }
printf '%s\n' "$out" | grep -q "missing peer: rank 0 passed every check, aborting the job" ||
  { echo "FAIL: rank 0 did not pass its checks"; fail=1; }
if [ $fail -eq 0 ]; then echo "1 passed, 0 failed"; else echo "0 passed, 1 failed"; fi
exit $fail
