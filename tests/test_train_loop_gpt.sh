#!/bin/sh
# The one training loop (trainer.h) with a GPT: what the mlp/cnn trainer always had, for the
# language model too. A tiny GPT (2 layers, 2 heads, 32 channels, T 32) on a generated text:
#  - preemption: SIGTERM to a single process, SIGTERM to rank 1 of 2, SIGUSR1 to mpirun: every
#    rank stops after the same step, a checkpoint of that step is written, exit 75; resuming it
#    gives the bytes of an unbroken run (--save-model);
#  - a resume with other --shards is refused naming them; --stop-at-step at the checkpoint's
#    step is refused;
#  - the start log has the DDP line (2 ranks) and says --init-from was read;
#  - DataParallel (--mode dp --devices cpu:2, one rank, B 8) against DDP (2 ranks, B 4) with
#    --no-shuffle: the same windows, the same losses and parameters (4e-6);
#  - --metrics-json (parses, has the epochs and the validation loss), --trace (forward,
#    backward, optimizer, all-reduce events), --log-file (each rank's file has its lines).
# Prints "N passed, N failed".
set -u
prog=${MPITRAIN:-./mpitrain}
srcdir=${srcdir:-.}
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_loop_gpt.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mpirun="$srcdir/tests/mpirun.sh"

awk 'BEGIN { srand(11); split("the a cat dog sat on mat ran fast slow red blue big small " \
     "house tree and of to in", w, " ");
     for (i = 0; i < 6000; i++) { n = 5 + int(rand() * 6); s = "";
       for (j = 0; j < n; j++) s = s w[1 + int(rand() * 20)] " "; print s "." } }' \
  > "$tmp/text.txt"
"$prog" tokenize --bytes --val-fraction 0.1 -o "$tmp/shards" "$tmp/text.txt" > /dev/null ||
  { echo "FAIL: tokenize"; exit 1; }
cp "$tmp/shards/train_000000.bin" "$tmp/other.bin"
tiny="--model gpt --n-layer 2 --n-head 2 --n-embd 32 --seq-len 32 --vocab-size 256 --threads 1"
data="--shards $tmp/shards/train_000000.bin --val-shards $tmp/shards/val_000000.bin"
args="$tiny $data --batch-size 4 --lr 3e-3 --log-every 1 --progress-interval 0"

# wait_for FILE PATTERN SECONDS: until FILE has a line with PATTERN
wait_for() {
  end=$(($(date +%s) + $3))
  while [ "$(date +%s)" -lt "$end" ]; do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}
descendants() {
  for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do
    echo "$c"
    descendants "$c"
  done
}
rank_pid() { # JOB RANK
  descendants "$1" | while read -r p; do
    [ "$(cat "/proc/$p/comm" 2>/dev/null)" = mpitrain ] || continue
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -q "^OMPI_COMM_WORLD_RANK=$2\$" &&
      echo "$p"
  done | head -n1
}
stop_steps() { grep -o "stopping after step [0-9]*" "$1" | sort -u; }

# The unbroken runs the resumed ones must equal (1 and 2 ranks, 600 steps).
# shellcheck disable=SC2086 # word lists on purpose
"$prog" train $args --max-steps 600 --save-model "$tmp/straight1.bin" > "$tmp/straight1.log" 2>&1 ||
  bad "straight run, 1 rank: $(tail -3 "$tmp/straight1.log")"
# shellcheck disable=SC2086
"$mpirun" 2 120 "$prog" train $args --max-steps 600 --save-model "$tmp/straight2.bin" \
  > "$tmp/straight2.log" 2>&1 || bad "straight run, 2 ranks: $(tail -3 "$tmp/straight2.log")"
grep -q "info: DDP: 1 bucket(s)" "$tmp/straight2.log" && ok ||
  bad "2 ranks: no DDP line at the start: $(grep -c DDP "$tmp/straight2.log") DDP lines"

