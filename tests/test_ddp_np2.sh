#!/bin/sh
# The DDP engine tests with 2 ranks: tests/test_ddp (equivalence with one process, bucket plan)
# and tests/test_faults (the docs/faults.md cases F03-F08 with their exact values). Each mpirun is
# killed after its time limit (tests/mpirun.sh), so a hang fails instead of blocking make check.
unset MPT_CHECK_COLLECTIVES
here=$(dirname "$0")
status=0
"$here/mpirun.sh" 2 120 ./tests/test_ddp || status=$?
"$here/mpirun.sh" 2 60 ./tests/test_faults || { rc=$?; [ $status -eq 0 ] && status=$rc; }
exit $status
