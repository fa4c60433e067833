#!/bin/sh
# The DDP engine tests with 3 ranks on 2 cores (oversubscribed): an odd world size, so the
# average is a division by 3 and the fault cases run with their W-rank generalisations
# (tests/test_faults.c says which values they take).
unset MPT_CHECK_COLLECTIVES
here=$(dirname "$0")
status=0
"$here/mpirun.sh" 3 150 ./tests/test_ddp || status=$?
"$here/mpirun.sh" 3 90 ./tests/test_faults || { rc=$?; [ $status -eq 0 ] && status=$rc; }
exit $status
