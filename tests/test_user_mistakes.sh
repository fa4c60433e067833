#!/bin/sh
# What a new user gets wrong first, and what mpitrain answers (one process each, seconds):
# - --resume MODEL.bin (a model file, what --save-model writes, not a checkpoint): refused at
#   once, pointing to --init-from, with no word about run-options.txt;
# - --skip-nonfinite: the warning of a skipped step, the "checkpoint not written" line and the
#   final error name the same step numbers as the step lines and checkpoint files (from 1);
# - --allreduce-algo with one rank: the no-effect warning of the other DDP options;
# - bench/scaling_model.py given a DataParallel trace: refused, saying what it reads.
# Prints "N passed, N failed".
set -u
srcdir=$(cd "${srcdir:-.}" && pwd)
prog=$(pwd)/mpitrain
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
has() { printf '%s\n' "$1" | grep -q -- "$2"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_mistakes.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cd "$tmp" || exit 1

# --resume with a model file
awk 'BEGIN { for (i = 0; i < 2000; i++) print "the cat sat on the mat " i }' > text.txt
"$prog" tokenize --bytes --val-fraction 0.1 -o shards text.txt > /dev/null 2>&1 ||
  { echo "FAIL: tokenize"; exit 1; }
gpt="train --model gpt --n-layer 1 --n-head 2 --n-embd 16 --seq-len 16 --vocab-size 256
     --shards shards/train_000000.bin --batch-size 2 --no-progress --threads 1"
# shellcheck disable=SC2086 # word list on purpose
"$prog" $gpt --max-steps 1 --save-model model.bin > save.log 2>&1 || bad "--save-model run failed"
# shellcheck disable=SC2086
out=$(timeout 60 "$prog" $gpt --max-steps 2 --resume model.bin 2>&1)
rc=$?
[ $rc -eq 1 ] && has "$out" "--resume 'model.bin' is an llm.c model file" &&
  has "$out" "--init-from 'model.bin'" && ! has "$out" "run-options.txt" && ok ||
  bad "--resume MODEL.bin: status $rc (want 1, --init-from suggested, no run-options.txt warning): $out"
# ... and mpt_ckpt_load itself says what the file is, for a library user.
mkdir ck && cp model.bin ck/ckpt-step00000001.mpt && : > ck/run-options.txt
# shellcheck disable=SC2086
out=$(timeout 60 "$prog" $gpt --max-steps 2 --resume ck 2>&1)
rc=$?
[ $rc -eq 1 ] && has "$out" "--init-from" && ok ||
  bad "--resume DIR whose latest checkpoint is a model file: status $rc: $(printf '%s\n' "$out" | tail -n 2)"

# --skip-nonfinite: a learning rate that overflows the MLP within a few steps; 3 skipped steps
# in a row stop the run.
out=$(timeout 120 "$prog" train --synthetic --train-limit 512 --test-limit 64 --epochs 1 \
  --batch-size 32 --no-progress --threads 1 --lr 1000 --momentum 0.99 --skip-nonfinite \
  --log-every 1 --checkpoint-dir ckn --checkpoint-every 1 2>&1)
rc=$?
skipped=$(printf '%s\n' "$out" | sed -n 's/.*warning: step \([0-9]*\): non-finite gradients.*/\1/p' | tr '\n' ' ')
unwritten=$(printf '%s\n' "$out" | sed -n 's/.*checkpoint at global step \([0-9]*\) not written.*/\1/p' | tr '\n' ' ')
stopped=$(printf '%s\n' "$out" | sed -n 's/.*all skipped for non-finite gradients (stopping after a skipped step, step \([0-9]*\)).*/\1/p')
first=${skipped%% *}
last=$(echo "$skipped" | awk '{ print $NF }')
if [ $rc -eq 1 ] && [ -n "$first" ] && [ "$stopped" = "$last" ] &&
   [ ! -e "ckn/ckpt-step$(printf '%08d' "$first").mpt" ] &&
   [ -e "ckn/ckpt-step$(printf '%08d' $((first - 1))).mpt" ] &&
   printf '%s\n' "$out" | grep -q "step  *$((first - 1))/16  loss" &&
   case " $unwritten" in " $first "*) true ;; *) false ;; esac; then ok; else
  bad "--skip-nonfinite numbering: status $rc, skipped steps '$skipped', checkpoints not written" \
      "'$unwritten', stopped at '$stopped', files: $(ls ckn 2>/dev/null | tr '\n' ' ')"
fi

# --allreduce-algo with one rank has no effect, and says so like --grad-comm and --zero.
out=$("$prog" train --synthetic --train-limit 64 --test-limit 32 --epochs 1 --max-steps 1 \
  --no-progress --threads 1 --allreduce-algo rs-ag 2>&1)
rc=$?
[ $rc -eq 0 ] && has "$out" "warning: --allreduce-algo has no effect: one rank" && ok ||
  bad "--allreduce-algo with one rank: status $rc, no no-effect warning: $(printf '%s\n' "$out" | grep -i warn)"

# The scaling model reads DDP traces; a DataParallel trace is refused naming it.
"$prog" train --synthetic --train-limit 256 --test-limit 32 --epochs 1 --max-steps 4 \
  --mode dp --devices cpu:2 --trace dp.json --no-progress --threads 1 > dp.log 2>&1 ||
  bad "--mode dp --trace run failed: $(tail -n 2 dp.log)"
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3
out=$("$py" "$srcdir/bench/scaling_model.py" --trace1 dp.json --model mlp 2>&1)
rc=$?
[ $rc -ne 0 ] && has "$out" "dp.json is a DataParallel trace" && ok ||
  bad "scaling_model.py with a DataParallel trace: status $rc: $(printf '%s\n' "$out" | head -n 2)"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
