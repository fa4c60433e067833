#!/bin/sh
# The NaN case of the comm tests (tests/test_comm.c, Check case "nan") with 4 ranks on 2 cores:
# MIN / MAX / SUM / AVG keep a NaN of any rank at 2, 3 (test_comm_np2.sh, _np3.sh) and 4 ranks.
unset MPT_CHECK_COLLECTIVES
CK_RUN_CASE=nan
export CK_RUN_CASE
MPT_MPIRUN_ARGS="${MPT_MPIRUN_ARGS:-} -x CK_RUN_CASE"
export MPT_MPIRUN_ARGS
exec "$(dirname "$0")/mpirun.sh" 4 150 ./tests/test_comm
