#!/bin/sh
# The flight recorder and `mpitrain hang-report` on real 2-rank jobs (docs/hangs.md):
#   1. rank 1 skips global step 3 (MPT_TEST_SKIP_STEP_RANK / MPT_TEST_SKIP_STEP): its collectives
#      pair with step 4's on rank 0 with the same counts, so training goes on wrongly until the
#      counts differ at the epoch's end, and the job fails. Both ranks dump (reason "error"), and
#      the report names the first collective whose signatures differ (number, step, purpose, on
#      each rank) and rank 1 as the one that skipped step 3, exactly; --json says the same;
#   2. the same under --check-collectives: the job fails at that first collective, and the error
#      names it with each rank's step and purpose;
#   3. rank 1 stops (SIGSTOP, raised by itself before step 20: MPT_TEST_STOP_RANK / _STEP, so
#      that it stops between collectives, as a rank stuck in compute; one stopped from outside
#      inside a collective looks like the ranks waiting in it): rank 0 times out after --timeout
#      (5 s) in step 20's stop vote, dumps (reason "collective timeout"), and the report names
#      that collective, rank 0 inside it for at least 5 s, and rank 1, with its host and pid, as
#      the rank that left no dump;
#   4. SIGUSR2 to mpirun while the job runs: every rank writes its dump (reason SIGUSR2), the
#      job goes on to its last epoch and exits 0; the report over those dumps reads them whole;
#   5. SIGSEGV sent to rank 1: its fatal-signal handler writes its dump, whole, before it dies.
# The collective numbers are read from the dumps (they depend on the set-up's collectives); the
# lines that name them must then be exactly these. Needs --enable-fault-injection.
# Prints "N passed, N failed".
set -u
dir=$(dirname "$0")
. "$dir/fault_injection.sh"
require_fault_injection
command -v "${MPIRUN:-mpirun}" > /dev/null 2>&1 || { echo "$0: no mpirun; skipping"; exit 77; }
prog=$(pwd)/mpitrain
[ -x "$prog" ] || { echo "$0: $prog not found (run from the build directory)"; exit 1; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_flight.XXXXXX")
job=
cleanup() {
  [ -n "$job" ] && kill "$job" 2> /dev/null
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
# field FILE KEY: the value of a dump's header line "KEY VALUE".
field() { sed -n "s/^$2 //p" "$1" | head -n 1; }
# seq_of FILE STEP PURPOSE: the number of the collective tagged STEP / PURPOSE in a dump.
seq_of() {
  sed -n "s/^c seq=\([0-9]*\) .* step=$2 .* purpose=$3\$/\1/p" "$1" | head -n 1
}
train="$prog train --synthetic --train-limit 512 --test-limit 64 --epochs 1 --batch-size 32
  --hidden 32 --no-progress --threads 1"
skip_env="-x MPT_TEST_SKIP_STEP_RANK=1 -x MPT_TEST_SKIP_STEP=3"

# 1. Rank 1 skips step 3.
d=$tmp/skip
# shellcheck disable=SC2086 # $train is a list of words
MPT_MPIRUN_ARGS=$skip_env "$dir/mpirun.sh" 2 120 $train --timeout 30 --debug-dir "$d" \
  > "$tmp/skip.out" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && ok || bad "skip: status $rc (want non-zero, not a timeout)"
if [ -f "$d/flight-rank0.txt" ] && [ -f "$d/flight-rank1.txt" ]; then
  ok
  "$prog" hang-report "$d" > "$tmp/skip.report" 2>&1
  rc=$?
  cat "$tmp/skip.report"
  [ $rc -eq 0 ] && ok || bad "skip: hang-report status $rc"
  h0=$(field "$d/flight-rank0.txt" host)
  h1=$(field "$d/flight-rank1.txt" host)
  p1=$(field "$d/flight-rank1.txt" pid)
  s=$(seq_of "$d/flight-rank0.txt" 3 "stop vote")   # rank 0's step 3 ...
  s1=$(seq_of "$d/flight-rank1.txt" 4 "stop vote")  # ... is rank 1's step 4
  if [ -z "$s" ] || [ "$s" != "$s1" ]; then
    bad "skip: rank 0's step 3 stop vote is #$s, rank 1's step 4 stop vote #$s1 (want the same)"
  else
    ok
    want="ranks whose collectives differ: #$s: rank 0 all-reduce #$s (1 int32, step 3, stop vote); rank 1 all-reduce #$s (1 int32, step 4, stop vote); (a rank that skipped or repeated a step, or synced alone, pairs its collectives with other steps' collectives)"
    grep -qxF "$want" "$tmp/skip.report" && ok || bad "skip: no line '$want'"
    want="rank 1 skipped step 3 (host $h1, pid $p1): its collectives go from step 2 (#$((s - 1))) to step 4 (#$s)"
    grep -qxF "$want" "$tmp/skip.report" && ok || bad "skip: no line '$want'"
  fi
  grep -qx "  rank 0 host $h0 pid [0-9]*: dump reason 'error: .*', [0-9]* collective(s) recorded, next #[0-9]*" \
    "$tmp/skip.report" && ok || bad "skip: rank 0's dump is not a whole one written on the error"
  if command -v python3 > /dev/null 2>&1; then
    "$prog" hang-report "$d" --json > "$tmp/skip.json"
    python3 - "$tmp/skip.json" "$s" "$p1" <<'PY' && ok || bad "skip: --json (above)"
import json, sys
r = json.load(open(sys.argv[1]))
s, p1 = int(sys.argv[2]), int(sys.argv[3])
sm = r["signature_mismatch"]
got = (r["world"], len(r["dumps"]), sm["seq"],
       [(x["rank"], x["collective"]["step"], x["collective"]["purpose"]) for x in sm["ranks"]],
       [(j["rank"], j["pid"], j["from_step"], j["to_step"], j["seq"]) for j in r["step_jumps"]])
want = (2, 2, s, [(0, 3, "stop vote"), (1, 4, "stop vote")], [(1, p1, 2, 4, s)])
if got != want:
    print("FAIL: --json: %r, want %r" % (got, want))
    sys.exit(1)
PY
  fi
else
  bad "skip: not both dumps written: $(ls "$d" 2>&1)"
  tail -n 20 "$tmp/skip.out"
fi

# 2. The same under --check-collectives: named at that collective, with the steps.
# shellcheck disable=SC2086
MPT_MPIRUN_ARGS=$skip_env "$dir/mpirun.sh" 2 120 $train --timeout 30 --debug-dir "$tmp/checked" \
  --check-collectives > "$tmp/checked.out" 2>&1
rc=$?
[ $rc -ne 0 ] && [ $rc -ne 124 ] && ok || bad "checked: status $rc (want non-zero, not a timeout)"
grep -q "error: ranks disagree: collectives disagree across ranks (checked mode): rank 0 all-reduces 1 int32 (max) as collective #[0-9]* at step 3 (stop vote), rank 1 all-reduces 1 int32 (max) as collective #[0-9]* at step 4 (stop vote)" \
  "$tmp/checked.out" && ok || { bad "checked: no error naming steps 3 and 4"; grep error "$tmp/checked.out"; }

# 3. Rank 1 stops itself (SIGSTOP) before step 20: rank 0 times out in step 20's first
# collective and dumps; the report names rank 1.
timeout_s=5
d=$tmp/stop
start=$(date +%s)
# shellcheck disable=SC2086
MPT_MPIRUN_ARGS="-x MPT_TEST_STOP_RANK=1 -x MPT_TEST_STOP_STEP=20" "$dir/mpirun.sh" 2 120 \
  $train --epochs 5 --timeout $timeout_s --debug-dir "$d" > "$tmp/stop.out" 2>&1
rc=$?
took=$(($(date +%s) - start))
grep -q "mpitrain: rank 1: stopping itself at step 20" "$tmp/stop.out" && ok ||
  bad "stop: rank 1 did not stop itself at step 20"
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $took -le $((timeout_s + 30)) ] && ok ||
  bad "stop: status $rc after $took s (want non-zero, within $((timeout_s + 30)) s)"
if [ -f "$d/flight-rank0.txt" ]; then
  "$prog" hang-report "$d" > "$tmp/stop.report" 2>&1
  rc=$?
  cat "$tmp/stop.report"
  [ $rc -eq 0 ] && ok || bad "stop: hang-report status $rc"
  h0=$(field "$d/flight-rank0.txt" host)
  p0=$(field "$d/flight-rank0.txt" pid)
  p1=$(sed -n 's/^peer 1 pid \([0-9]*\) host .*/\1/p' "$d/flight-rank0.txt")
  s=$(seq_of "$d/flight-rank0.txt" 20 "stop vote")
  grep -q "^reason collective timeout: " "$d/flight-rank0.txt" && ok ||
    bad "stop: rank 0's dump reason: $(field "$d/flight-rank0.txt" reason)"
  grep -qxF "first collective where the ranks differ: all-reduce #$s (1 int32, step 20, stop vote)" \
    "$tmp/stop.report" && ok || bad "stop: the first difference is not #$s, step 20's stop vote"
  secs=$(sed -n "s/^  inside it: rank 0 (host $h0, pid $p0, for \([0-9]*\)\.[0-9] s)\$/\1/p" "$tmp/stop.report")
  [ -n "$secs" ] && [ "$secs" -ge $timeout_s ] && ok ||
    bad "stop: no line 'inside it: rank 0 (host $h0, pid $p0, for N s)' with N >= $timeout_s"
  grep -qxF "ranks that left no dump (stopped, killed, or their folder is on another host: copy every host's dumps into one folder): rank 1 (host $h0, pid $p1)" \
    "$tmp/stop.report" && ok || bad "stop: rank 1 (pid $p1) is not named as the rank without a dump"
else
  bad "stop: rank 0 wrote no dump: $(ls "$d" 2>&1)"
  tail -n 20 "$tmp/stop.out"
fi

# 4. SIGUSR2 to a live job: every rank dumps, the job goes on and ends normally.
d=$tmp/usr2
epochs=40
"$dir/mpirun.sh" 2 300 "$prog" train --synthetic --train-limit 60000 --test-limit 100 \
  --epochs $epochs --hidden 64 --no-progress --threads 1 --debug-dir "$d" \
  > "$tmp/usr2.out" 2>&1 &
job=$!
i=0
until grep -q "epoch   1/$epochs" "$tmp/usr2.out" || [ $i -ge 600 ]; do sleep 0.1; i=$((i + 1)); done
mpirun_pid=
for p in $(descendants "$job"); do
  [ "$(cat /proc/"$p"/comm 2> /dev/null)" = mpirun ] && mpirun_pid=$p
done
if [ -z "$mpirun_pid" ]; then
  bad "usr2: mpirun not found"
else
  kill -USR2 "$mpirun_pid"
  i=0
  until { [ -f "$d/flight-rank0.txt" ] && [ -f "$d/flight-rank1.txt" ]; } || [ $i -ge 300 ]; do
    sleep 0.1
    i=$((i + 1))
  done
  wait "$job"
  rc=$?
  job=
  [ $rc -eq 0 ] && grep -q "epoch  $epochs/$epochs" "$tmp/usr2.out" && ok ||
    { bad "usr2: the job did not go on to its end (status $rc)"; tail -n 5 "$tmp/usr2.out"; }
  grep -q "info: SIGUSR2: flight recorder written to $d/flight-rank0.txt (the run goes on)" \
    "$tmp/usr2.out" && ok || bad "usr2: rank 0 did not log its dump"
  for r in 0 1; do
    f=$d/flight-rank$r.txt
    if [ -f "$f" ] && [ "$(field "$f" reason)" = SIGUSR2 ] && [ "$(field "$f" rank)" = "$r of 2" ] &&
      tail -n 1 "$f" | grep -q "^end [1-9][0-9]*$"; then
      ok
    else
      bad "usr2: rank $r's dump is missing, not whole, or not SIGUSR2's: $(head -n 5 "$f" 2>&1)"
    fi
  done
  "$prog" hang-report "$d" > "$tmp/usr2.report" 2>&1
  rc=$?
  [ $rc -eq 0 ] && head -n 1 "$tmp/usr2.report" | grep -qxF "hang report for $d: 2 dump(s), world of 2 rank(s)" &&
    ! grep -q "CUT SHORT\|unreadable" "$tmp/usr2.report" && ok ||
    { bad "usr2: hang-report status $rc"; cat "$tmp/usr2.report"; }
fi

# 5. A fatal signal (SIGSEGV sent to rank 1): the rank writes its dump, whole, then dies of it.
d=$tmp/segv
"$dir/mpirun.sh" 2 120 "$prog" train --synthetic --train-limit 60000 --test-limit 100 \
  --epochs 500 --hidden 64 --no-progress --threads 1 --debug-dir "$d" > "$tmp/segv.out" 2>&1 &
job=$!
i=0
until grep -q "epoch   1/500" "$tmp/segv.out" || [ $i -ge 600 ]; do sleep 0.1; i=$((i + 1)); done
victim=
for p in $(descendants "$job"); do
  [ "$(cat /proc/"$p"/comm 2> /dev/null)" = mpitrain ] &&
    tr '\0' '\n' < /proc/"$p"/environ 2> /dev/null | grep -qx OMPI_COMM_WORLD_RANK=1 && victim=$p
done
if [ -z "$victim" ]; then
  bad "segv: rank 1 not found"
  kill "$job"
else
  kill -SEGV "$victim"
fi
wait "$job"
rc=$?
job=
f=$d/flight-rank1.txt
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ -f "$f" ] && [ "$(field "$f" reason)" = "fatal signal SIGSEGV" ] &&
  [ "$(field "$f" pid)" = "$victim" ] && tail -n 1 "$f" | grep -q "^end [1-9][0-9]*$" && ok ||
  bad "segv: status $rc; rank 1 (pid $victim) left no whole dump with reason 'fatal signal SIGSEGV': $(head -n 5 "$f" 2>&1)"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
