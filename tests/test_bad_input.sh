#!/bin/sh
# shellcheck disable=SC2086,SC2015,SC2016 # word lists; A && ok || bad; sh -c in single quotes
# Bad inputs and misuse of the mlp/cnn trainer and the shared command line, as a user and as a
# hostile file would give them: IDX files, option values, checkpoints, output paths. Each case
# expects an exit status (2 a usage error, 1 a failure, 0 where the input is legal) and a
# message naming the problem; none may crash, hang or answer silently wrong. Uses hand-made
# IDX data sets (python3; skipped without it); about 20 runs of the program, one process each
# (about 30 s on two loaded cores). docs/faults.md F44-F51 list what these cases found (F47 is
# in bench/test_allreduce_bench.sh). Prints "N passed, N failed".
set -u
prog=${MPITRAIN:-./mpitrain}
command -v python3 > /dev/null 2>&1 || { echo "no python3: skipped"; exit 77; }
EXPECT_TIMEOUT_S=120
# shellcheck source=tests/expect.sh
. "${srcdir:-.}/tests/expect.sh" # pass, fail, ok, bad, expect
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_bad.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# mkidx DIR N [same|rand] [TEST_N] [TEST_H] [TEST_W]: a Fashion-MNIST-like folder of gzipped IDX
# files, N training images of 28 x 28 (all 0 with label 0 for "same", else random) and TEST_N
# test images (default 10) of TEST_H x TEST_W (default 28 x 28).
mkidx() {
  python3 -c 'import gzip, os, random, struct, sys
d, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
tn, th, tw = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
os.makedirs(d, exist_ok=True)
r = random.Random(1)
for split, m, h, w in (("train", n, 28, 28), ("t10k", tn, th, tw)):
    px = bytes(m * h * w) if mode == "same" else bytes(r.randrange(256) for _ in range(m * h * w))
    lab = bytes(m) if mode == "same" else bytes(r.randrange(10) for _ in range(m))
    with gzip.open("%s/%s-images-idx3-ubyte.gz" % (d, split), "wb") as f:
        f.write(struct.pack(">IIII", 0x803, m, h, w) + px)
    with gzip.open("%s/%s-labels-idx1-ubyte.gz" % (d, split), "wb") as f:
        f.write(struct.pack(">II", 0x801, m) + lab)' "$1" "$2" "${3:-rand}" "${4:-10}" "${5:-28}" \
    "${6:-28}"
}
small="--epochs 1 --threads 1 --progress-interval 0"

# ---- the training loss over an epoch ---------------------------------------------------------
# F44: the epoch's loss was summed in float: 100000 steps of batch 1 (all samples alike, --lr 0,
# so every step has the loss of the test set's equal samples) averaged 3.1536 where each has
# 3.1510. Summed in double, the training and test losses agree.
mkidx "$tmp/same" 100000 same
line=$("$prog" train --data "$tmp/same" --hidden 1 --lr 0 --batch-size 1 --no-shuffle $small 2>&1 |
  grep -m1 "epoch   1/1  train loss")
tr=$(printf '%s' "$line" | sed -n 's/.*train loss \([0-9.]*\) .*/\1/p')
te=$(printf '%s' "$line" | sed -n 's/.*test loss \([0-9.]*\) .*/\1/p')
[ -n "$tr" ] && [ "$tr" = "$te" ] && ok ||
  bad "training loss over 100000 equal steps $tr, the test loss of the same samples $te"
rm -rf "$tmp/same"

# ---- option values ---------------------------------------------------------------------------
# F45: values that are valid doubles but that the trainers use in float: --lr 1e-50 trained
# with lr 0, --momentum 1e-50 ran SGD without momentum, --grad-clip 1e-310 failed at step 1.
mkidx "$tmp/d100" 100
for o in lr momentum weight-decay min-lr dropout; do
  expect 2 "--$o: 1e-50 is below the smallest normal float" "--$o 1e-50" -- \
    "$prog" train --data "$tmp/d100" --$o 1e-50 $small
done
expect 2 "--weight-decay: 1e-40 is below the smallest normal float" "--weight-decay 1e-40" -- \
  "$prog" train --data "$tmp/d100" --weight-decay 1e-40 $small
expect 2 "--grad-clip: 1e-310 is below the smallest normal float" "gpt --grad-clip 1e-310" -- \
  "$prog" train --model gpt --shards "$tmp/none.bin" --grad-clip 1e-310
expect 2 "--lr: 1e-400 is below the smallest normal float" "--lr 1e-400 (0 in a double)" -- \
  "$prog" train --data "$tmp/d100" --lr 1e-400 $small
expect 0 "sgd lr 1.2e-38, momentum 0, weight decay 1.2e-38" "--lr 1.2e-38" -- \
  "$prog" train --data "$tmp/d100" --lr 1.2e-38 --momentum 0 --weight-decay 1.2e-38 $small

