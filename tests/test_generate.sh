#!/bin/sh
# `mpitrain generate` on a hand-made llm.c model file whose output is known: every
# weight is 0 except the final LayerNorm's bias (1 in channel 0) and the token embedding's
# channel 0 (5.0 for 'B', 4.9 for 'C', 0 for the other 254 bytes), so the last position's
# logits are wte[:, 0] whatever the input: greedy (--temperature 0) writes only 'B'; --top-k 1
# only 'B'; --top-k 2 only 'B' and 'C' (each about half); without top-k the other bytes hold
# 254 / (254 + e^5 + e^4.9) = 47 % of the mass and appear. The same seed gives the same text, another
# seed another; under mpirun -np 2 the text once; bad uses exit 2, a missing or malformed file 1.
# Needs python3 to write the file (skipped without it). Prints "N passed, N failed".
set -u
prog=${MPITRAIN:-./mpitrain}
command -v python3 > /dev/null 2>&1 || { echo "no python3: skipped"; exit 77; }
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_generate.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# T 8, V 256, L 1, H 1, C 4, Vp 256: 1308 parameters in llm.c's order (wte first, lnfb last).
python3 - "$tmp/m.bin" <<'PY'
import struct, sys
T, V, L, H, C, Vp = 8, 256, 1, 1, 4, 256
hdr = [20240326, 3, T, V, L, H, C, Vp] + [0] * 248
counts = [Vp*C, T*C, L*C, L*C, L*3*C*C, L*3*C, L*C*C, L*C, L*C, L*C, L*4*C*C, L*4*C,
          L*C*4*C, L*C, C, C]
p = [0.0] * sum(counts)
p[ord('B') * C] = 5.0
p[ord('C') * C] = 4.9
p[len(p) - C] = 1.0  # lnfb[0]
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", *hdr))
    f.write(struct.pack("<%df" % len(p), *p))
PY

gen() { "$prog" generate --model-file "$tmp/m.bin" "$@"; }
# greedy: the prompt, then 20 'B', then a newline
out=$(gen --prompt 'xy' --tokens 20 --temperature 0)
[ "$out" = "xyBBBBBBBBBBBBBBBBBBBB" ] && ok || bad "greedy: '$out'"
out=$(gen --tokens 50 --top-k 1 --seed 5 | tr -d '\n')
[ "$out" = "$(printf 'B%.0s' $(seq 50))" ] && ok || bad "--top-k 1: '$out'"
out=$(gen --tokens 300 --top-k 2 --seed 5 | tr -d '\n')
nb=$(printf '%s' "$out" | tr -cd 'B' | wc -c)
nc=$(printf '%s' "$out" | tr -cd 'C' | wc -c)
[ "$nb" -gt 100 ] && [ "$nc" -gt 100 ] && [ $((nb + nc)) -eq 300 ] && ok ||
  bad "--top-k 2: $nb B, $nc C of 300"
gen --tokens 300 --seed 5 > "$tmp/all.txt"
nother=$(tr -d 'BC' < "$tmp/all.txt" | wc -c) # 2 newlines + about 47 % of 300
[ "$nother" -gt 90 ] && [ "$nother" -lt 200 ] && ok || bad "no top-k: $nother other bytes of 300"
gen --tokens 300 --seed 5 | cmp -s - "$tmp/all.txt" && ok || bad "the same seed gave other text"
gen --tokens 300 --seed 6 | cmp -s - "$tmp/all.txt" && bad "another seed gave the same text" || ok
# under mpirun -np 2 only rank 0 generates: the same text once (it was printed by every rank)
srcdir=${srcdir:-.}
if command -v mpirun > /dev/null 2>&1; then
  "$srcdir/tests/mpirun.sh" 2 60 "$prog" generate --model-file "$tmp/m.bin" --tokens 300 \
    --seed 5 > "$tmp/np2.txt" 2> "$tmp/np2.err"
  cmp -s "$tmp/np2.txt" "$tmp/all.txt" && ok ||
    bad "mpirun -np 2 generate: $(wc -c < "$tmp/np2.txt") bytes, not the 1-process text"
fi
# bad uses
expect() { # STATUS PATTERN -- ARGS...
  want=$1 pattern=$2
  shift 3
  o=$("$@" 2>&1)
  got=$?
  [ $got -eq "$want" ] && printf '%s' "$o" | grep -q -- "$pattern" && ok ||
    bad "$*: status $got (want $want): $o"
}
expect 2 "give the model with --model-file" -- "$prog" generate --tokens 3
expect 2 "--temperature '-1'" -- "$prog" generate --model-file "$tmp/m.bin" --temperature -1
expect 2 "--tokens '0'" -- "$prog" generate --model-file "$tmp/m.bin" --tokens 0
expect 2 "unknown option" -- "$prog" generate --model-file "$tmp/m.bin" --frobnicate
expect 1 "does not exist" -- "$prog" generate --model-file "$tmp/none.bin"
head -c 3000 "$tmp/m.bin" > "$tmp/short.bin"
expect 1 "short.bin" -- "$prog" generate --model-file "$tmp/short.bin"
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
