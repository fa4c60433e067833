#!/bin/sh
# The DDP engine's communication hook (tests/test_ddp_hook.c) at 2 and 3 ranks.
unset MPT_CHECK_COLLECTIVES
for np in 2 3; do
  "$(dirname "$0")/mpirun.sh" "$np" 120 ./tests/test_ddp_hook || exit $?
done
