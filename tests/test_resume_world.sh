#!/bin/sh
# Resume on another number of ranks (docs/checkpoints.md): a run on W ranks is stopped at a step
# (--stop-at-step, checkpoint), resumed on W' ranks with the per-rank batch and accumulation that
# keep its global batch G, and compared with the same run uninterrupted on W ranks:
#   - the samples consumed: every rank records "<global step> <sample index>" for each real
#     sample it trains on (MPT_TEST_RECORD_SAMPLES, a fault-injection hook); the interrupted
#     run's records plus the resumed run's, sorted, must equal the uninterrupted run's, exactly:
#     each step takes the same samples, each sample once per epoch;
#   - the parameters after the last step (--save-params): max |a - b| over the largest |a| at
#     most TOL = 1e-6. Why not bit for bit: the same samples are summed in another order (each
#     rank's GEMMs over its rows, then the all-reduce over W or W' partial sums), so a step's
#     averaged gradient differs from the uninterrupted run's by a few float32 roundings (2^-24
#     relative each), and the resumed steps carry that on; measured 2e-8 to 1e-7 here. One
#     sample more or less in a step of G (or a padding repeat weighed in) moves that step's
#     update by about lr x (a sample's gradient) / G, an estimated 1e-5 of the largest
#     parameter or more here, and every later step carries it on: the bound sits between the
#     two. The sample records are the exact oracle; the bound catches a wrong weight. (Over a
#     longer run a rounding difference can also flip a ReLU for one sample in one step, a jump
#     of that same size: seen at 2 of 9 stop points of a 384-step mlp run; the cases here were
#     checked not to hit one, and are deterministic.)
# Cases (the equivalence table this prints): mlp SGD 4 -> 2 (--accumulate 2), mlp SGD ZeRO-1
# 4 -> 1 (--accumulate 4), mlp AdamW ZeRO-1 4 -> 2 (--batch-size auto --accumulate auto); cnn
# AdamW ZeRO-1 4 -> 2 and SGD 4 -> 1; mlp SGD and AdamW ZeRO-1 2 -> 3 on a data set that neither
# 2 nor 3 divides (padding in the last step of each epoch); a tiny GPT: AdamW 4 -> 2, SGD ZeRO-1
# 4 -> 1, AdamW ZeRO-1 2 -> 3 (--accumulate auto). The GPT's drift is measured the same
# (1e-8 to 1e-7 after its 12 steps): the same bound holds.
# BatchNorm is left out: its batch statistics are per rank's micro-batch, so another split of
# the same global batch normalises with other statistics (not a reduction-order difference).
# Then the refusals, each with a clear message and the checkpoint folder left byte-identical:
# a G that no setting makes on the new number of ranks (names the ranks that can), settings
# given that do not make G (lists those that do), another model, another data set, a corrupt
# checkpoint, a partial one, one of a newer format. Prints "N passed, N failed".
set -u
dir=$(cd "$(dirname "$0")" && pwd)
. "$dir/fault_injection.sh"
require_fault_injection # MPT_TEST_RECORD_SAMPLES
prog=$(pwd)/mpitrain
[ -x "$prog" ] || { echo "$0: $prog not found (run from the build directory)"; exit 1; }
command -v "${MPIRUN:-mpirun}" > /dev/null 2>&1 || { echo "SKIP: no mpirun"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_resume_world.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
TOL=1e-6

# np record_prefix args...: one run (records to PREFIX.<rank> when PREFIX is not "-")
run() {
  np=$1
  rec=$2
  shift 2
  if [ "$rec" = - ]; then
    "$dir/mpirun.sh" "$np" 300 "$prog" "$@" < /dev/null
  else
    MPT_TEST_RECORD_SAMPLES=$rec MPT_MPIRUN_ARGS="-x MPT_TEST_RECORD_SAMPLES" \
      "$dir/mpirun.sh" "$np" 300 "$prog" "$@" < /dev/null
  fi
}
# a.bin b.bin: "max|a-b| max|a| max|a-b|/max|a|" over two raw float32 files
param_diff() {
  od -An -v -f -w4 "$1" > "$tmp/a.txt"
  od -An -v -f -w4 "$2" > "$tmp/b.txt"
  paste "$tmp/a.txt" "$tmp/b.txt" | awk '
    NF != 2 { bad = 1 }
    { d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; a = $1 < 0 ? -$1 : $1; if (a > mx) mx = a }
    END { if (bad || mx == 0) print "x x inf"; else printf "%.3g %.3g %.3g\n", m, mx, m / mx }'
}

: > "$tmp/rows"
# check_case NAME W W' STOP "args of both" "args of the resumed run only" STEPS_PER_EPOCH TOL
check_case() {
  name=$1
  w=$2
  w2=$3
  stop=$4
  args=$5
  res_args=$6
  spe=$7
  tol=$8
  d=$tmp/$1
  mkdir -p "$d"
  # shellcheck disable=SC2086 # word lists on purpose
  run "$w" "$d/full" train $args --save-params "$d/full.bin" > "$d/full.log" 2>&1 ||
    { bad "$name: the uninterrupted run failed"; tail -n 5 "$d/full.log"; return; }
  # shellcheck disable=SC2086
  run "$w" "$d/part" train $args --checkpoint-dir "$d/ck" --stop-at-step "$stop" \
    > "$d/part.log" 2>&1 ||
    { bad "$name: the interrupted run failed"; tail -n 5 "$d/part.log"; return; }
  # shellcheck disable=SC2086
  run "$w2" "$d/res" train $args $res_args --resume "$d/ck" --save-params "$d/res.bin" \
    > "$d/res.log" 2>&1 ||
    { bad "$name: the resumed run on $w2 rank(s) failed"; tail -n 5 "$d/res.log"; return; }
  if ! grep -q "resumed from $d/ck: .*global step $stop\$" "$d/res.log"; then
    bad "$name: the resume did not start after step $stop"
    return
  fi
  cat "$d"/full.[0-9]* | sort -n -k1,1 -k2,2 > "$d/full.samples"
  cat "$d"/part.[0-9]* "$d"/res.[0-9]* | sort -n -k1,1 -k2,2 > "$d/resumed.samples"
  same=no
  n=$(wc -l < "$d/full.samples")
  steps=$(awk '{ print $1 }' "$d/full.samples" | sort -u | wc -l)
  if [ "$n" -gt 0 ] && cmp -s "$d/full.samples" "$d/resumed.samples"; then
    same=yes
    ok
  else
    bad "$name: the samples consumed differ from the uninterrupted run's (first difference:" \
      "$(diff "$d/full.samples" "$d/resumed.samples" | sed -n 2p))"
  fi
  # every step of an epoch takes its samples once: no sample twice within an epoch
  dup=$(awk -v spe="$spe" '{ print int($1 / spe), $2 }' "$d/full.samples" | sort | uniq -d | wc -l)
  [ "$dup" -eq 0 ] && ok || bad "$name: $dup sample(s) taken twice in an epoch"
  diff=$(param_diff "$d/full.bin" "$d/res.bin")
  rel=${diff##* }
  if awk -v r="$rel" -v t="$tol" 'BEGIN { exit !(r != "inf" && r + 0 <= t + 0) }'; then
    ok
  else
    bad "$name: parameters differ by $rel of the largest (> $tol)"
  fi
  how=$(grep -o "this job runs [0-9]* x [0-9]* x [0-9]*" "$d/res.log" | head -n 1)
  # shellcheck disable=SC2086 # the three figures of param_diff
  printf '%-26s %2d -> %-2d %-14s %6d %5d %-4s %9s %9s %10s %7s\n' "$name" "$w" "$w2" \
    "${how#this job runs }" "$n" "$steps" "$same" $diff "$tol" >> "$tmp/rows"
}

# Images: 1000 synthetic samples (divisible by 1, 2 and 4), G = 128: 8 steps per epoch (the
# last one short), 2 epochs; stopped mid-epoch 2.
img="--synthetic --train-limit 1000 --test-limit 64 --epochs 2 --no-progress --threads 1 --seed 7"
mlp="--model mlp --hidden 64 $img --batch-size 32"
cnn="--model cnn $img --batch-size 16 --lr 0.02"
adamw="--optimizer adamw --lr 0.002"
check_case mlp_sgd_4to2 4 2 11 "$mlp" "--accumulate 2" 8 $TOL
check_case mlp_sgd_zero1_4to1 4 1 5 "$mlp --zero 1" "--accumulate 4" 8 $TOL
auto="--batch-size auto --accumulate auto"
check_case mlp_adamw_zero1_4to2 4 2 11 "$mlp $adamw --zero 1" "$auto" 8 $TOL
cnn4="$cnn --accumulate 2" # G = 4 x 16 x 2 = 128
check_case cnn_adamw_zero1_4to2 4 2 11 "$cnn4 $adamw --zero 1" "--accumulate 4" 8 $TOL
check_case cnn_sgd_4to1 4 1 5 "$cnn4" "--accumulate 8" 8 $TOL
# DataParallel inside each rank: 2 ranks of 2 CPU devices -> 1 rank of 4 (the batch of a rank is
# split over its devices; G = 2 x 32 x 2 = 1 x 32 x 4 = 128)
check_case mlp_dp_2x2dev_to_1x4dev 2 1 11 "$mlp --accumulate 2 --mode dp --devices cpu:2" \
  "--accumulate 4 --devices cpu:4" 8 $TOL
# 1001 samples: 2 ranks pad 1, 3 ranks pad 2; G = 2 x 12 x 3 = 72 = 3 x 12 x 2: 14 steps per
# epoch, the last with 65 real samples
odd="--model mlp --hidden 64 --synthetic --train-limit 1001 --test-limit 64 --epochs 2
  --no-progress --threads 1 --seed 3 --batch-size 12 --accumulate 3"
check_case mlp_sgd_pad_2to3 2 3 17 "$odd" "--batch-size auto --accumulate auto" 14 $TOL
check_case mlp_adamw_zero1_pad_2to3 2 3 13 "$odd $adamw --zero 1" "--accumulate auto" 14 $TOL

# A tiny GPT on byte tokens: 691 windows of B 4 x T 32, epochs of 6 steps (--max-steps) of G =
# 12 windows = 4 x 3 = 2 x 6 = 3 x 4 = 1 x 12, 2 epochs (each epoch a new permutation of all
# 691 windows: its first 72 are trained on).
awk 'BEGIN { srand(9); split("the a cat dog sat on mat ran fast slow red blue big small " \
     "house tree and of to in", w, " ");
     for (i = 0; i < 3000; i++) { n = 5 + int(rand() * 6); s = "";
       for (j = 0; j < n; j++) s = s w[1 + int(rand() * 20)] " "; print s "." } }' \
  > "$tmp/text.txt"
"$prog" tokenize --bytes --val-fraction 0.1 -o "$tmp/shards" "$tmp/text.txt" > /dev/null ||
  { echo "FAIL: tokenize"; exit 1; }
gpt="--model gpt --n-layer 2 --n-head 2 --n-embd 32 --seq-len 32 --vocab-size 256 --batch-size 4
  --shards $tmp/shards/train_000000.bin --max-steps 6 --epochs 2 --lr 3e-3
  --warmup-steps 2 --threads 1 --no-progress --progress-interval 0 --seed 5 --log-every 0"
check_case gpt_adamw_4to2 4 2 4 "$gpt --accumulate 3" "--accumulate 6" 6 $TOL
gsgd="--accumulate 3 --optimizer sgd --lr 0.1 --momentum 0.9 --zero 1"
check_case gpt_sgd_zero1_4to1 4 1 8 "$gpt $gsgd" "--accumulate 12" 6 $TOL
check_case gpt_adamw_zero1_2to3 2 3 7 "$gpt --accumulate 6 --zero 1" "--accumulate auto" 6 $TOL

echo "# resume on another number of ranks: the samples consumed and the parameters after the"
echo "# last step against the uninterrupted run on the first number of ranks"
printf '%-26s %-8s %-14s %6s %5s %-4s %9s %9s %10s %7s\n' case "W -> W'" "W' x b x K" \
  samples steps same "max|diff|" "max|p|" rel_diff bound
cat "$tmp/rows"

# ---- refusals: a clear message, exit 1, the checkpoint folder byte-identical ----
mlp999=$(echo "$mlp" | sed "s/--train-limit 1000/--train-limit 999/")
mlp32=$(echo "$mlp" | sed "s/--hidden 64/--hidden 32/")
ck=$tmp/mlp_sgd_4to2/ck # 4 ranks x 32 x 1 = G 128, stopped at step 11
# the checkpoints and run-options.txt (a failing run may add its flight-recorder dumps,
# flight-rank*.txt, to the folder: mpitrain hang-report reads them)
sums() { (cd "$1" && cksum ./*.mpt ./run-options.txt 2> /dev/null | sort); }
before=$(sums "$ck")
# refuse NAME NP PATTERN ARGS...: status 1, PATTERN in the output, the folder unchanged
refuse() {
  name=$1
  np=$2
  pattern=$3
  shift 3
  out=$(run "$np" - train "$@" 2>&1)
  rc=$?
  if [ $rc -ne 1 ] || ! printf '%s' "$out" | grep -q -- "$pattern"; then
    bad "$name: status $rc, not refused with '$pattern': $(printf '%s' "$out" | grep -m1 error)"
  elif [ "$(sums "$ck")" != "$before" ]; then
    bad "$name: the checkpoint folder changed"
  else
    ok
    echo "refused ($name): $(printf '%s' "$out" | grep -m1 ' error: ' | sed 's/.* error: //')"
  fi
}
# shellcheck disable=SC2086
{
refuse "G on 3 ranks" 3 "ranks that can: 1, 2, 4, 8, 16, 32, 64, 128" $mlp \
  --batch-size auto --accumulate auto --checkpoint-dir "$ck" --resume auto
refuse "settings that do not make G" 2 \
  "keep it: --batch-size 64 --accumulate 1, --batch-size 32 --accumulate 2" \
  $mlp --checkpoint-dir "$ck" --resume auto
refuse "another model" 2 "model mlp in the checkpointed run, cnn now" $cnn --accumulate 4 \
  --checkpoint-dir "$ck" --resume auto
refuse "another data set" 2 "a data set of 1000 samples, this run's has 999" \
  $mlp999 --accumulate 2 --checkpoint-dir "$ck" --resume auto
}
# The checkpoint file alone (no run-options.txt beside it): the meta still names the data set,
# and the optimizer and model signature are checked by the loader.
lone=$tmp/lone
mkdir -p "$lone"
latest=$(ls "$ck"/ckpt-step*.mpt | tail -n 1)
cp "$latest" "$lone/ckpt.mpt"
ck=$lone
before=$(sums "$ck")
# shellcheck disable=SC2086
{
refuse "another data set (no run-options.txt)" 2 "a data set of 1000 samples, this run's has 999" \
  $mlp999 --accumulate 2 --resume "$lone/ckpt.mpt"
refuse "another model (no run-options.txt)" 2 "of a different model" $mlp32 \
  --accumulate 2 --resume "$lone/ckpt.mpt"
}
size=$(wc -c < "$lone/ckpt.mpt")
cp "$lone/ckpt.mpt" "$lone/corrupt.mpt"
printf '\377' | dd of="$lone/corrupt.mpt" bs=1 seek=$((size / 2)) conv=notrunc 2> /dev/null
head -c $((size / 2)) "$lone/ckpt.mpt" > "$lone/partial.mpt"
cp "$lone/ckpt.mpt" "$lone/newer.mpt"
printf '\011' | dd of="$lone/newer.mpt" bs=1 seek=8 conv=notrunc 2> /dev/null # version 9
before=$(sums "$ck")
# shellcheck disable=SC2086
{
refuse "corrupt checkpoint" 2 "corrupt: CRC-32 mismatch" $mlp --accumulate 2 --resume "$lone/corrupt.mpt"
refuse "partial checkpoint" 2 "is truncated" $mlp --accumulate 2 --resume "$lone/partial.mpt"
refuse "newer format" 2 "format version 9, newer than" $mlp --accumulate 2 --resume "$lone/newer.mpt"
}
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
