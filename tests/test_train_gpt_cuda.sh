#!/bin/sh
# `mpitrain train --model gpt --device cuda` against the same run on the CPU. Exits 77
# (automake's SKIP) with "SKIP: no CUDA device" without a GPU (nvidia-smi lists none).
#
# A tiny GPT (2 layers, 2 heads, 32 channels, T 32, bytes: 34,688 parameters), B 4, one rank,
# from one model file (--init-from) and the same windows on both devices:
# - SGD (lr 0.1, clipping at 1 active: the norms are about 3): 5 steps. Each step's loss and
#   gradient norm as printed within 2e-4 and 2e-3 (one unit of the last printed digit plus
#   rounding: the GPU's forward is within 1e-5 of the CPU's, tests/test_cuda_gpt.c), and every
#   parameter within 1e-4. Why 1e-4: the gradients agree to 1e-4 of the largest
#   (test_cuda_gpt.c); after clipping to norm 1 each of the 5 steps moves a parameter by at most
#   lr |g| <= 0.1, so the device difference is at most 5 x 0.1 x 1e-4 = 5e-5. Unclipped
#   gradients on one side would differ by up to 0.2 per step, tokens or targets not uploaded
#   change the losses at once.
# - AdamW (the GPT default, lr 1e-3): 5 steps; losses and norms as above; the parameters, all
#   but the key biases, within 1e-2 of their change in relative L2 norm (||gpu - cpu|| /
#   ||cpu - start||), not element by element: AdamW divides each gradient by its own RMS, so an
#   element whose gradient is small moves by about lr whatever its rounding, and the relative
#   error of that gradient becomes the relative error of the step. Measured on the CPU:
#   summation-order noise (B 8 against 2 x B 4, the same kernels) gives 4e-6; training without
#   clipping on one side gives 2.7e-2 (a weak check of clipping: the SGD case above is the
#   strong one). Why not tighter: with every kernel different (GPU against CPU) elements of
#   tiny gradient may each step up to ~0.1 lr apart, and the whole change is only ~0.75 in L2.
#   The key biases' gradients are exactly zero in exact arithmetic (tests/gpt_torch.py): they
#   are only checked to be at most 2 lr per step apart.
# - --accumulate 2 with B 4 on the GPU against B 8 on the GPU (the gradients accumulated on the
#   device, the loss scaled by 1/2), 6 AdamW steps: the same printed losses and norms, the
#   parameters within 1e-3 in relative L2 (the same kernels on both sides: 4e-6 on the CPU).
# - Checkpoints from the GPU (parameters and AdamW state copied to the host): 6 steps with
#   --accumulate 2 straight against 3, stop, --resume auto: the same bytes (every kernel is
#   deterministic: no atomics; cuBLAS gives the same bits on the same GPU).
# - `mpitrain generate` on the CPU reads the model the GPU run saved.
# - 2 ranks on the only GPU of a one-GPU machine: refused with status 1 before NCCL starts, no
#   hang (the two-ranks-one-device check of mpt_comm_bind_device).
# Prints "N passed, N failed".
set -u
prog=${MPITRAIN:-./mpitrain}
srcdir=${srcdir:-.}
if ! nvidia-smi -L 2>/dev/null | grep -q GPU; then
  echo "SKIP: no CUDA device"
  exit 77
fi
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_train_gpt_cuda.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# The text of tests/test_train_gpt.sh (awk's srand(7)), byte-level shards.
awk 'BEGIN { srand(7); split("the a cat dog sat on mat ran fast slow red blue big small " \
     "house tree and of to in", w, " ");
     for (i = 0; i < 3000; i++) { n = 5 + int(rand() * 6); s = "";
       for (j = 0; j < n; j++) s = s w[1 + int(rand() * 20)] " "; print s "." } }' \
  > "$tmp/text.txt"
"$prog" tokenize --bytes --val-fraction 0.1 -o "$tmp/shards" "$tmp/text.txt" > /dev/null ||
  { echo "FAIL: tokenize"; exit 1; }
