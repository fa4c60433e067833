#!/bin/sh
# `mpitrain train --model llama-tiny` (2 layers, 4 heads sharing 2 key/value heads, 64 channels,
# T 64, byte vocabulary) on a generated text, through the trainer's one loop. Checks:
# - learning: the validation loss starts at about ln(256) = 5.545 (Hugging Face's
#   initialisation predicts nearly uniformly) and is at least 1 nat lower after 40 steps;
# - equivalence with one process on the combined batch: 6 AdamW steps of 12 sequences per step,
#   unshuffled, as 1 rank x 12 against 2 ranks x 6, 3 ranks x 4, 2 ranks x 3 x --accumulate 2,
#   2 ranks x 6 under --zero 1, 2 and 3, and 1 rank x 6 x --accumulate 2 with --recompute and
#   --threads 2: the final parameters (--save-params) within 2e-5 of the one process's. Why
#   2e-5: the runs sum the same gradients in other orders (per-rank GEMMs then a mean, micro-
#   batches accumulated), a few ulps, which AdamW's m / sqrt(v) turns into at most a few 1e-6
#   where a gradient is near zero; a missing, repeated or extra window, or a sum instead of a
#   mean, moves parameters by about lr = 1e-3 per step. --grad-comm bf16 (gradients rounded to
#   bf16 on the wire, 8 bits of mantissa): the mean |difference| within 2e-5 (measured 1.2e-6)
#   and the largest within 2e-3 (measured 9.9e-4: where a gradient is near zero its rounding can
#   flip the sign of AdamW's step, a difference of up to 2 lr in a step, in a few dozen of the
#   131,392 parameters);
# - --recompute gives the same bytes as without;
# - checkpoints on 2 ranks: 8 steps straight (a checkpoint every 4) against 4 steps, stop, and
#   --resume auto for the rest: the same bytes;
# - bad input: no shards, a GPT's size option, an unknown preset (status 2), a model past the
#   host's memory, --device cuda (status 1), each with its message.
# Prints "N passed, N failed".
set -u
prog=${MPITRAIN:-./mpitrain}
srcdir=${srcdir:-.}
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_train_llama.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mpirun="$srcdir/tests/mpirun.sh"

# A text of short sentences over 20 words (deterministic: awk's srand(7)), about 98 kB.
awk 'BEGIN { srand(7); split("the a cat dog sat on mat ran fast slow red blue big small " \
     "house tree and of to in", w, " ");
     for (i = 0; i < 3000; i++) { n = 5 + int(rand() * 6); s = "";
       for (j = 0; j < n; j++) s = s w[1 + int(rand() * 20)] " "; print s "." } }' \
  > "$tmp/text.txt"
"$prog" tokenize --bytes --val-fraction 0.1 -o "$tmp/shards" "$tmp/text.txt" > /dev/null ||
  { echo "FAIL: tokenize"; exit 1; }
data="--shards $tmp/shards/train_*.bin --val-shards $tmp/shards/val_*.bin"
common="--model llama-tiny --threads 1 --no-progress --progress-interval 0"

vals() { sed -n 's/.*val loss \([0-9.]*\) nats.*/\1/p' "$1"; }
cmp_lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 < b + 0) }'; }

# learning
# shellcheck disable=SC2086 # word lists on purpose
"$prog" train $common $data --batch-size 4 --lr 3e-3 --warmup-steps 5 --max-steps 40 \
  --val-every 40 --val-steps 4 > "$tmp/learn.log" 2>&1
rc=$?
v0=$(vals "$tmp/learn.log" | head -n 1)
v1=$(vals "$tmp/learn.log" | tail -n 1)
if [ $rc -eq 0 ] && cmp_lt 5.445 "${v0:-0}" && cmp_lt "${v0:-0}" 5.645 &&
   cmp_lt "${v1:-9}" "$(awk -v a="${v0:-0}" 'BEGIN { print a - 1.0 }')"; then
  ok
  echo "learning: val loss $v0 -> $v1 in 40 steps"
else
  bad "learning (status $rc): val loss '$v0' -> '$v1': $(tail -n 3 "$tmp/learn.log")"
fi

# maxdiff A B: the count of two raw float32 parameter files, their largest |difference| and
# their mean |difference|.
maxdiff() {
  od -An -v -tf4 -w4 "$1" > "$tmp/p1.txt"
  od -An -v -tf4 -w4 "$2" > "$tmp/p2.txt"
  paste "$tmp/p1.txt" "$tmp/p2.txt" |
    awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; s += d; n++ }
         END { printf "%d %.3g %.3g\n", n, m, n ? s / n : 0 }'
}
eq="$common --shards $tmp/shards/train_*.bin --no-shuffle --max-steps 6 --lr 1e-3 --log-every 1"
# shellcheck disable=SC2086
"$prog" train $eq --batch-size 12 --save-params "$tmp/ref.bin" > "$tmp/ref.log" 2>&1 ||
  { echo "FAIL: the one-process run: $(tail -n 3 "$tmp/ref.log")"; exit 1; }
