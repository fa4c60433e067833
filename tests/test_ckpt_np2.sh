#!/bin/sh
# The collective checkpoint tests of tests/test_ckpt.c (save by rank 0, load on every rank,
# errors reaching every rank) with 2 ranks.
exec "$(dirname "$0")/mpirun.sh" 2 120 ./tests/test_ckpt --mpi