tiny="--model gpt --n-layer 2 --n-head 2 --n-embd 32 --seq-len 32 --vocab-size 256"
args="$tiny --shards $tmp/shards/train_*.bin --no-shuffle --log-every 1"

# The starting model: one step at lr 0 changes nothing.
# shellcheck disable=SC2086 # word lists on purpose
"$prog" train $args --device cpu --batch-size 4 --max-steps 1 --lr 0 --save-model "$tmp/init.bin" \
  > "$tmp/init.log" 2>&1 || { echo "FAIL: the starting model: $(cat "$tmp/init.log")"; exit 1; }

# "loss norm" of each step a run printed, one line per step.
steps_of() { sed -n 's/.*step *[0-9]*\/[0-9]*  loss \([0-9.]*\)  norm \([0-9.]*\) .*/\1 \2/p' "$1"; }
# same_steps A B N: both logs have N steps whose losses are within 2e-4 and norms within 2e-3.
same_steps() {
  steps_of "$1" > "$tmp/s1.txt"
  steps_of "$2" > "$tmp/s2.txt"
  [ "$(wc -l < "$tmp/s1.txt")" -eq "$3" ] && [ "$(wc -l < "$tmp/s2.txt")" -eq "$3" ] &&
    paste "$tmp/s1.txt" "$tmp/s2.txt" | awk '{ dl = $1 - $3; dn = $2 - $4;
      if (dl < 0) dl = -dl; if (dn < 0) dn = -dn; if (dl > 2e-4 || dn > 2e-3) bad = 1 }
      END { exit bad }'
}
# compare A B START: over the parameters of two model files of this tiny GPT (float32 after the
# 1024-byte header), prints: count, max |A - B| and ||A - B|| / ||B - START|| outside the key
# biases, max |A - B| of the key biases. File order: wte 8192, wpe 1024, ln1w 64, ln1b 64,
# qkvw 6144, then qkvb (2 layers x 96): layer l's key biases are the floats
# [15488 + 96 l + 32, 15488 + 96 l + 64).
compare() {
  od -An -v -tf4 -w4 -j1024 "$1" > "$tmp/p1.txt"
  od -An -v -tf4 -w4 -j1024 "$2" > "$tmp/p2.txt"
  od -An -v -tf4 -w4 -j1024 "$3" > "$tmp/p0.txt"
  paste "$tmp/p1.txt" "$tmp/p2.txt" "$tmp/p0.txt" | awk '{
      i = NR - 1; d = $1 - $2; if (d < 0) d = -d; q = i - 15488;
      if (q >= 0 && q < 192 && q % 96 >= 32 && q % 96 < 64) { if (d > mk) mk = d }
      else { if (d > m) m = d; s += d * d; c = $2 - $3; t += c * c }
      n++ }
    END { printf "%d %.3g %.3g %.3g\n", n, m, (t > 0 ? sqrt(s / t) : 1), mk }'
}
field() { echo "$1" | awk -v k="$2" '{ print $k }'; }
le() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 <= b + 0) }'; }

