#!/bin/sh
# The Llama model under DDP with 3 ranks: tests/test_llama_ddp (equivalence with one process on
# the combined batch, the tied embedding included). Killed after its time limit
# (tests/mpirun.sh), so a hang fails instead of blocking make check.
unset MPT_CHECK_COLLECTIVES
here=$(dirname "$0")
exec "$here/mpirun.sh" 3 120 ./tests/test_llama_ddp
