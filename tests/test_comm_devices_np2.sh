#!/bin/sh
# Device binding and the NCCL bootstrap's CPU part (tests/test_comm_devices.c) with 2 ranks.
exec "$(dirname "$0")/mpirun.sh" 2 120 ./tests/test_comm_devices
