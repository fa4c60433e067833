#!/bin/sh
# `mpitrain train --model gpt --threads N`: what a run promises about bits
# (include/mpitrain/ops.h, "CPU threads"; README, --threads).
# - The CPU ops other than GEMM split their work over the rank's threads
#   (src/core/cpu/cpu_pool.c) and give the bits of one thread by construction. The GEMM and
#   convolution libraries do not (oneDNN's AVX2 kernels give other bits at 2 threads), so they
#   are pinned to one thread with MPT_GEMM_THREADS=1 while the other ops use N: a small GPT
#   (2 layers, 4 heads, 128 channels, T 128, B 8: 1024 rows, large enough that most split ops
#   split) trains 6 steps with --threads 1, 2 and 3; the printed losses and gradient norms are
#   the same lines and the --save-model files the same bytes.
# - Without the switch, the same --threads twice (2, the GEMMs on 2 threads) gives the same
#   bytes and lines: a run is reproducible at a given count.
# Prints "N passed, N failed".
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

# train NAME ENV... -- ARGS...: a 6-step run saving $tmp/NAME.bin, its output in $tmp/NAME.log.
train() {
  name=$1
  shift
  envs=
  while [ "$1" != -- ]; do envs="$envs $1"; shift; done
  shift
  # shellcheck disable=SC2086 # word lists on purpose
  env $envs "$prog" train $args "$@" --save-model "$tmp/$name.bin" > "$tmp/$name.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ] && [ "$(steps "$tmp/$name.log" | wc -l)" -eq 6 ]; then
    ok
  else
    bad "$name: training run (status $rc): $(tail -5 "$tmp/$name.log")"
  fi
}

# same A B WHAT: the runs A and B saved the same model bytes and printed the same step lines.
same() {
  if [ -s "$tmp/$1.bin" ] && cmp -s "$tmp/$1.bin" "$tmp/$2.bin"; then
    ok
  else
    bad "$3: the saved model differs"
  fi
  if [ "$(steps "$tmp/$1.log")" = "$(steps "$tmp/$2.log")" ]; then
    ok
  else
    bad "$3: the step lines differ: $(steps "$tmp/$2.log") against $(steps "$tmp/$1.log")"
  fi
}

for t in 1 2 3; do
  train "pinned$t" MPT_GEMM_THREADS=1 OPENBLAS_NUM_THREADS=$t -- --threads "$t"
done
for t in 2 3; do
  same pinned1 "pinned$t" "MPT_GEMM_THREADS=1 --threads $t against --threads 1"
done
train again2a OPENBLAS_NUM_THREADS=2 -- --threads 2
train again2b OPENBLAS_NUM_THREADS=2 -- --threads 2
same again2a again2b "--threads 2 twice (the GEMMs on 2 threads)"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
