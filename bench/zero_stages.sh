#!/bin/sh
# Peak resident memory per rank and step time of a gpt2-shaped model (12 layers, 12 heads, 768
# channels, GPT-2's vocabulary; T 128, B 1, 2 ranks) under plain DDP and ZeRO-1, 2 and 3, each
# without and with --recompute, and ZeRO-3 without its prefetch; then (HEADLINE=1) gpt2-large
# at 2 ranks with --zero 3 --recompute for a few steps. Each run is short (STEPS steps, the
# first a warm-up the step time leaves out). Prints one row per run: peak resident MiB of each
# rank at start (VmHWM when training starts: the model built, wrapped and its optimizer made)
# and over the run (the trainer's memory lines), the model state per rank it reports, and ms
# per step (the trainer's per-step breakdown, slowest rank).
# PAIRS=N: step time alone, N sets each running plain DDP, ZeRO-3 and ZeRO-3 --no-prefetch
# one after the other (alternated, so that a change of the machine's load falls on all three),
# each run's ms/step and the 1-minute load average before it, then the medians.
# Usage: sh bench/zero_stages.sh [OUT.txt]   (from the build folder; STEPS=N, HEADLINE=1,
# ROWS=0 for the headline alone, PAIRS=N)
set -u
case ${1:-} in
  -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) echo "usage: bench/zero_stages.sh [OUT.txt] (see --help)" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "usage: bench/zero_stages.sh [OUT.txt] (one file; see --help)" >&2; exit 2; }
case ${STEPS:-4} in *[!0-9]* | 0* | ?????*)
  echo "zero_stages.sh: STEPS=$STEPS is not a number from 1 to 9999" >&2; exit 2 ;;
esac
case ${PAIRS:-0} in *[!0-9]* | ?????*)
  echo "zero_stages.sh: PAIRS=$PAIRS is not a number from 0 to 9999" >&2; exit 2 ;;
esac
prog=${MPITRAIN:-./mpitrain}
here=$(dirname "$0")
steps=${STEPS:-4}
out=${1:-/dev/stdout}
# The output can be written, before minutes of runs.
(: >>"$out") 2>/dev/null || { echo "zero_stages.sh: cannot write $out" >&2; exit 2; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_zero_mem.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
awk 'BEGIN { srand(7); for (i = 0; i < 4000; i++) { s = "";
  for (j = 0; j < 12; j++) s = s substr("abcdefghijklmnop ", 1 + int(rand() * 17), 1); print s } }' \
  >"$tmp/text.txt"
