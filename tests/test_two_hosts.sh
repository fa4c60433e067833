#!/bin/bash
# Two hosts over TCP (scripts/two_hosts.sh: two network namespaces joined by a veth pair, mpirun
# reaching the second host through a launch agent, Open MPI's TCP transport), one rank per host:
#   1. training across the two hosts gives parameters bit-identical to the same run with 2 ranks
#      on one host over shared memory (tests/mpirun.sh). Exact, not within a tolerance: with 2
#      ranks every element of the all-reduce is one sum a + b, which IEEE float addition makes
#      the same whichever rank adds and in which order, whatever algorithm or transport Open MPI
#      picks; the average is then that sum times 1/2 on both.
#   2. killing every process of host2 mid-run (a node failure, after a checkpoint was written)
#      ends the whole job within 30 s, non-zero, with the output naming host2's rank (1);
#   3. --resume from the checkpoint directory on both hosts continues from the last checkpoint
#      to the parameters of an uninterrupted run (bit-identical, compared with cmp).
# Skipped (exit 77) where network namespaces cannot be made (not root, no CAP_SYS_ADMIN, no
# iproute2) or there is no mpirun. Every wait is bounded; the namespaces and every process in
# them are removed on exit, also on failure or interrupt. Prints "N passed, N failed".
set -u
dir=$(cd "$(dirname "$0")" && pwd)
hosts_sh=$dir/../scripts/two_hosts.sh
prog=$(pwd)/mpitrain
[ -x "$prog" ] || { echo "$0: $prog not found (run from the build directory)"; exit 1; }

skip() { echo "$0: $*; skipping"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "not root"
command -v ip >/dev/null 2>&1 || skip "no 'ip' (Debian: apt-get install iproute2)"
command -v unshare >/dev/null 2>&1 || skip "no 'unshare' (util-linux)"
command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1 || skip "no mpirun (Debian: apt-get install openmpi-bin)"
probe=mptprobe$$
ip netns add "$probe" 2>/dev/null || skip "cannot create a network namespace (no CAP_SYS_ADMIN?)"
ip netns del "$probe"

tmp=$(mktemp -d)
MPT_TWOHOST_NAME=mpt2h$(($$ % 10000))
MPT_TWOHOST_DIR=$tmp/hosts
export MPT_TWOHOST_NAME MPT_TWOHOST_DIR
job=
# All descendants of PID (from one ps snapshot).
descendants() {
  ps -e -o pid=,ppid= | awk -v root="$1" '{ parent[$1] = $2 }
    END { for (p in parent) { q = p; while ((q in parent) && q != root && q > 1) q = parent[q];
          if (q == root && p != root) print p } }'
}
# waitfor CMD...: CMD in the background, waited for, so that a signal to this script is acted
# on at once (the trap kills CMD's processes) rather than when CMD ends.
waitfor() {
  local rc
  "$@" &
  job=$!
  wait "$job"
  rc=$?
  job=
  return $rc
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
now_ms() { echo $(($(date +%s%N) / 1000000)); }
secs() { # milliseconds -> "s.mmm"
  printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000))
}

# maxdiff A B: ", largest difference D at element I of N" for two raw float32 files (a
# diagnostic only: the verdict is cmp's), using Debian's python3 (stdlib only) where it exists.
maxdiff() {
  [ -x /usr/bin/python3 ] || return 0
  /usr/bin/python3 - "$1" "$2" <<'PY'
import array, sys
a, b = array.array("f"), array.array("f")
a.frombytes(open(sys.argv[1], "rb").read())
b.frombytes(open(sys.argv[2], "rb").read())
if len(a) != len(b):
    print(", %d vs %d floats" % (len(a), len(b)), end="")
else:
    d, i = max((abs(x - y), i) for i, (x, y) in enumerate(zip(a, b)))
    print(", largest difference %g at element %d of %d" % (d, i, len(a)), end="")
PY
}

t0=$(now_ms)
waitfor "$hosts_sh" setup || { rc=$?; [ $rc -eq 77 ] && exit 77; echo "setup failed ($rc)"; exit 1; }
echo "setup: $(secs $(($(now_ms) - t0))) s"

# 4096 samples, batch 32 per rank, 2 ranks: 64 steps per epoch, 20 epochs = 1280 steps. The
# compared runs stop after global step $stop; the killed run would go on to 1280.
stop=160
base=(train --synthetic --train-limit 4096 --test-limit 256 --epochs 20 --batch-size 32
      --no-progress --threads 1 --seed 7)

# 1. Two hosts over TCP == one host over shared memory.
t0=$(now_ms)
MPT_TWOHOST_TIMEOUT=120 waitfor "$hosts_sh" run "$prog" "${base[@]}" --stop-at-step $stop \
  --save-params "$tmp/two_hosts.params" >"$tmp/two_hosts.log" 2>&1
