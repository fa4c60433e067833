#!/bin/sh
# bench/gpu-check.sh without a GPU (its GPT stages must work the first time they run on
# a lent GPU, whose minutes are few):
# - the script parses (bash -n) and prints its usage with status 2 when given no mode;
# - bench/gpu_gpt_torch.py, its PyTorch side, is the same training as mpitrain's: a tiny GPT
#   (2 layers, 32 channels, T 32, bytes) from one llm.c model file on the same unshuffled
#   windows, AdamW at a constant lr 1e-3 with clipping, on the CPU: each of 5 steps' loss and
#   gradient norm within 2e-4 and 2e-3 of what mpitrain prints (4 and 3 decimals; the two sides
#   agree to float rounding, tests/gpt_torch.py);
# - `bench/gpu-check.sh gpt .`, its GPT stages, run end to end on the CPU with the tiny GPT
#   (GPU_CHECK_GPT_DEVICE=cpu GPU_CHECK_GPT_TINY=1): every stage ok (the fused-attention one
#   may skip on PyTorch 1.13), tokens/s and the mpitrain / PyTorch ratios printed as numbers.
# The last two need Debian's python3-torch (/usr/bin/python3) and mpirun; without them only the
# first runs. Prints "N passed, N failed".
set -u
prog=${MPITRAIN:-./mpitrain}
srcdir=${srcdir:-.}
py=/usr/bin/python3
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_gpu_check.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

bash -n "$srcdir/bench/gpu-check.sh" && ok || bad "bash -n bench/gpu-check.sh"
bash "$srcdir/bench/gpu-check.sh" > "$tmp/usage.txt" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "bench/gpu-check.sh gpt BUILD_DIR" "$tmp/usage.txt"; then
  ok
else
  bad "usage: status $rc, $(head -n 3 "$tmp/usage.txt")"
fi

if ! "$py" -c 'import torch, numpy' > /dev/null 2>&1 || ! command -v mpirun > /dev/null 2>&1; then
  echo "SKIP (part): $py cannot import torch and numpy, or no mpirun"
  echo "$pass passed, $fail failed"
  [ "$fail" -eq 0 ]
  exit
fi

awk 'BEGIN { srand(7); split("the a cat dog sat on mat ran fast slow red blue big small " \
     "house tree and of to in", w, " ");
     for (i = 0; i < 1000; i++) { n = 5 + int(rand() * 6); s = "";
       for (j = 0; j < n; j++) s = s w[1 + int(rand() * 20)] " "; print s "." } }' \
  > "$tmp/text.txt"
"$prog" tokenize --bytes --val-fraction 0 -o "$tmp/shards" "$tmp/text.txt" > /dev/null ||
  { echo "FAIL: tokenize"; exit 1; }
tiny="--n-layer 2 --n-head 2 --n-embd 32 --seq-len 32 --vocab-size 256"
# shellcheck disable=SC2086 # word lists on purpose
"$prog" train --model gpt $tiny --shards "$tmp/shards/train_*.bin" --no-shuffle --batch-size 4 \
  --max-steps 1 --lr 0 --save-model "$tmp/init.bin" > "$tmp/init.log" 2>&1 ||
  { echo "FAIL: the starting model: $(cat "$tmp/init.log")"; exit 1; }
# shellcheck disable=SC2086
"$prog" train --model gpt $tiny --shards "$tmp/shards/train_*.bin" --no-shuffle --batch-size 4 \
  --max-steps 5 --schedule constant --lr 1e-3 --log-every 1 --init-from "$tmp/init.bin" \
  > "$tmp/mpt.log" 2>&1
rc1=$?
# shellcheck disable=SC2086
OMP_NUM_THREADS=1 timeout 120 "$py" "$srcdir/bench/gpu_gpt_torch.py" --model gpt-mini $tiny \
  --device cpu --batch-size 4 --steps 5 --lr 1e-3 --model-file "$tmp/init.bin" \
  --shards "$tmp/shards/train_*.bin" --print-losses > "$tmp/torch.txt" 2>&1
rc2=$?
sed -n 's/.*step *[0-9]*\/5  loss \([0-9.]*\)  norm \([0-9.]*\) .*/\1 \2/p' "$tmp/mpt.log" \
  > "$tmp/s1.txt"
sed -n 's/^step [0-9]* loss \([0-9.]*\) norm \([0-9.]*\)$/\1 \2/p' "$tmp/torch.txt" > "$tmp/s2.txt"
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ "$(wc -l < "$tmp/s1.txt")" -eq 5 ] &&
   [ "$(wc -l < "$tmp/s2.txt")" -eq 5 ] &&
   paste "$tmp/s1.txt" "$tmp/s2.txt" | awk '{ dl = $1 - $3; dn = $2 - $4; if (dl < 0) dl = -dl;
     if (dn < 0) dn = -dn; if (dl > 2e-4 || dn > 2e-3) bad = 1 } END { exit bad }'; then
  ok
else
  bad "gpu_gpt_torch.py (status $rc2) against mpitrain (status $rc1): $(paste "$tmp/s1.txt" \
    "$tmp/s2.txt" | tr '\n' ',') $(tail -n 3 "$tmp/torch.txt")"
fi

GPU_CHECK_PYTHON=$py GPU_CHECK_GPT_DEVICE=cpu GPU_CHECK_GPT_TINY=1 OUT="$tmp/out" TMPDIR="$tmp" \
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 timeout 300 bash "$srcdir/bench/gpu-check.sh" gpt . \
  > "$tmp/gpt.txt" 2>&1
rc=$?
sum="$tmp/out/summary.txt"
if [ $rc -eq 0 ] && grep -q "^GPT STAGES PASSED" "$sum" &&
   [ "$(grep -c "^STAGE \(gpt-data\|gpt-mini\|gpt2\|torch-gpt-mini\|torch-gpt2\): ok" "$sum")" -eq 5 ] &&
   grep -q "^STAGE torch-gpt2-sdpa: \(ok\|skip\)" "$sum" &&
   grep -q "^gpt-mini on cpu, B 8, 30 steps: mpitrain [0-9]* tokens/s .*mpitrain / pytorch: [0-9.]* ([0-9.]* after" "$sum" &&
   grep -q "^gpt2 on cpu, B 4, 10 steps: mpitrain [0-9]* tokens/s .*mpitrain / pytorch: [0-9.]* ([0-9.]* after" "$sum"; then
  ok
else
  bad "gpu-check.sh gpt (status $rc): $(cat "$sum" 2>/dev/null); $(tail -n 20 "$tmp/gpt.txt")"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
