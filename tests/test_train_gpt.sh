#!/bin/sh
# `mpitrain train --model gpt`: a tiny GPT (2 layers, 2 heads, 32 channels, T 32,
# byte vocabulary) trained for 50 steps on a generated text, on 1 and 2 ranks. Checks: exit 0;
# the validation loss starts at about ln(256) = 5.545 (a fresh GPT-2 initialisation predicts
# nearly uniformly) and ends at least 1.5 nats lower; --save-model writes an llm.c model file
# (header fields and size exact) that --init-from loads: the resumed run's first validation
# loss is the saving run's last, to the printed digit (same validation windows, same
# parameters); and bad inputs (no shards, a model file of another shape or truncated, a token
# outside the vocabulary, bad sizes) give a clear error and status 1 or 2; on 2 ranks the
# end-of-run report has the DDP line (all-reduce per step, buckets, share hidden behind
# backward). Checkpoints on 2
# ranks: stopping at step 10 and resuming gives the bytes of the straight run. --accumulate 2
# with B 4 trains as B 8 (1 and 2 ranks) and resumes exactly from a checkpoint; --device cuda
# without a GPU is a clear error. --profile prints the op table (nodes per step exact). Prints
# "N passed, N failed".
set -u
prog=${MPITRAIN:-./mpitrain}
srcdir=${srcdir:-.}
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_train_gpt.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# A text of short sentences over 20 words (deterministic: awk's srand(7)), about 98 kB.
awk 'BEGIN { srand(7); split("the a cat dog sat on mat ran fast slow red blue big small " \
     "house tree and of to in", w, " ");
     for (i = 0; i < 3000; i++) { n = 5 + int(rand() * 6); s = "";
       for (j = 0; j < n; j++) s = s w[1 + int(rand() * 20)] " "; print s "." } }' \
  > "$tmp/text.txt"
"$prog" tokenize --bytes --val-fraction 0.1 -o "$tmp/shards" "$tmp/text.txt" > /dev/null ||
  { echo "FAIL: tokenize"; exit 1; }
tiny="--model gpt --n-layer 2 --n-head 2 --n-embd 32 --seq-len 32 --vocab-size 256"
data="--shards $tmp/shards/train_*.bin --val-shards $tmp/shards/val_*.bin"
run_args="$tiny $data --batch-size 4 --lr 3e-3 --warmup-steps 5 --log-every 10"

# The validation losses a run printed, one per line, in order.
vals() { sed -n 's/.*val loss \([0-9.]*\) nats.*/\1/p' "$1"; }
first_val() { vals "$1" | head -n 1; }
last_val() { vals "$1" | tail -n 1; }
# awk comparisons on decimals: exit 0 when true
cmp_lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 < b + 0) }'; }

