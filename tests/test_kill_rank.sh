#!/bin/sh
# docs/faults.md F10: rank 1 is killed (SIGKILL) at step 2 of a 2-rank DDP run. The whole job must
# end within 30 s, non-zero, with a message naming rank 1 — never a hang.
set -u
dir=$(dirname "$0")
. "$dir/fault_injection.sh"
require_fault_injection
start=$(date +%s)
out=$(MPT_TEST_KILL_RANK=1 MPT_TEST_KILL_STEP=2 MPT_MPIRUN_ARGS="-x MPT_TEST_KILL_RANK -x MPT_TEST_KILL_STEP" \
      "$dir/mpirun.sh" 2 60 ./mpitrain train --synthetic --train-limit 2048 --test-limit 256 \
      --epochs 1 --no-progress 2>&1)
rc=$?
elapsed=$(( $(date +%s) - start ))
printf '%s\n' "$out" | tail -n 15
fail=0
[ "$rc" -ne 0 ] || { echo "FAIL: the job exited 0"; fail=1; }
[ "$rc" -ne 124 ] || { echo "FAIL: the job hung (killed by the test's timeout)"; fail=1; }
[ "$elapsed" -le 30 ] || { echo "FAIL: the job took ${elapsed} s (> 30 s) to end"; fail=1; }
printf '%s\n' "$out" | grep -Eq "rank 1 .*(exited on signal|killed)|process rank 1" ||
  { echo "FAIL: no message names rank 1"; fail=1; }
echo "job ended in ${elapsed} s with status $rc"
if [ $fail -eq 0 ]; then echo "1 passed, 0 failed"; else echo "0 passed, 1 failed"; fi
exit $fail
