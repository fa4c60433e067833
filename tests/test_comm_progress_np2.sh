#!/bin/sh
# The progress-mode tests of the comm layer (tests/test_comm_progress.c) with 2 ranks.
unset MPT_CHECK_COLLECTIVES
exec "$(dirname "$0")/mpirun.sh" 2 90 ./tests/test_comm_progress
