#!/bin/sh
# ZeRO-2 in the DDP engine (tests/test_zero.c with stage 2) at 2, 3 and 4 ranks.
unset MPT_CHECK_COLLECTIVES
for np in 2 3 4; do
  "$(dirname "$0")/mpirun.sh" "$np" 300 ./tests/test_zero 2 || exit $?
done
