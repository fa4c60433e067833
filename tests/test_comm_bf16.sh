#!/bin/sh
# bfloat16 reductions rounded once (tests/test_comm_bf16.c) at 2, 3, 4 and 8 ranks on 2 cores
# (oversubscribed): exact small cases where a rounding per hop would read another value.
unset MPT_CHECK_COLLECTIVES
for np in 2 3 4 8; do
  "$(dirname "$0")/mpirun.sh" "$np" 150 ./tests/test_comm_bf16 || exit $?
done
