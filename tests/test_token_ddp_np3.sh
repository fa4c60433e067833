#!/bin/sh
# The language-model windows sharded over 3 real ranks (tests/test_token_ddp.c).
exec "$(dirname "$0")/mpirun.sh" 3 120 ./tests/test_token_ddp
