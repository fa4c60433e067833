#!/bin/sh
# `mpitrain ckpt info FILE|DIR`: after a 1-rank run (512 samples, batch 32, 2 epochs) and a
# 2-rank run stopped mid-epoch, the newest checkpoint of the directory, and the file named
# directly, report the exact global step, epoch, samples consumed, world size and global
# batch; a byte flipped in the middle of the file (checksum not OK), a newer format version, a
# truncated copy, /dev/null, a text file, a missing path and an empty directory exit 1 with a
# clear message; usage errors exit 2. Prints "N passed, N failed".
set -u
dir=$(dirname "$0")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
base="train --synthetic --train-limit 512 --test-limit 64 --epochs 2 --batch-size 32 --no-progress --threads 1 --seed 7"
# expect_info name status file_or_dir line...: the exit status and each exact line of stdout
expect_info() {
  name=$1
  want=$2
  path=$3
  shift 3
  ./mpitrain ckpt info "$path" >"$tmp/out" 2>"$tmp/err"
  got=$?
  if [ "$got" -ne "$want" ]; then
    bad "$name: exit status $got, expected $want"
    cat "$tmp/out" "$tmp/err"
    return
  fi
  for line in "$@"; do
    if grep -qxF "$line" "$tmp/out"; then ok; else bad "$name: no line '$line' in:"; cat "$tmp/out"; fi
  done
}
# expect_error name pattern path: exit 1, the pattern on stderr, "checksum: OK" nowhere
expect_error() {
  ./mpitrain ckpt info "$3" >"$tmp/out" 2>"$tmp/err"
  got=$?
  if [ "$got" -ne 1 ]; then bad "$1: exit status $got, expected 1"; cat "$tmp/out" "$tmp/err"; return; fi
  if grep -q "$2" "$tmp/err"; then ok; else bad "$1: stderr lacks '$2':"; cat "$tmp/err"; fi
  if grep -q "checksum: OK" "$tmp/out"; then bad "$1: reported the checksum as OK"; else ok; fi
}

# One rank: 16 steps per epoch, 32 in all; G = 1 x 32 x 1.
./mpitrain $base --checkpoint-dir "$tmp/ck1" >"$tmp/run1.log" 2>&1 ||
  { bad "1-rank training run failed"; tail -n 5 "$tmp/run1.log"; }
newest=$(ls "$tmp/ck1" | grep "^ckpt-step" | sort | tail -n 1)
for p in "$tmp/ck1" "$tmp/ck1/$newest"; do
  expect_info "1 rank ($p)" 0 "$p" "file: $tmp/ck1/$newest" "format version: 2" \
    "global step: 32" "epoch: 2 complete (counted from 1, as the training log does)" "step in epoch: 0" "samples consumed in epoch: 0 of 512" "model: mlp" "world size: 1" "seed: 7" \
    "global batch: 32 (1 rank x batch 32 x accumulate 1)" "data set: 512 training samples" \
    "parameters: 6 tensors, 669706 values (2.55 MiB)" \
    "optimizer: sgd, 1 state buffer(s) of 669706 values, step count 32"
done
# The older file, at the end of epoch 1 (as the log counts; the start of the second).
expect_info "1 rank, step 16" 0 "$tmp/ck1/ckpt-step00000016.mpt" "global step: 16" \
  "epoch: 1 complete (counted from 1, as the training log does)" \
  "step in epoch: 0" "samples consumed in epoch: 0 of 512"
grep -q "^checksum: OK (CRC-32 0x[0-9a-f]\{8\} over every byte)$" "$tmp/out" && ok ||
  bad "no 'checksum: OK' line"

# Two ranks, stopped after step 5 of the first epoch (8 steps per epoch): G = 2 x 32 x 1, 5 x 64
# samples of the epoch consumed.
if "$dir/mpirun.sh" 2 120 ./mpitrain $base --checkpoint-dir "$tmp/ck2" --checkpoint-every 3 \
  --stop-at-step 5 >"$tmp/run2.log" 2>&1; then
  expect_info "2 ranks" 0 "$tmp/ck2" "file: $tmp/ck2/ckpt-step00000005.mpt" "global step: 5" \
    "epoch: 1 (counted from 1, as the training log does)" "step in epoch: 5" "samples consumed in epoch: 320 of 512" "world size: 2" \
    "global batch: 64 (2 ranks x batch 32 x accumulate 1)"
else
  st=$?
  if [ "$st" -eq 77 ]; then echo "2-rank part skipped (no MPI launcher)"; else
    bad "2-rank training run failed ($st)"; tail -n 5 "$tmp/run2.log"; fi
