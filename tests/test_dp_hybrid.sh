#!/bin/sh
# Hybrid data parallelism with 2 ranks: DataParallel over cpu:2 inside each rank, DDP across
# the ranks (tests/test_dp_hybrid.c), against one process on the combined batch. The mpirun is
# killed after its time limit (tests/mpirun.sh), so a hang fails instead of blocking make check.
unset MPT_CHECK_COLLECTIVES
exec "$(dirname "$0")/mpirun.sh" 2 120 ./tests/test_dp_hybrid
