#!/bin/sh
# The trainer's --grad-comm: a bad value is an error naming the choices; at one rank
# the option is named as without effect; at 2 ranks a bf16 run logs it, keeps the replicas
# identical (--check-replicas 1 compares a CRC of the parameters every step) and ends with a
# test loss close to the fp32 run's (same seed and data: within 5% relative); the final
# parameters are not bit-identical to fp32 (bf16 was applied). Prints "N passed, N failed".
set -u
dir=$(dirname "$0")
prog=${MPITRAIN:-./mpitrain}
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
has() { printf '%s\n' "$1" | grep -q -- "$2"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_gradcomm.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
small="train --synthetic --train-limit 640 --test-limit 128 --epochs 1 --batch-size 32 --threads 1 --no-progress"

out=$("$prog" $small --grad-comm fp16 2>&1)
[ $? -eq 2 ] && has "$out" "--grad-comm: 'fp16' is not fp32 or bf16" && ok ||
  bad "a bad --grad-comm was not refused with status 2: $out"
out=$("$prog" $small --grad-comm bf16 2>&1)
has "$out" "warning: --grad-comm has no effect: one rank" && ok ||
  bad "one rank: no warning for --grad-comm: $(printf '%s' "$out" | grep warning)"

for mode in fp32 bf16; do
  if ! "$dir/mpirun.sh" 2 120 "$prog" $small --grad-comm $mode --check-replicas 1 \
    --metrics-json "$tmp/$mode.json" --save-params "$tmp/$mode.bin" >"$tmp/$mode.out" 2>&1; then
    bad "--grad-comm $mode at 2 ranks failed: $(tail -5 "$tmp/$mode.out")"
  fi
done
has "$(cat "$tmp/bf16.out")" "gradients bf16 on the wire" && ok ||
  bad "the bf16 run does not log its gradient communication"
loss() { sed -n 's/.*"test_loss": \([0-9.eE+-]*\).*/\1/p' "$1" | tail -1; }
l32=$(loss "$tmp/fp32.json")
l16=$(loss "$tmp/bf16.json")
if [ -n "$l32" ] && [ -n "$l16" ] &&
  awk -v a="$l32" -v b="$l16" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.05 * a) }'; then
  ok
else
  bad "test loss fp32 '$l32' vs bf16 '$l16': not within 5%"
fi
if [ -s "$tmp/fp32.bin" ] && [ -s "$tmp/bf16.bin" ] && ! cmp -s "$tmp/fp32.bin" "$tmp/bf16.bin"; then
  ok
else
  bad "the bf16 run's parameters are missing or bit-identical to fp32's (bf16 not applied?)"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
