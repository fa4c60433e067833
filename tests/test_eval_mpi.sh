#!/bin/sh
# tests/test_eval (evaluation mode as one switch; docs/faults.md F01: the DistributedSampler's padding
# rows are not counted, so an evaluation over W ranks equals one process) with 2 and 3 ranks,
# each mpirun killed after its time limit (tests/mpirun.sh).
here=$(dirname "$0")
status=0
for np in 2 3; do
  "$here/mpirun.sh" "$np" 120 ./tests/test_eval || { rc=$?; [ $status -eq 0 ] && status=$rc; }
done
exit $status