# SGD and AdamW, CPU against GPU.
for opt in sgd adamw; do
  if [ $opt = sgd ]; then o="--optimizer sgd --lr 0.1"; else o="--lr 1e-3"; fi
  for dev in cpu cuda; do
    # shellcheck disable=SC2086
    "$prog" train $args $o --device $dev --batch-size 4 --max-steps 5 --init-from "$tmp/init.bin" \
      --save-model "$tmp/$opt-$dev.bin" > "$tmp/$opt-$dev.log" 2>&1
    eval "rc_$dev=\$?"
  done
  r=$(compare "$tmp/$opt-cuda.bin" "$tmp/$opt-cpu.bin" "$tmp/init.bin")
  if [ $opt = sgd ]; then
    le "$(field "$r" 2)" 1e-4 && le "$(field "$r" 4)" 1e-4
  else
    le "$(field "$r" 3)" 1e-2 && le "$(field "$r" 4)" 1e-2
  fi
  close=$?
  # shellcheck disable=SC2154 # rc_cpu, rc_cuda set by eval
  if [ "$rc_cpu" -eq 0 ] && [ "$rc_cuda" -eq 0 ] && grep -q "1 rank on cuda:0" "$tmp/$opt-cuda.log" &&
     same_steps "$tmp/$opt-cpu.log" "$tmp/$opt-cuda.log" 5 && [ "$(field "$r" 1)" -eq 34688 ] &&
     [ $close -eq 0 ]; then
    ok
  else
    bad "$opt: cpu (status $rc_cpu) against cuda (status $rc_cuda): parameters: count, max diff," \
      "relative L2 diff, key biases max diff = $r; steps: $(steps_of "$tmp/$opt-cpu.log" | tr '\n' ',')" \
      "vs $(steps_of "$tmp/$opt-cuda.log" | tr '\n' ','); $(tail -n 3 "$tmp/$opt-cuda.log")"
  fi
done

# --accumulate on the GPU, and its checkpoints.
acc="$args --device cuda --init-from $tmp/init.bin --max-steps 6"
# shellcheck disable=SC2086
"$prog" train $acc --batch-size 8 --save-model "$tmp/b8.bin" > "$tmp/b8.log" 2>&1
rc1=$?
# shellcheck disable=SC2086
"$prog" train $acc --batch-size 4 --accumulate 2 --save-model "$tmp/b4k2.bin" > "$tmp/b4k2.log" 2>&1
rc2=$?
r=$(compare "$tmp/b4k2.bin" "$tmp/b8.bin" "$tmp/init.bin")
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && same_steps "$tmp/b8.log" "$tmp/b4k2.log" 6 &&
   le "$(field "$r" 3)" 1e-3 && le "$(field "$r" 4)" 1.2e-2; then
  ok
else
  bad "--accumulate 2 on the GPU (status $rc1 $rc2): $r; $(tail -n 3 "$tmp/b4k2.log")"
fi
# shellcheck disable=SC2086
"$prog" train $acc --batch-size 4 --accumulate 2 --checkpoint-dir "$tmp/ck" --checkpoint-every 3 \
  --stop-at-step 3 > "$tmp/stop.log" 2>&1
rc1=$?
# shellcheck disable=SC2086
"$prog" train $args --device cuda --max-steps 6 --batch-size 4 --accumulate 2 \
  --checkpoint-dir "$tmp/ck" --checkpoint-every 3 --resume auto --save-model "$tmp/res.bin" \
  > "$tmp/res.log" 2>&1
rc2=$?
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && cmp -s "$tmp/b4k2.bin" "$tmp/res.bin" &&
   grep -q "resumed at step 3" "$tmp/res.log"; then
  ok
else
  bad "GPU checkpoint resume (status $rc1 $rc2): $(cmp "$tmp/b4k2.bin" "$tmp/res.bin" 2>&1);" \
    "$(tail -n 3 "$tmp/res.log")"
fi

# generate on the CPU from the GPU's model file
out=$("$prog" generate --model-file "$tmp/adamw-cuda.bin" --prompt "the " --tokens 20 \
  --temperature 0 2>&1)
if [ $? -eq 0 ] && [ -n "$out" ]; then ok; else bad "generate from the GPU's model: $out"; fi

# Two ranks, one GPU: a clear refusal, not a hang.
if [ "$(nvidia-smi -L 2>/dev/null | grep -c GPU)" -eq 1 ]; then
  # shellcheck disable=SC2086
  "$srcdir/tests/mpirun.sh" 2 60 "$prog" train $args --device cuda --batch-size 4 --max-steps 1 \
    > "$tmp/np2.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "error" "$tmp/np2.log"; then
    ok
  else
    bad "2 ranks on one GPU: status $rc: $(tail -n 3 "$tmp/np2.log")"
  fi
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
