#!/bin/sh
# bf16 gradient communication in the DDP engine (tests/test_ddp_bf16.c) at 2 and 3 ranks.
unset MPT_CHECK_COLLECTIVES
for np in 2 3; do
  "$(dirname "$0")/mpirun.sh" "$np" 120 ./tests/test_ddp_bf16 || exit $?
done
