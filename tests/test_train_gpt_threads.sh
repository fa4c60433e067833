#!/bin/sh
# `mpitrain train --model gpt --threads N` (issue 13): the CPU ops other than GEMM split their
# work over the rank's threads (src/core/cpu/cpu_pool.c) and must give the bits of one thread.
# A small GPT (2 layers, 4 heads, 128 channels, T 128, B 8: 1024 rows, large enough that most
# split ops split) trains 6 steps with --threads 1, 2 and 3; the printed losses and gradient
# norms are the same lines and the --save-model files the same bytes. Prints "N passed, N
# failed".
set -u
prog=${MPITRAIN:-./mpitrain}
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_train_gpt_threads.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# A text of short sentences over 20 words (deterministic: awk's srand(3)), about 98 kB.
awk 'BEGIN { srand(3); split("the a cat dog sat on mat ran fast slow red blue big small " \
     "house tree and of to in", w, " ");
     for (i = 0; i < 3000; i++) { n = 5 + int(rand() * 6); s = "";
       for (j = 0; j < n; j++) s = s w[1 + int(rand() * 20)] " "; print s "." } }' \
  > "$tmp/text.txt"
"$prog" tokenize --bytes --val-fraction 0.1 -o "$tmp/shards" "$tmp/text.txt" > /dev/null ||
  { echo "FAIL: tokenize"; exit 1; }
args="--model gpt --n-layer 2 --n-head 4 --n-embd 128 --seq-len 128 --vocab-size 256
      --shards $tmp/shards/train_*.bin --batch-size 8 --lr 3e-3 --max-steps 6 --log-every 1"

# The step lines without the timing: "step N/6 loss L norm G lr R".
steps() { sed -n 's/.*\(step .*lr [0-9.e+-]*\).*/\1/p' "$1"; }

for t in 1 2 3; do
  # shellcheck disable=SC2086 # word list on purpose
  OPENBLAS_NUM_THREADS=$t "$prog" train $args --threads "$t" --save-model "$tmp/m$t.bin" \
    > "$tmp/run$t.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && [ "$(steps "$tmp/run$t.log" | wc -l)" -eq 6 ]; then
    ok
  else
    bad "--threads $t: training run (status $rc): $(tail -5 "$tmp/run$t.log")"
  fi
done
for t in 2 3; do
  if [ -s "$tmp/m1.bin" ] && cmp -s "$tmp/m1.bin" "$tmp/m$t.bin"; then
    ok
  else
    bad "--threads $t: the saved model differs from --threads 1's"
  fi
  if [ "$(steps "$tmp/run1.log")" = "$(steps "$tmp/run$t.log")" ]; then
    ok
  else
    bad "--threads $t: the step lines differ from --threads 1's: $(steps "$tmp/run$t.log")"
  fi
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
