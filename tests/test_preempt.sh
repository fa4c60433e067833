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
./mpitrain $args >"$tmp/single.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do grep -q "model mlp" "$tmp/single.log" 2>/dev/null && break; sleep 0.2; done
sleep 1
kill -TERM "$pid"
wait "$pid"
rc=$?
[ "$rc" -eq 75 ] && ok || bad "single process exited $rc after SIGTERM, want 75"
grep -q "preempted" "$tmp/single.log" && ok || bad "single process did not say it was preempted"

# Two ranks; the signal goes to rank 1 only.
MPT_MPIRUN_ARGS="--tag-output" "$dir/mpirun.sh" 2 120 ./mpitrain $args >"$tmp/ddp.log" 2>&1 &
job=$!
for _ in $(seq 1 150); do grep -q "DDP:" "$tmp/ddp.log" 2>/dev/null && break; sleep 0.2; done
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
[ "$fail" -eq 0 ] || tail -n 20 "$tmp/ddp.log"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
