#!/bin/sh
# F14 end to end: a program started without mpirun or srun (an MPI singleton) while
# SLURM_NTASKS=4 says the job has 4 tasks must exit non-zero with the srun --mpi=pmix hint; the
# same program in a clean environment starts as a plain process, with Open MPI asked to yield
# the core while it waits unless the environment says otherwise.
set -u
prog=./tests/test_launch
# Forget any launcher this test itself runs under.
for v in $(env | sed -n 's/^\(\(SLURM\|OMPI\|PMIX\|PMI\)_[A-Za-z0-9_]*\)=.*/\1/p'); do
  unset "$v"
done
unset MPT_CHECK_COLLECTIVES

out=$(SLURM_NTASKS=4 timeout -k 5 60 "$prog" --init 2>&1)
rc=$?
echo "$out"
if [ $rc -eq 0 ]; then
  echo "FAIL: SLURM_NTASKS=4 with a world of 1 exited 0" >&2
  exit 1
fi
if [ $rc -eq 124 ]; then
  echo "FAIL: the singleton with SLURM_NTASKS=4 hung" >&2
  exit 1
fi
case $out in
  *"SLURM_NTASKS=4"*"--mpi=pmix"*) ;;
  *) echo "FAIL: the error does not name SLURM_NTASKS=4 and srun --mpi=pmix" >&2; exit 1 ;;
esac

out=$(timeout -k 5 60 "$prog" --init 2>&1)
rc=$?
echo "$out"
if [ $rc -ne 0 ]; then
  echo "FAIL: a plain singleton exited $rc" >&2
  exit 1
fi
case $out in
  *"launcher: plain process, world 1"*) ;;
  *) echo "FAIL: a plain singleton was not reported as a plain process of world 1" >&2; exit 1 ;;
esac
# mpt_comm_init asks Open MPI to yield while it waits (mpi_yield_when_idle 1) unless the variable
# is set, and then leaves it as it is.
case $out in
  *"yield when idle 1"*) ;;
  *) echo "FAIL: mpt_comm_init did not set OMPI_MCA_mpi_yield_when_idle=1" >&2; exit 1 ;;
esac
out=$(OMPI_MCA_mpi_yield_when_idle=0 timeout -k 5 60 "$prog" --init 2>&1)
echo "$out"
case $out in
  *"yield when idle 0"*) ;;
  *) echo "FAIL: mpt_comm_init overrode OMPI_MCA_mpi_yield_when_idle=0" >&2; exit 1 ;;
esac
echo "PASS"
