#!/bin/sh
# Exact resume: training M steps uninterrupted gives bit-identical parameters to training N < M
# steps with checkpoints, stopping, and resuming from the checkpoint directory — with 1 and 2
# ranks, mid-epoch and at an epoch boundary, for an MLP with SGD and a CNN with BatchNorm and
# AdamW. Also: a resume that would change the global batch, a corrupt checkpoint, and a missing one
# fail with a clear message. Prints "N passed, N failed".
set -u
dir=$(dirname "$0")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
run() { # np args...
  np=$1
  shift
  if [ "$np" -eq 1 ]; then ./mpitrain "$@"; else "$dir/mpirun.sh" "$np" 120 ./mpitrain "$@"; fi
}
# 512 samples, batch 32: 16 steps per epoch with 1 rank, 8 with 2; 2 epochs.
base="train --synthetic --train-limit 512 --test-limit 64 --epochs 2 --batch-size 32 --no-progress --threads 1 --seed 7"
check_resume() { # name np stop_step extra_args...
  name=$1
  np=$2
  stop=$3
  shift 3
  run "$np" $base "$@" --save-params "$tmp/$name.full" >"$tmp/$name.full.log" 2>&1 ||
    { bad "$name: uninterrupted run failed"; tail -n 5 "$tmp/$name.full.log"; return; }
  run "$np" $base "$@" --checkpoint-dir "$tmp/$name.ck" --checkpoint-every 3 --stop-at-step "$stop" \
    >"$tmp/$name.part.log" 2>&1 || { bad "$name: interrupted run failed"; tail -n 5 "$tmp/$name.part.log"; return; }
  run "$np" $base "$@" --resume "$tmp/$name.ck" --save-params "$tmp/$name.resumed" \
    >"$tmp/$name.resume.log" 2>&1 || { bad "$name: resumed run failed"; tail -n 5 "$tmp/$name.resume.log"; return; }
  if cmp -s "$tmp/$name.full" "$tmp/$name.resumed"; then ok; else bad "$name: resumed parameters differ from the uninterrupted run's"; fi
}
check_resume mlp_1rank_mid 1 5
check_resume mlp_1rank_boundary 1 16
check_resume mlp_2ranks_mid 2 5
check_resume cnn_bn_adamw_2ranks 2 11 --model cnn --batchnorm --optimizer adamw --lr 0.001 \
  --dropout 0.2
# Keep-last-K: checkpoints at steps 3, 6, 9, 11 with --keep 3 (the default) leave 3 files.
n=$(ls "$tmp/cnn_bn_adamw_2ranks.ck" | grep -c '^ckpt-step.*\.mpt$')
[ "$n" -eq 3 ] && ok || bad "keep-last-3 left $n checkpoints"
# A new run into a directory that holds another run's checkpoints is refused before training,
# and those checkpoints are left byte-identical (never rotated away); so is --resume from
# another directory into it.
d="$tmp/cnn_bn_adamw_2ranks.ck"
sums=$(cd "$d" && cksum ckpt-step*.mpt)
out=$(run 1 $base --checkpoint-dir "$d" 2>&1)
[ $? -eq 1 ] && printf '%s' "$out" | grep -q "already holds checkpoints of another run" && ok ||
  bad "a second run into $d was not refused: $(printf '%s' "$out" | tail -n 2)"
out=$(run 1 $base --resume "$tmp/mlp_1rank_mid.ck" --checkpoint-dir "$d" 2>&1)
[ $? -eq 1 ] && printf '%s' "$out" | grep -q "Continue that run with --resume" && ok ||
  bad "--resume from another directory into $d was not refused: $(printf '%s' "$out" | tail -n 2)"
# Resuming from an older checkpoint of the directory would overwrite the later ones: refused.
older=$(ls "$d"/ckpt-step*.mpt | head -n 1)
out=$(run 2 $base --model cnn --batchnorm --optimizer adamw --lr 0.001 --dropout 0.2 \
      --resume "$older" --checkpoint-dir "$d" 2>&1)
[ $? -eq 1 ] && printf '%s' "$out" | grep -q "is not the latest checkpoint" && ok ||
  bad "--resume of an older checkpoint into $d was not refused: $(printf '%s' "$out" | tail -n 2)"
[ "$(cd "$d" && cksum ckpt-step*.mpt)" = "$sums" ] && ok || bad "the checkpoints in $d changed"
# Another world size with the same per-rank batch would change the global batch (1 x 32 -> 2 x
# 32): refused, naming the checkpoint's global batch and the settings that keep it.
out=$(run 2 $base --resume "$tmp/mlp_1rank_mid.ck" 2>&1)
[ $? -ne 0 ] && printf '%s' "$out" | grep -q "global batch of 32 samples per step" &&
  printf '%s' "$out" | grep -q "Settings that keep it: --batch-size 16 --accumulate 1" && ok ||
  bad "another global batch was not refused clearly: $(printf '%s' "$out" | grep -m1 error)"
# A corrupt checkpoint (one byte flipped in the middle) is refused, naming the file.
f=$(ls "$tmp/mlp_1rank_mid.ck"/ckpt-step*.mpt | tail -n 1)
size=$(wc -c <"$f")
printf '\377' | dd of="$f" bs=1 seek=$((size / 2)) conv=notrunc 2>/dev/null
out=$(run 1 $base --resume "$f" 2>&1)
rc=$?
[ $rc -eq 1 ] && printf '%s' "$out" | grep -q "ckpt-step" && ok ||
  bad "corrupt checkpoint: status $rc, output: $(printf '%s' "$out" | tail -n 2)"
# A missing checkpoint directory is refused.
out=$(run 1 $base --resume "$tmp/nothing-here" 2>&1)
[ $? -eq 1 ] && printf '%s' "$out" | grep -q "nothing-here" && ok || bad "missing checkpoint: $(printf '%s' "$out" | tail -n 2)"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
