#!/bin/sh
# bench/comm_yield.sh: what the comm worker's waiting costs the compute. Trains the same short
# run at 2 ranks with Open MPI's progress loop spinning (OMPI_MCA_mpi_yield_when_idle=0, Open
# MPI's default when not oversubscribed) and yielding (mpitrain's default: mpt_comm_init sets it
# to 1 unless it is set), alternating, and prints each run's samples/s, the medians and their
# ratio. Usage:
#   bench/comm_yield.sh [--model mlp|cnn] [--pairs N] [--train-limit N] [--np N] [--build DIR]
# Defaults: mlp, 5 pairs, 16384 samples, 2 ranks. Environment: as bench/bench_lib.sh
# (MPT_BENCH_MPIRUN_ARGS, default "--bind-to none"). Output: one line per run, then
# "median spin S, yield Y samples/s: yield/spin R".
set -u
. "$(dirname "$0")/bench_lib.sh"
model=mlp pairs=5 limit=16384 np=2
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --model) model=${2:?--model needs a value}; shift 2 ;;
    --pairs) pairs=${2:?--pairs needs a value}; shift 2 ;;
    --train-limit) limit=${2:?--train-limit needs a value}; shift 2 ;;
    --np) np=${2:?--np needs a value}; shift 2 ;;
    --build) MPT_BUILD=${2:?--build needs a value}; shift 2 ;;
    *) bench_die "unknown argument '$1' (see --help)" ;;
  esac
done
case $pairs$limit$np in *[!0-9]*) bench_die "--pairs, --train-limit and --np take numbers" ;; esac
bench_find_build
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_yield.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
i=0
while [ $i -lt "$pairs" ]; do
  for mode in spin yield; do
    if [ $mode = spin ]; then
      OMPI_MCA_mpi_yield_when_idle=0
      export OMPI_MCA_mpi_yield_when_idle
    else
      unset OMPI_MCA_mpi_yield_when_idle
    fi
    bench_launch "$np" "$MPT_BUILD/mpitrain" train --synthetic --model "$model" \
      --train-limit "$limit" --test-limit 64 --epochs 1 --no-progress > "$tmp/out" 2>&1 ||
      { cat "$tmp/out"; bench_die "the $mode run failed"; }
    s=$(sed -n 's/.* \([0-9][0-9]*\) samples\/s overall.*/\1/p' "$tmp/out")
    echo "$model np $np $mode $s samples/s"
    echo "$s" >> "$tmp/$mode"
  done
  i=$((i + 1))
done
median() { sort -n "$1" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ms=$(median "$tmp/spin")
my=$(median "$tmp/yield")
awk -v s="$ms" -v y="$my" 'BEGIN { printf "median spin %s, yield %s samples/s: yield/spin %.2f\n", s, y, y / s }'
