#!/bin/sh
# No change in results from the one training loop (trainer.h): the mlp, the cnn (BatchNorm,
# AdamW) and a tiny GPT, each on 1 and 2 ranks, a few steps with a fixed seed, write the same
# parameter bytes as the two trainers the loop replaced (src/cli/train.c for mlp/cnn and
# src/cli/train_gpt.c for the GPT; commit 79218e8, the last before the loop). Their SHA-256s
# are below, made by this script with MPITRAIN naming that commit's program. Every run forces one arithmetic that does not depend on the CPU's best
# instruction set: MPT_CPU_ISA=avx2 (our kernels' AVX2 path, oneDNN capped at AVX2), one thread,
# OpenBLAS's Haswell kernels.
#
# The hashes were made on the CPU named in REF_CPU. On another CPU model a mismatch may come
# from the libraries' kernels (oneDNN and OpenBLAS choose their own block sizes) rather than
# from the loop: there the test prints what differs and skips (77); on REF_CPU a mismatch fails.
# Exit 77 also without AVX2 or mpirun. Prints "N passed, N failed".
set -u
prog=${MPITRAIN:-./mpitrain}
srcdir=${srcdir:-.}
pass=0
fail=0
mismatch=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_same.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
REF_CPU="AMD EPYC (AVX-512, avx512_bf16)"

grep -q ' avx2 ' /proc/cpuinfo 2>/dev/null || { echo "SKIP: no AVX2"; exit 77; }
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: no mpirun"; exit 77; }
MPT_CPU_ISA=avx2 OPENBLAS_CORETYPE=Haswell OPENBLAS_NUM_THREADS=1
export MPT_CPU_ISA OPENBLAS_CORETYPE OPENBLAS_NUM_THREADS

awk 'BEGIN { srand(9); split("the a cat dog sat on mat ran fast slow red blue big small " \
     "house tree and of to in", w, " ");
     for (i = 0; i < 3000; i++) { n = 5 + int(rand() * 6); s = "";
       for (j = 0; j < n; j++) s = s w[1 + int(rand() * 20)] " "; print s "." } }' \
  > "$tmp/text.txt"
"$prog" tokenize --bytes --val-fraction 0.1 -o "$tmp/shards" "$tmp/text.txt" > /dev/null ||
  { echo "FAIL: tokenize"; exit 1; }

# --gemm onednn: the old trainers sent every product with m, n > 1 to oneDNN's sgemm, which
# --gemm auto no longer does with AVX2 kernels for the small ones.
common="--threads 1 --no-progress --progress-interval 0 --seed 5 --gemm onednn"
mlp="--model mlp --hidden 64 --synthetic --train-limit 640 --test-limit 64 --batch-size 32
  --epochs 2 --max-steps 5"
cnn="--model cnn --batchnorm --optimizer adamw --lr 0.001 --synthetic --train-limit 320
  --test-limit 64 --batch-size 16 --epochs 1 --max-steps 6 --accumulate 2"
gpt="--model gpt --n-layer 2 --n-head 2 --n-embd 32 --seq-len 32 --vocab-size 256 --batch-size 4
  --shards $tmp/shards/train_000000.bin --val-shards $tmp/shards/val_000000.bin --val-steps 2
  --max-steps 6 --accumulate 2 --lr 3e-3 --warmup-steps 2"

# name np args: the SHA-256 of the parameters the run wrote (--save-params; a GPT's llm.c file
# with --save-model, the one output both old trainers had)
run() {
  name=$1 np=$2
  shift 2
  out=--save-params
  case $name in gpt*) out=--save-model ;; esac
  if [ "$np" -eq 1 ]; then
    # shellcheck disable=SC2086 # word lists on purpose
    "$prog" train "$@" $common $out "$tmp/$name.bin" > "$tmp/$name.log" 2>&1 < /dev/null
  else
    # shellcheck disable=SC2086
    "$srcdir/tests/mpirun.sh" 2 120 "$prog" train "$@" $common $out "$tmp/$name.bin" \
      > "$tmp/$name.log" 2>&1 < /dev/null # mpirun reads stdin: the list below
  fi || { bad "$name: the run failed: $(tail -n 3 "$tmp/$name.log")"; return 1; }
  sha256sum "$tmp/$name.bin" | cut -c1-64
}

# name hash-of-the-old-trainers
while read -r name want; do
  case $name in mlp*) set -- $mlp ;; cnn*) set -- $cnn ;; gpt*) set -- $gpt ;; esac
  np=${name##*_np}
  got=$(run "$name" "$np" "$@") || continue
  if [ "$got" = "$want" ]; then
    ok
  else
    mismatch=$((mismatch + 1))
    echo "differs: $name: $got, the trainers before the loop wrote $want"
  fi
done <<'EOF'
mlp_np1 b176473c34738f08a52f11a20a34eb2f11d08e8b66718ae170d21f325f739bd5
mlp_np2 3b8e8cdd10f2781e2c7a8835cb2d8384e64a0c4f2560a8dbf9b7ba4666f21822
cnn_np1 b81a17c10436164846452a269fc5d09a4e08c22a7325130908b4e14235cfd501
cnn_np2 596d824748db2a44e3c88c97571e2e0f4a0399dacb004a49339dff692517958f
gpt_np1 ce2d32ee2b0746c921d86faa77a23c4d37bcd5cc3aada2bb7edaed1bb83e3cdf
gpt_np2 aa87ed5dea7335b54b8ec6fc32ba58697f4f43043ab03477d9b30fe988969363
EOF
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)
flags="AVX2"
grep -q ' avx512f ' /proc/cpuinfo && flags="AVX-512"
grep -q ' avx512_bf16 ' /proc/cpuinfo && flags="$flags, avx512_bf16"
if [ "$mismatch" -gt 0 ] && [ "$cpu ($flags)" != "$REF_CPU" ]; then
  echo "SKIP: $mismatch of 6 differ on '$cpu ($flags)'; the hashes were made on '$REF_CPU'"
  exit 77
fi
fail=$((fail + mismatch))
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
