#!/bin/sh
# The GPT model under DDP with 3 ranks: tests/test_gpt_ddp (equivalence with one process on the
# combined batch, tied wte included). Killed after its time limit (tests/mpirun.sh), so a hang
# fails instead of blocking make check.
unset MPT_CHECK_COLLECTIVES
here=$(dirname "$0")
exec "$here/mpirun.sh" 3 150 ./tests/test_gpt_ddp
