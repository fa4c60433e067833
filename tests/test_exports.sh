#!/usr/bin/env bash
# The installed shared library exports exactly its public API:
#   - no internal symbol: nothing named mpt__ (the prefix of cross-file internals), and nothing
#     outside the mpt_ prefix, is defined in the dynamic symbol table of .libs/libmpitrain.so;
#   - every function a public header declares with MPT_API (include/mpitrain.h and
#     include/mpitrain/*.h) is exported, and every exported function is declared there;
#   - (not an export, but read from the same table) no vmath.h helper has an out-of-line copy.
# So the test fails both when the visibility control leaks internals and when it hides part of
# the API. Run from the build folder (make check); $srcdir holds the headers.
set -u
srcdir=${srcdir:-.}
lib=.libs/libmpitrain.so
if [ ! -f "$lib" ]; then
  echo "FAIL: $lib not built (the shared library: make libmpitrain.la)"
  exit 1
fi
command -v nm > /dev/null || { echo "SKIP: nm not found (binutils)"; exit 77; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Defined dynamic symbols of any kind (code, data, weak); "U" lines are excluded by nm itself.
nm -D --defined-only "$lib" | awk 'NF >= 3 {print $3}' | sed 's/@.*//' | sort -u > "$tmp/exported"
# The public declarations: the identifier before the first "(" on each MPT_API line.
cat "$srcdir"/include/mpitrain.h "$srcdir"/include/mpitrain/*.h |
  sed -n 's/.*MPT_API[^(]*[ *]\(mpt_[A-Za-z0-9_]*\)(.*/\1/p' | sort -u > "$tmp/declared"

fail=0
n_exported=$(wc -l < "$tmp/exported")
n_declared=$(wc -l < "$tmp/declared")
if [ "$n_declared" -lt 50 ]; then
  echo "FAIL: only $n_declared MPT_API declarations parsed from the public headers"
  fail=1
fi

internal=$(grep '^mpt__' "$tmp/exported" || true)
if [ -n "$internal" ]; then
  echo "FAIL: $lib exports $(printf '%s\n' "$internal" | wc -l) internal mpt__ symbols, e.g.:"
  printf '%s\n' "$internal" | head -n 10 | sed 's/^/  /'
  fail=1
fi
foreign=$(grep -v '^mpt_' "$tmp/exported" || true)
if [ -n "$foreign" ]; then
  echo "FAIL: $lib exports symbols outside the mpt_ prefix:"
  printf '%s\n' "$foreign" | head -n 10 | sed 's/^/  /'
  fail=1
fi
hidden=$(comm -23 "$tmp/declared" "$tmp/exported")
if [ -n "$hidden" ]; then
  echo "FAIL: declared in include/ with MPT_API but not exported by $lib:"
  printf '%s\n' "$hidden" | head -n 20 | sed 's/^/  /'
  fail=1
fi
undeclared=$(comm -13 "$tmp/declared" "$tmp/exported" | grep -v '^mpt__' | grep '^mpt_' || true)
if [ -n "$undeclared" ]; then
  echo "FAIL: exported by $lib but declared by no public header:"
  printf '%s\n' "$undeclared" | head -n 20 | sed 's/^/  /'
  fail=1
fi

# The vector helpers of src/core/cpu/vmath.h are inlined into the AVX-512 / AVX2 clones of their
# callers: an out-of-line copy (a local symbol) would be built for the default target (SSE2),
# so the clones would run it at a quarter of the vector width. Local symbols are listed only
# while the library is not stripped (a build tree's is not).
if nm "$lib" 2> /dev/null | grep -q ' [tT] '; then
  outline=$(nm "$lib" | awk '$2 ~ /^[tT]$/ {print $3}' |
            grep -E '^mpt__(vselect|vexpf|vsum_d|vmax|softmax_row|softmax_backward_row)$' || true)
  if [ -n "$outline" ]; then
    echo "FAIL: vmath.h helpers built out of line (the default target's code): $outline"
    fail=1
  fi
fi

echo "$lib: $n_exported exported symbols, $n_declared public declarations"
[ "$fail" -eq 0 ] && echo "PASS: the library exports exactly the public API"
exit "$fail"
