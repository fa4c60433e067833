#!/bin/sh
# What a new user meets, each checked against the program's output:
# --version names the build's features and libraries; a typo under mpirun -np 4 prints one
# message, not the usage once per rank; --log-file (FILE.RANK per rank), --quiet; the one-line
# progress on rank 0 when stderr is a pipe; warnings for options without effect and the logged
# configuration; the learning rate per epoch in the metrics JSON; --checkpoint-dir creates its
# parents; 3 skipped steps in a row stop the run without checkpointing; the DP trace has every
# step and each device's forward and backward; SIGUSR1 is named as such; --resume auto.
# Prints "N passed, N failed".
set -u
dir=$(dirname "$0")
prog=${MPITRAIN:-./mpitrain}
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
has() { printf '%s\n' "$1" | grep -q -- "$2"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_usage.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
small="train --synthetic --train-limit 640 --test-limit 64 --epochs 1 --batch-size 32 --threads 1 --no-progress"

# --version: features and library versions.
out=$("$prog" --version)
has "$out" "^mpitrain [0-9]" && has "$out" "^features: cuda \(yes\|no\), nccl \(yes\|no\), onednn \(yes\|no\), fault injection" &&
  has "$out" "^MPI: Open MPI v[0-9]" && has "$out" "^OpenBLAS: OpenBLAS [0-9]" && has "$out" "^zlib: [0-9]" && ok ||
  bad "--version lacks features or library versions: $out"

# A typo: the error and where the options are (two lines, not the usage) as a plain process;
# under mpirun -np 4 one message (rank 0), no usage.
out=$("$prog" train --epochz 3 2>&1)
[ $? -eq 2 ] && has "$out" "unknown option '--epochz'" && has "$out" "mpitrain train --help. lists the options" &&
  [ "$(printf '%s\n' "$out" | wc -l)" -eq 2 ] && ok ||
  bad "plain typo: $(printf '%s' "$out" | head -n 2)"
out=$("$dir/mpirun.sh" 4 60 "$prog" train --epochz 3 2>&1)
rc=$?
n=$(printf '%s\n' "$out" | grep -c "^mpitrain")
[ $rc -eq 2 ] && [ "$n" -le 2 ] && has "$out" "unknown option '--epochz'" && ! has "$out" "usage: mpitrain train" && ok ||
  bad "typo under mpirun -np 4: status $rc, $n lines from mpitrain (want <= 2, no usage)"

out=$("$dir/mpirun.sh" 3 60 "$prog" --help 2>&1)
[ "$(printf '%s\n' "$out" | grep -c "^usage: mpitrain train")" -eq 1 ] && ok || bad "--help under mpirun -np 3 not printed once"

# --log-file: one file per rank, each with that rank's own lines; nothing left on stderr.
out=$("$dir/mpirun.sh" 2 60 "$prog" $small --log-file "$tmp/run.log" 2>&1)
rc=$?
[ $rc -eq 0 ] && ! has "$out" "mpitrain" && grep -q "rank 0/2" "$tmp/run.log.0" &&
  grep -q "rank 1/2" "$tmp/run.log.1" && ! grep -q "rank 0/2" "$tmp/run.log.1" &&
  grep -q "epoch   1/1" "$tmp/run.log.0" && ok ||
  bad "--log-file: status $rc; stderr: $(printf '%s' "$out" | head -n 2); files: $(ls "$tmp")"
# a second run (a resubmitted job) appends: the first run's lines stay
"$dir/mpirun.sh" 2 60 "$prog" $small --log-file "$tmp/run.log" >/dev/null 2>&1
[ "$(grep -c "epoch   1/1" "$tmp/run.log.0")" -eq 2 ] && ok || bad "--log-file does not append"

# ... and a failure is still named on the launcher's stderr, with the log file to read.
out=$("$dir/mpirun.sh" 2 60 "$prog" $small --log-file "$tmp/bad.log" --checkpoint-dir /dev/null 2>&1)
[ $? -ne 0 ] && has "$out" "rank 0/2\] error: .*--checkpoint-dir '/dev/null' exists and is not a directory.*(log: $tmp/bad.log.0)" &&
  grep -q "is not a directory" "$tmp/bad.log.0" && ok || bad "--log-file failure note: $(printf '%s' "$out" | head -n 2)"

# --quiet: warnings only (one for --bucket-cap-mb, which one rank does not use).
out=$("$prog" $small --quiet --bucket-cap-mb 4 2>&1)
rc=$?
[ $rc -eq 0 ] && [ "$(printf '%s\n' "$out" | grep -c .)" -eq 1 ] &&
  has "$out" "warning: --bucket-cap-mb has no effect" && ok || bad "--quiet: status $rc, output: $out"

# Progress on rank 0 when stderr is a pipe: at most one line per interval, none when 0.
prog_args="train --synthetic --train-limit 40000 --test-limit 64 --epochs 1 --batch-size 32 --threads 1 --max-steps 300"
t0=$(date +%s%N)
out=$("$dir/mpirun.sh" 2 60 "$prog" $prog_args --progress-interval 0.1 2>&1)
t_ms=$((($(date +%s%N) - t0) / 1000000))
n=$(printf '%s\n' "$out" | grep -c "rank 0/2\] info: progress: epoch 1/1 step [0-9]*/300, global step [0-9]*/300, .* samples/s, ETA ")
n1=$(printf '%s\n' "$out" | grep -c "rank 1/2\] info: progress")
# at least 2 lines, at most one per 0.1 s of the run (not one per step), none on rank 1
[ "$n" -ge 2 ] && [ "$n" -le $((t_ms / 100 + 1)) ] && [ "$n" -lt 300 ] && [ "$n1" -eq 0 ] && ok ||
  bad "progress lines: rank 0 $n in $t_ms ms at one per 0.1 s at most (and >= 2), rank 1 $n1"
out=$("$prog" $prog_args --progress-interval 0 2>&1)
! has "$out" "progress:" && ok || bad "--progress-interval 0 still printed progress"
out=$("$prog" $prog_args 2>&1) # default 30 s: a run of a second prints none
! has "$out" "progress:" && ok || bad "the default interval printed progress in a short run"

# Options without effect are named (also abbreviated or with =, as getopt takes them; --device
# is another option than --devices); the effective configuration is logged once.
out=$("$prog" $small --devices=cpu:2 --moment 0.5 --optimizer adamw --min-lr 0.01 --schedule step --device cpu 2>&1)
has "$out" "warning: --devices has no effect: it needs --mode dp" &&
  has "$out" "warning: --momentum has no effect" && has "$out" "warning: --min-lr has no effect" && ok ||
  bad "no-effect warnings missing: $(printf '%s' "$out" | grep warning)"
out=$("$dir/mpirun.sh" 2 60 "$prog" $small --lr 0.02 --buffers average --check-collectives 2>&1)
n=$(printf '%s\n' "$out" | grep -c "info: configuration: ")
[ "$n" -eq 1 ] && has "$out" "configuration: .*sgd lr 0.02, momentum 0.9, .*schedule cosine to 0 over 10 steps.*DDP (overlap on, buffers average).*check-collectives on" &&
  has "$out" "warning: --buffers has no effect: the model has no BatchNorm" && ok ||
  bad "configuration line ($n): $(printf '%s' "$out" | grep configuration)"

# The learning rate per epoch in the metrics JSON: step schedule halving every epoch of 20 steps.
"$prog" $small --epochs 2 --schedule step --gamma 0.5 --lr 0.1 --metrics-json "$tmp/m.json" >/dev/null 2>&1
grep -q '"epoch": 1, .*"lr_first": 0.1, "lr_last": 0.1, "steps": 20' "$tmp/m.json" &&
  grep -q '"epoch": 2, .*"lr_first": 0.05, "lr_last": 0.05, "steps": 20' "$tmp/m.json" && ok ||
  bad "lr per epoch: $(grep lr_first "$tmp/m.json")"

# --checkpoint-dir creates the missing parents (a/b/c).
out=$("$prog" $small --max-steps 2 --checkpoint-dir "$tmp/new/a/b/c" 2>&1)
[ $? -eq 0 ] && [ -f "$tmp/new/a/b/c/ckpt-step00000002.mpt" ] && ok || bad "--checkpoint-dir a/b/c: $(printf '%s' "$out" | tail -n 1)"

# 3 skipped steps in a row stop the run at once, also without checkpoints (64 steps otherwise).
out=$("$prog" train --synthetic --train-limit 2048 --test-limit 64 --epochs 1 --batch-size 32 \
      --threads 1 --no-progress --lr 1000 --skip-nonfinite 2>&1)
rc=$?
n=$(printf '%s\n' "$out" | grep -c "optimizer step skipped")
[ $rc -eq 1 ] && [ "$n" -eq 3 ] && has "$out" "the last 3 optimizer steps were all skipped" && ok ||
  bad "3 skips in a row: status $rc, $n steps skipped (want 3)"

# DP trace: 10 steps on 2 devices give 10 optimizer events and 10 forward and backward per device.
out=$("$prog" $small --max-steps 10 --mode dp --devices cpu:2 --trace "$tmp/t.json" \
      --metrics-json "$tmp/dp.json" 2>&1)
c() { grep -c "\"name\":\"$1\",\"ph\":\"X\",\"pid\":0,\"tid\":$2," "$tmp/t.json"; }
[ "$(c optimizer 0)" -eq 10 ] && [ "$(c forward 2)" -eq 10 ] && [ "$(c forward 3)" -eq 10 ] &&
  [ "$(c backward 2)" -eq 10 ] && [ "$(c backward 3)" -eq 10 ] && ! has "$out" dropped && ok ||
  bad "DP trace: optimizer $(c optimizer 0), forward $(c forward 2)/$(c forward 3), backward $(c backward 2)/$(c backward 3)"
has "$out" "forward+backward [0-9.]* (DP: one pass per device)" && ! has "$out" "backward 0.000" &&
  grep -q '"forward_includes_backward": true' "$tmp/dp.json" && ok ||
  bad "DP breakdown: $(printf '%s' "$out" | grep breakdown)"

# SIGUSR1 is named as SIGUSR1.
"$prog" train --synthetic --train-limit 100000 --test-limit 64 --epochs 2 --no-progress --threads 1 \
  >"$tmp/usr1.log" 2>&1 &
pid=$!
for _ in $(seq 1 100); do grep -q "configuration:" "$tmp/usr1.log" 2>/dev/null && break; sleep 0.2; done
sleep 0.5
kill -USR1 "$pid"
wait "$pid"
rc=$?
[ $rc -eq 75 ] && grep -q "SIGUSR1 received: stopping after step" "$tmp/usr1.log" &&
  grep -q "preempted (SIGUSR1)" "$tmp/usr1.log" && ok || bad "SIGUSR1: status $rc; $(grep -i "received\|preempted" "$tmp/usr1.log")"

# --resume auto: one command line for the first run and the resubmission; the result is
# bit-identical to an uninterrupted run; changed options are refused, naming them.
auto="train --synthetic --train-limit 2048 --test-limit 64 --epochs 2 --batch-size 32 --threads 1 --no-progress"
"$prog" $auto --save-params "$tmp/full.bin" >/dev/null 2>&1
out=$("$prog" $auto --checkpoint-dir "$tmp/ck" --resume auto --stop-at-step 25 2>&1)
[ $? -eq 0 ] && has "$out" "--resume auto: no checkpoint in $tmp/ck: starting a new run" && ok ||
  bad "--resume auto, first run: $(printf '%s' "$out" | grep -i "auto\|error")"
out=$("$prog" $auto --checkpoint-dir "$tmp/ck" --resume auto --save-params "$tmp/auto.bin" 2>&1)
[ $? -eq 0 ] && has "$out" "resumed from $tmp/ck: epoch 1, global step 25" && cmp -s "$tmp/full.bin" "$tmp/auto.bin" && ok ||
  bad "--resume auto, second run: $(printf '%s' "$out" | grep -i "resum\|error")"
out=$("$prog" $auto --checkpoint-dir "$tmp/ck" --resume auto 2>&1) # a finished run, submitted again
[ $? -eq 0 ] && has "$out" "the checkpoint ends the run (2 epoch(s) done): nothing left to train" && ok ||
  bad "--resume auto of a finished run: $(printf '%s' "$out" | tail -n 2)"
out=$("$prog" $auto --checkpoint-dir "$tmp/ck" --resume auto --lr 0.1 --epochs 3 2>&1)
[ $? -eq 1 ] && has "$out" "2 option(s) differ from the run that wrote the checkpoint (--epochs 2 in the checkpointed run, 3 now; --lr 0.05 in the checkpointed run, 0.1 now)" && ok ||
  bad "--resume with other options: $(printf '%s' "$out" | grep -i error)"
out=$("$prog" $auto --checkpoint-dir "$tmp/ck" --resume auto --no-decay-bias-norm 2>&1)
[ $? -eq 1 ] && has "$out" "--no-decay-bias-norm 0 in the checkpointed run, 1 now" && ok ||
  bad "--resume with --no-decay-bias-norm added: $(printf '%s' "$out" | grep -i error)"
out=$("$prog" $auto --resume auto 2>&1)
[ $? -eq 2 ] && has "$out" "--resume auto needs --checkpoint-dir" && ok || bad "--resume auto without a directory"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
