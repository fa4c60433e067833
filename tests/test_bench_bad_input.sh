#!/bin/sh
# The bench scripts given bad input, no build needed (seconds):
# - bench/run_all.sh, bench/flight_recorder_cost.sh, bench/zero_stages.sh: bad options and
#   values are refused with one line naming them and exit status 2 before any run;
# - bench/results_readme.py on a copy of bench/results whose files are damaged (empty,
#   truncated, not a JSON object, keys of the wrong type, numbers that do not parse, tabs and
#   backticks in the manifest): the README still comes, status 0, no traceback, the figures it
#   cannot read "not in this set"; a missing folder or machine.txt: one line, status non-zero.
# Prints "N passed, N failed".
set -u
srcdir=$(cd "${srcdir:-.}" && pwd)
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_bench_bad.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3
cd "$tmp" || exit 1
: >afile
# No build here: a check that let a bad value through would stop at the missing mpitrain with
# another message (never at a run), which the expected words below then miss.
MPT_BUILD=$tmp/nobuild
export MPT_BUILD

refused() { # "expected words" [VAR=value...] script args...: status 2, the words on stderr
  _want=$1
  shift
  _env=""
  while case $1 in *=*) true ;; *) false ;; esac; do _env="$_env $1"; shift; done
  _s=$1
  shift
  # shellcheck disable=SC2086 # the assignments (no spaces in them)
  timeout -k 5 20 env $_env sh "$srcdir/bench/$_s" "$@" </dev/null >out.txt 2>err.txt
  _rc=$?
  if [ $_rc -eq 2 ] && grep -q -- "$_want" err.txt && [ "$(wc -l <err.txt)" -le 30 ]; then ok; else
    bad "$_env $_s $*: status $_rc (want 2), stderr: $(head -c 300 err.txt) (want '$_want')"
  fi
}
ra=run_all.sh
refused "needs a value" $ra --np
refused "the value is empty" $ra --np ""
refused "not a number from 1 to 9999" $ra --np abc
refused "not a number from 1 to 9999" $ra --np 0
refused "not a number from 1 to 9999" $ra --np 08
refused "not a number from 1 to 9999" $ra --np 99999999999
refused "not a number from 1 to 9999" $ra --repeats -1
refused "the value is empty" $ra --only ""
refused "names no section" $ra --only ,
refused "'bogus' is not a section" $ra --only comm,bogus
refused "not a comma-separated list" $ra --only "*"
refused "not a number of seconds" $ra --wait-idle abc
refused "not a number of seconds" $ra --wait-idle 1.5
refused "exists and is not a folder" $ra --out afile
refused "exists and is not a folder" $ra --runs afile
refused "not the option '--np'" $ra --out --np 2
refused "unknown option 'bogus'" $ra bogus
refused "not a number of seconds" MPT_BENCH_WAIT_IDLE_S=zz $ra --only comm
fr=flight_recorder_cost.sh
refused "needs a value" $fr --pairs
refused "not a number from 1 to 9999" $fr --np abc
refused "not a number from 1 to 9999" $fr --pairs 0
refused "not a number from 1 to 9999" $fr --pairs 99999999999999999999
refused "the value is empty" $fr --build ""
refused "not the option '--pairs'" $fr --np --pairs 2
refused "unknown option 'bogus'" $fr bogus
zs=zero_stages.sh
refused "usage" $zs --bogus
refused "one file" $zs a.txt b.txt
refused "STEPS=0 is not a number" STEPS=0 $zs
refused "PAIRS=x is not a number" PAIRS=x $zs
refused "cannot write" $zs "$tmp/no/such/folder/out.txt"

# results_readme.py on damaged copies of the set (a source tree from a tarball has no set).
rr=$srcdir/bench/results_readme.py
if [ ! -f "$srcdir/bench/results/machine.txt" ]; then
  echo "skip (results_readme.py: no set in $srcdir/bench/results to damage)"
  echo "$pass passed, $fail failed"
  [ "$fail" -eq 0 ]
  exit
fi
mkdir set
cp "$srcdir"/bench/results/*.json "$srcdir"/bench/results/*.txt "$srcdir"/bench/results/*.tsv set/
readme() { # label: the README of set/ comes, status 0, no traceback
  "$py" "$rr" --dir set >readme.md 2>err.txt
  _rc=$?
  if [ $_rc -eq 0 ] && ! grep -q Traceback err.txt && grep -q '^## Headline' readme.md &&
    grep -q '^## Files' readme.md; then ok; else
    bad "results_readme.py, $1: status $_rc, stderr: $(tail -c 300 err.txt)"
  fi
}
readme "the set as it is"
grep -q "not in this set" readme.md && bad "the set as it is: a figure reads 'not in this set'"
# DAMAGE PARITY: every file of the set (parity 2), or every other one (0, 1), damaged one way.
damage() {
  "$py" - "$@" <<'EOF'
import os, re, sys
kind, parity = sys.argv[1], int(sys.argv[2])
for i, f in enumerate(sorted(os.listdir("set"))):
    if f in ("machine.txt", "README.md") or (parity < 2 and i % 2 != parity):
        continue
    p = os.path.join("set", f)
    data = open(p, "rb").read()
    if kind == "empty":
        data = b""
    elif kind == "truncated":
        data = data[:len(data) // 2]
    elif kind == "binary":
        data = bytes(range(256)) * 4
    elif f.endswith(".json"):
        data = {"list": b"[1, 2]", "number": b"7", "deep": b"[" * 100000,
                "types": b'{"results": 1, "rows": "x", "versions": 3}',
                "records": b'{"results": [1, null, {"model": "mlp", "impls": 2, "np": "x"}], '
                           b'"rows": [null, {"bytes": "x"}, {"bytes": 1048576, '
                           b'"ratio_in_place": "y", "ratio_out_of_place": {}}]}'}.get(kind, data)
    else:
        rep = {"dots": ".", "signs": "+-", "letters": "e", "zeros": "0", "tabs": "\t`|"}[kind] \
            if kind in ("dots", "signs", "letters", "zeros", "tabs") else None
        if rep is not None:
            data = re.sub(rb"[0-9]", rep.encode(), data)
    open(p, "wb").write(data)
EOF
}
for kind in empty truncated binary list number deep types records dots signs letters zeros tabs; do
  for parity in 2 0 1; do
    rm -rf set && mkdir set
    cp "$srcdir"/bench/results/*.json "$srcdir"/bench/results/*.txt "$srcdir"/bench/results/*.tsv set/
    damage "$kind" "$parity"
    readme "$kind, parity $parity"
    [ $parity -ne 2 ] || grep -q "not in this set" readme.md ||
      bad "$kind, every file: no figure reads 'not in this set'"
  done
done
# Only a missing folder or machine.txt is an error: one line, status non-zero.
for dir in "$tmp/nowhere" "$tmp/afile" ""; do
  "$py" "$rr" --dir "$dir" >readme.md 2>err.txt
  _rc=$?
  if [ $_rc -ne 0 ] && [ "$(wc -l <err.txt)" -eq 1 ] && grep -q "not a folder" err.txt; then ok; else
    bad "results_readme.py --dir '$dir': status $_rc, stderr: $(head -c 300 err.txt)"
  fi
done
rm -f set/machine.txt
"$py" "$rr" --dir set >readme.md 2>err.txt
_rc=$?
if [ $_rc -ne 0 ] && [ "$(wc -l <err.txt)" -eq 1 ] && grep -q "machine.txt" err.txt; then ok; else
  bad "results_readme.py without machine.txt: status $_rc, stderr: $(head -c 300 err.txt)"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
