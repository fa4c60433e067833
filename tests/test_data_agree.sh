#!/bin/sh
# Ranks must train on the same data. Under real mpirun, MPMD with -wdir: two
# ranks run the same command line, --data data, from two working directories A and B whose
# data folders differ; the job must stop before training, naming rank 1, what differs and the
# file each rank read:
# - B holds 999 training samples, A 1000 (each rank would shuffle differently);
# - same count, but B's training labels are shifted by one class;
# - one pixel of one of B's test images differs (255 -> 1);
# and identical copies in A and B train to status 0 (the check compares contents, not paths).
# The folders are cut from Debian's dataset-fashion-mnist (skip, 77, without it).
# Prints "N passed, N failed".
set -u
dir=$(cd "$(dirname "$0")" && pwd)
prog=$(pwd)/mpitrain
src=/usr/share/datasets/fashion-mnist
[ -r "$src/train-images-idx3-ubyte.gz" ] || { echo "no $src (apt-get install dataset-fashion-mnist): skipping"; exit 77; }
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_data_agree.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# cut SRC_GZ DST N HEADER_BYTES ITEM_BYTES COUNT_OCTAL: the first N items of an IDX file, with
# the item count of the header (bytes 4-7, big-endian) set to N (given as 4 octal escapes).
cut_idx() {
  gzip -dc "$1" | head -c $(( $4 + $3 * $5 )) > "$2"
  printf "$6" | dd of="$2" bs=1 seek=4 conv=notrunc 2>/dev/null
}
make_data() { # DIR NTRAIN_ITEMS NTRAIN_OCTAL
  mkdir -p "$1"
  cut_idx "$src/train-images-idx3-ubyte.gz" "$1/train-images-idx3-ubyte" "$2" 16 784 "$3"
  cut_idx "$src/train-labels-idx1-ubyte.gz" "$1/train-labels-idx1-ubyte" "$2" 8 1 "$3"
  cut_idx "$src/t10k-images-idx3-ubyte.gz" "$1/t10k-images-idx3-ubyte" 100 16 784 '\000\000\000\144'
  cut_idx "$src/t10k-labels-idx1-ubyte.gz" "$1/t10k-labels-idx1-ubyte" 100 8 1 '\000\000\000\144'
}
make_data "$tmp/ref/data" 1000 '\000\000\003\350'
make_data "$tmp/short/data" 999 '\000\000\003\347'
mkdir -p "$tmp/labels/data" "$tmp/test/data"
cp "$tmp/ref/data/"* "$tmp/labels/data/"
cp "$tmp/ref/data/"* "$tmp/test/data/"
f="$tmp/labels/data/train-labels-idx1-ubyte"
{ head -c 8 "$f"; tail -c +9 "$f" | tr '\000-\011' '\001-\011\000'; } > "$f.new" && mv "$f.new" "$f"
f="$tmp/test/data/t10k-images-idx3-ubyte"
printf '\001' | dd of="$f" bs=1 seek=$((16 + 50 * 784 + 400)) conv=notrunc 2>/dev/null
cp -r "$tmp/ref" "$tmp/copy"

args="train --data data --epochs 1 --hidden 32 --batch-size 50 --no-progress --threads 1"
run() { # A B
  "$dir/mpirun.sh" 1 60 -wdir "$tmp/$1" "$prog" $args : -np 1 -wdir "$tmp/$2" "$prog" $args 2>&1
}
expect_refused() { # NAME B PATTERN
  out=$(run ref "$2")
  rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && printf '%s' "$out" | grep -q -- "$3" &&
     ! printf '%s' "$out" | grep -q "epoch   1/1"; then
    ok
  else
    bad "$1: status $rc; want a refusal matching '$3':"
    printf '%s\n' "$out" | grep -v "^mpitrain: \|^-\|^$" | head -n 6
  fi
}
expect_refused "999 vs 1000 training samples" short \
  "ranks loaded different data (the number of training samples): rank 1 has 999 from '$tmp/short/data/train-images-idx3-ubyte' on $(hostname), rank 0 has 1000 from '$tmp/ref/data/train-images-idx3-ubyte' on $(hostname)"
expect_refused "shifted training labels" labels \
  "(the training labels): rank 1 has CRC-32 [0-9a-f]* from '$tmp/labels/data/train-labels-idx1-ubyte'"
expect_refused "one changed test pixel" test \
  "(the test images): rank 1 has CRC-32 [0-9a-f]* from '$tmp/test/data/t10k-images-idx3-ubyte'"
out=$(run ref copy)
rc=$?
[ $rc -eq 0 ] && printf '%s' "$out" | grep -q "epoch   1/1" && ok ||
  { bad "identical data in two folders: status $rc"; printf '%s\n' "$out" | tail -n 4; }
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
