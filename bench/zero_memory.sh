#!/bin/sh
# Memory per rank with and without ZeRO-1: a GPT of gpt2's shape (12 layers, 12
# heads, 768 channels, vocabulary 50257 padded to 50304) with T 64 instead of 1024 (wpe of 64
# rows: 123.69M parameters instead of 124.44M) so that a step takes seconds on 2 cores, trained
# for 2 steps of batch 1 per rank on a random token shard, at 1, 2 and 4 ranks (4
# oversubscribed), --zero 0 then --zero 1 at each size. Prints, per run, rank 0's and the last
# rank's line of the trainer's memory report at the end (optimizer state, peak resident VmHWM,
# bytes sent per step in the ring model). Usage: bench/zero_memory.sh [OUT.txt]
set -eu
case ${1:-} in
  -h|--help) sed -n '2,/^set -eu/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) echo "usage: bench/zero_memory.sh [OUT.txt] (see --help)" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "usage: bench/zero_memory.sh [OUT.txt] (see --help)" >&2; exit 2; }
dir=$(cd "$(dirname "$0")/.." && pwd)
prog=${MPITRAIN:-$dir/mpitrain}
out=${1:-/dev/stdout}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_zero_mem.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# llm.c token shard: 256 int32 header (magic 20240520, version 1, count), then uint16 tokens
python3 - "$tmp/train_000000.bin" <<'PY'
import random, struct, sys
n = 20000
random.seed(5)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *(random.randrange(50257) for _ in range(n))))
PY
model="train --model gpt --n-layer 12 --n-head 12 --n-embd 768 --seq-len 64 --vocab-size 50257"
args="$model --batch-size 1 --max-steps 2 --log-every 1 --threads 1 --shards $tmp/train_000000.bin"
{
  echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $(nproc) cores; command per run:"
  echo "#   mpirun -np W mpitrain $model --batch-size 1 --max-steps 2 --threads 1 --shards RANDOM --zero Z"
  for np in 1 2 4; do
    for z in 0 1; do
      if [ "$np" -eq 1 ]; then
        "$prog" $args --zero $z >"$tmp/run.log" 2>&1 || { tail -5 "$tmp/run.log"; exit 1; }
      else
        "$dir/tests/mpirun.sh" "$np" 600 "$prog" $args --zero $z >"$tmp/run.log" 2>&1 ||
          { tail -5 "$tmp/run.log"; exit 1; }
      fi
      echo "## W=$np --zero $z"
      grep "memory at the end, rank \(0\|$((np - 1))\):" "$tmp/run.log" | sed 's/.*info: //' | sort -u
    done
  done
} >"$out"