for np in 1 2; do
  if [ "$np" -eq 1 ]; then launch="$prog"; else launch="$srcdir/tests/mpirun.sh 2 60 $prog"; fi
  # shellcheck disable=SC2086 # word lists on purpose
  $launch train $run_args --max-steps 50 --val-every 25 --save-model "$tmp/m$np.bin" \
    > "$tmp/run$np.log" 2>&1
  rc=$?
  v0=$(first_val "$tmp/run$np.log")
  v1=$(last_val "$tmp/run$np.log")
  if [ $rc -eq 0 ] && [ "$(vals "$tmp/run$np.log" | wc -l)" -eq 3 ] &&
     grep -q "step     50/50  loss" "$tmp/run$np.log" &&
     grep -q "tokens/s" "$tmp/run$np.log"; then
    ok
  else
    bad "np $np: training run (status $rc): $(cat "$tmp/run$np.log")"
  fi
  # ln(256) = 5.545 at the start (within 0.1), and at least 1.5 nats lower after 50 steps
  if cmp_lt 5.445 "${v0:-0}" && cmp_lt "${v0:-0}" 5.645 &&
     cmp_lt "${v1:-9}" "$(awk -v a="${v0:-0}" 'BEGIN { print a - 1.5 }')"; then
    ok
  else
    bad "np $np: validation loss from '$v0' to '$v1' (want ~5.545, then 1.5 lower)"
  fi
  # The end-of-run DDP line on 2 ranks (all-reduce time per step, printed to 0.1 ms: this
  # model's one bucket can take under 0.05 ms, so 0.0 is a valid figure; bucket count; hidden
  # share in [0, 100] %), none on 1.
  ddp=$(sed -n 's/.*DDP (rank 0, mean over 50 steps): all-reduce \([0-9.]*\) ms per step in 1 bucket(s), \([0-9]*\) % of it hidden behind backward.*/\1 \2/p' "$tmp/run$np.log")
  if [ "$np" -eq 1 ] && [ -z "$ddp" ] ||
     { [ "$np" -eq 2 ] && echo "$ddp" | awk 'NF == 2 && $1 >= 0 && $2 >= 0 && $2 <= 100 { ok = 1 } END { exit !ok }'; }; then
    ok
  else
    bad "np $np: DDP summary '$ddp'"
  fi
  # The model file: llm.c header [magic 20240326, version 3, T 32, V 256, L 2, H 2, C 32,
  # Vp 256], then 34688 float32 parameters.
  hdr=$(od -An -v -td4 -N 32 "$tmp/m$np.bin" 2>/dev/null | tr -s ' \n' ' ' | sed 's/^ //; s/ $//')
  size=$(wc -c < "$tmp/m$np.bin" 2>/dev/null || echo 0)
  if [ "$hdr" = "20240326 3 32 256 2 2 32 256" ] && [ "$size" -eq $((1024 + 4 * 34688)) ]; then
    ok
  else
    bad "np $np: model file header '$hdr', $size bytes"
  fi
  # --init-from: the first validation loss is the saving run's last
  # shellcheck disable=SC2086
  $launch train $run_args --max-steps 10 --init-from "$tmp/m$np.bin" > "$tmp/resume$np.log" 2>&1
  rc=$?
  r0=$(first_val "$tmp/resume$np.log")
  if [ $rc -eq 0 ] && [ -n "$r0" ] && [ "$r0" = "$v1" ]; then
    ok
  else
    bad "np $np: --init-from (status $rc) starts at val loss '$r0', the saved model ended at '$v1'"
  fi
done

# The GPT defaults reach the optimizer: AdamW, betas (0.9, 0.95), decay 0.1 on the 2-D weights
# only (wte 256x32, wpe 32x32, 2 x (qkvw 96x32, attprojw 32x32, fcw 128x32, fcprojw 32x128) =
# 33792; the 896 biases and LayerNorm parameters not), clipping at 1; options override them.
grep -q "optimizer adamw: lr 0.003, betas (0.9, 0.95), eps 1e-08, weight decay 0.1 on 33792 parameters (>= 2-D), none on 896; gradient clipping at norm 1$" "$tmp/run1.log" &&
  ok || bad "GPT optimizer defaults: $(grep optimizer "$tmp/run1.log")"
# shellcheck disable=SC2086
"$prog" train $run_args --max-steps 1 --optimizer sgd --weight-decay 0.01 --grad-clip 0 \
  > "$tmp/sgd.log" 2>&1
grep -q "optimizer sgd: lr 0.003, .*weight decay 0.01 on 33792 parameters (>= 2-D), none on 896; gradient clipping off$" "$tmp/sgd.log" &&
  ok || bad "GPT optimizer options: $(cat "$tmp/sgd.log")"

# Checkpoints, 2 ranks: 20 steps straight (a checkpoint every 10) against 10 steps, stop, and
# --resume auto for the rest: the final models are the same bytes (parameters, AdamW state and
# the windows of the rest of the epoch restored), as is the loss line of step 20.
ck="$run_args --max-steps 20 --checkpoint-every 10 --val-steps 4"
# shellcheck disable=SC2086
"$srcdir/tests/mpirun.sh" 2 60 "$prog" train $ck --checkpoint-dir "$tmp/ckA" \
  --save-model "$tmp/straight.bin" > "$tmp/straight.log" 2>&1
rc1=$?
# shellcheck disable=SC2086
"$srcdir/tests/mpirun.sh" 2 60 "$prog" train $ck --checkpoint-dir "$tmp/ckB" --stop-at-step 10 \
  > "$tmp/stopped.log" 2>&1
