#!/bin/sh
# Every script of bench/ and scripts/ answers --help: prints its text on stdout and exits 0, at
# once (10 s at most), writing nothing (a script that took --help as an output file or an
# argument wrote a file named --help, or started its run). bench/bench_lib.sh is sourced, not
# run. The Python scripts that import torch are left out, saying so, where torch is missing.
# Prints "N passed, N failed".
set -u
srcdir=$(cd "${srcdir:-.}" && pwd)
pass=0
fail=0
skip=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_help.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3
have_torch=0
"$py" -c 'import torch' 2>/dev/null && have_torch=1

n=0
for s in "$srcdir"/bench/*.sh "$srcdir"/scripts/*.sh "$srcdir"/bench/*.py; do
  name=${s#"$srcdir"/}
  case $name in bench/bench_lib.sh) continue ;; esac
  case $name in
    *.py)
      if [ $have_torch -eq 0 ] && grep -q '^import torch' "$s"; then
        skip=$((skip + 1)); echo "skip ($name imports torch, not installed here)"; continue
      fi
      run="$py $s" ;;
    *) run="sh $s"; head -n 1 "$s" | grep -q bash && run="bash $s" ;;
  esac
  n=$((n + 1))
  rm -rf "$tmp/run" && mkdir "$tmp/run"
  # shellcheck disable=SC2086 # the interpreter and the script
  out=$(cd "$tmp/run" && timeout 10 $run --help 2>"$tmp/err" </dev/null)
  rc=$?
  left=$(ls -A "$tmp/run")
  if [ $rc -eq 0 ] && [ -n "$out" ] && [ -z "$left" ]; then ok; else
    bad "$name --help: status $rc (want 0), $(printf '%s\n' "$out" | wc -l) lines on stdout," \
        "files written: '$left'; stderr: $(head -c 300 "$tmp/err")"
  fi
done
[ $n -ge 15 ] || bad "only $n scripts found under $srcdir/bench and $srcdir/scripts"
echo "$pass passed, $fail failed ($skip skipped)"
[ "$fail" -eq 0 ]
