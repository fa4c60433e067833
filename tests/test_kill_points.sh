#!/bin/bash
# Fail-fast at each point where a rank can die (2 ranks on one host, tests/mpirun.sh), with a
# checkpoint directory in use. Each time the whole job must end within 30 s, non-zero (not by
# the test's timeout), with output naming the dead rank; the checkpoint written before the
# fault must be intact (byte-identical to the one a clean run writes at that step: checkpoint
# files are deterministic) and loadable: resuming from the directory must give parameters
# bit-identical to an uninterrupted run.
#   mid-step         rank 1 SIGKILLs itself before global step 12 (MPT_TEST_KILL_RANK/STEP),
#                    checkpoints every 5 steps: step 10 must be the latest, intact.
#   mid-all-reduce   a communication-bound run (MLP 784-2048-2048-10, 8 samples per rank, all-
#                    reduce after backward; about two thirds of a step is all-reduce) resumed
#                    from a clean step-10 checkpoint and writing no other: once it is in its
#                    steps, rank 1 is stopped (SIGSTOP), so rank 0 runs on into the next all-
#                    reduce and waits there for rank 1's data; after 1 s (about 10 steps' time)
#                    rank 0 is SIGKILLed from outside while inside that all-reduce, then rank 1
#                    is continued and meets a peer that died mid-all-reduce. Where gdb is
#                    installed, rank 0's stacks are taken first to check that it is inside
#                    MPI_Allreduce.
#   mid-checkpoint   resuming from a directory holding the clean checkpoints of steps 5 and 10,
#                    rank 0 (the writer) SIGKILLs itself while writing step 15's checkpoint
#                    (MPT_TEST_CKPT_KILL=mid-write: part of the temporary file written), and
#                    again just before the rename (before-rename: the temporary file complete).
#                    Step 10's file must be untouched, no step-15 checkpoint may appear, and
#                    the resume must pick step 10.
# Prints "N passed, N failed".
set -u
dir=$(cd "$(dirname "$0")" && pwd)
. "$dir/fault_injection.sh"
require_fault_injection # mid-step and mid-checkpoint are MPT_TEST_* hooks
prog=$(pwd)/mpitrain
[ -x "$prog" ] || { echo "$0: $prog not found (run from the build directory)"; exit 1; }
command -v "${MPIRUN:-mpirun}" >/dev/null 2>&1 || { echo "$0: no mpirun; skipping"; exit 77; }

tmp=$(mktemp -d)
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
secs() { printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)); }
ckpt() { printf '%s/ckpt-step%08d.mpt' "$1" "$2"; } # DIR STEP: the checkpoint's path

# The mpitrain process of rank RANK among the descendants of JOB.
rank_pid() { # JOB RANK
  local p
  for p in $(descendants "$1"); do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = mpitrain ] || continue
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$2" && echo "$p"
  done
}

# check_fail_fast NAME RANK RC ELAPSED_MS LOG: ended in time, non-zero, naming RANK.
check_fail_fast() {
  local name=$1 rank=$2 rc=$3 ms=$4 log=$5
  echo "$name: the job ended with status $rc, $(secs "$ms") s after the fault"
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
    bad "$name: status $rc (want non-zero, not the test's timeout)"
    tail -n 15 "$log"
  elif [ "$ms" -gt 30000 ]; then
    bad "$name: the job took $(secs "$ms") s (> 30 s) to end"
  elif ! grep -Eq "process rank $rank |rank $rank .*(exited on signal|killed)" "$log"; then
    bad "$name: no message names rank $rank"
    tail -n 15 "$log"
  else
    ok "$name: ended in $(secs "$ms") s, status $rc, naming rank $rank"
  fi
}

# check_resume NAME DIR STEP REF ARGS...: resuming from DIR starts at STEP and gives REF's params.
check_resume() {
  local name=$1 ck=$2 step=$3 ref=$4
  shift 4
  waitfor "$dir/mpirun.sh" 2 120 "$prog" "$@" --resume "$ck" --save-params "$tmp/$name.resumed" \
    >"$tmp/$name.resume.log" 2>&1 || {
    bad "$name: resuming from $ck failed"
    tail -n 5 "$tmp/$name.resume.log"
    return
  }
  if ! grep -q "resumed from $ck: .*global step $step\$" "$tmp/$name.resume.log"; then
    bad "$name: the resume did not start from step $step"
    grep resumed "$tmp/$name.resume.log"
  elif cmp "$tmp/$name.resumed" "$ref"; then
    ok "$name: resuming from step $step's checkpoint gives the uninterrupted run's parameters"
  else
    bad "$name: the resumed parameters differ from the uninterrupted run's"
  fi
}

# Small model: 2048 samples, batch 32 per rank: 32 steps per epoch, 64 in all.
small=(train --synthetic --train-limit 2048 --test-limit 256 --epochs 2 --batch-size 32
       --no-progress --threads 1 --seed 7)
