#!/bin/sh
# The progress-mode tests of the comm layer (tests/test_comm_progress.c) with 3 ranks on 2 cores
# (oversubscribed).
unset MPT_CHECK_COLLECTIVES
exec "$(dirname "$0")/mpirun.sh" 3 120 ./tests/test_comm_progress
