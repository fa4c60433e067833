#!/bin/sh
# The sharded-collective and bfloat16 tests (tests/test_comm_shard.c) at 2, 3 and 4 ranks on 2
# cores (oversubscribed): even and odd worlds, buffers not divisible by the world size.
unset MPT_CHECK_COLLECTIVES
for np in 2 3 4; do
  "$(dirname "$0")/mpirun.sh" "$np" 150 ./tests/test_comm_shard || exit $?
done