# ---- IDX data ----------------------------------------------------------------------------------
# F46: test images of another size than the training images (or than --model takes) failed
# only after the first epoch's training, at the evaluation; now at start-up, naming the file.
mkidx "$tmp/mixed" 100 rand 10 14 14
for m in mlp cnn; do
  out=$(timeout 120 "$prog" train --model $m --data "$tmp/mixed" $small 2>&1)
  got=$?
  [ $got -eq 1 ] &&
    printf '%s' "$out" | grep -q "mixed/t10k-images-idx3-ubyte.gz' holds images of 1 x 14 x 14" &&
    ! printf '%s' "$out" | grep -q "epoch   1/1" && ok ||
    bad "--model $m, test images of 14 x 14: status $got: $(printf '%s' "$out" | tail -n 2)"
done

# ---- output paths --------------------------------------------------------------------------
# F48: --save-params (or --metrics-json, --trace) onto a --data file replaced the training
# images at the end of the run; two outputs on one path lost one of them. Refused at start-up.
cp "$tmp/d100/train-images-idx3-ubyte.gz" "$tmp/images.orig"
expect 1 "--save-params '$tmp/d100/train-images-idx3-ubyte.gz' is an input of the run" \
  "--save-params onto the training images" -- \
  "$prog" train --data "$tmp/d100" --save-params "$tmp/d100/train-images-idx3-ubyte.gz" $small
cmp -s "$tmp/images.orig" "$tmp/d100/train-images-idx3-ubyte.gz" && ok ||
  bad "--save-params replaced the training images"
cp "$tmp/images.orig" "$tmp/d100/train-images-idx3-ubyte.gz" # (for the cases below)
expect 1 "--metrics-json '$tmp/out' and --trace '$tmp/./out' are the same file" \
  "--metrics-json and --trace on one path" -- \
  "$prog" train --data "$tmp/d100" --metrics-json "$tmp/out" --trace "$tmp/./out" $small

# ---- checkpoints ---------------------------------------------------------------------------
# F49: a run-options.txt that records none of the options (junk in the checkpoint folder) let a
# --resume with another --epochs (another schedule) through without a word, where a missing
# file warns. It warns alike now.
"$prog" train --data "$tmp/d100" --batch-size 50 --checkpoint-dir "$tmp/ck" $small \
  > /dev/null 2>&1 || bad "a run with --checkpoint-dir failed"
echo "junk" > "$tmp/ck/run-options.txt"
expect 0 "run-options.txt records none of the options" "--resume past a junk run-options.txt" -- \
  "$prog" train --data "$tmp/d100" --batch-size 50 --resume "$tmp/ck" --threads 1 --epochs 2 \
  --progress-interval 0

# F50: a --log-file on a full disk lost every line and the run exited 0. The log's write
# errors now fail the run, named on the launcher's stderr (FILE.0 -> /dev/full: ENOSPC).
if [ -c /dev/full ]; then
  ln -s /dev/full "$tmp/full.0"
  expect 1 "--log-file: writing '$tmp/full.0' failed on rank 0" "--log-file on a full disk" -- \
    "$prog" train --data "$tmp/d100" --log-file "$tmp/full" $small
fi

# F51: --metrics-json was written in place: on a full disk the earlier file was left cut (the
# metrics of 30 epochs, 7 kB, past the 4 kB block the earlier file freed). It is written to a
# temporary file and renamed, so the earlier file stays whole. The full disk is
# a 16 KiB tmpfs in a private mount namespace (unshare; skipped where that is not allowed).
echo '{"earlier": 1}' > "$tmp/m.json"
mkdir "$tmp/mnt"
if unshare -rm true 2> /dev/null; then
  out=$(unshare -rm sh -c 'mount -t tmpfs -o size=16k tmpfs "$1" || exit 77
cp "$2" "$1/m.json"; head -c 100000 /dev/zero > "$1/fill" 2> /dev/null
"$3" train --data "$4" --metrics-json "$1/m.json" --epochs 30 --batch-size 100 --threads 1 \
  --progress-interval 0
st=$?; cat "$1/m.json"; ls "$1"; exit $st' sh "$tmp/mnt" "$tmp/m.json" "$prog" "$tmp/d100" 2>&1)
  got=$?
  if [ $got -ne 77 ]; then
    [ $got -eq 1 ] && printf '%s' "$out" | grep -q "cannot write metrics file .*No space left" &&
      printf '%s' "$out" | grep -q '^{"earlier": 1}$' &&
      ! printf '%s' "$out" | grep -q "m.json.tmp" &&
      ok || bad "--metrics-json on a full disk: status $got: $(printf '%s' "$out" | tail -n 4)"
  fi
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
