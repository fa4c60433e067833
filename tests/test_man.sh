#!/bin/sh
# The manual page docs/mpitrain.1 is in sync with `mpitrain --help` (regenerating it gives the
# same bytes; after changing --help run `make man`), renders without roff warnings, and shows
# every command (train, tokenize, generate: the list the program prints without one),
# the options, the exit statuses and the version. Prints "N passed, N failed".
set -u
srcdir=${srcdir:-.}
prog=${MPITRAIN:-./mpitrain}
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_man.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
sh "$srcdir/scripts/make_man.sh" "$prog" >"$tmp/mpitrain.1" || bad "scripts/make_man.sh failed"
if cmp -s "$tmp/mpitrain.1" "$srcdir/docs/mpitrain.1"; then ok; else
  bad "docs/mpitrain.1 is out of date with --help (run: make man):"
  diff "$srcdir/docs/mpitrain.1" "$tmp/mpitrain.1" | head -n 10
fi
if command -v groff >/dev/null 2>&1; then
  warn=$(groff -man -ww -z "$srcdir/docs/mpitrain.1" 2>&1)
  [ -z "$warn" ] && ok || bad "groff warns: $warn"
  text=$(MANWIDTH=100 man -l "$srcdir/docs/mpitrain.1" 2>/dev/null || groff -man -Tutf8 "$srcdir/docs/mpitrain.1")
  # every option of --help is in the rendered page
  missing=""
  for o in $("$prog" --help | grep -o -- '--[a-z][a-z-]*' | sort -u); do
    printf '%s\n' "$text" | grep -q -- "$o" || missing="$missing $o"
  done
  [ -z "$missing" ] && ok || bad "options missing from the rendered page:$missing"
  # every command the program accepts (its "expected: ..." list) is in the synopsis and described
  cmds=$("$prog" 2>&1 >/dev/null | sed -n 's/.*(expected: \(.*\))$/\1/p' | sed 's/,/ /g; s/ or / /')
  [ -n "$cmds" ] || bad "mpitrain without a command does not list the commands"
  missing=""
  for c in $cmds; do
    [ "$(printf '%s\n' "$text" | grep -cE -- "mpitrain +$c")" -ge 2 ] || missing="$missing $c"
  done
  [ -z "$missing" ] && ok || bad "commands missing from the synopsis or the description:$missing"
  v=$("$prog" --version | sed -n '1s/^mpitrain //p')
  printf '%s\n' "$text" | grep -q "mpitrain $v" && printf '%s\n' "$text" | grep -q "EXIT STATUS" && ok ||
    bad "the rendered page lacks the version $v or the exit statuses"
else
  echo "groff not installed: rendering not checked"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