fi

# A language model: its sample is one window of --batch-size rows, so G = 1 x 1 x 1 here, and
# the line's product is that, not the batch size 2.
awk 'BEGIN { for (i = 0; i < 50; i++) print "the cat sat on the mat and ran fast." }' > "$tmp/t.txt"
./mpitrain tokenize --bytes -o "$tmp/sh" "$tmp/t.txt" >/dev/null 2>&1 || bad "tokenize"
./mpitrain train --model gpt --n-layer 1 --n-head 2 --n-embd 16 --seq-len 16 --vocab-size 256 \
  --shards "$tmp/sh/train_000000.bin" --batch-size 2 --max-steps 2 --no-progress --threads 1 \
  --checkpoint-dir "$tmp/ck3" >"$tmp/run3.log" 2>&1 || { bad "gpt run failed"; tail -n 3 "$tmp/run3.log"; }
expect_info "gpt" 0 "$tmp/ck3" "global step: 2" "batch size: 2" \
  "global batch: 1 (1 rank x 1 x accumulate 1; a sample is one window of batch 2 x the sequence length)"

# Damaged files.
f="$tmp/ck1/$newest"
size=$(wc -c < "$f")
cp "$f" "$tmp/flipped.mpt"
mid=$((size / 2))
orig=$(od -An -tu1 -j "$mid" -N 1 "$f" | tr -d ' ')
printf "\\$(printf '%03o' $(((orig + 1) % 256)))" |
  dd of="$tmp/flipped.mpt" bs=1 seek="$mid" count=1 conv=notrunc 2>/dev/null
cmp -s "$f" "$tmp/flipped.mpt" && bad "the byte was not flipped"
expect_error "flipped byte" "is corrupt: CRC-32 mismatch" "$tmp/flipped.mpt"
grep -qx "checksum: NOT OK" "$tmp/out" && ok || bad "flipped byte: no 'checksum: NOT OK' line"
# Format version 3 (byte 8, the low byte of the u32 version): newer than this build reads.
cp "$f" "$tmp/v3.mpt"
printf '\003' | dd of="$tmp/v3.mpt" bs=1 seek=8 count=1 conv=notrunc 2>/dev/null
expect_error "newer format" "has format version 3, newer than this build of mpitrain reads" "$tmp/v3.mpt"
head -c $((size - 100)) "$f" > "$tmp/cut.mpt"
expect_error "truncated" "is truncated: expected $size bytes" "$tmp/cut.mpt"
expect_error "/dev/null" "not a regular file" /dev/null
printf 'epoch 1 loss 0.5\n' > "$tmp/notes.txt"
expect_error "text file" "not an mpitrain checkpoint" "$tmp/notes.txt"
grep -qx "checksum: not verified" "$tmp/out" && ok || bad "text file: no 'checksum: not verified'"
# A missing path and an empty folder: said plainly, on one line, with no checksum result (no
# file was read) and neither the trainer's "resume from" nor a source place or rank.
expect_error "missing file" "^mpitrain ckpt info: $tmp/no/such/file: no such file or directory$" \
  "$tmp/no/such/file"
mkdir "$tmp/empty"
expect_error "empty directory" "no checkpoint (ckpt-step<step>.mpt) in $tmp/empty$" "$tmp/empty"
for p in "$tmp/no/such/file" "$tmp/empty"; do
  ./mpitrain ckpt info "$p" >"$tmp/out" 2>"$tmp/err"
  [ -s "$tmp/out" ] && bad "$p: printed on stdout: $(cat "$tmp/out")" || ok
  [ "$(wc -l < "$tmp/err")" -eq 1 ] && ! grep -q "resume from\|rank \|(at " "$tmp/err" && ok ||
    bad "$p: stderr: $(cat "$tmp/err")"
done

# Usage.
for args in "ckpt" "ckpt show $f" "ckpt info" "ckpt info $f extra" "ckpt info --json"; do
  ./mpitrain $args >/dev/null 2>"$tmp/err"
  st=$?
  if [ "$st" -eq 2 ] && grep -q "usage: mpitrain ckpt info" "$tmp/err"; then ok; else
    bad "'mpitrain $args': exit $st, expected 2 and the usage"; fi
done
./mpitrain ckpt --help >"$tmp/out" 2>&1 && grep -q "usage: mpitrain ckpt info FILE|DIR" "$tmp/out" &&
  ok || bad "ckpt --help"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
