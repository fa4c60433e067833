#!/bin/sh
# Usage: tests/mpirun.sh NP TIMEOUT_S PROGRAM [ARGS...]
#
# Runs PROGRAM with NP ranks of Open MPI's mpirun on this host and kills the whole job after
# TIMEOUT_S seconds (exit status 124, with a message naming the program). Shared by the MPI
# tests of every layer. It works as root (--allow-run-as-root) and with more ranks than cores
# (--oversubscribe), uses the shared-memory transport (btl self,vader with pml ob1, no network),
# does not bind ranks to cores, and gives each rank one BLAS thread (OPENBLAS_NUM_THREADS=1).
# Extra mpirun arguments may be passed in MPT_MPIRUN_ARGS (e.g. "--tag-output"). MPIRUN names
# another mpirun. Exit status: the program's (mpirun's), 124 on timeout, 77 (skip) when there is
# no mpirun, 2 on bad usage.
set -u
if [ $# -lt 3 ]; then
  echo "usage: $0 NP TIMEOUT_S PROGRAM [ARGS...]" >&2
  exit 2
fi
np=$1
limit=$2
shift 2
mpirun=${MPIRUN:-mpirun}
if ! command -v "$mpirun" >/dev/null 2>&1; then
  echo "$0: '$mpirun' not found (Debian: apt-get install openmpi-bin); skipping" >&2
  exit 77
fi
OPENBLAS_NUM_THREADS=1
export OPENBLAS_NUM_THREADS
# shellcheck disable=SC2086 # MPT_MPIRUN_ARGS is a list of words on purpose
start=$(date +%s)
timeout -k 10 "$limit" "$mpirun" --allow-run-as-root --oversubscribe --bind-to none \
  --mca pml ob1 --mca btl self,vader -x OPENBLAS_NUM_THREADS ${MPT_MPIRUN_ARGS:-} \
  -np "$np" "$@"
rc=$?
# 137 is also mpirun's own status when a rank died of SIGKILL: only a run that lasted the whole
# limit is a timeout.
elapsed=$(( $(date +%s) - start ))
if [ $rc -eq 124 ] || { [ $rc -eq 137 ] && [ "$elapsed" -ge "$limit" ]; }; then
  echo "$0: '$*' with $np ranks did not finish within $limit s (a rank hung?); killed" >&2
  exit 124
fi
exit $rc