rc=$?
echo "two-host run of $stop steps: $(secs $(($(now_ms) - t0))) s"
t0=$(now_ms)
waitfor "$dir/mpirun.sh" 2 120 "$prog" "${base[@]}" --stop-at-step $stop \
  --save-params "$tmp/one_host.params" >"$tmp/one_host.log" 2>&1
rc1=$?
echo "one-host run of $stop steps: $(secs $(($(now_ms) - t0))) s"
if [ $rc -ne 0 ]; then
  bad "the two-host run failed (status $rc)"
  tail -n 20 "$tmp/two_hosts.log"
elif ! grep -q "rank 0/2 .*host host1" "$tmp/two_hosts.log" ||
  ! grep -q "rank 1/2 .*host host2" "$tmp/two_hosts.log"; then
  bad "the ranks did not run on host1 and host2"
  grep "mpitrain: rank" "$tmp/two_hosts.log"
elif [ $rc1 -ne 0 ]; then
  bad "the one-host run failed (status $rc1)"
  tail -n 20 "$tmp/one_host.log"
elif cmp "$tmp/two_hosts.params" "$tmp/one_host.params"; then
  ok "two hosts over TCP give the parameters of one host over shared memory (bit-identical)"
else
  bad "two-host parameters differ from the one-host run's$(maxdiff "$tmp/two_hosts.params" "$tmp/one_host.params")"
fi

# 2. Kill host2 mid-run, after a checkpoint exists.
ck=$tmp/ck
MPT_TWOHOST_TIMEOUT=120 "$hosts_sh" run "$prog" "${base[@]}" --checkpoint-dir "$ck" \
  --checkpoint-every 20 >"$tmp/kill.log" 2>&1 &
job=$!
have_ckpt=0
for _ in $(seq 1 600); do # at most 60 s
  if compgen -G "$ck/ckpt-step*.mpt" >/dev/null; then have_ckpt=1; break; fi
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
if [ $have_ckpt -eq 0 ]; then
  bad "no checkpoint appeared within 60 s (or the job ended first)"
  tail -n 20 "$tmp/kill.log"
else
  t0=$(now_ms)
  "$hosts_sh" kill host2
  ended=0
  for _ in $(seq 1 600); do # at most 60 s
    kill -0 "$job" 2>/dev/null || { ended=1; break; }
    sleep 0.1
  done
  took=$(($(now_ms) - t0))
  if [ $ended -eq 0 ]; then
    bad "the job did not end within 60 s of losing host2"
    kill -KILL "$job" 2>/dev/null
    "$hosts_sh" kill host1
  fi
  wait "$job"
  rc=$?
  job=
  echo "job ended $(secs $took) s after host2 was killed, status $rc"
  grep "two_hosts: \|on node\|Peer host" "$tmp/kill.log"
  if [ $ended -eq 1 ] && [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -le 30000 ] &&
    grep -q "lost host host2, which ran rank(s) 1$" "$tmp/kill.log"; then
    ok "losing host2 ended the job in $(secs $took) s, status $rc, naming rank 1"
  else
    bad "losing host2: ended=$ended status=$rc after $(secs $took) s (want non-zero within 30 s, naming rank 1)"
    tail -n 30 "$tmp/kill.log"
  fi
fi

# 3. Resume on both hosts from the last checkpoint == the uninterrupted run.
last=
for f in "$ck"/ckpt-step*.mpt; do [ -f "$f" ] && last=${f##*/}; done # the glob sorts: the latest
if [ -z "$last" ]; then
  bad "no checkpoint to resume from"
else
  echo "last checkpoint: $last"
  t0=$(now_ms)
  MPT_TWOHOST_TIMEOUT=120 waitfor "$hosts_sh" run "$prog" "${base[@]}" --resume "$ck" --stop-at-step $stop \
    --save-params "$tmp/resumed.params" >"$tmp/resume.log" 2>&1
  rc=$?
  echo "two-host resume to step $stop: $(secs $(($(now_ms) - t0))) s"
  step=${last#ckpt-step}
  step=$((10#${step%.mpt}))
  if [ $rc -ne 0 ]; then
    bad "the resumed run failed (status $rc)"
    tail -n 20 "$tmp/resume.log"
  elif [ "$step" -ge $stop ]; then
    bad "the kill came too late: the last checkpoint is at step $step >= $stop"
  elif ! grep -q "resumed from $ck: .*global step $step\$" "$tmp/resume.log"; then
    bad "the resumed run did not start from $last"
    grep "resumed" "$tmp/resume.log"
  elif cmp "$tmp/resumed.params" "$tmp/two_hosts.params"; then
    ok "resuming on both hosts from step $step gives the uninterrupted run's parameters (bit-identical)"
  else
    bad "resumed parameters differ from the uninterrupted run's"
  fi
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
