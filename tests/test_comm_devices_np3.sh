#!/bin/sh
# Device binding and the NCCL bootstrap's CPU part (tests/test_comm_devices.c) with 3 ranks.
exec "$(dirname "$0")/mpirun.sh" 3 120 ./tests/test_comm_devices
