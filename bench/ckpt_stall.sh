#!/bin/sh
# The training step's stall when a checkpoint is written, --checkpoint-async off vs on: a GPT of
# gpt2's shape (12 layers, 12 heads, 768 channels, vocabulary 50257; T 64 instead of 1024 so a
# step takes seconds on a few cores, 123.69M parameters; AdamW: a checkpoint of about 1.4 GiB),
# random init, batch 1 per rank on a random token shard, 2 ranks (mpirun -np 2), 9 steps with a
# checkpoint every 3. Each line rank 0 prints is stamped as it arrives; a step's time is the gap
# between its step line and the previous one, so the step after a checkpoint carries the
# checkpoint's stall (sync: the whole write and fsync; async: the snapshot into host memory).
# Prints, per mode, the median of the steps without a checkpoint before them, each step after a
# checkpoint, and the waits for the background writer (before the next checkpoint, at the end). The figures are noisy on a
# shared machine. Usage: bench/ckpt_stall.sh [OUT.txt] (CKPT_DIR: where checkpoints go, default
# a temporary folder)
set -eu
case ${1:-} in
  -h|--help) sed -n '2,/^set -eu/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) echo "usage: bench/ckpt_stall.sh [OUT.txt] (see --help)" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "usage: bench/ckpt_stall.sh [OUT.txt] (see --help)" >&2; exit 2; }
dir=$(cd "$(dirname "$0")/.." && pwd)
prog=${MPITRAIN:-$dir/mpitrain}
out=${1:-/dev/stdout}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_ckpt_stall.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
ck=${CKPT_DIR:-$tmp/ck}
python3 - "$tmp/train_000000.bin" <<'PY'
import random, struct, sys
n = 20000
random.seed(5)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack("<%dH" % n, *(random.randrange(50257) for _ in range(n))))
PY
model="train --model gpt --n-layer 12 --n-head 12 --n-embd 768 --seq-len 64 --vocab-size 50257"
args="$model --batch-size 1 --max-steps 9 --log-every 1 --threads 1 --checkpoint-every 3 --keep 1"
stamp() { while IFS= read -r line; do echo "$(date +%s.%N) $line"; done; }
{
  echo "# $(date -u +%Y-%m-%dT%H:%MZ) $(uname -n), $(nproc) cores, load average $(cut -d" " -f1-3 /proc/loadavg);"
  echo "# commit $(git -C "$dir" rev-parse --short HEAD 2>/dev/null || echo unknown); command per mode:"
  echo "#   mpirun -np 2 mpitrain $args --shards RANDOM --checkpoint-dir DIR --checkpoint-async M"
  printf '%-6s %14s %s\n' "async" "normal step s" "steps after a checkpoint (s); waits for the background writer"
  for mode in off on; do
    rm -rf "$ck"
    "$dir/tests/mpirun.sh" 2 900 "$prog" $args --shards "$tmp/train_000000.bin" \
      --checkpoint-dir "$ck" --checkpoint-async $mode 2>&1 | stamp >"$tmp/$mode.log" || true
    grep -q "done:" "$tmp/$mode.log" || { tail -5 "$tmp/$mode.log" >&2; exit 1; }
    awk -v mode="$mode" '
      / step +[0-9]+\/[0-9]+ / { for (i = 2; i <= NF; i++) if ($i == "step") break
        split($(i + 1), s, "/"); k = s[1] + 0
        if (prev != "") { dt[k] = $1 - prev; after[k] = ck }
        prev = $1; ck = 0 }
      /checkpoint of global step|checkpoint .*ckpt-step.*\(/ { ck = 1 }
      / snapshot in [0-9.]+ ms/ { for (i = 1; i <= NF; i++) if ($i == "snapshot") sn = sn " " $(i + 2) }
      /\(waited [0-9.]+ ms for it\)/ { for (i = 1; i <= NF; i++) if ($i == "(waited") w = w " " $(i + 1) }
      END { n = 0; a = ""
        for (k = 1; k <= 100; k++) if (k in dt) {
          if (after[k]) a = a sprintf(" step %d: %.2f", k, dt[k]); else v[++n] = dt[k] }
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
        med = n ? (n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2) : 0
        printf "%-6s %14.2f%s; %s\n", mode, med, a, w == "" ? "-" : "snapshots (ms):" sn "; waits for the writer (ms):" w }' "$tmp/$mode.log"
  done
} >"$out"
