#!/bin/sh
# The language-model windows sharded over 2 real ranks (tests/test_token_ddp.c).
exec "$(dirname "$0")/mpirun.sh" 2 120 ./tests/test_token_ddp