t0=$(now_ms)
waitfor "$dir/mpirun.sh" 2 120 "$prog" "${small[@]}" --save-params "$tmp/small.ref" >"$tmp/small.ref.log" 2>&1 ||
  { echo "the uninterrupted run failed"; tail -n 10 "$tmp/small.ref.log"; exit 1; }
waitfor "$dir/mpirun.sh" 2 120 "$prog" "${small[@]}" --checkpoint-dir "$tmp/refck" --checkpoint-every 5 \
  --keep 10 --stop-at-step 15 >"$tmp/refck.log" 2>&1 ||
  { echo "the reference checkpoint run failed"; tail -n 10 "$tmp/refck.log"; exit 1; }
echo "references: $(secs $(($(now_ms) - t0))) s"

# --- mid-step: rank 1 dies before step 12; checkpoints at 5 and 10.
ck=$tmp/mid_step
t0=$(now_ms)
MPT_TEST_KILL_RANK=1 MPT_TEST_KILL_STEP=12 MPT_MPIRUN_ARGS="-x MPT_TEST_KILL_RANK -x MPT_TEST_KILL_STEP" \
  waitfor "$dir/mpirun.sh" 2 60 "$prog" "${small[@]}" --checkpoint-dir "$ck" --checkpoint-every 5 \
  >"$tmp/mid_step.log" 2>&1
rc=$?
check_fail_fast mid-step 1 $rc $(($(now_ms) - t0)) "$tmp/mid_step.log"
if [ -e "$(ckpt "$ck" 15)" ] || ! cmp "$(ckpt "$ck" 10)" "$(ckpt "$tmp/refck" 10)"; then
  bad "mid-step: step 10's checkpoint is not the latest or not intact"
  ls -l "$ck"
else
  ok "mid-step: step 10's checkpoint is the latest and byte-identical to a clean run's"
fi
check_resume mid-step "$ck" 10 "$tmp/small.ref" "${small[@]}"

# --- mid-checkpoint: rank 0 dies while writing step 15's checkpoint (resuming from step 10).
for point in mid-write before-rename; do
  ck=$tmp/$point
  mkdir -p "$ck"
  cp "$(ckpt "$tmp/refck" 5)" "$(ckpt "$tmp/refck" 10)" "$ck/"
  t0=$(now_ms)
  MPT_TEST_CKPT_KILL=$point MPT_MPIRUN_ARGS="-x MPT_TEST_CKPT_KILL" \
    waitfor "$dir/mpirun.sh" 2 60 "$prog" "${small[@]}" --resume "$ck" --checkpoint-dir "$ck" \
    --checkpoint-every 5 >"$tmp/$point.log" 2>&1
  rc=$?
  check_fail_fast "mid-checkpoint ($point)" 0 $rc $(($(now_ms) - t0)) "$tmp/$point.log"
  grep -q "killing itself during a checkpoint write (MPT_TEST_CKPT_KILL=$point)" "$tmp/$point.log" ||
    bad "$point: the writer was not killed at that point"
  if [ -e "$(ckpt "$ck" 15)" ]; then
    bad "$point: a step-15 checkpoint appeared although its writer was killed"
  elif ! cmp "$(ckpt "$ck" 10)" "$(ckpt "$tmp/refck" 10)" || ! cmp "$(ckpt "$ck" 5)" "$(ckpt "$tmp/refck" 5)"; then
    bad "$point: the previous checkpoints were changed"
  else
    left=
    for f in "$ck"/*; do left="$left ${f##*/}"; done
    ok "$point: the previous checkpoints are byte-identical; left behind:$left"
  fi
  check_resume "$point" "$ck" 10 "$tmp/small.ref" "${small[@]}"
  # The next run into the directory removes the killed writer's temporary file, naming it.
  waitfor "$dir/mpirun.sh" 2 60 "$prog" "${small[@]}" --resume "$ck" --checkpoint-dir "$ck" \
    --stop-at-step 11 >"$tmp/$point.next.log" 2>&1 || bad "$point: the next run into $ck failed"
  if ls "$ck" | grep -q '\.tmp\.'; then
    bad "$point: the killed writer's temporary file is still there: $(ls "$ck" | tr '\n' ' ')"
  elif grep -q "removed .*ckpt-step00000015.mpt.tmp.* left by a writer (pid [0-9]*) that was killed" "$tmp/$point.next.log"; then
    ok "$point: the next run removed the killed writer's temporary file and said so"
  else
    bad "$point: the temporary file went without a log line: $(grep -i removed "$tmp/$point.next.log")"
  fi
done