rc2=$?
# shellcheck disable=SC2086
"$srcdir/tests/mpirun.sh" 2 60 "$prog" train $ck --checkpoint-dir "$tmp/ckB" --resume auto \
  --save-model "$tmp/resumed.bin" > "$tmp/resumed.log" 2>&1
rc3=$?
l1=$(grep "step     20/20  loss" "$tmp/straight.log" | sed 's/lr .*//')
l3=$(grep "step     20/20  loss" "$tmp/resumed.log" | sed 's/lr .*//')
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ $rc3 -eq 0 ] && [ -f "$tmp/ckB/ckpt-step00000010.mpt" ] &&
   grep -q "resumed from .*: epoch 1, global step 10" "$tmp/resumed.log" &&
   cmp -s "$tmp/straight.bin" "$tmp/resumed.bin" && [ -n "$l1" ] && [ "$l1" = "$l3" ]; then
  ok
else
  bad "checkpoint resume (status $rc1 $rc2 $rc3): '$l1' vs '$l3'; $(tail -n 3 "$tmp/resumed.log")"
fi

# --accumulate 2 with B 4 against B 8 without accumulation, 1 and 2 ranks, unshuffled (window w
# of B 8 is windows 2w and 2w+1 of B 4; at 2 ranks a step takes windows 4s..4s+3 of B 4 in both
# cases): each step's loss and gradient norm as printed (4 and 3 digits; the norm, before
# clipping, would double without the 1/K scale), and the parameters after 6 AdamW steps within
# 2e-5. Why 2e-5: the two sides sum the same gradients in another order (two micro-batches
# accumulated against one GEMM over 8 rows), a few ulps, which AdamW's m / sqrt(v) turns into at
# most 1.8e-6 where a gradient is near zero (measured, one process); a missing, repeated or
# extra window moves parameters by about lr = 1e-3 per step.
# maxdiff A B: the largest |difference| of the parameters of two model files (float32 after the
# 1024-byte header), and how many there are.
maxdiff() {
  od -An -v -tf4 -w4 -j1024 "$1" > "$tmp/p1.txt"
  od -An -v -tf4 -w4 -j1024 "$2" > "$tmp/p2.txt"
  paste "$tmp/p1.txt" "$tmp/p2.txt" |
    awk '{ d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; n++ } END { printf "%d %.3g\n", n, m }'
}
acc="$tiny --shards $tmp/shards/train_*.bin --no-shuffle --max-steps 6 --log-every 1 --lr 1e-3"
steps_of() { grep "step  *[0-9]*/6  loss" "$1" | sed 's/lr .*//'; }
for np in 1 2; do
  if [ "$np" -eq 1 ]; then launch="$prog"; else launch="$srcdir/tests/mpirun.sh 2 60 $prog"; fi
  # shellcheck disable=SC2086
  $launch train $acc --batch-size 8 --save-model "$tmp/b8_$np.bin" > "$tmp/b8_$np.log" 2>&1
  rc1=$?
  # shellcheck disable=SC2086
  $launch train $acc --batch-size 4 --accumulate 2 --save-model "$tmp/b4k2_$np.bin" \
    > "$tmp/b4k2_$np.log" 2>&1
  rc2=$?
  d=$(maxdiff "$tmp/b8_$np.bin" "$tmp/b4k2_$np.bin")
  if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ "$(steps_of "$tmp/b8_$np.log" | wc -l)" -eq 6 ] &&
     [ "$(steps_of "$tmp/b8_$np.log")" = "$(steps_of "$tmp/b4k2_$np.log")" ] &&
     grep -q "batch 4 per rank x $np rank(s) x 2 micro-batch(es)" "$tmp/b4k2_$np.log" &&
     [ "${d%% *}" -eq 34688 ] && cmp_lt "${d#* }" 2e-5; then
    ok
  else
    bad "np $np: --accumulate 2 (status $rc2) against B 8 (status $rc1): parameters '$d' apart;" \
      "$(steps_of "$tmp/b8_$np.log") vs $(steps_of "$tmp/b4k2_$np.log"); $(tail -n 2 "$tmp/b4k2_$np.log")"
  fi
