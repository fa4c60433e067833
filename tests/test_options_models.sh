#!/bin/sh
# Every trainer option with every model (the one training loop, trainer.h): for each row of the
# table below and each of mlp, cnn, a tiny GPT and llama-tiny, the option either works (a run of 2 steps on
# tiny data, and its effect checked: the file it writes parses, the lines it prints are there,
# the state it keeps is on disk) or is refused with status 2 and a message naming the model's
# reason. Rows: OPTIONS | MODELS THAT REFUSE IT | CHECK. Runs on 1 rank, or on 2 (np2) where
# the option needs ranks. Prints the table of results and "N passed, N failed".
set -u
prog=${MPITRAIN:-./mpitrain}
srcdir=${srcdir:-.}
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_options.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mpirun="$srcdir/tests/mpirun.sh"

awk 'BEGIN { srand(5); for (i = 0; i < 2000; i++) print "the cat sat on the mat and ran." }' \
  > "$tmp/text.txt"
"$prog" tokenize --bytes --val-fraction 0.1 -o "$tmp/shards" "$tmp/text.txt" > /dev/null ||
  { echo "FAIL: tokenize"; exit 1; }
base_mlp="--model mlp --hidden 32 --synthetic --train-limit 256 --test-limit 64 --batch-size 32"
base_cnn="--model cnn --synthetic --train-limit 128 --test-limit 64 --batch-size 16"
base_gpt="--model gpt --n-layer 1 --n-head 2 --n-embd 16 --seq-len 16 --batch-size 2
  --shards $tmp/shards/train_000000.bin --val-shards $tmp/shards/val_000000.bin --val-steps 2"
base_llama="--model llama-tiny --batch-size 2
  --shards $tmp/shards/train_000000.bin --val-shards $tmp/shards/val_000000.bin --val-steps 2"
common="--epochs 1 --max-steps 2 --threads 1 --no-progress --progress-interval 0"
# a model file of the tiny GPT's sizes, for --init-from
# shellcheck disable=SC2086 # word lists on purpose
"$prog" train $base_gpt $common --save-model "$tmp/g0.bin" > "$tmp/g0.log" 2>&1 ||
  { echo "FAIL: the GPT run that writes the model file: $(tail -3 "$tmp/g0.log")"; exit 1; }
# and a llama-tiny as Hugging Face safetensors (a Llama's only model files)
# shellcheck disable=SC2086 # word lists on purpose
"$prog" train $base_llama $common --save-model "$tmp/l0.safetensors" > "$tmp/l0.log" 2>&1 ||
  { echo "FAIL: the Llama run that writes the model file: $(tail -3 "$tmp/l0.log")"; exit 1; }

# check NAME FILE: the effect of an option, on the run's output FILE (exit 0: seen); every
# check but those of where the output goes and where the run stops also wants the 2 steps run.
check() {
  case $1 in
    logfile | quiet | stopped | ran) ;;
    *) grep -q "done: 2 steps" "$2" || return 1 ;;
  esac
  case $1 in
    ran) grep -q "done: 2 steps" "$2" ;;
    metrics) python3 -c "import json,sys; m=json.load(open(sys.argv[1])); \
assert m['epochs'][0]['steps']==2" "$tmp/w/m.json" ;;
    trace) python3 -c "import json,sys; e=json.load(open(sys.argv[1])); \
n={x.get('name') for x in e}; assert {'forward','backward','optimizer'} <= n, n" "$tmp/w/t.json" ;;
    params) [ "$(grep -o '[0-9]* parameters;' "$2" | head -n1 | tr -dc 0-9)" -gt 0 ] &&
      [ "$(wc -c < "$tmp/w/p.bin")" -eq \
        "$(($(grep -o '[0-9]* parameters;' "$2" | head -n1 | tr -dc 0-9) * 4))" ] ;;
    logfile) grep -q "done: 2 steps" "$tmp/w/log.0" && ! grep -q "done:" "$2" ;;
    quiet) ! grep -q "info:" "$2" && ! grep -q "^mpitrain: done" "$2" ;;
    steplines) [ "$(grep -c 'step      [12]/2  loss' "$2")" -eq 2 ] ;;
    evallines) [ "$(grep -c '^mpitrain: step  *[0-9]*  \(test\|val\) loss' "$2")" -ge 2 ] ;;
    profile) grep -q "op times on this rank" "$2" ;;
    ckpt) [ "$(ls "$tmp/w/ck" | grep -c '^ckpt-step.*\.mpt$')" -ge 1 ] ;;
    stopped) grep -q "stopping after global step 1" "$2" && grep -q "done: 1 steps" "$2" ;;
    replicas) grep -q "done: 2 steps" "$2" ;;
    ddp) grep -q "info: DDP: " "$2" ;;
    zero) grep -q "ZeRO-[13]" "$2" ;;
    bf16wire) grep -q "gradients bf16 on the wire" "$2" ;;
    rsag) grep -q "all-reduce rs-ag" "$2" ;;
    dp) grep -q "DP over 2 devices" "$2" ;;
    clip) grep -q "gradient clipping at norm 0.5" "$2" ;;
    betas) grep -q "betas (0.8, 0.99)" "$2" ;;
    nodecay) grep -q ">= 2-D" "$2" ;;
    sched) grep -q "schedule step (x0.5 every 1 steps)" "$2" ;;
    warm) grep -q "warm-up 1 steps" "$2" ;;
    accum) grep -q "x 2 micro-batch(es)" "$2" ;;
    nonfinite) grep -q "skip-nonfinite" "$2" ;;
    collectives) grep -q "check-collectives on" "$2" ;;
    *) echo "no check '$1'"; return 1 ;;
  esac
}

