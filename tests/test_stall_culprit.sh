#!/bin/sh
# The timeout names the rank that held the job up, not only the waiter. Under
# real mpirun, 3 DDP ranks train; rank 1 is stopped from outside with SIGSTOP mid-run. Ranks 0
# and 2 must fail after --timeout (5 s) with a message that names rank 1 as holding up the
# collective they wait in, and no other (read from the shared-memory
# progress records, without rank 1's help; the first report counts: it aborts the job),
# and the job must end within --timeout + 10 s, non-zero.
# Prints "N passed, N failed".
set -u
dir=$(dirname "$0")
command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1 || { echo "$0: no mpirun; skipping"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_stall.XXXXXX")
job=
victim=
cleanup() {
  [ -n "$victim" ] && kill -CONT "$victim" 2>/dev/null
  [ -n "$job" ] && kill "$job" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
descendants() {
  ps -e -o pid=,ppid= | awk -v root="$1" '{ parent[$1] = $2 }
    END { for (p in parent) { q = p; while ((q in parent) && q != root && q > 1) q = parent[q];
          if (q == root && p != root) print p } }'
}
timeout_s=5
"$dir/mpirun.sh" 3 120 ./mpitrain train --synthetic --train-limit 60000 --test-limit 100 \
  --epochs 500 --hidden 64 --no-progress --threads 1 --timeout $timeout_s > "$tmp/out" 2>&1 &
job=$!
i=0
until grep -q "epoch   1/500" "$tmp/out" || [ $i -ge 600 ]; do sleep 0.1; i=$((i + 1)); done
for p in $(descendants "$job"); do
  if [ "$(cat /proc/"$p"/comm 2>/dev/null)" = mpitrain ] &&
     tr '\0' '\n' < /proc/"$p"/environ 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1; then
    victim=$p
  fi
done
if [ -z "$victim" ]; then
  bad "rank 1 not found (training did not start?)"; cat "$tmp/out"
  echo "$pass passed, $fail failed"; exit 1
fi
kill -STOP "$victim"
start=$(date +%s)
wait "$job"
rc=$?
job=
elapsed=$(( $(date +%s) - start ))
grep "error" "$tmp/out" | head -n 4
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && ok || bad "status $rc (want non-zero, not the test's timeout)"
[ "$elapsed" -le $((timeout_s + 10)) ] && ok || bad "the job took $elapsed s after SIGSTOP (want <= $((timeout_s + 10)))"
# Ranks 0 and 2 time out together. The first to report aborts the job: mpirun then continues
# (SIGCONT) and kills the processes, so a second report may come from the middle of that
# teardown (rank 0 "has exited", rank 1 running again). The first report must name rank 1.
first=$(grep "error: deadline exceeded: .* did not complete within $timeout_s s on rank" "$tmp/out" | head -n 1)
printf '%s' "$first" | grep -q "rank [02]/3\] error: deadline exceeded: .* did not complete within $timeout_s s on rank [02]; on host [^:]*: holding it up: rank 1 ([^;]*; process $victim is stopped (SIGSTOP or job control); [^)]*); waiting in it: rank" &&
  ok || bad "the first timeout report does not name rank 1 (pid $victim) as holding the collective up"
echo "SIGSTOP of rank 1 (pid $victim): job ended $elapsed s later with status $rc"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
