#!/bin/sh
# bench/flight_recorder_cost.sh: what the comm's flight recorder (docs/hangs.md) costs. Two
# measurements, each alternating the recorder on (the default, 2000 entries) and off
# (--flight-recorder 0), the order of each pair swapped from one pair to the next:
#   1. gpt-mini trained for 6 steps at W ranks on the fortunes (B 8, T 256, 1 thread per rank):
#      the trainer's mean step time of each run, the ratio on/off pair by pair and its median;
#   2. the smallest all-reduce (8 bytes, 20000 calls), where the recorder's share of a
#      collective is largest: mpitrain's time per call, on - off.
# Usage: bench/flight_recorder_cost.sh [--np W] [--pairs N] [--build DIR]   (defaults 2, 5)
set -u
. "$(dirname "$0")/bench_lib.sh"
np=2 pairs=5
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  esac
  case $1 in --np | --pairs | --build) ;; *) bench_die "unknown option '$1' (see --help)" ;; esac
  bench_option_value "$@"
  case $1 in
    --np) np=$2 ;;
    --pairs) pairs=$2 ;;
    --build) MPT_BUILD=$2 ;;
  esac
  shift 2
done
bench_count --np "$np"
bench_count --pairs "$pairs"
bench_find_build
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_frcost.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fortunes=""
for f in /usr/share/games/fortunes/*; do # the text files, not the indexes (.dat) nor .u8 links
  case $f in *.dat | *.u8) ;; *) [ ! -f "$f" ] || fortunes="$fortunes $f" ;; esac
done
[ -n "$fortunes" ] || bench_die "no fortunes in /usr/share/games/fortunes (apt-get install fortunes)"
# shellcheck disable=SC2086 # one word per file (the fortunes' names have no spaces)
"$MPT_BUILD/mpitrain" tokenize --bytes --val-fraction 0.1 -o "$tmp/sh" $fortunes >/dev/null ||
  bench_die "tokenize failed"

median() { sort -g | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2];
  else printf "%.4g\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "# 1. gpt-mini, $np ranks, 6 steps, B 8, T 256, 1 thread per rank; the trainer's mean step (ms)"
echo "# mpirun -np $np ./mpitrain train --model gpt-mini --shards SHARDS --max-steps 6 --epochs 1 \\"
echo "#   --batch-size 8 --threads 1 --no-progress --log-every 0 [--flight-recorder 0]"
gpt() { # on|off: prints the mean step in ms
  _fr=""
  [ "$1" = off ] && _fr="--flight-recorder 0"
  bench_launch "$np" "$MPT_BUILD/mpitrain" train --model gpt-mini --shards "$tmp/sh/train_*.bin" \
    --max-steps 6 --epochs 1 --batch-size 8 --threads 1 --no-progress --log-every 0 $_fr \
    </dev/null 2>&1 | sed -n 's/.*per-step breakdown .* total \([0-9.]*\).*/\1/p' | tail -1
}
# alternate MEASURE WHAT UNIT: $pairs pairs of "MEASURE on" and "MEASURE off", the order swapped
# from pair to pair; prints each pair and the median of on/off (UNIT ms) or of on - off (us).
alternate() {
  _i=0
  : >"$tmp/pairs"
  while [ "$_i" -lt "$pairs" ]; do
    _i=$((_i + 1))
    if [ $((_i % 2)) -eq 1 ]; then a=$($1 on); b=$($1 off); else b=$($1 off); a=$($1 on); fi
    [ -n "$a" ] && [ -n "$b" ] || bench_die "a $2 run printed no time"
    awk -v i="$_i" -v a="$a" -v b="$b" -v u="$3" 'BEGIN {
      if (u == "ms") printf "pair %d  on %8.1f ms  off %8.1f ms  on/off %.3f\n", i, a, b, a / b
      else printf "pair %d  on %7.3f us  off %7.3f us  on-off %+.3f us\n", i, a, b, a - b }' |
      tee -a "$tmp/pairs"
  done
  if [ "$3" = ms ]; then
    echo "median on/off ($2): $(awk '{ print $NF }' "$tmp/pairs" | median)"
  else
    echo "median on-off ($2): $(awk '{ print $(NF - 1) }' "$tmp/pairs" | median) us"
  fi
}
gpt on >/dev/null
alternate gpt "gpt-mini step" ms

echo "# 2. all-reduce of 8 bytes, $np ranks: mpitrain's time per call (us), out-of-place"
echo "# mpirun -np $np ./mpt_allreduce_bench -b 8 -e 8 -n 20000 -w 1000 -R 3 --flight-recorder F"
ar() { # on|off: prints mpitrain's out-of-place time per call
  _f=2000
  [ "$1" = off ] && _f=0
  bench_launch "$np" "$MPT_BUILD/mpt_allreduce_bench" -b 8 -e 8 -n 20000 -w 1000 -R 3 \
    --flight-recorder "$_f" </dev/null 2>/dev/null | awk '$1 == 8 && $2 == 2 { print $5 }'
}
alternate ar "8-byte all-reduce" us
