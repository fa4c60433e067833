#!/bin/sh
# --recompute (each transformer block a checkpoint, mpt_tape_checkpoint): a 3-layer GPT trained
# 8 steps with and without it ends with the same model file bytes, at 1 rank and at 2 ranks
# (DDP: the blocks' gradients reach the buckets after the recomputed block's backward), with
# --accumulate 2 at 2 ranks too. The start-up line names it; --recompute with the mlp is
# status 2. Prints "N passed, N failed".
set -u
dir=$(dirname "$0")
prog=${MPITRAIN:-./mpitrain}
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_recompute.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

out=$("$prog" train --synthetic --train-limit 64 --epochs 1 --recompute 2>&1)
[ $? -eq 2 ] && printf '%s\n' "$out" | grep -q -- "--recompute does not apply to --model mlp" &&
  ok || bad "--recompute with the mlp was not refused with status 2: $out"

awk 'BEGIN { srand(5); for (i = 0; i < 400; i++) { s = "";
  for (j = 0; j < 8; j++) s = s substr("abcdefgh", 1 + int(rand() * 8), 1); print s } }' \
  >"$tmp/text.txt"
"$prog" tokenize --bytes --val-fraction 0.1 -o "$tmp/shards" "$tmp/text.txt" >/dev/null ||
  bad "tokenize failed"
gpt="train --model gpt --n-layer 3 --n-head 2 --n-embd 16 --seq-len 16 --vocab-size 256 --batch-size 2 --max-steps 8 --threads 1 --shards $tmp/shards/train_000000.bin"
run() { # name np args...
  name=$1
  np=$2
  shift 2
  "$dir/mpirun.sh" "$np" 120 "$prog" $gpt "$@" --save-model "$tmp/$name.bin" \
    >"$tmp/$name.out" 2>&1 || bad "$name failed: $(tail -5 "$tmp/$name.out")"
}
same() { # a b what
  if [ -s "$tmp/$1.bin" ] && cmp -s "$tmp/$1.bin" "$tmp/$2.bin"; then ok; else
    bad "$3: the model file with --recompute is not the bytes of the run without"
  fi
}
run plain1 1
run re1 1 --recompute
same plain1 re1 "1 rank"
grep -q -- "--recompute (blocks' activations recomputed in backward)" "$tmp/re1.out" && ok ||
  bad "the configuration line does not name --recompute"
run plain2 2
run re2 2 --recompute
same plain2 re2 "2 ranks"
run plain2a 2 --accumulate 2
run re2a 2 --accumulate 2 --recompute
same plain2a re2a "2 ranks, --accumulate 2"
if cmp -s "$tmp/plain1.bin" "$tmp/plain2.bin"; then
  bad "the 1- and 2-rank runs are the same bytes: the comparison cannot tell runs apart"
else ok; fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
