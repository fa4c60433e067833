#!/bin/bash
# The flight recorder, `mpitrain hang-report` and the straggler line across two hosts over TCP
# (scripts/two_hosts.sh: two network namespaces, rank 0 on host1, rank 1 on host2, a shared file
# system as on a cluster; docs/hangs.md):
#   1. rank 1 on host2 stops (SIGSTOP, raised by itself before step 20: MPT_TEST_STOP_RANK /
#      _STEP, between two collectives; tests/test_flight.sh says why): the job ends after its
#      deadline (--timeout 5), non-zero; rank 0 dumps, and hang-report, run on host1 and on host2
#      alike, names step 20's first collective, rank 0 inside it for at least 5 s, and rank 1
#      with host2 and its pid as the rank that left no dump;
#   2. rank 1 on host2 skips step 3 (fault injection): the report names the first collective
#      whose signatures differ (rank 0 at step 3, rank 1 at step 4) and rank 1 on host2 as the
#      rank that skipped step 3, exactly;
#   3. rank 1 on host2 slowed (fault injection: it sleeps as long again as each forward): a
#      warning within the first 2 straggler lines names rank 1 on host2 the slowest;
#   4. SIGUSR2 to mpirun on host1 while the job runs: both ranks, on both hosts, dump (reason
#      SIGUSR2), and the job goes on to its end and exits 0.
# Skipped (exit 77) where network namespaces cannot be made (not root, no CAP_SYS_ADMIN, no
# iproute2), without mpirun, or without --enable-fault-injection. Every wait is bounded; the
# namespaces and their processes are removed on exit. Prints "N passed, N failed".
set -u
dir=$(cd "$(dirname "$0")" && pwd)
hosts_sh=$dir/../scripts/two_hosts.sh
prog=$(pwd)/mpitrain
[ -x "$prog" ] || { echo "$0: $prog not found (run from the build directory)"; exit 1; }
. "$dir/fault_injection.sh"
require_fault_injection

