#!/bin/sh
# `mpitrain train --no-decay-bias-norm` (optimizer parameter groups, mpt_param_groups_split_decay):
# with weight decay the final parameters differ from the default run (which decays everything);
# with --weight-decay 0 the option changes nothing, bit for bit; the default run is untouched
# (the other tests run it); a checkpointed run resumes exactly. Compares the --save-params files of short synthetic runs.
set -u
prog=${MPITRAIN:-./mpitrain}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail=0
run() { # name args...
  name=$1
  shift
  if ! "$prog" train --synthetic --train-limit 128 --test-limit 32 --epochs 1 --batch-size 32 \
      --model mlp --hidden 16 --no-progress --save-params "$dir/$name" "$@" >"$dir/$name.log" 2>&1; then
    echo "FAIL: mpitrain train $* exited non-zero:"
    tail -n 5 "$dir/$name.log"
    fail=1
  fi
}
run all
run split --no-decay-bias-norm
run all0 --weight-decay 0
run split0 --weight-decay 0 --no-decay-bias-norm
run adamw --optimizer adamw --lr 0.01 --weight-decay 0.1
run adamw_split --optimizer adamw --lr 0.01 --weight-decay 0.1 --no-decay-bias-norm
if cmp -s "$dir/all" "$dir/split"; then
  echo "FAIL: --no-decay-bias-norm changed nothing with weight decay 0.0005 (SGD)"
  fail=1
fi
if cmp -s "$dir/adamw" "$dir/adamw_split"; then
  echo "FAIL: --no-decay-bias-norm changed nothing with weight decay 0.1 (AdamW)"
  fail=1
fi
if ! cmp -s "$dir/all0" "$dir/split0"; then
  echo "FAIL: --no-decay-bias-norm changed the parameters with --weight-decay 0"
  fail=1
fi
# Groups are configuration, not checkpoint state: a run stopped at step 3 and resumed with the
# same options ends bit-identical to the uninterrupted run (AdamW state sliced by the groups).
g="--optimizer adamw --lr 0.01 --weight-decay 0.1 --no-decay-bias-norm"
run stop $g --checkpoint-dir "$dir/ck" --stop-at-step 3
run resumed $g --resume "$dir/ck"
if ! cmp -s "$dir/adamw_split" "$dir/resumed"; then
  echo "FAIL: with --no-decay-bias-norm, stop at step 3 + --resume differs from the uninterrupted run"
  fail=1
fi
[ $fail -eq 0 ] && echo "PASS: --no-decay-bias-norm"
exit $fail
