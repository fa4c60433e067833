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
  [ $# -ge 2 ] || bench_die "$1 needs a value (see --help)"
  case $2 in
    '') bench_die "$1: the value is empty" ;;
    --*) bench_die "$1 needs a value, not the option '$2' (see --help)" ;;
  esac
  case $1 in
    --np) np=$2 ;;
    --pairs) pairs=$2 ;;
    --build) MPT_BUILD=$2 ;;
  esac
  shift 2
done
# Plain decimal numbers, at most 4 digits (test(1) stops at numbers past its range).
case $np in *[!0-9]* | 0* | ?????*) bench_die "--np: '$np' is not a number from 1 to 9999" ;; esac
case $pairs in *[!0-9]* | 0* | ?????*) bench_die "--pairs: '$pairs' is not a number from 1 to 9999" ;; esac
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
gpt on >/dev/null
i=0
: >"$tmp/r1"
while [ "$i" -lt "$pairs" ]; do
  i=$((i + 1))
  if [ $((i % 2)) -eq 1 ]; then a=$(gpt on); b=$(gpt off); else b=$(gpt off); a=$(gpt on); fi
  [ -n "$a" ] && [ -n "$b" ] || bench_die "a gpt-mini run printed no step time"
  r=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", a / b }')
  printf 'pair %d  on %8.1f ms  off %8.1f ms  on/off %s\n' "$i" "$a" "$b" "$r"
  echo "$r" >>"$tmp/r1"
done
echo "median on/off (gpt-mini step): $(median <"$tmp/r1")"

echo "# 2. all-reduce of 8 bytes, $np ranks: mpitrain's time per call (us), out-of-place"
echo "# mpirun -np $np ./mpt_allreduce_bench -b 8 -e 8 -n 20000 -w 1000 -R 3 --flight-recorder F"
ar() { # F: prints mpitrain's out-of-place time per call
  bench_launch "$np" "$MPT_BUILD/mpt_allreduce_bench" -b 8 -e 8 -n 20000 -w 1000 -R 3 \
    --flight-recorder "$1" </dev/null 2>/dev/null | awk '$1 == 8 && $2 == 2 { print $5 }'
}
i=0
: >"$tmp/r2"
while [ "$i" -lt "$pairs" ]; do
  i=$((i + 1))
  if [ $((i % 2)) -eq 1 ]; then a=$(ar 2000); b=$(ar 0); else b=$(ar 0); a=$(ar 2000); fi
  [ -n "$a" ] && [ -n "$b" ] || bench_die "an all-reduce run printed no time"
  d=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%+.3f", a - b }')
  printf 'pair %d  on %7.3f us  off %7.3f us  on-off %s us\n' "$i" "$a" "$b" "$d"
  echo "$d" >>"$tmp/r2"
done
echo "median on-off (8-byte all-reduce): $(median <"$tmp/r2") us"