# preempt CASE SIGNAL NP: start a run of 600 steps with checkpoints, signal it once it trains,
# want exit 75, one common stop step, a checkpoint; then resume it to the end and compare.
preempt() {
  case_=$1 sig=$2 np=$3
  ck="$tmp/ck_$case_"
  # shellcheck disable=SC2086
  if [ "$np" -eq 1 ]; then
    "$prog" train $args --max-steps 600 --checkpoint-dir "$ck" --checkpoint-every 1000 \
      > "$tmp/$case_.log" 2>&1 &
  else
    MPT_MPIRUN_ARGS="--tag-output" "$mpirun" 2 120 "$prog" train $args --max-steps 600 \
      --checkpoint-dir "$ck" --checkpoint-every 1000 > "$tmp/$case_.log" 2>&1 &
  fi
  job=$!
  wait_for "$tmp/$case_.log" "step      3/600" 120 || bad "$case_: never reached step 3"
  if [ "$np" -eq 1 ]; then
    kill -"$sig" "$job"
  elif [ "$sig" = USR1 ]; then # to mpirun itself, which forwards it to every rank
    p=$(descendants "$job" | while read -r q; do
      case $(cat "/proc/$q/comm" 2>/dev/null) in mpirun | orterun) echo "$q" ;; esac
    done | head -n1)
    if [ -n "$p" ]; then kill -USR1 "$p"; else bad "$case_: no mpirun process"; fi
  else
    p=$(rank_pid "$job" 1)
    if [ -n "$p" ]; then kill -"$sig" "$p"; else bad "$case_: no rank 1 process"; fi
  fi
  wait "$job"
  rc=$?
  [ "$rc" -eq 75 ] && ok || bad "$case_: exit $rc after SIG$sig, want 75: $(tail -3 "$tmp/$case_.log")"
  [ "$(stop_steps "$tmp/$case_.log" | wc -l)" -eq 1 ] &&
    [ "$(grep -c "stopping after step" "$tmp/$case_.log")" -eq "$np" ] && ok ||
    bad "$case_: the ranks did not stop after one common step: $(stop_steps "$tmp/$case_.log")"
  n=$(ls "$ck" 2>/dev/null | grep -c '^ckpt-step.*\.mpt$')
  [ "$n" -eq 1 ] && ok || bad "$case_: $n checkpoints in $ck, want 1"
  # shellcheck disable=SC2086
  if [ "$np" -eq 1 ]; then
    "$prog" train $args --max-steps 600 --checkpoint-dir "$ck" --checkpoint-every 1000 \
      --resume auto --save-model "$tmp/$case_.bin" > "$tmp/$case_.resume.log" 2>&1
  else
    "$mpirun" 2 120 "$prog" train $args --max-steps 600 --checkpoint-dir "$ck" \
      --checkpoint-every 1000 --resume auto --save-model "$tmp/$case_.bin" \
      > "$tmp/$case_.resume.log" 2>&1
  fi
  rc=$?
  [ "$rc" -eq 0 ] && cmp -s "$tmp/$case_.bin" "$tmp/straight$np.bin" && ok ||
    bad "$case_: the resumed run (exit $rc) did not end with the unbroken run's model"
}
preempt term1 TERM 1
preempt term_rank1 TERM 2
preempt usr1_mpirun USR1 2

# A resume with other --shards: refused, naming both.
# shellcheck disable=SC2086
out=$("$prog" train $tiny --shards "$tmp/other.bin" --val-shards "$tmp/shards/val_000000.bin" \
  --batch-size 4 --lr 3e-3 --max-steps 600 --checkpoint-dir "$tmp/ck_term1" --resume auto 2>&1)
rc=$?
[ "$rc" -ne 0 ] && printf '%s' "$out" | grep -q -- "--shards $tmp/shards/train_000000.bin in the checkpointed run, $tmp/other.bin now" && ok ||
  bad "resume with other --shards: status $rc: $(printf '%s' "$out" | tail -2)"

# --stop-at-step at the checkpoint's step: refused. The checkpoint of term1 is at step 40 now
# (the resumed run ended there); take a fresh one at step 5.
# shellcheck disable=SC2086
"$prog" train $args --max-steps 600 --checkpoint-dir "$tmp/ck5" --stop-at-step 5 \
  > "$tmp/stop5.log" 2>&1 || bad "--stop-at-step 5: $(tail -2 "$tmp/stop5.log")"
# shellcheck disable=SC2086
out=$("$prog" train $args --max-steps 600 --checkpoint-dir "$tmp/ck5" --resume auto \
  --stop-at-step 5 2>&1)
rc=$?
[ "$rc" -ne 0 ] && printf '%s' "$out" | grep -q -- "--stop-at-step 5 is not after the checkpoint's step 5" && ok ||
  bad "--stop-at-step at the checkpoint's step: status $rc: $(printf '%s' "$out" | tail -2)"

# --init-from: the start log says the file was read.
# shellcheck disable=SC2086
out=$("$prog" train $args --max-steps 2 --init-from "$tmp/straight1.bin" 2>&1)
printf '%s' "$out" | grep -q "init-from: the parameters were read from $tmp/straight1.bin" && ok ||
  bad "--init-from: no line saying the file was read"

# --init-from a model file whose padded vocabulary is not a multiple of 128 (llm.c reads any
# padded size of at least V): V 200 padded to 208, made from one of ours (padded to 256) by
# dropping wte's rows 208..255; it loads, trains and is written back with its padding.
small="--model gpt --n-layer 2 --n-head 2 --n-embd 32 --seq-len 32 --vocab-size 200 --threads 1"
# shellcheck disable=SC2086
"$prog" train $small $data --batch-size 4 --max-steps 1 --save-model "$tmp/v200.bin" \
  > "$tmp/v200.log" 2>&1 || bad "V 200: $(tail -2 "$tmp/v200.log")"
