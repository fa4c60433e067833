#!/bin/sh
# Fault injection only where asked for (src/core/fault.h):
#   1. no source file reads an MPT_TEST_* variable except through the gate (mpt__test_env in the
#      library, src/core/fault.h; trainer_test_env in the program, src/cli/fault.h);
#   2. a program whose gate is off ignores every MPT_TEST_* variable: with all of them set to
#      values that would kill the rank, poison a batch and kill the checkpoint writer, a short
#      run with checkpoints ends with status 0, finite losses and its checkpoints. The program
#      is ./mpitrain itself in a build configured without --enable-fault-injection (the hooks
#      are compiled out), else tests/mpitrain_nofault (the same objects with both gates replaced
#      by tests/fault_off.c);
#   3. in a build with fault injection, ./mpitrain does obey the same variables (so the check of
#      step 2 is not vacuous).
# Prints "N passed, N failed".
set -u
srcdir=${srcdir:-.}
dir=$(dirname "$0")
. "$dir/fault_injection.sh"
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_fault.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# 1. the gate
raw=$(grep -rn 'getenv *( *"MPT_TEST_' "$srcdir/src" --include='*.c' --include='*.h' --include='*.cu' |
      grep -v '^[^:]*src/\(core\|cli\)/fault\.c:' || true)
[ -z "$raw" ] && ok ||
  bad "MPT_TEST_* read without the gate (src/core/fault.h, src/cli/fault.h): $raw"

run="train --synthetic --train-limit 256 --test-limit 64 --epochs 1 --batch-size 32 --threads 1
     --no-progress --checkpoint-every 2"
if fault_injection_built; then
  off=./tests/mpitrain_nofault
  # 3. the real program obeys the hooks
  out=$(MPT_TEST_KILL_RANK=0 MPT_TEST_KILL_STEP=3 timeout 60 ./mpitrain $run \
        --checkpoint-dir "$tmp/on" 2>&1)
  rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && printf '%s' "$out" | grep -q "killing itself at step 3" && ok ||
    bad "fault-injection build ignored MPT_TEST_KILL_*: status $rc; $(printf '%s' "$out" | tail -n 2)"
else
  off=./mpitrain
fi
[ -x "$off" ] || { echo "FAIL: $off not built"; exit 1; }

# 2. the gate closed: every hook's variable set, nothing happens
out=$(MPT_TEST_KILL_RANK=0 MPT_TEST_KILL_STEP=3 MPT_TEST_NAN_RANK=0 MPT_TEST_NAN_STEP=2 \
      MPT_TEST_PERTURB_RANK=0 MPT_TEST_PERTURB_STEP=1 MPT_TEST_EPOCH_SKEW_RANK=0 \
      MPT_TEST_CKPT_KILL=mid-write timeout 120 "$off" $run --checkpoint-dir "$tmp/off" 2>&1)
rc=$?
[ $rc -eq 0 ] && ok || bad "$off with MPT_TEST_* set: status $rc; $(printf '%s' "$out" | tail -n 3)"
printf '%s' "$out" | grep -qi "killing itself\|non-finite" &&
  bad "$off acted on MPT_TEST_*: $(printf '%s' "$out" | grep -i "killing itself\|non-finite" | head -n 2)" || ok
n=$(ls "$tmp/off" 2> /dev/null | grep -c '^ckpt-step.*\.mpt$') || true
[ "$n" -ge 1 ] && ok || bad "$off wrote no checkpoint with MPT_TEST_CKPT_KILL=mid-write set"
printf '%s' "$out" | grep -q "test loss [0-9]" && ok ||
  bad "$off: no finite test loss in the output: $(printf '%s' "$out" | tail -n 2)"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
