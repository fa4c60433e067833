#!/bin/sh
# The comm layer on CUDA (tests/test_comm_cuda.c) with 2 ranks: with one GPU both ranks share it
# through the staged MPI backend; with two or more, NCCL is tested too. Exit 77 (skip) without a
# GPU (every rank exits 77 before MPI starts, and mpirun passes the status on).
exec "$(dirname "$0")/mpirun.sh" 2 300 ./tests/test_comm_cuda