done
# ... and its checkpoints: 6 steps straight against 3, stop, --resume auto (2 ranks): the same
# bytes (the resumed run skips the 3 x 2 windows per rank already trained on).
# shellcheck disable=SC2086
"$srcdir/tests/mpirun.sh" 2 60 "$prog" train $acc --batch-size 4 --accumulate 2 \
  --checkpoint-dir "$tmp/ckK" --checkpoint-every 3 --stop-at-step 3 > "$tmp/kstop.log" 2>&1
rc1=$?
# shellcheck disable=SC2086
"$srcdir/tests/mpirun.sh" 2 60 "$prog" train $acc --batch-size 4 --accumulate 2 \
  --checkpoint-dir "$tmp/ckK" --checkpoint-every 3 --resume auto --save-model "$tmp/kres.bin" \
  > "$tmp/kres.log" 2>&1
rc2=$?
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && cmp -s "$tmp/b4k2_2.bin" "$tmp/kres.bin" &&
   grep -q "resumed from .*: epoch 1, global step 3" "$tmp/kres.log"; then
  ok
else
  bad "--accumulate 2 resume (status $rc1 $rc2): $(cmp "$tmp/b4k2_2.bin" "$tmp/kres.bin" 2>&1);" \
    "$(tail -n 3 "$tmp/kres.log")"
fi

