#!/bin/sh
# --checkpoint-async on (checkpoints written on a background thread from a host snapshot):
# - 2 ranks, a checkpoint every 3 steps: each file is byte for byte the one --checkpoint-async
#   off writes, and the final parameters are the same bytes;
# - a resume from an async checkpoint (step 6) ends with the uninterrupted run's parameters;
# - the background write killed at each of its stages (MPT_TEST_CKPT_KILL=snapshot, mid-write,
#   before-fsync, before-rename; needs --enable-fault-injection) while the checkpoint of step 9
#   is made leaves the one of step 6 the newest, verified by `mpitrain ckpt info`, and a resume
#   from it ends bit for bit as the uninterrupted run;
# - a background write that fails (MPT_TEST_CKPT_FAIL=rename) fails the run (non-zero exit);
# - a bad value is refused (exit 2).
# Prints "N passed, N failed".
set -u
dir=$(dirname "$0")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
base="train --synthetic --train-limit 512 --test-limit 64 --epochs 1 --batch-size 16 --no-progress --threads 1 --seed 3 --checkpoint-every 3 --keep 10"
run() { "$dir/mpirun.sh" 2 300 ./mpitrain $base "$@"; }

run --checkpoint-dir "$tmp/sync" --save-params "$tmp/sync.bin" >"$tmp/sync.log" 2>&1
st=$?
[ "$st" -eq 77 ] && { echo "skipped: no MPI launcher"; exit 77; }
[ "$st" -eq 0 ] || { bad "sync run failed ($st)"; tail -n 5 "$tmp/sync.log"; }
run --checkpoint-dir "$tmp/async" --checkpoint-async on --save-params "$tmp/async.bin" \
  >"$tmp/async.log" 2>&1 || { bad "async run failed"; tail -n 5 "$tmp/async.log"; }
grep -q "written in the background" "$tmp/async.log" && ok || bad "async run: no background line"
n=0
for f in "$tmp"/sync/ckpt-step*.mpt; do
  n=$((n + 1))
  cmp -s "$f" "$tmp/async/$(basename "$f")" && ok || bad "$(basename "$f") differs (sync vs async)"
done
[ "$n" -eq 5 ] && ok || bad "expected 5 checkpoints (steps 3, 6, 9, 12, 15), found $n"
[ "$(ls "$tmp/async" | grep -c '^ckpt-step')" -eq "$n" ] && ok || bad "async wrote another number of files"
ls "$tmp/async" | grep -q tmp && bad "a temporary file was left" || ok
cmp -s "$tmp/sync.bin" "$tmp/async.bin" && ok || bad "final parameters differ (sync vs async)"

# Resume from the async checkpoint of step 6.
mkdir "$tmp/r6"
cp "$tmp/async/ckpt-step00000006.mpt" "$tmp/r6/"
run --checkpoint-dir "$tmp/r6" --checkpoint-async on --resume "$tmp/r6/ckpt-step00000006.mpt" \
  --save-params "$tmp/r6.bin" >"$tmp/r6.log" 2>&1 || { bad "resume from step 6 failed"; tail -n 5 "$tmp/r6.log"; }
cmp -s "$tmp/sync.bin" "$tmp/r6.bin" && ok || bad "resume from an async checkpoint differs"

# A kill at each stage of the write of step 9's checkpoint.
for stage in snapshot mid-write before-fsync before-rename; do
  d="$tmp/k-$stage"
  mkdir "$d"
  cp "$tmp/async/ckpt-step00000006.mpt" "$d/"
  cp "$tmp/async/run-options.txt" "$d/" 2>/dev/null
  MPT_TEST_CKPT_KILL=$stage MPT_MPIRUN_ARGS="-x MPT_TEST_CKPT_KILL" run --checkpoint-dir "$d" \
    --checkpoint-async on --resume auto >"$tmp/k.log" 2>&1
  if ! grep -q "killing itself during a checkpoint write (MPT_TEST_CKPT_KILL=$stage)" "$tmp/k.log"; then
    echo "kill at $stage skipped (built without --enable-fault-injection)"
    continue
  fi
  newest=$(ls "$d" | grep "^ckpt-step.*[.]mpt$" | sort | tail -n 1)
  [ "$newest" = "ckpt-step00000006.mpt" ] && ok || bad "$stage: newest checkpoint is $newest"
  ./mpitrain ckpt info "$d" >"$tmp/info" 2>&1 && grep -qx "global step: 6" "$tmp/info" && ok ||
    bad "$stage: ckpt info of the folder: $(cat "$tmp/info")"
  run --checkpoint-dir "$d" --resume auto --save-params "$tmp/k.bin" >"$tmp/k2.log" 2>&1 ||
    { bad "$stage: resume failed"; tail -n 5 "$tmp/k2.log"; }
  cmp -s "$tmp/sync.bin" "$tmp/k.bin" && ok || bad "$stage: resume differs from the uninterrupted run"
done

# A background write that fails (an injected rename error) ends the run with status 1 and the
# write's error, leaving no file behind.
MPT_TEST_CKPT_FAIL=rename MPT_MPIRUN_ARGS="-x MPT_TEST_CKPT_FAIL" run --checkpoint-dir "$tmp/f" \
  --checkpoint-async on >"$tmp/f.log" 2>&1
st=$?
if grep -q "injected failure" "$tmp/f.log"; then
  [ "$st" -ne 0 ] && ok || bad "a failed background write exited 0"
  grep -q "background checkpoint write failed: .*cannot rename" "$tmp/f.log" && ok ||
    bad "no 'background checkpoint write failed' line"
  [ -z "$(ls "$tmp/f" | grep '^ckpt-step')" ] && ok || bad "files left after the failed write: $(ls "$tmp/f")"
else
  echo "failed-write case skipped (built without --enable-fault-injection)"
fi

./mpitrain $base --checkpoint-dir "$tmp/x" --checkpoint-async maybe >/dev/null 2>"$tmp/err"
[ $? -eq 2 ] && grep -q "checkpoint-async: 'maybe' is not on or off" "$tmp/err" && ok ||
  bad "--checkpoint-async maybe: $(cat "$tmp/err")"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
