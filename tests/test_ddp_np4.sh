#!/bin/sh
# The DDP engine tests with 4 ranks on 2 cores (oversubscribed): F03 with the counts of
# docs/faults.md (2, 2, 1, 1 batches), the other fault cases and the equivalence with W = 4.
unset MPT_CHECK_COLLECTIVES
here=$(dirname "$0")
status=0
"$here/mpirun.sh" 4 150 ./tests/test_ddp || status=$?
"$here/mpirun.sh" 4 90 ./tests/test_faults || { rc=$?; [ $status -eq 0 ] && status=$rc; }
exit $status