skip() { echo "$0: $*; skipping"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "not root"
command -v ip >/dev/null 2>&1 || skip "no 'ip' (Debian: apt-get install iproute2)"
command -v unshare >/dev/null 2>&1 || skip "no 'unshare' (util-linux)"
command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1 || skip "no mpirun (Debian: apt-get install openmpi-bin)"
probe=mptprobe$$
ip netns add "$probe" 2>/dev/null || skip "cannot create a network namespace (no CAP_SYS_ADMIN?)"
ip netns del "$probe"

tmp=$(mktemp -d)
MPT_TWOHOST_NAME=mpthg$(($$ % 10000))
MPT_TWOHOST_DIR=$tmp/hosts
export MPT_TWOHOST_NAME MPT_TWOHOST_DIR
job=
descendants() {
  ps -e -o pid=,ppid= | awk -v root="$1" '{ parent[$1] = $2 }
    END { for (p in parent) { q = p; while ((q in parent) && q != root && q > 1) q = parent[q];
          if (q == root && p != root) print p } }'
}
cleanup() {
  if [ -n "$job" ]; then
    # shellcheck disable=SC2046 # a list of pids
    kill -KILL $(descendants "$job") "$job" 2>/dev/null
  fi
  "$hosts_sh" teardown
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok: $*"; }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
# wait_for FILE PATTERN TENTHS: until FILE has a line matching PATTERN (at most TENTHS / 10 s).
wait_for() {
  local i=0
  until grep -q "$2" "$1" 2>/dev/null || [ $i -ge "$3" ]; do sleep 0.1; i=$((i + 1)); done
  grep -q "$2" "$1" 2>/dev/null
}
field() { sed -n "s/^$2 //p" "$1" | head -n 1; }
seq_of() { sed -n "s/^c seq=\([0-9]*\) .* step=$2 .* purpose=$3\$/\1/p" "$1" | head -n 1; }
# report NAME DIR: hang-report of DIR run on host1 and on host2; the two must be the same.
report() {
  "$hosts_sh" exec host1 "$prog" hang-report "$2" >"$tmp/$1.report" 2>&1
  local rc=$?
  "$hosts_sh" exec host2 "$prog" hang-report "$2" >"$tmp/$1.report2" 2>&1
  cat "$tmp/$1.report"
  if [ $rc -ne 0 ]; then
    bad "$1: hang-report on host1: status $rc"
  elif ! cmp -s "$tmp/$1.report" "$tmp/$1.report2"; then
    bad "$1: hang-report on host2 differs from host1's"
    diff "$tmp/$1.report" "$tmp/$1.report2"
  else
    ok "$1: hang-report on host1 and host2 agree"
  fi
}

"$hosts_sh" setup || { rc=$?; [ $rc -eq 77 ] && exit 77; echo "setup failed ($rc)"; exit 1; }

small=(train --synthetic --train-limit 512 --test-limit 64 --epochs 1 --batch-size 32 --hidden 32
       --no-progress --threads 1)

# 1. Rank 1 on host2 stops itself (SIGSTOP) before step 20.
timeout_s=5
d=$tmp/stop
start=$(date +%s)
MPT_TWOHOST_TIMEOUT=180 MPT_MPIRUN_ARGS="-x MPT_TEST_STOP_RANK=1 -x MPT_TEST_STOP_STEP=20" \
  "$hosts_sh" run "$prog" "${small[@]}" --epochs 5 --timeout $timeout_s --debug-dir "$d" \
  >"$tmp/stop.out" 2>&1
rc=$?
took=$(($(date +%s) - start))
if grep -q "mpitrain: rank 1: stopping itself at step 20" "$tmp/stop.out" && [ $rc -ne 0 ] &&
  [ $rc -ne 124 ] && [ $took -le $((timeout_s + 60)) ]; then
  ok "stop: rank 1 stopped at step 20, the job ended in $took s, status $rc"
else
  bad "stop: status $rc after $took s (want rank 1 stopped, non-zero within $((timeout_s + 60)) s)"
  tail -n 20 "$tmp/stop.out"
fi
if [ -f "$d/flight-rank0.txt" ]; then
  report stop "$d"
  p0=$(field "$d/flight-rank0.txt" pid)
  p1=$(sed -n 's/^peer 1 pid \([0-9]*\) host .*/\1/p' "$d/flight-rank0.txt")
  s=$(seq_of "$d/flight-rank0.txt" 20 "stop vote")
  grep -qxF "first collective where the ranks differ: all-reduce #$s (1 int32, step 20, stop vote)" \
    "$tmp/stop.report" && ok "stop: #$s, step 20's stop vote, named" ||
    bad "stop: the first difference is not #$s, step 20's stop vote"
  secs=$(sed -n "s/^  inside it: rank 0 (host host1, pid $p0, for \([0-9]*\)\.[0-9] s)\$/\1/p" "$tmp/stop.report")
  [ -n "$secs" ] && [ "$secs" -ge $timeout_s ] && ok "stop: rank 0 on host1 inside it for $secs s" ||
    bad "stop: no line 'inside it: rank 0 (host host1, pid $p0, for N s)' with N >= $timeout_s"
  grep -qxF "ranks that left no dump (stopped, killed, or their folder is on another host: copy every host's dumps into one folder): rank 1 (host host2, pid $p1)" \
    "$tmp/stop.report" && ok "stop: rank 1 on host2 (pid $p1) named" ||
    bad "stop: rank 1 on host2 (pid $p1) is not named as the rank without a dump"
else
  bad "stop: rank 0 wrote no dump"
  tail -n 20 "$tmp/stop.out"
fi

# 2. Rank 1 on host2 skips step 3.
d=$tmp/skip
MPT_TWOHOST_TIMEOUT=180 MPT_MPIRUN_ARGS="-x MPT_TEST_SKIP_STEP_RANK=1 -x MPT_TEST_SKIP_STEP=3" \
  "$hosts_sh" run "$prog" "${small[@]}" --timeout 30 --debug-dir "$d" >"$tmp/skip.out" 2>&1
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ -f "$d/flight-rank0.txt" ] && [ -f "$d/flight-rank1.txt" ]; then
  ok "skip: the job failed (status $rc), both ranks dumped"
  report skip "$d"
  p1=$(field "$d/flight-rank1.txt" pid)
  s=$(seq_of "$d/flight-rank0.txt" 3 "stop vote")
  want="ranks whose collectives differ: #$s: rank 0 all-reduce #$s (1 int32, step 3, stop vote); rank 1 all-reduce #$s (1 int32, step 4, stop vote); (a rank that skipped or repeated a step, or synced alone, pairs its collectives with other steps' collectives)"
  grep -qxF "$want" "$tmp/skip.report" && ok "skip: #$s named with both steps" || bad "skip: no line '$want'"
  want="rank 1 skipped step 3 (host host2, pid $p1): its collectives go from step 2 (#$((s - 1))) to step 4 (#$s)"
  grep -qxF "$want" "$tmp/skip.report" && ok "skip: rank 1 on host2 named" || bad "skip: no line '$want'"
else
  bad "skip: status $rc, dumps: $(ls "$d" 2>&1)"
  tail -n 20 "$tmp/skip.out"
fi

# 3. Rank 1 on host2 slowed.
MPT_TWOHOST_TIMEOUT=180 MPT_MPIRUN_ARGS="-x MPT_TEST_SLOW_RANK=1 -x MPT_TEST_SLOW_PCT=100" \
  "$hosts_sh" run "$prog" train --synthetic --train-limit 2048 --test-limit 64 --epochs 1 \
  --batch-size 32 --hidden 512 --no-progress --threads 1 --log-every 8 >"$tmp/slow.out" 2>&1
rc=$?
grep "stragglers" "$tmp/slow.out"
if [ $rc -eq 0 ] && grep "stragglers: slowest rank" "$tmp/slow.out" | head -n 2 |
  grep -q "warning: stragglers: slowest rank 1 (host host2) [0-9.]* ms/step of compute, fastest rank 0 (host host1) [0-9.]* ms/step, ratio [0-9.]*: above --straggler-warn"; then
  ok "slow: rank 1 on host2 named the slowest"
else
  bad "slow: status $rc, no warning naming rank 1 on host2 in the first 2 straggler lines"
fi

# 4. SIGUSR2 to mpirun on host1.
d=$tmp/usr2
epochs=40
MPT_TWOHOST_TIMEOUT=300 "$hosts_sh" run "$prog" train --synthetic --train-limit 60000 \
  --test-limit 100 --epochs $epochs --hidden 64 --no-progress --threads 1 --debug-dir "$d" \
  >"$tmp/usr2.out" 2>&1 &
job=$!
if ! wait_for "$tmp/usr2.out" "epoch   1/$epochs" 1200; then
  bad "usr2: training did not start within 120 s"
else
  mp=
  for p in $(descendants "$job"); do [ "$(cat /proc/"$p"/comm 2>/dev/null)" = mpirun ] && mp=$p; done
  kill -USR2 "$mp"
  for _ in $(seq 1 300); do
    [ -f "$d/flight-rank0.txt" ] && [ -f "$d/flight-rank1.txt" ] && break
    sleep 0.1
  done
  wait "$job"
  rc=$?
  job=
  [ $rc -eq 0 ] && grep -q "epoch  $epochs/$epochs" "$tmp/usr2.out" &&
    ok "usr2: the job went on to its end" || bad "usr2: status $rc, or no last epoch line"
  for r in 0 1; do
    f=$d/flight-rank$r.txt
    if [ -f "$f" ] && [ "$(field "$f" reason)" = SIGUSR2 ] && [ "$(field "$f" host)" = "host$((r + 1))" ] &&
      tail -n 1 "$f" | grep -q "^end [1-9][0-9]*$"; then
      ok "usr2: rank $r on host$((r + 1)) dumped"
    else
      bad "usr2: rank $r's dump is missing, not whole, or not SIGUSR2's from host$((r + 1))"
    fi
  done
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
