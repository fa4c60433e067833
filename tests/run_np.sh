#!/bin/sh
# Usage: tests/run_np.sh [--print] [DIR/]PROGRAM_npN.mpi
#
# Runs an MPI Check program of tests/ with N ranks, under tests/mpirun.sh (root, oversubscribed,
# killed after its time limit, exit 77 without mpirun). It is the test driver of every name
# PROGRAM_npN.mpi in TESTS (automake's MPI_LOG_COMPILER, Makefile.am): registering a program
# at a rank count is one word in a .mk file, `TESTS += tests/test_comm_np3.mpi`, plus its line
# in the table below; `make check` reports each rank count as its own test
# (PASS: tests/test_comm_np3.mpi, log tests/test_comm_np3.log). By hand, from the build
# folder: tests/run_np.sh tests/test_comm_np3.mpi. --print prints the settings it would run with
# ("np N limit S args ... checked ... case ...") and exits 0, or fails like a run on a name that
# is not in the table.
#
# The table: one arm per registered name (tests/test_tree.sh checks that the two agree).
#   limit    seconds before the whole job is killed (status 124)
#   args     the program's arguments (none by default)
#   checked  "keep": MPT_CHECK_COLLECTIVES passes through from the caller; by default it is
#            unset, since the program chooses checked mode itself where it tests it
#   ck_case  the one Check case to run (CK_RUN_CASE, passed to every rank)
# A program exits 77 on every rank where it cannot run (no GPU): mpirun passes that on (SKIP).
set -u
print=0
[ "${1:-}" = --print ] && { print=1; shift; }
if [ $# -ne 1 ]; then
  echo "usage: $0 [DIR/]PROGRAM_npN.mpi" >&2
  exit 2
fi
name=${1##*/}
base=${name%.mpi}
prog=${base%_np*}
np=${base##*_np}
case $name:$np in
  *.mpi:[1-9] | *.mpi:[1-9][0-9]) ;;
  *) echo "$0: '$1' is not PROGRAM_npN.mpi (N ranks)" >&2; exit 2 ;;
esac
limit=
args=
checked=
ck_case=
case $name in
  test_ckpt_np2.mpi)                limit=120 args=--mpi checked=keep ;;
  test_comm_np2.mpi)                limit=120 ;;
  test_comm_np3.mpi)                limit=150 ;;
  test_comm_np4.mpi)                limit=150 ck_case=nan ;;
  test_comm_bf16_np[2348].mpi)      limit=150 ;;
  test_comm_cuda_np2.mpi)           limit=300 checked=keep ;;
  test_comm_devices_np[23].mpi)     limit=120 checked=keep ;;
  test_comm_progress_np2.mpi)       limit=90 ;;
  test_comm_progress_np3.mpi)       limit=120 ;;
  test_comm_shard_np[234].mpi)      limit=150 ;;
  test_ddp_np2.mpi)                 limit=120 ;;
  test_ddp_np[34].mpi)              limit=150 ;;
  test_ddp_bf16_np[23].mpi)         limit=120 ;;
  test_ddp_hook_np[23].mpi)         limit=120 ;;
  test_dp_hybrid_np2.mpi)           limit=120 ;;
  test_eval_np[23].mpi)             limit=120 checked=keep ;;
  test_faults_np2.mpi)              limit=60 ;;
  test_faults_np[34].mpi)           limit=90 ;;
  test_gpt_ddp_np2.mpi)             limit=120 ;;
  test_gpt_ddp_np3.mpi)             limit=150 ;;
  test_llama_ddp_np2.mpi)           limit=120 ;;
  test_llama_ddp_np3.mpi)           limit=150 ;;
  test_token_ddp_np[23].mpi)        limit=120 checked=keep ;;
  *)
    echo "$0: $name is not in the table of tests/run_np.sh (add its line there)" >&2
    exit 99 ;;
esac
if [ $print -eq 1 ]; then
  echo "np $np limit $limit args '$args' checked '${checked:-unset}' case '$ck_case' program ./tests/$prog"
  exit 0
fi
[ "$checked" = keep ] || unset MPT_CHECK_COLLECTIVES
if [ -n "$ck_case" ]; then
  CK_RUN_CASE=$ck_case
  MPT_MPIRUN_ARGS="${MPT_MPIRUN_ARGS:-} -x CK_RUN_CASE"
  export CK_RUN_CASE MPT_MPIRUN_ARGS
fi
# shellcheck disable=SC2086 # args is a list of words
exec "$(dirname "$0")/mpirun.sh" "$np" "$limit" "./tests/$prog" $args
