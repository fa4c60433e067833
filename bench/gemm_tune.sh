#!/bin/sh
# bench/gemm_tune.sh: --gemm auto (the fixed rule) against --gemm tune (timed per shape, cached)
# on the same short runs, side by side: for each model and instruction set, pairs of runs
# alternating which goes first, each run's samples/s, the medians and their ratio, and the load
# average before each pair (a shared machine's load shows in the spread). The instruction set is
# the CPU's own, then AVX2 forced (MPT_CPU_ISA=avx2, OPENBLAS_CORETYPE=Haswell,
# ONEDNN_MAX_CPU_ISA=AVX2). The tune runs share a fresh cache folder (XDG_CACHE_HOME): the first
# of each setting times its shapes (after its first step, outside the training time), the others
# read the cache; the first tune run's table is printed. Usage:
#   bench/gemm_tune.sh [--models mlp,cnn] [--pairs N] [--np N] [--isa native,avx2] [--build DIR]
# Defaults: mlp,cnn; 5 pairs; 2 ranks; native,avx2. Training samples: mlp 32768, cnn 4096
# (--synthetic). Environment: as bench/bench_lib.sh. Output: a machine line, then one line per
# run (samples/s, and the CPU seconds of all its processes: less sensitive to other jobs' load
# than the wall clock), then per setting the median CPU seconds and "median auto A, tune T samples/s: tune/auto R; median of the pairs'
# ratios P" (P: each pair's tune/auto, which cancels the load that both runs of a pair share).
set -u
. "$(dirname "$0")/bench_lib.sh"
models=mlp,cnn pairs=5 np=2 isas=native,avx2
while [ $# -gt 0 ]; do
  case $1 in
    -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --models) models=${2:?--models needs a value}; shift 2 ;;
    --pairs) pairs=${2:?--pairs needs a value}; shift 2 ;;
    --np) np=${2:?--np needs a value}; shift 2 ;;
    --isa) isas=${2:?--isa needs a value}; shift 2 ;;
    --build) MPT_BUILD=${2:?--build needs a value}; shift 2 ;;
    *) bench_die "unknown argument '$1' (see --help)" ;;
  esac
done
case $pairs$np in *[!0-9]*) bench_die "--pairs and --np take numbers" ;; esac
bench_find_build
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_gemmtune.XXXXXX") || exit 1
trap 'rm -rf "$tmp"' EXIT
XDG_CACHE_HOME=$tmp/cache
export XDG_CACHE_HOME
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
flags=$(grep -m 1 '^flags' /proc/cpuinfo)
isa_best=avx2
case $flags in *avx512f*) isa_best=avx512 ;; esac
echo "machine: $cpu, $(nproc) cores, best ISA $isa_best, $(free -g | awk '/^Mem:/ { print $2 }') GiB;" \
  "commit $(git -C "$BENCH_SRCDIR" rev-parse --short HEAD 2> /dev/null || echo unknown)"
echo "load average at start: $(cut -d ' ' -f 1-3 /proc/loadavg)"
# The CPU seconds (user + system) of this shell's finished children in file $1, written by
# `times` in this shell itself (a command substitution's subshell has no such children).
child_cpu() {
  tail -n 1 "$1" | awk '{ s = 0; for (i = 1; i <= 2; i++) { split($i, p, "m"); sub("s", "", p[2]); s += p[1] * 60 + p[2] } printf "%.2f\n", s }'
}
median() { sort -n "$1" | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for isa in $(bench_words "$isas"); do
  if [ "$isa" = avx2 ]; then
    MPT_CPU_ISA=avx2 OPENBLAS_CORETYPE=Haswell ONEDNN_MAX_CPU_ISA=AVX2
    export MPT_CPU_ISA OPENBLAS_CORETYPE ONEDNN_MAX_CPU_ISA
  else
    unset MPT_CPU_ISA OPENBLAS_CORETYPE ONEDNN_MAX_CPU_ISA
  fi
  for model in $(bench_words "$models"); do
    limit=32768
    [ "$model" = cnn ] && limit=4096
    : > "$tmp/auto"
    : > "$tmp/tune"
    : > "$tmp/ratio"
    : > "$tmp/cpu_auto"
    : > "$tmp/cpu_tune"
    i=0
    while [ $i -lt "$pairs" ]; do
      order="auto tune"
      [ $((i % 2)) -eq 1 ] && order="tune auto"
      echo "pair $((i + 1)): load average $(cut -d ' ' -f 1-3 /proc/loadavg)"
      for mode in $order; do
        times > "$tmp/t0"
        bench_launch "$np" "$MPT_BUILD/mpitrain" train --synthetic --model "$model" \
          --train-limit "$limit" --test-limit 64 --epochs 1 --no-progress --gemm "$mode" \
          < /dev/null > "$tmp/out" 2>&1 || { cat "$tmp/out"; bench_die "the $mode run failed"; }
        times > "$tmp/t1"
        c0=$(child_cpu "$tmp/t0")
        c1=$(child_cpu "$tmp/t1")
        s=$(sed -n 's/.* \([0-9][0-9]*\) samples\/s overall.*/\1/p' "$tmp/out")
        cpu=$(awk -v a="$c0" -v b="$c1" 'BEGIN { printf "%.2f", b - a }')
        echo "$model isa $isa np $np --gemm $mode: $s samples/s, $cpu CPU s (all ranks, start-up included)"
        echo "$s" >> "$tmp/$mode"
        echo "$cpu" >> "$tmp/cpu_$mode"
        [ "$mode" = tune ] && [ $i -eq 0 ] && grep -o 'GEMM tune: .*' "$tmp/out" | grep -v 'no cache' |
          sed 's/^/  /' | cut -c 1-600
      done
      paste "$tmp/auto" "$tmp/tune" | tail -n 1 | awk '{ print $2 / $1 }' >> "$tmp/ratio"
      i=$((i + 1))
    done
    ma=$(median "$tmp/auto")
    mt=$(median "$tmp/tune")
    mr=$(median "$tmp/ratio")
    echo "$model isa $isa: median CPU s per run: auto $(median "$tmp/cpu_auto"), tune $(median "$tmp/cpu_tune")"
    awk -v m="$model" -v i="$isa" -v a="$ma" -v t="$mt" -v r="$mr" 'BEGIN {
      printf "%s isa %s: median auto %s, tune %s samples/s: tune/auto %.3f; median of the pairs'"'"' ratios %.3f\n", m, i, a, t, t / a, r }'
  done
done
echo "load average at end: $(cut -d ' ' -f 1-3 /proc/loadavg)"