python3 - "$tmp/v200.bin" "$tmp/v208.bin" <<'PY'
import struct, sys
b = open(sys.argv[1], "rb").read()
h = list(struct.unpack("<256i", b[:1024]))
C, Vp = h[6], h[7]
assert h[3] == 200 and Vp == 256, h[:8]
h[7] = 208
w = b[1024:]
open(sys.argv[2], "wb").write(struct.pack("<256i", *h) + w[:208 * C * 4] + w[Vp * C * 4:])
PY
# shellcheck disable=SC2086
out=$("$prog" train $small $data --batch-size 4 --max-steps 2 --init-from "$tmp/v208.bin" \
  --save-model "$tmp/v208b.bin" 2>&1)
rc=$?
[ $rc -eq 0 ] && printf '%s' "$out" | grep -q "vocabulary 200 (padded 208)" &&
  [ "$(od -An -t d4 -j 28 -N 4 "$tmp/v208b.bin" | tr -d ' ')" = 208 ] && ok ||
  bad "--init-from with a padded vocabulary of 208: status $rc: $(printf '%s' "$out" | tail -2)"

# DataParallel on one rank against DDP on two: the same windows with --no-shuffle (DDP's rank r
# takes window 2k + r of B 4 rows; DP's window k of B 8 rows is those two), the same sums.
# shellcheck disable=SC2086
"$prog" train $tiny $data --lr 3e-3 --no-shuffle --max-steps 8 --batch-size 8 --mode dp \
  --devices cpu:2 --log-every 1 --save-params "$tmp/dp.params" > "$tmp/dp.log" 2>&1 ||
  bad "--mode dp with a GPT: $(tail -3 "$tmp/dp.log")"
# shellcheck disable=SC2086
"$mpirun" 2 120 "$prog" train $tiny $data --lr 3e-3 --no-shuffle --max-steps 8 --batch-size 4 \
  --log-every 1 --save-params "$tmp/ddp.params" > "$tmp/ddp.log" 2>&1 ||
  bad "DDP with a GPT: $(tail -3 "$tmp/ddp.log")"
if [ -s "$tmp/dp.params" ] && [ -s "$tmp/ddp.params" ]; then
  python3 - "$tmp/dp.params" "$tmp/ddp.params" <<'EOF' && ok || bad "DP and DDP differ"
import struct, sys
a = open(sys.argv[1], "rb").read(); b = open(sys.argv[2], "rb").read()
assert len(a) == len(b), (len(a), len(b))
n = len(a) // 4
x = struct.unpack("%df" % n, a); y = struct.unpack("%df" % n, b)
worst = max(abs(p - q) for p, q in zip(x, y))
print("DP vs DDP: largest parameter difference %.3g over %d parameters" % (worst, n))
sys.exit(0 if worst <= 4e-6 else 1)
EOF
fi
l1=$(sed -n 's/.*step *8\/8  loss \([0-9.]*\).*/\1/p' "$tmp/dp.log")
l2=$(sed -n 's/.*step *8\/8  loss \([0-9.]*\).*/\1/p' "$tmp/ddp.log")
[ -n "$l1" ] && [ "$l1" = "$l2" ] && ok || bad "DP's step-8 loss '$l1', DDP's '$l2'"

# --metrics-json, --trace and --log-file with a GPT on 2 ranks.
# shellcheck disable=SC2086
"$mpirun" 2 120 "$prog" train $args --max-steps 6 --metrics-json "$tmp/m.json" \
  --trace "$tmp/t.json" --log-file "$tmp/log" > "$tmp/out.log" 2>&1 ||
  bad "--metrics-json --trace --log-file: $(tail -3 "$tmp/out.log")"
python3 - "$tmp/m.json" "$tmp/t.json" <<'EOF' && ok || bad "metrics or trace file"
import json, sys
m = json.load(open(sys.argv[1]))
assert m["config"]["model"] == "gpt" and m["config"]["unit"] == "tokens", m["config"]
assert len(m["epochs"]) == 1 and m["epochs"][0]["steps"] == 6, m["epochs"]
assert m["epochs"][0]["test_loss"] > 0 and m["final"]["test_loss"] > 0, m
t = json.load(open(sys.argv[2]))
ev = t["traceEvents"] if isinstance(t, dict) else t
names = {e.get("name") for e in ev}
for want in ("forward", "backward", "optimizer"):
    assert want in names, (want, sorted(n for n in names if n)[:20])
assert "allreduce" in names, sorted(n for n in names if n)[:20]
EOF
for r in 0 1; do
  grep -q "step      6/6  loss" "$tmp/log.$r" 2>/dev/null && ok ||
    bad "--log-file: $tmp/log.$r has no step line"
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
