#!/bin/sh
# Preemption at random moments, under load (docs/faults.md F52): `mpitrain train` gets SIGUSR1
# or SIGTERM (alternately) at a random moment of its first 3 s of training, MPT_PREEMPT_RUNS
# times (default 20), with two busy loops on the cores beside it. Every run must exit 75, say
# it was preempted, and print no abort, crash or sanitizer report. The signal used to be
# handled on the training thread, inside oneDNN's GEMM kernels, which had moved the stack
# pointer into the heap: a run in 3 to 10 aborted in free() after "preempted". Runs the
# ./mpitrain of the build it is in (with --enable-sanitizers: under AddressSanitizer).
# MPT_PREEMPT_RUNS=200 for the long run. Prints "N passed, N failed".
set -u
prog=${MPITRAIN:-./mpitrain}
runs=${MPT_PREEMPT_RUNS:-20}
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_preempt_stress.XXXXXX")
loads=""
cleanup() {
  for p in $loads; do kill "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# A libtool wrapper relinks on its first run; make that happen before any signal is sent, so
# that the pid signalled below is the trainer's own.
"$prog" --version >/dev/null 2>&1 || { echo "FAIL: $prog --version"; exit 1; }

# The load: two busy loops (nice 10, so that the trainer still gets time on a 2-core machine).
for _ in 1 2; do
  nice -n 10 sh -c 'while :; do :; done' &
  loads="$loads $!"
done

# A pseudo-random delay in [0, 3) s with millisecond steps, from the run number and the clock.
delay() {
  awk -v s="$1$(date +%N)" 'BEGIN { srand(s % 2147483647); printf "%.3f", 3 * rand() }'
}

i=0
while [ "$i" -lt "$runs" ]; do
  i=$((i + 1))
  sig=USR1
  [ $((i % 2)) -eq 0 ] && sig=TERM
  log="$tmp/run$i.log"
  "$prog" train --synthetic --train-limit 100000 --test-limit 64 --epochs 2 --no-progress \
    --threads 1 --batch-size 256 >"$log" 2>&1 &
  pid=$!
  n=0 # until the run has started (MPI initialised, model built): at most 120 s
  while [ "$n" -lt 600 ] && ! grep -q "configuration:" "$log" 2>/dev/null &&
    kill -0 "$pid" 2>/dev/null; do
    sleep 0.2
    n=$((n + 1))
  done
  d=$(delay "$i")
  sleep "$d"
  # a burst: the first signal, then one every few ms while the run finishes its step and exits
  # (each one that lands inside a GEMM is another chance to hit the fault)
  b=0
  while [ "$b" -lt 30 ] && kill -"$sig" "$pid" 2>/dev/null; do
    b=$((b + 1))
    sleep 0.001
  done
  wait "$pid"
  rc=$?
  if [ "$rc" -eq 75 ] && grep -q "preempted (SIG$sig): exit status 75" "$log" &&
    ! grep -q -E "AddressSanitizer|LeakSanitizer|runtime error:|free\(\)|corrupted|Aborted|Segmentation|received signal" "$log"; then
    ok
  else
    bad "run $i: SIG$sig after ${d} s: exit status $rc (want 75); its last lines:"
    tail -n 12 "$log" | sed 's/^/  /'
  fi
done
echo "$runs signalled runs: $pass passed, $fail failed"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
