#!/bin/sh
# Preemption: SIGTERM (what Slurm sends before the time limit with --signal) makes mpitrain
# finish its current step and exit 75. Under mpirun every rank stops after the same step even
# when only one rank receives the signal. Prints "N passed, N failed".
set -u
dir=$(dirname "$0")
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
args="train --synthetic --train-limit 100000 --test-limit 64 --epochs 2 --no-progress --threads 1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# One process.
# wait_for FILE PATTERN SECONDS: until FILE has a line with PATTERN (a loaded machine's start-up
# can take tens of seconds: the signal must not be sent before the run has started).
wait_for() {
  end=$(($(date +%s) + $3))
  while [ "$(date +%s)" -lt "$end" ]; do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.2
  done
  return 1
}
./mpitrain $args >"$tmp/single.log" 2>&1 &
pid=$!
wait_for "$tmp/single.log" "model mlp" 120 || bad "single process: no 'model mlp' line within 120 s"
sleep 1
kill -TERM "$pid"
wait "$pid"
rc=$?
[ "$rc" -eq 75 ] && ok || bad "single process exited $rc after SIGTERM, want 75"
grep -q "preempted" "$tmp/single.log" && ok || bad "single process did not say it was preempted"
[ "$fail" -eq 0 ] || tail -n 20 "$tmp/single.log"

# Two ranks; the signal goes to rank 1 only.
f0=$fail
MPT_MPIRUN_ARGS="--tag-output" "$dir/mpirun.sh" 2 300 ./mpitrain $args >"$tmp/ddp.log" 2>&1 &
job=$!
wait_for "$tmp/ddp.log" "DDP:" 120 || bad "mpirun -np 2: no 'DDP:' line within 120 s"
sleep 1
# Rank 1 among the descendants of this job (other jobs may run mpitrain on the same machine).
descendants() {
  for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do
    echo "$c"
    descendants "$c"
  done
}
rank1=$(descendants "$job" | while read -r p; do
  [ "$(cat "/proc/$p/comm" 2>/dev/null)" = mpitrain ] || continue
  tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -q '^OMPI_COMM_WORLD_RANK=1$' && echo "$p"
done | head -n1)
if [ -n "$rank1" ]; then kill -TERM "$rank1"; else bad "could not find rank 1's process"; fi
wait "$job"
rc=$?
[ "$rc" -eq 75 ] && ok || bad "mpirun -np 2 exited $rc after SIGTERM to rank 1, want 75"
steps=$(grep -o "stopping after step [0-9]*" "$tmp/ddp.log" | sort -u | wc -l)
n=$(grep -c "stopping after step" "$tmp/ddp.log")
[ "$n" -eq 2 ] && [ "$steps" -eq 1 ] && ok ||
  bad "ranks did not stop after the same step: $(grep -o 'stopping after step [0-9]*' "$tmp/ddp.log" | tr '\n' ' ')"
[ "$fail" -eq "$f0" ] || tail -n 20 "$tmp/ddp.log"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
