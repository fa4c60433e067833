#!/bin/sh
# bench/train_bench.sh: training throughput of `mpitrain train` in the modes single (one
# process), ddp (mpirun -np W) and dp (--mode dp --devices cpu:K, skipped with a message while
# the trainer rejects it), with per-step forward / backward / exposed communication / optimizer /
# total times, samples/s, the fraction of all-reduce hidden behind backward, and the scaling
# efficiency samples/s(W) / (W * samples/s(1)) against one process of the same model and batch.
#
# How a run is timed: `mpitrain train --synthetic --epochs 2 --max-steps N ...`. Epoch 1 is the
# warm-up; samples/s is epoch 2's (samples of all ranks / the epoch's training seconds, which
# exclude evaluation). The step breakdown is the trainer's (mean over all 2N steps, slowest
# rank: it includes the warm-up epoch). Each configuration runs --repeats times, configurations
# alternating, and the median is reported.
#
# Examples (each sweep is one command):
#   bench/train_bench.sh --model mlp --mode ddp --np 2
#   bench/train_bench.sh --sweep-ranks 1,2,4 --json ranks.json
#   bench/train_bench.sh --sweep-buckets 0.25,0.5,1,2,4,8,25,100 --overlap both --json caps.json
set -u
. "$(dirname "$0")/bench_lib.sh"

usage() {
  cat <<'EOF'
usage: bench/train_bench.sh [options]
  --build DIR            build folder with mpitrain (default: $MPT_BUILD, ., build, build-*)
  --model mlp|cnn        model (default mlp)
  --mode single|ddp|dp   (default ddp)
  --np W                 ranks for ddp (default 2)
  --devices cpu:K        devices for dp (default cpu:2)
  --batch-size N         samples per step per rank (default 64)
  --bucket-cap-mb F      DDP bucket cap in MiB (default: the trainer's, 25)
  --first-bucket-cap-mb F   first bucket's cap (default: the trainer's, 1; in a bucket
                         sweep: the swept cap, so that one cap applies to every bucket)
  --overlap on|off|both  all-reduce during backward (default on)
  --steps N              timed steps, after a warm-up epoch of N steps (default 200)
  --threads N            BLAS threads per rank (default 1)
  --repeats R            runs per configuration; the median is reported (default 3)
  --data synthetic|real  synthetic data (default) or Fashion-MNIST from Debian's package
  --no-baseline          do not run the one-process baseline (no scaling efficiency)
  --sweep-ranks LIST     e.g. 1,2,4: 1 is a single process, others ddp (over the CPUs:
                         oversubscribed, marked so in the results)
  --sweep-buckets LIST   e.g. 0.25,0.5,1,2,4,8,25,100: one ddp run per bucket cap (a
                         model with more parameters shows more: --extra "--hidden 1024,1024,1024")
  --extra "ARGS"         more `mpitrain train` flags, the same for every run
  --out DIR              keep every run's metrics and log here (default: a temporary folder)
  --json FILE            write the summary as JSON
  --wait-idle S          before each run, wait up to S seconds for the CPUs to be 90% idle
                         (shared machines; the idle fraction is recorded either way)
  -h, --help
EOF
}

model=mlp mode=ddp np=2 devices=cpu:2 batch=64 cap="" first_cap="" overlap=on steps=200 threads=1
repeats=3 data=synthetic baseline=1 sweep_ranks="" sweep_buckets="" extra="" out="" json=""
while [ $# -gt 0 ]; do
  case $1 in
    --no-baseline|-h|--help) ;;
    *) [ $# -ge 2 ] || bench_die "$1 needs a value (see --help)" ;;
  esac
  case $1 in
    --build) MPT_BUILD=$2; shift ;;
    --model) model=$2; shift ;;
    --mode) mode=$2; shift ;;
    --np) np=$2; shift ;;
    --devices) devices=$2; shift ;;
    --batch-size) batch=$2; shift ;;
    --bucket-cap-mb) cap=$2; shift ;;
    --first-bucket-cap-mb) first_cap=$2; shift ;;
    --overlap) overlap=$2; shift ;;
    --steps) steps=$2; shift ;;
    --threads) threads=$2; shift ;;
    --repeats) repeats=$2; shift ;;
    --data) data=$2; shift ;;
    --no-baseline) baseline=0 ;;
    --sweep-ranks) sweep_ranks=$2; shift ;;
    --sweep-buckets) sweep_buckets=$2; shift ;;
    --extra) extra=$2; shift ;;
    --out) out=$2; shift ;;
    --json) json=$2; shift ;;
    --wait-idle) MPT_BENCH_WAIT_IDLE_S=$2; export MPT_BENCH_WAIT_IDLE_S; shift ;;
    -h|--help) usage; exit 0 ;;
    *) usage >&2; bench_die "unknown option '$1'" ;;
  esac
  shift
done
case $model in mlp|cnn) ;; *) bench_die "--model: '$model' is not mlp or cnn" ;; esac
case $mode in single|ddp|dp) ;; *) bench_die "--mode: '$mode' is not single, ddp or dp" ;; esac
case $overlap in on|off|both) ;; *) bench_die "--overlap: '$overlap' is not on, off or both" ;; esac
case $data in synthetic|real) ;; *) bench_die "--data: '$data' is not synthetic or real" ;; esac
for v in "$np" "$batch" "$steps" "$threads" "$repeats"; do
  case $v in ''|*[!0-9]*) bench_die "'$v' is not a positive integer" ;; esac
  [ "$v" -ge 1 ] || bench_die "'$v' is not a positive integer"
