#!/bin/sh
# --timeout is also the deadline of MPI's initialisation. Under real mpirun,
# the second process of the job is not mpitrain (`: -np 1 sleep 1000`) and never initialises
# MPI, so MPI_Init_thread on rank 0 would block for ever. The job must end within --timeout + 10
# s, with a non-zero status and a message that says what rank 0 waited for.
# Prints "N passed, N failed".
set -u
dir=$(dirname "$0")
timeout_s=10
start=$(date +%s)
out=$("$dir/mpirun.sh" 1 60 ./mpitrain train --synthetic --train-limit 64 --test-limit 16 \
      --epochs 1 --no-progress --timeout $timeout_s : -np 1 sleep 1000 2>&1)
rc=$?
elapsed=$(( $(date +%s) - start ))
printf '%s\n' "$out" | grep "mpitrain"
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && ok || bad "status $rc (want non-zero, not the test's timeout)"
[ "$elapsed" -le $((timeout_s + 10)) ] && ok || bad "the job took $elapsed s (want <= $((timeout_s + 10)) s)"
printf '%s' "$out" | grep -q "MPI initialisation did not complete within $timeout_s s (the start-up deadline: --timeout, at least 10 s) on rank 0 of 2 (mpirun).*still waiting in MPI_Init_thread, which returns once every process of the job has started" &&
  ok || bad "no message naming what rank 0 waited for"
echo "job ended in $elapsed s with status $rc"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