"$prog" tokenize --bytes --val-fraction 0.1 -o "$tmp/shards" "$tmp/text.txt" >/dev/null || exit 1
gpt2="--model gpt --n-layer 12 --n-head 12 --n-embd 768 --vocab-size 50257 --seq-len 128"
common="--shards $tmp/shards/train_000000.bin --batch-size 1 --max-steps $steps --threads 1 --val-steps 1 --log-every 1 --debug-dir $tmp/dbg"
row() { # label args...
  label=$1
  shift
  "$here/../tests/mpirun.sh" 2 1800 "$prog" train "$@" $common >"$tmp/run.out" 2>&1 ||
    { echo "$label: failed: $(tail -3 "$tmp/run.out")"; return; }
  peaks=$(sed -n 's/.*memory at the end, rank \([0-9]\): parameters \([0-9.]*\) MiB, gradients \([0-9.]*\) MiB, optimizer state \([0-9.]*\) MiB.*peak resident \([0-9.]*\) MiB.*/r\1 \5 (state \2+\3+\4)/p' "$tmp/run.out" | tr '\n' ' ')
  starts=$(sed -n 's/.*memory at start, rank \([0-9]\):.*peak resident \([0-9.]*\) MiB.*/r\1 \2/p' "$tmp/run.out" | tr '\n' ' ')
  ms=$(sed -n 's/.*per-step breakdown .* total \([0-9.]*\).*/\1/p' "$tmp/run.out" | tail -1)
  loss=$(sed -n 's/.*step *\([0-9]*\)\/[0-9]*  loss \([0-9.]*\).*/\2/p' "$tmp/run.out" | tr '\n' ' ')
  printf '%-34s start MiB %s| peak MiB %s| %s ms/step | loss %s\n' "$label" "$starts" "$peaks" \
    "$ms" "$loss"
}
{
  if [ "${ROWS:-1}" = 1 ]; then
    echo "# gpt2-shaped (124M) at 2 ranks, B 1, T 128, $steps steps, 1 thread per rank; $(date -u +%F)"
    for z in 0 1 2 3; do
      row "zero $z" $gpt2 --zero $z
      row "zero $z --recompute" $gpt2 --zero $z --recompute
    done
    row "zero 3 --no-prefetch" $gpt2 --zero 3 --no-prefetch
  fi
  if [ "${PAIRS:-0}" -gt 0 ]; then
    echo "# step time, gpt2-shaped at 2 ranks, T 128, $steps steps (the first left out), $PAIRS sets of DDP / ZeRO-3 / ZeRO-3 --no-prefetch; $(date -u +%F)"
    i=0
    while [ "$i" -lt "$PAIRS" ]; do
      i=$((i + 1))
      for cfg in "0" "3" "3 --no-prefetch"; do
        load=$(cut -d' ' -f1 /proc/loadavg)
        "$here/../tests/mpirun.sh" 2 1800 "$prog" train $gpt2 --zero $cfg $common \
          >"$tmp/run.out" 2>&1 </dev/null || { echo "zero $cfg: failed"; continue; }
        ms=$(sed -n 's/.*per-step breakdown .* total \([0-9.]*\).*/\1/p' "$tmp/run.out" | tail -1)
        [ -n "$ms" ] || { echo "zero $cfg: no step time in its output"; continue; }
        printf 'set %d  zero %-16s load %5s  %s ms/step\n' "$i" "$cfg" "$load" "$ms"
        printf '%s %s\n' "$(echo "$cfg" | tr ' ' '_')" "$ms" >>"$tmp/times"
      done
    done
    for cfg in 0 3 3_--no-prefetch; do
      awk -v c="$cfg" '$1 == c { v[n++] = $2 } END { if (!n) exit
        for (i = 0; i < n; i++) for (j = i + 1; j < n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
        m = n % 2 ? v[(n - 1) / 2] : (v[n / 2 - 1] + v[n / 2]) / 2
        printf "median zero %-16s %.1f ms/step over %d runs\n", c, m, n }' "$tmp/times" | tr '_' ' '
    done
  fi
  if [ "${HEADLINE:-0}" = 1 ]; then
    large="--model gpt --n-layer 36 --n-head 20 --n-embd 1280 --vocab-size 50257 --seq-len 64"
    avail=$(awk '/^MemAvailable/ { print $2 * 1024 }' /proc/meminfo)
    echo "# gpt2-large (774M) at 2 ranks, B 1, T 64 (--model gpt with its sizes): whether each"
    echo "# stage fits, from the trainer's own memory check (run with MPITRAIN_HOST_MEMORY=1K, so"
    echo "# that every stage is refused and prints what it needs per rank), against this host's"
    echo "# MemAvailable of $(awk -v a="$avail" 'BEGIN { printf "%.1f", a / 2^30 }') GiB for the 2 ranks"
    for z in 0 1 2 3; do
      for rc in "" --recompute; do
        MPITRAIN_HOST_MEMORY=1K "$here/../tests/mpirun.sh" 2 300 "$prog" train $large --zero $z \
          $rc $common >"$tmp/run.out" 2>&1 </dev/null
        need=$(sed -n 's/.*needs at least \([0-9.]*\) GiB per rank (model state \([0-9.]*\) GiB.*/\1 \2/p' \
          "$tmp/run.out" | head -1)
        [ -n "$need" ] || { echo "zero $z $rc: no memory check line: $(tail -2 "$tmp/run.out")"; continue; }
        set -- $need
        printf '%-34s needs %5.1f GiB per rank (model state %5.2f): %s\n' "zero $z $rc" "$1" "$2" \
          "$(awk -v n="$1" -v a="$avail" 'BEGIN { print (2 * n * 2^30 <= a) ? "fits" : "refused" }')"
      done
    done
    echo "# gpt2-large trained at 2 ranks, $steps steps"
    row "gpt2-large zero 3 --recompute" $large --zero 3 --recompute --lr 2.5e-4
  fi
} >"$out"
