#!/bin/sh
# Bad inputs and misuse of the language-model commands (issue 13): `mpitrain tokenize`, token
# shards and model files, `mpitrain train --model gpt*` and `mpitrain generate`, as a user and as
# a hostile file would give them. Each case expects an exit status (2 a usage error, 1 a failure,
# 0 where the input is legal) and a message naming the problem; none may crash, hang, answer
# silently wrong or leave a partial output behind. Uses a 1-layer GPT of 7664 parameters on a
# 19 kB text, so the whole script runs in a few seconds. Needs python3 for the hand-made files
# (skipped without it). Prints "N passed, N failed".
set -u
prog=${MPITRAIN:-./mpitrain}
command -v python3 > /dev/null 2>&1 || { echo "no python3: skipped"; exit 77; }
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_gpt_bad.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# expect STATUS PATTERN DESCRIPTION -- COMMAND...: the status and a line matching PATTERN
expect() {
  want=$1 pattern=$2 what=$3
  shift 4
  out=$(timeout 60 "$@" 2>&1)
  got=$?
  if [ $got -eq "$want" ] && printf '%s\n' "$out" | grep -q -- "$pattern"; then
    ok
  else
    bad "$what: status $got (want $want, and '$pattern'): $(printf '%s' "$out" | tail -n 3)"
  fi
}

# A text of short sentences (deterministic), 19 kB, as byte-level shards.
awk 'BEGIN { srand(7); split("the a cat dog sat on mat ran fast slow red blue big small " \
     "house tree and of to in", w, " ");
     for (i = 0; i < 600; i++) { n = 5 + int(rand() * 6); s = "";
       for (j = 0; j < n; j++) s = s w[1 + int(rand() * 20)] " "; print s "." } }' \
  > "$tmp/text.txt"
"$prog" tokenize --bytes -o "$tmp/sh" "$tmp/text.txt" > /dev/null ||
  { echo "FAIL: tokenize"; exit 1; }

# ---- tokenize ------------------------------------------------------------------------------
# A file that fails while being read, after earlier shards were written (/proc files say size
# 0 and then give bytes): the run fails and the shards it wrote are removed, so the folder is
# not left holding a partial data set (which the next run would also refuse).
if [ -r /proc/self/status ]; then
  expect 1 "cannot read '/proc/self/status'" "tokenize: a file failing mid-way" -- \
    "$prog" tokenize --bytes --shard-tokens 100 -o "$tmp/part" "$tmp/text.txt" /proc/self/status
  n=$(ls "$tmp/part" 2>/dev/null | wc -l)
  [ "$n" -eq 0 ] && ok || bad "tokenize: a failed run left $n file(s) in its folder"
  expect 0 "tokenize: 17471 training tokens in 175 shards" "tokenize: the folder after a failure" -- \
    "$prog" tokenize --bytes --shard-tokens 100 -o "$tmp/part" "$tmp/text.txt"
fi
# A missing file after a good one: refused before anything is written.
expect 1 "cannot read '$tmp/missing.txt'" "tokenize: a missing second file" -- \
  "$prog" tokenize --bytes --shard-tokens 100 -o "$tmp/miss" "$tmp/text.txt" "$tmp/missing.txt"
n=$(ls "$tmp/miss" 2>/dev/null | wc -l)
[ "$n" -eq 0 ] && ok || bad "tokenize: a missing input left $n file(s) in the folder"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