# NP|OPTIONS|TOLERANCE OF THE LARGEST|OF THE MEAN
cases='2|--batch-size 6|2e-5|2e-5
3|--batch-size 4|2e-5|2e-5
2|--batch-size 3 --accumulate 2|2e-5|2e-5
2|--batch-size 6 --zero 1|2e-5|2e-5
2|--batch-size 6 --zero 2|2e-5|2e-5
2|--batch-size 6 --zero 3|2e-5|2e-5
1|--batch-size 6 --accumulate 2 --recompute --threads 2|2e-5|2e-5
2|--batch-size 6 --grad-comm bf16|2e-3|2e-5'
printf '%s\n' "$cases" > "$tmp/cases"
i=0
while IFS='|' read -r np opts tol mtol; do
  i=$((i + 1))
  if [ "$np" -eq 1 ]; then launch="$prog"; else launch="$mpirun $np 120 $prog"; fi
  # shellcheck disable=SC2086
  $launch train $eq $opts --save-params "$tmp/c$i.bin" > "$tmp/c$i.log" 2>&1 < /dev/null
  rc=$?
  d=$(maxdiff "$tmp/ref.bin" "$tmp/c$i.bin")
  set -- $d
  if [ $rc -eq 0 ] && grep -q "done: 6 steps" "$tmp/c$i.log" && [ "${1:-0}" -eq 131392 ] &&
     cmp_lt "${2:-1}" "$tol" && cmp_lt "${3:-1}" "$mtol"; then
    ok
    echo "$np rank(s) $opts: parameters at most $2 (mean $3) from one process x 12"
  else
    bad "$np rank(s) $opts (status $rc): parameters at most '${2:-}' (mean '${3:-}') from one" \
      "process x 12 (tolerances $tol, $mtol): $(tail -n 3 "$tmp/c$i.log")"
  fi
done < "$tmp/cases"

# --recompute: the same bytes
# shellcheck disable=SC2086
"$prog" train $eq --batch-size 6 --save-params "$tmp/plain.bin" > "$tmp/plain.log" 2>&1 &&
  "$prog" train $eq --batch-size 6 --recompute --save-params "$tmp/rec.bin" > "$tmp/rec.log" 2>&1 &&
  cmp -s "$tmp/plain.bin" "$tmp/rec.bin" && ok ||
  bad "--recompute changed the parameters: $(cmp "$tmp/plain.bin" "$tmp/rec.bin" 2>&1)"

# checkpoints: 8 steps straight against 4, stop, --resume auto
ck="$common $data --batch-size 4 --max-steps 8 --checkpoint-every 4 --val-steps 2"
# shellcheck disable=SC2086
$mpirun 2 120 "$prog" train $ck --checkpoint-dir "$tmp/ckA" --save-params "$tmp/straight.bin" \
  > "$tmp/straight.log" 2>&1
rc1=$?
# shellcheck disable=SC2086
$mpirun 2 120 "$prog" train $ck --checkpoint-dir "$tmp/ckB" --stop-at-step 4 \
  > "$tmp/stopped.log" 2>&1
rc2=$?
# shellcheck disable=SC2086
$mpirun 2 120 "$prog" train $ck --checkpoint-dir "$tmp/ckB" --resume auto \
  --save-params "$tmp/resumed.bin" > "$tmp/resumed.log" 2>&1
rc3=$?
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ $rc3 -eq 0 ] &&
   grep -q "resumed from .*: epoch 1, global step 4" "$tmp/resumed.log" &&
   cmp -s "$tmp/straight.bin" "$tmp/resumed.bin"; then
  ok
else
  bad "checkpoint resume (status $rc1 $rc2 $rc3): $(cmp "$tmp/straight.bin" "$tmp/resumed.bin" 2>&1);" \
    "$(tail -n 3 "$tmp/resumed.log")"
fi

# bad input: a clear message and status 2 (usage) or 1
expect() { # STATUS PATTERN WHAT -- ARGS...
  want=$1 pat=$2 what=$3
  shift 4
  out=$("$@" 2>&1 < /dev/null)
  rc=$?
  if [ $rc -eq "$want" ] && printf '%s\n' "$out" | grep -q -- "$pat"; then
    ok
  else
    bad "$what: status $rc (want $want), output: $(printf '%s\n' "$out" | tail -n 2)"
  fi
}
expect 2 "--model llama-tiny needs --shards GLOB" "no shards" -- "$prog" train --model llama-tiny
expect 2 "--n-layer does not apply to --model llama-tiny: " "a GPT size" -- \
  "$prog" train $common $data --n-layer 3
expect 2 "unknown model 'llama-huge'" "an unknown preset" -- \
  "$prog" train --model llama-huge $data
expect 1 "--model llama-mini (9638784 parameters, B 8 x T 256) needs at least" \
  "a model past the host's memory" -- env MPITRAIN_HOST_MEMORY=64M "$prog" train \
  --model llama-mini --threads 1 $data
# without a GPU the device is refused; with one, the model (CPU only)
expect 1 "cuda\|CPU only" "--device cuda" -- "$prog" train $common $data --device cuda

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
