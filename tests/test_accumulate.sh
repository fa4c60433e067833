#!/bin/sh
# --accumulate K: a step of K micro-batches equals one step on the combined batch (the README's
# promise), also when an epoch's batches are not a multiple of K. Oracle: the final parameters
# of --batch-size 50 --accumulate 2 against --batch-size 100 on the same samples (max |diff| /
# max |param| below 1e-5; rounding alone gives about 1e-7):
# - 180 samples: batches 50 50 50 30, i.e. groups 100 and 80 (the short micro-batch must weigh
#   30/80, not 1/2: weighting it like a full one differs by about 1e-2);
# - 250 samples: batches 50 x 5, the last group is one micro-batch (dropping it differs by 8e-2);
# - the same with 2 DDP ranks (--batch-size 25 per rank) and with DataParallel over 2 devices.
# Prints "N passed, N failed".
set -u
dir=$(dirname "$0")
prog=$(pwd)/mpitrain
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_accumulate.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
base="train --synthetic --test-limit 16 --epochs 2 --hidden 32 --no-progress --threads 1"

# Relative max difference of two raw float32 files (prints a number, or "size" if they differ).
reldiff() {
  od -An -v -f -w4 "$1" > "$tmp/a.txt" && od -An -v -f -w4 "$2" > "$tmp/b.txt" || { echo size; return; }
  [ "$(wc -l < "$tmp/a.txt")" -eq "$(wc -l < "$tmp/b.txt")" ] || { echo size; return; }
  paste "$tmp/a.txt" "$tmp/b.txt" | awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d;
    a = $2 < 0 ? -$2 : $2; if (a > s) s = a } END { printf "%.3e\n", (s > 0 ? m / s : 1) }'
}
# check NAME REF_FILE FILE
check() {
  r=$(reldiff "$2" "$3")
  if [ -n "$r" ] && [ "$r" != size ] && awk -v r="$r" 'BEGIN { exit !(r < 1e-5) }'; then ok; echo "$1: rel diff $r"
  else bad "$1: --accumulate 2 differs from one batch of the combined samples by $r (want < 1e-5)"; fi
}

for n in 180 250; do
  "$prog" $base --train-limit $n --batch-size 100 --save-params "$tmp/ref$n" > "$tmp/log" 2>&1 ||
    { bad "reference run ($n samples)"; cat "$tmp/log"; continue; }
  "$prog" $base --train-limit $n --batch-size 50 --accumulate 2 --save-params "$tmp/acc$n" \
    > "$tmp/log" 2>&1 && check "$n samples, 1 rank" "$tmp/ref$n" "$tmp/acc$n" ||
    { [ -s "$tmp/acc$n" ] || { bad "$n samples, 1 rank: run failed"; tail -n 3 "$tmp/log"; }; }
  "$dir/mpirun.sh" 2 120 "$prog" $base --train-limit $n --batch-size 25 --accumulate 2 \
    --save-params "$tmp/ddp$n" > "$tmp/log" 2>&1 && check "$n samples, 2 DDP ranks" "$tmp/ref$n" "$tmp/ddp$n" ||
    { [ -s "$tmp/ddp$n" ] || { bad "$n samples, 2 ranks: run failed"; tail -n 3 "$tmp/log"; }; }
  "$prog" $base --train-limit $n --batch-size 50 --accumulate 2 --mode dp --devices cpu:2 \
    --save-params "$tmp/dp$n" > "$tmp/log" 2>&1 && check "$n samples, DP over 2 devices" "$tmp/ref$n" "$tmp/dp$n" ||
    { [ -s "$tmp/dp$n" ] || { bad "$n samples, DP: run failed"; tail -n 3 "$tmp/log"; }; }
done
# 250 samples, batch 50, --accumulate 2: 3 steps per epoch (the last of one micro-batch).
out=$("$prog" $base --train-limit 250 --batch-size 50 --accumulate 2 2>&1)
printf '%s' "$out" | grep -q "3 steps per epoch" && ok || bad "250 samples in batches of 50 x 2: $(printf '%s' "$out" | grep 'steps per epoch')"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
