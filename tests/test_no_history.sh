#!/bin/sh
# The repository describes what it is, not how it was made: no tracked file speaks of how the
# work was organised (numbered rounds or periods of work, who measured what when) or of numbered
# issues instead of what the code guarantees (that history is in git), and no file name carries
# a round suffix (_s4, _s7...).
# Checked in the tracked files (git ls-files / git grep; skipped outside a git checkout), this
# file excepted:
#   names:    _sN before the extension or another _ ; _before / _after / _old / _new /
#             _loaded / _slowmem / _fast before the extension (a result named by its history)
#   contents: the words of $words below (numbered issues and rounds, periods of work, the
#             lead's measurements), except where Open MPI, MPI-4 or ssh use the same word for
#             their own things ($allowed). The words are spelled with a bracket class ([e])
#             so that this file does not hold them itself.
# Each hit is printed as FILE:LINE: TEXT. Prints "N passed, N failed".
set -u
srcdir=$(cd "${srcdir:-.}" && pwd)
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
if ! git -C "$srcdir" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
  echo "SKIP: $srcdir is not a git checkout (the check reads the tracked files)"
  exit 77
fi
self=tests/test_no_history.sh

names=$(git -C "$srcdir" ls-files | grep -E '_s[0-9]+([._]|$)|_(before|after|old|new|loaded|slowmem|fast)\.[a-z]+$')
if [ -z "$names" ]; then ok; else
  bad "file names that tell their history (rename by what they hold; git keeps the old ones):"
  printf '  %s\n' $names
fi

words='\bissues? #?[0-9]+\b|\bissue-[0-9]+|\bround [0-9]+\b|\bs[e]ssions?\b|\bthe lead (re-?ran|re-?measured|measured|merged|merges)\b|\bby the lead\b'
allowed='s[e]ssion director|MPI_S[e]ssion|S[e]ssions model|login s[e]ssion|ssh s[e]ssion'
hits=$(git -C "$srcdir" grep -nIiE "$words" -- ":!$self" | grep -viE "$allowed")
if [ -z "$hits" ]; then ok; else
  bad "text about how the project was made ($(printf '%s\n' "$hits" | wc -l) lines; say what the code or figure is instead):"
  printf '%s\n' "$hits" | cut -c1-200 | sed 's/^/  /'
fi

# The check itself must be able to fail: each pattern catches a line made to hold it, and the
# allow-list lets Open MPI's own words through.
w=ses # the probes' word, assembled here for the reason above
for probe in "see issue 13" "as in round 2 of it" "another ${w}sion ran" "measured by the lead" \
             "branch issue-13-attn"; do
  printf '%s\n' "$probe" | grep -qiE "$words" && ok || bad "the pattern misses '$probe'"
done
printf '%s\n' "Open MPI's ${w}sion directories" | grep -viE "$allowed" | grep -qiE "$words" &&
  bad "the allow-list does not let Open MPI's own directories through" || ok
printf '%s\n' "compare_gpt_mini_s7.txt" "x_s5_slowmem.txt" "gpt2_after.json" |
  grep -cE '_s[0-9]+([._]|$)|_(before|after|old|new|loaded|slowmem|fast)\.[a-z]+$' | grep -qx 3 && ok ||
  bad "the name pattern misses a round suffix"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
