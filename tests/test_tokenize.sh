#!/bin/sh
# `mpitrain tokenize`: byte-level llm.c shards from text. On two small files the
# shards are checked byte by byte against the format and the split written out by hand (the
# last floor(F n) bytes of each file go to validation; shards cut at --shard-tokens); every
# bad use exits 2 (usage) or 1 (failure) naming the problem; and, when Debian's fortunes
# package is installed, its text becomes shards holding every byte. Prints "N passed, N failed".
set -u
prog=${MPITRAIN:-./mpitrain}
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_tokenize.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# The uint16 tokens of a shard, one per line, from byte 1024 on; and its header's 3 int32.
tokens() { od -An -v -tu2 -j 1024 "$1" | tr -s ' ' '\n' | sed '/^$/d'; }
header() { od -An -v -td4 -N 12 "$1" | tr -s ' ' ' ' | sed 's/^ //'; }
bytes() { od -An -v -tu1 "$@" | tr -s ' ' '\n' | sed '/^$/d'; }

printf 'hello world\n%%\nsecond fortune\n' > "$tmp/a.txt"   # 29 bytes: 5 to validation at 0.2
printf 'ABCDEFGHIJ' > "$tmp/b.txt"                          # 10 bytes: 2 to validation
out=$("$prog" tokenize --bytes --val-fraction 0.2 --shard-tokens 10 -o "$tmp/out/sub" \
      "$tmp/a.txt" "$tmp/b.txt" 2>&1)
if [ $? -eq 0 ] && printf '%s' "$out" | grep -q "32 training tokens in 4 shards, 7 validation tokens in 1 shard"; then
  ok
else
  bad "tokenize of two files: $out"
fi
ls "$tmp/out/sub" > "$tmp/list"
printf 'train_000000.bin\ntrain_000001.bin\ntrain_000002.bin\ntrain_000003.bin\nval_000000.bin\n' |
  cmp -s - "$tmp/list" && ok || bad "shard names: $(cat "$tmp/list")"
# Headers: magic, version, count; sizes 1024 + 2 count.
[ "$(header "$tmp/out/sub/train_000000.bin")" = "20240520 1 10" ] &&
  [ "$(header "$tmp/out/sub/train_000003.bin")" = "20240520 1 2" ] &&
  [ "$(header "$tmp/out/sub/val_000000.bin")" = "20240520 1 7" ] &&
  [ "$(wc -c < "$tmp/out/sub/train_000003.bin")" -eq 1028 ] && ok ||
  bad "headers: $(header "$tmp/out/sub/train_000000.bin") / $(header "$tmp/out/sub/val_000000.bin")"
# Content: training = a[0:24] b[0:8], validation = a[24:29] b[8:10], each byte one token.
for f in "$tmp"/out/sub/train_*.bin; do tokens "$f"; done > "$tmp/train.got"
{ head -c 24 "$tmp/a.txt"; head -c 8 "$tmp/b.txt"; } > "$tmp/train.txt"
bytes "$tmp/train.txt" | cmp -s - "$tmp/train.got" && ok || bad "training tokens differ from the text"
tokens "$tmp/out/sub/val_000000.bin" > "$tmp/val.got"
{ tail -c 5 "$tmp/a.txt"; tail -c 2 "$tmp/b.txt"; } > "$tmp/val.txt"
bytes "$tmp/val.txt" | cmp -s - "$tmp/val.got" && ok || bad "validation tokens differ from the text"
# No temporary files left.
ls -a "$tmp/out/sub" | grep -q tmp && bad "temporary file left" || ok

# --val-fraction 0: no validation shard.
"$prog" tokenize --bytes --val-fraction 0 -o "$tmp/nov" "$tmp/a.txt" > /dev/null 2>&1 &&
  [ ! -e "$tmp/nov/val_000000.bin" ] && [ "$(header "$tmp/nov/train_000000.bin")" = "20240520 1 29" ] &&
  ok || bad "--val-fraction 0"

