#!/bin/sh
# The comm tests (tests/test_comm.c) with 3 ranks on 2 cores (oversubscribed; an odd world size
# exercises the non-power-of-two paths of the collectives).
unset MPT_CHECK_COLLECTIVES
exec "$(dirname "$0")/mpirun.sh" 3 150 ./tests/test_comm
