#!/bin/sh
# The comm tests (tests/test_comm.c) with 2 ranks. Checked mode comes from the test itself, not
# from the caller's environment.
unset MPT_CHECK_COLLECTIVES
exec "$(dirname "$0")/mpirun.sh" 2 120 ./tests/test_comm