done
bench_find_build
PY=$(bench_python)
if [ -z "$out" ]; then
  out=$(mktemp -d "${TMPDIR:-/tmp}/mpt_train_bench.XXXXXX")
  echo "runs in $out"
fi
mkdir -p "$out" || bench_die "cannot create $out"
manifest=$out/manifest.jsonl
: >"$manifest"

# The configurations: lines of "mode np devices cap overlap".
overlaps=$overlap
[ "$overlap" = both ] && overlaps="on off"
configs=""
add() { configs="$configs$1
"; }
if [ -n "$sweep_ranks" ]; then
  for w in $(bench_words "$sweep_ranks"); do
    for ov in $overlaps; do
      if [ "$w" -eq 1 ]; then add "single 1 - ${cap:--} -"; break; fi
      add "ddp $w - ${cap:--} $ov"
    done
  done
elif [ -n "$sweep_buckets" ]; then
  for c in $(bench_words "$sweep_buckets"); do
    for ov in $overlaps; do add "ddp $np - $c $ov"; done
  done
  [ "$baseline" -eq 1 ] && add "single 1 - - -"
else
  case $mode in
    single) add "single 1 - - -" ;;
    ddp) for ov in $overlaps; do add "ddp $np - ${cap:--} $ov"; done
         [ "$baseline" -eq 1 ] && add "single 1 - - -" ;;
    dp) add "dp 1 $devices - -"
        [ "$baseline" -eq 1 ] && add "single 1 - - -" ;;
  esac
fi

dataflag=--synthetic
[ "$data" = real ] && dataflag=""

run_one() { # mode np devices cap overlap repeat
  _mode=$1 _np=$2 _dev=$3 _cap=$4 _ov=$5 _rep=$6
  _tag="${model}_${_mode}_np${_np}_dev${_dev#cpu:}_cap${_cap}_ov${_ov}_b${batch}_r${_rep}"
  _metrics=$out/$_tag.json _log=$out/$_tag.log
  set -- train --model "$model" --epochs 2 --max-steps "$steps" --batch-size "$batch" \
    --threads "$threads" --test-limit 1000 --no-progress --metrics-json "$_metrics"
  [ -n "$dataflag" ] && set -- "$@" "$dataflag"
  [ "$_cap" != - ] && set -- "$@" --bucket-cap-mb "$_cap"
  if [ -n "$first_cap" ]; then
    set -- "$@" --first-bucket-cap-mb "$first_cap"
  elif [ -n "$sweep_buckets" ] && [ "$_cap" != - ]; then
    set -- "$@" --first-bucket-cap-mb "$_cap"
  fi
  [ "$_ov" = off ] && set -- "$@" --no-overlap
  [ "$_mode" = dp ] && set -- "$@" --mode dp --devices "$_dev"
  # shellcheck disable=SC2086 # extra is a list of words
  set -- "$@" $extra
  rm -f "$_metrics"
  _launch=0
  [ "$_mode" = ddp ] && _launch=$_np
  _idle=$(bench_wait_idle)
  _t0=$(date +%s)
  OPENBLAS_NUM_THREADS=$threads bench_launch "$_launch" "$MPT_BUILD/mpitrain" "$@" </dev/null >"$_log" 2>&1
  _rc=$?
  _secs=$(( $(date +%s) - _t0 ))
  _cmd="mpitrain $*"
  [ "$_launch" -gt 0 ] && _cmd="mpirun -np $_np $_cmd"
  if [ "$_rc" -ne 0 ] && [ "$_mode" = dp ]; then
    echo "  skip: the trainer rejects --mode dp: $(grep -m1 -i 'error\|dp' "$_log")" >&2
  elif [ "$_rc" -ne 0 ]; then
    echo "  FAILED (exit $_rc), log $_log:" >&2
    tail -5 "$_log" >&2
  fi
  printf '{"tag": "%s", "model": "%s", "mode": "%s", "np": %s, "devices": "%s", "batch_size": %s, "bucket_cap_mb": "%s", "overlap": "%s", "threads": %s, "steps": %s, "data": "%s", "repeat": %s, "rc": %s, "seconds": %s, "metrics": "%s", "log": "%s", "extra": "%s", "idle_before": %s, "command": "%s"}\n' \
    "$_tag" "$model" "$_mode" "$_np" "$_dev" "$batch" "$_cap" "$_ov" "$threads" "$steps" \
    "$data" "$_rep" "$_rc" "$_secs" "$_metrics" "$_log" "$extra" "$_idle" "$_cmd" >>"$manifest"
}

rep=1
while [ "$rep" -le "$repeats" ]; do
  echo "$configs" | while read -r m w dv c ov; do
    [ -n "$m" ] || continue
    echo "repeat $rep/$repeats: $model $m np=$w devices=$dv cap=$c overlap=$ov" >&2
    run_one "$m" "$w" "$dv" "$c" "$ov" "$rep"
  done
  rep=$((rep + 1))
done

set -- train --manifest "$manifest" --cpus "$(bench_ncpus)" --build "$MPT_BUILD"
[ -n "$json" ] && set -- "$@" --json "$json"
"$PY" "$BENCH_SRCDIR/bench/summarize.py" "$@"