# --profile: the op table after the run, with each op's nodes per step exact for 2 layers
# (linear_nd: qkv, attproj, fcproj per layer and the head; add and layernorm: the fused
# add + LayerNorm records both, plus ln1 of the first block), over the steps after the first,
# and the GEMMs inside them (9 linears x forward, dX, dW = 27 mpt_op_gemm calls per step);
# on 2 ranks DDP's bucket launches appear as the grad-ready hooks' row.
for np in 1 2; do
  if [ "$np" -eq 1 ]; then launch="$prog"; else launch="$srcdir/tests/mpirun.sh 2 60 $prog"; fi
  # shellcheck disable=SC2086
  $launch train $run_args --max-steps 3 --profile > "$tmp/prof$np.log" 2>&1
  rc=$?
  missing=""
  for row in "linear_nd +7.0 " "linear_gelu +2.0 " "causal_attention +2.0 " "add +4.0 " \
             "layernorm +5.0 " "embedding_gpt +1.0 " "cross_entropy_vocab +1.0 " "all ops " \
             "rest of the step " "mean of 2 steps after the first" \
             "GEMMs inside the ops +27.0 .*GFLOP/s"; do
    grep -Eq "$row" "$tmp/prof$np.log" || missing="$missing '$row'"
  done
  if [ "$np" -eq 2 ]; then grep -q "grad-ready hooks" "$tmp/prof$np.log" || missing="$missing hooks"; fi
  # how each rank was launched, and the configuration once (the mlp/cnn trainer's lines)
  [ "$(grep -c "^mpitrain: rank [0-9]/$np local rank [0-9] host .* launcher" "$tmp/prof$np.log")" \
    -eq "$np" ] || missing="$missing rank-lines"
  [ "$(grep -c "configuration: .*schedule cosine to 0 over 3 steps, warm-up 2 steps from 0.3333 x lr" \
    "$tmp/prof$np.log")" -eq 1 ] || missing="$missing configuration"
  # --warmup-steps 5 over 3 steps: warned once, by rank 0 (every rank warned before)
  [ "$(grep -c "warmup-steps 5 is not below the run's 3 steps" "$tmp/prof$np.log")" -eq 1 ] ||
    missing="$missing one-warm-up-warning"
  if [ $rc -eq 0 ] && [ -z "$missing" ]; then
    ok
  else
    bad "--profile np $np (status $rc), missing:$missing: $(cat "$tmp/prof$np.log")"
  fi
done

# Bad inputs: status and message.
expect() { # STATUS PATTERN DESCRIPTION -- ARGS...
  want=$1 pattern=$2 what=$3
  shift 4
  out=$("$@" 2>&1)
  got=$?
  if [ $got -eq "$want" ] && printf '%s' "$out" | grep -q -- "$pattern"; then
    ok
  else
    bad "$what: status $got (want $want), output: $out"
  fi
}
# shellcheck disable=SC2086
expect 1 "no file matches '$tmp/none/\*.bin'" "missing shards" -- \
  "$prog" train $tiny --shards "$tmp/none/*.bin" --max-steps 1
# shellcheck disable=SC2086
expect 1 "model file '$tmp/m1.bin' has layers 2, the model expects 3" "model of another shape" -- \
  "$prog" train --model gpt --n-layer 3 --n-head 2 --n-embd 32 --seq-len 32 --vocab-size 256 \
  $data --init-from "$tmp/m1.bin" --max-steps 1
# shellcheck disable=SC2086
expect 1 "has layers 2, the model expects 3" "model of another shape, 2 ranks" -- \
  "$srcdir/tests/mpirun.sh" 2 60 "$prog" train --model gpt --n-layer 3 --n-head 2 --n-embd 32 \
  --seq-len 32 --vocab-size 256 $data --init-from "$tmp/m1.bin" --max-steps 1
head -c 5000 "$tmp/m1.bin" > "$tmp/short.bin"
# shellcheck disable=SC2086
expect 1 "short.bin" "truncated model file" -- \
  "$prog" train $run_args --init-from "$tmp/short.bin" --max-steps 1
# shellcheck disable=SC2086
expect 1 "token 0 (byte offset 1024) is 111, outside the vocabulary of 100" \
  "token outside the vocabulary (the first, found at start-up)" -- \
  "$prog" train --model gpt --n-layer 2 --n-head 2 --n-embd 32 --seq-len 32 --vocab-size 100 \
  $data --max-steps 1
# shellcheck disable=SC2086
expect 1 "give one" "--init-from and --resume" -- \
  "$prog" train $run_args --init-from "$tmp/m1.bin" --resume "$tmp/ckA" --max-steps 1
# 12 layers (gpt2's depth) make 98 runs of decayed / not decayed parameters for AdamW's groups
# shellcheck disable=SC2086
"$prog" train --model gpt --n-layer 12 --n-head 2 --n-embd 16 --seq-len 16 --vocab-size 256 \
  $data --batch-size 2 --max-steps 1 > "$tmp/deep.log" 2>&1
rc=$?
if [ $rc -eq 0 ] && grep -q "step      1/1  loss" "$tmp/deep.log"; then
  ok
else
  bad "12 layers (status $rc): $(cat "$tmp/deep.log")"
fi
# shellcheck disable=SC2086
# --accumulate beyond the epoch: one step of the 688 windows there are (each weighs 1/688), as
# the last step of any epoch takes the micro-batches left
expect 0 "x 1000 micro-batch(es); 1 steps per epoch" "--accumulate beyond the epoch" -- \
  "$prog" train $tiny $data --batch-size 4 --accumulate 1000 --max-steps 1
if ! nvidia-smi -L 2>/dev/null | grep -q GPU; then # no GPU: --device cuda is refused
  # shellcheck disable=SC2086
  expect 1 "no CUDA device is visible" "--device cuda without a GPU" -- \
    "$prog" train $run_args --device cuda --max-steps 1
fi
expect 2 "needs --shards" "no --shards" -- "$prog" train --model gpt-mini
expect 2 "not a multiple of --n-head" "C not a multiple of H" -- \
  "$prog" train --model gpt --n-embd 30 --n-head 4 --shards x
expect 2 "is a preset" "sizes with a preset" -- "$prog" train --model gpt2 --n-layer 2 --shards x
expect 2 "^mpitrain: --shards does not apply to --model mlp: the mlp and cnn train on images" \
  "GPT option with the MLP" -- "$prog" train --model mlp --shards x
expect 2 "Quote it, as in --shards 'DIR/train_\*.bin'" "a shard glob the shell expanded" -- \
  "$prog" train $tiny --shards "$tmp/shards/train_000000.bin" "$tmp/shards/val_000000.bin"
# shellcheck disable=SC2086
expect 0 "give --max-steps 2 or more for a table" "--profile with one step: warned at the start" -- \
  "$prog" train $run_args --max-steps 1 --profile
expect 2 "unknown model 'gpt3'" "unknown model" -- "$prog" train --model gpt3

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
