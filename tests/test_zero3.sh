#!/bin/sh
# ZeRO-3 in the DDP engine (tests/test_zero.c with stage 3) at 2, 3 and 4 ranks.
unset MPT_CHECK_COLLECTIVES
for np in 2 3 4; do
  "$(dirname "$0")/mpirun.sh" "$np" 300 ./tests/test_zero 3 || exit $?
done