# OPTIONS | REFUSED BY | CHECK | np
rows='--metrics-json W/m.json||metrics|1
--trace W/t.json||trace|1
--save-params W/p.bin||params|1
--log-file W/log||logfile|1
--quiet||quiet|1
--log-every 1||steplines|1
--val-every 1||evallines|1
--profile||profile|1
--checkpoint-dir W/ck --checkpoint-every 1||ckpt|1
--stop-at-step 1||stopped|1
--skip-nonfinite||nonfinite|1
--grad-clip 0.5||clip|1
--optimizer adamw --adam-beta1 0.8 --adam-beta2 0.99||betas|1
--no-decay-bias-norm||nodecay|1
--schedule step --step-size 1 --gamma 0.5||sched|1
--warmup-steps 1||warm|1
--accumulate 2||accum|1
--seed 7 --no-shuffle --drop-last||ran|1
--precision fp32||ran|1
--mode dp --devices cpu:2||dp|1
--check-replicas 1||replicas|2
--check-collectives --timeout 60||collectives|2
--bucket-cap-mb 0.01 --first-bucket-cap-mb 0.01 --no-overlap||ddp|2
--buffers average --find-unused-parameters||ddp|2
--zero 1||zero|2
--zero 3 --no-prefetch||zero|2
--recompute|mlp cnn|ran|1
--grad-comm bf16||bf16wire|2
--allreduce-algo rs-ag||rsag|2
--hidden 16|cnn gpt llama|ran|1
--batchnorm|mlp gpt llama|ran|1
--dropout 0.1|gpt llama|ran|1
--conv-algo im2col|gpt llama|ran|1
--data W/|gpt llama|ran|1
--synthetic|gpt llama|ran|1
--n-layer 1|mlp cnn llama|ran|1
--init-from M0|mlp cnn|ran|1
--save-model W/M1|mlp cnn|ran|1'

printf '%-56s %-6s %-6s %-6s %-6s\n' "option" "mlp" "cnn" "gpt" "llama"
printf '%s\n' "$rows" > "$tmp/rows"
while IFS='|' read -r opts refused what np; do
  line=$(printf '%-56s' "$opts")
  for model in mlp cnn gpt llama; do
    rm -rf "$tmp/w"
    mkdir -p "$tmp/w"
    m0=$tmp/g0.bin m1=g.bin # the model files of the model: llm.c's, a Llama's safetensors
    [ "$model" = llama ] && m0=$tmp/l0.safetensors m1=l.safetensors
    o=$(printf '%s' "$opts" | sed "s|W/|$tmp/w/|g; s|M0|$m0|g; s|M1|$m1|g")
    eval "base=\$base_$model"
    mname=$model
    [ "$model" = llama ] && mname=llama-tiny
    log="$tmp/w/out.log"
    case " $refused " in *" $model "*) want=refused ;; *) want=works ;; esac
    if [ "$np" -eq 2 ]; then launch="$mpirun 2 120 $prog"; else launch="$prog"; fi
    # shellcheck disable=SC2086 # word lists on purpose
    $launch train $base $common $o > "$log" 2>&1 < /dev/null # mpirun reads stdin: the rows
    rc=$?
    name=$(printf '%s' "$opts" | cut -d' ' -f1)
    if [ "$want" = refused ]; then
      if [ $rc -eq 2 ] && grep -q -- "$name does not apply to --model $mname: [a-z]" "$log"; then
        ok
        line="$line refused"
      else
        bad "$opts with $model: status $rc, want a refusal naming the reason: $(tail -2 "$log")"
        line="$line BAD   "
      fi
    elif [ $rc -eq 0 ] && check "$what" "$log"; then
      ok
      line="$line works "
    else
      bad "$opts with $model: status $rc or no effect ($what): $(tail -3 "$log")"
      line="$line BAD   "
    fi
  done
  echo "$line"
  echo x >> "$tmp/done"
done < "$tmp/rows"
[ "$(wc -l < "$tmp/done")" -eq "$(wc -l < "$tmp/rows")" ] ||
  bad "$(wc -l < "$tmp/done") of the table's $(wc -l < "$tmp/rows") rows were run"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