# --- mid-all-reduce: a communication-bound run (5.8 M parameters, 23 MB of gradients per step):
# 960 samples, batch 8 per rank: 60 steps. The faulty run resumes from a clean checkpoint of
# step 10 and writes no other (--checkpoint-every 1000), so that the only collectives rank 0 can
# wait in are the steps' all-reduces.
# shellcheck disable=SC2054 # "2048,2048" is one argument
big=(train --synthetic --train-limit 960 --test-limit 64 --epochs 1 --batch-size 8 --no-progress
     --threads 1 --seed 7 --hidden 2048,2048 --no-overlap --bucket-cap-mb 1)
t0=$(now_ms)
waitfor "$dir/mpirun.sh" 2 120 "$prog" "${big[@]}" --save-params "$tmp/big.ref" >"$tmp/big.ref.log" 2>&1 ||
  { bad "mid-all-reduce: the uninterrupted run failed"; tail -n 10 "$tmp/big.ref.log"; }
waitfor "$dir/mpirun.sh" 2 120 "$prog" "${big[@]}" --checkpoint-dir "$tmp/refbig" --checkpoint-every 10 \
  --stop-at-step 10 >"$tmp/refbig.log" 2>&1 ||
  { bad "mid-all-reduce: the reference checkpoint run failed"; tail -n 10 "$tmp/refbig.log"; }
echo "mid-all-reduce references: $(secs $(($(now_ms) - t0))) s; $(grep -o 'per-step breakdown.*' "$tmp/big.ref.log")"
ck=$tmp/mid_allreduce
mkdir -p "$ck"
cp "$(ckpt "$tmp/refbig" 10)" "$ck/"
"$dir/mpirun.sh" 2 60 "$prog" "${big[@]}" --resume "$ck" --checkpoint-dir "$ck" \
  --checkpoint-every 1000 >"$tmp/mid_allreduce.log" 2>&1 &
job=$!
r0=
r1=
for _ in $(seq 1 600); do # at most 60 s for the resume to load
  grep -q "resumed from" "$tmp/mid_allreduce.log" && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
if grep -q "resumed from" "$tmp/mid_allreduce.log"; then
  sleep 0.1 # into the steps
  r0=$(rank_pid "$job" 0)
  r1=$(rank_pid "$job" 1)
fi
if [ -z "$r0" ] || [ -z "$r1" ] || ! kill -STOP "$r1"; then
  bad "mid-all-reduce: the run did not get to its steps within 60 s, or its ranks were not found"
  tail -n 10 "$tmp/mid_allreduce.log"
else
  sleep 1 # rank 0 runs on into the next all-reduce and waits there for rank 1
  # Where rank 0 waits, when gdb is there to show it: its comm thread must be inside
  # MPI_Allreduce (the main thread in mpt_ddp_finalize: the gradients').
  if command -v gdb >/dev/null 2>&1; then
    timeout 30 gdb -batch -p "$r0" -ex "thread apply all bt" >"$tmp/r0.bt" 2>&1
    if ! grep -q "Thread 2 " "$tmp/r0.bt"; then
      echo "mid-all-reduce: gdb could not attach to rank 0; not checking where it waits"
    elif grep -q "PMPI_Allreduce" "$tmp/r0.bt"; then
      ok "mid-all-reduce: rank 0 is inside MPI_Allreduce$(grep -q mpt_tape_backward "$tmp/r0.bt" &&
        echo " of the gradients") when it is killed"
    else
      bad "mid-all-reduce: rank 0 is not inside MPI_Allreduce when it is killed"
      grep -E "^#[0-9]+ " "$tmp/r0.bt" | head -n 40
    fi
  fi
  t0=$(now_ms)
  kill -KILL "$r0"
  kill -CONT "$r1"
  ended=0
  for _ in $(seq 1 600); do # at most 60 s
    kill -0 "$job" 2>/dev/null || { ended=1; break; }
    sleep 0.1
  done
  took=$(($(now_ms) - t0))
  if [ $ended -eq 0 ]; then
    bad "mid-all-reduce: the job did not end within 60 s"
    # shellcheck disable=SC2046 # a list of pids
    kill -KILL $(descendants "$job") 2>/dev/null
  fi
  wait "$job"
  rc=$?
  job=
  [ $ended -eq 1 ] && check_fail_fast mid-all-reduce 0 $rc $took "$tmp/mid_allreduce.log"
  if grep -q "epoch   1/1 " "$tmp/mid_allreduce.log"; then
    bad "mid-all-reduce: the run finished its epoch before the fault"
  elif ! cmp "$(ckpt "$ck" 10)" "$(ckpt "$tmp/refbig" 10)"; then
    bad "mid-all-reduce: step 10's checkpoint was changed"
  else
    ok "mid-all-reduce: step 10's checkpoint is byte-identical"
  fi
  check_resume mid-all-reduce "$ck" 10 "$tmp/big.ref" "${big[@]}"
fi

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