check() { # expected_status pattern args...
  want=$1 pattern=$2
  shift 2
  o=$("$prog" tokenize "$@" 2>&1)
  got=$?
  if [ "$got" -eq "$want" ] && printf '%s\n' "$o" | grep -q -- "$pattern"; then ok; else
    bad "mpitrain tokenize $* -> status $got (want $want), output lacks '$pattern': $(printf '%s' "$o" | head -n 2)"
  fi
  # A usage error is one line and where --help is (as train's), not the whole usage.
  if [ "$want" -eq 2 ]; then
    [ "$(printf '%s\n' "$o" | wc -l)" -eq 2 ] && ! printf '%s\n' "$o" | grep -q '^usage:' &&
      printf '%s\n' "$o" | grep -q "mpitrain tokenize --help" && ok ||
      bad "mpitrain tokenize $*: a usage error prints 2 lines, no usage; got: $(printf '%s\n' "$o" | head -n 4)"
  fi
}
check 2 "give --bytes" -o "$tmp/x" "$tmp/a.txt"
check 2 "give the output folder" --bytes "$tmp/a.txt"
check 2 "at least one text FILE" --bytes -o "$tmp/x"
check 2 "val-fraction '1' must be a number in \[0, 1)" --bytes --val-fraction 1 -o "$tmp/x" "$tmp/a.txt"
check 2 "val-fraction 'abc'" --bytes --val-fraction abc -o "$tmp/x" "$tmp/a.txt"
check 2 "shard-tokens '0'" --bytes --shard-tokens 0 -o "$tmp/x" "$tmp/a.txt"
check 2 "unknown option '--bites'" --bites -o "$tmp/x" "$tmp/a.txt"
check 2 "option '--val-fraction' needs a value" --bytes -o "$tmp/x" "$tmp/a.txt" --val-fraction
check 1 "cannot read '$tmp/missing.txt'" --bytes -o "$tmp/x" "$tmp/missing.txt"
check 1 "'$tmp' is not a regular file (it is a directory" --bytes -o "$tmp/y" "$tmp"
check 1 "already holds shards" --bytes -o "$tmp/out/sub" "$tmp/a.txt"
check 1 "cannot create the folder" --bytes -o "$tmp/a.txt/dir" "$tmp/a.txt"
# A folder whose name holds glob characters: it was looked into as a glob ('g[1]' matches
# 'g1'), so a second run into it was not refused and left the first run's train_000001.bin
# among its own shards. Now refused, the first run's shards untouched.
"$prog" tokenize --bytes --val-fraction 0 --shard-tokens 10 -o "$tmp/g[1]" "$tmp/a.txt" > /dev/null 2>&1
check 1 "'$tmp/g\[1\]' already holds shards" --bytes -o "$tmp/g[1]" "$tmp/b.txt"
[ "$(header "$tmp/g[1]/train_000000.bin")" = "20240520 1 10" ] &&
  [ "$(ls "$tmp/g[1]" | wc -l)" -eq 3 ] && ok || bad "tokenize into 'g[1]' twice: $(ls "$tmp/g[1]")"
: > "$tmp/empty.txt"
check 1 "no text to tokenize: $tmp/empty.txt is empty" --bytes -o "$tmp/z" "$tmp/empty.txt"
[ ! -e "$tmp/z" ] && ok || bad "tokenize of an empty file left the folder $tmp/z"
check 1 "the files given are all empty" --bytes -o "$tmp/z2/sub" "$tmp/empty.txt" "$tmp/empty.txt"
[ ! -e "$tmp/z2" ] && ok || bad "tokenize of empty files left the folder $tmp/z2"
check 0 "usage: mpitrain tokenize" --help

# The demo corpus: Debian's fortunes (skip the .dat index files and the .u8 links).
if [ -d /usr/share/games/fortunes ]; then
  files=$(find /usr/share/games/fortunes -type f ! -name '*.dat' | sort)
  total=$(cat $files | wc -c)
  out=$("$prog" tokenize --bytes --val-fraction 0.1 -o "$tmp/fortunes" $files 2>&1)
  ntrain=$(od -An -td4 -j 8 -N 4 "$tmp/fortunes/train_000000.bin" | tr -d ' ')
  nval=$(od -An -td4 -j 8 -N 4 "$tmp/fortunes/val_000000.bin" | tr -d ' ')
  if [ -n "$ntrain" ] && [ -n "$nval" ] && [ $((ntrain + nval)) -eq "$total" ] &&
     [ "$nval" -gt $((total / 11)) ] && [ "$nval" -le $((total / 10)) ]; then ok; else
    bad "fortunes: $total bytes, shards of $ntrain + $nval tokens: $out"
  fi
else
  echo "note: Debian's fortunes package is not installed (./setup.sh installs it): its case left out"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
