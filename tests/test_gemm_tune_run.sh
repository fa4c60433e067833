#!/bin/sh
# The trainer's --gemm tune (ops.h "CPU GEMM tuning", trainer.h "GEMM tuning"):
#   - a first run times the first step's shapes, logs them in one line and writes the cache
#     (--gemm-cache, or MPT_GEMM_CACHE); a second run takes the table from it;
#   - a cache edited to say openblas for every shape gives the bits of a --gemm openblas run
#     (and onednn: of --gemm onednn), at 1 rank and at 2 ranks; the two libraries' bits differ
#     here, so the routing is observable;
#   - a cut or foreign cache is ignored with a warning, an unwritable one is a warning, and the
#     runs go on (status 0);
#   - with the fault-injection hooks: each rank's timing is made to favour a different library,
#     and both ranks still install rank 0's table.
# Prints "N passed, N failed".
set -u
dir=$(dirname "$0")
prog=${MPITRAIN:-./mpitrain}
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
has() { printf '%s\n' "$1" | grep -q -- "$2"; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_gemmtune.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
small="train --model mlp --synthetic --train-limit 640 --test-limit 128 --epochs 1 --batch-size 32 --threads 1 --no-progress"
onednn=0
"$prog" --version 2>&1 | grep -q "^features:.*onednn yes" && onednn=1

# 1. the first run times and writes; the second reads
out=$("$prog" $small --gemm tune --gemm-cache "$tmp/c.txt" 2>&1)
[ $? -eq 0 ] && has "$out" "no cache at $tmp/c.txt yet" && has "$out" "GEMM tune: [0-9]* shape(s) (" &&
  [ "$(head -n 1 "$tmp/c.txt" 2> /dev/null)" = "mpitrain-gemm-cache 1" ] && ok ||
  bad "the first tuned run did not time and cache: $out"
out=$("$prog" $small --gemm tune --gemm-cache "$tmp/c.txt" 2>&1)
[ $? -eq 0 ] && has "$out" "GEMM tune: [0-9]* shape(s) from the cache $tmp/c.txt" &&
  ! has "$out" "timed in" && ok || bad "the second run did not take the cache: $out"
MPT_GEMM_CACHE="$tmp/env.txt" "$prog" $small --gemm tune > /dev/null 2>&1
[ -s "$tmp/env.txt" ] && ok || bad "MPT_GEMM_CACHE did not name the cache file"

# 2. a forced cache gives the forced library's bits, at 1 and 2 ranks
force() { # force LIB OUT: the cache with every shape on LIB
  awk -v lib="$1" 'NF == 7 && $5 ~ /^(openblas|onednn)$/ { $5 = lib } { print }' \
    "$tmp/c.txt" > "$2"
}
libs=openblas
[ "$onednn" = 1 ] && libs="openblas onednn"
for np in 1 2; do
  for lib in $libs; do
    force "$lib" "$tmp/$lib.txt"
    if [ "$np" = 1 ]; then
      "$prog" $small --gemm "$lib" --save-params "$tmp/fixed-$lib-$np.bin" > /dev/null 2>&1
      out=$("$prog" $small --gemm tune --gemm-cache "$tmp/$lib.txt" \
            --save-params "$tmp/tuned-$lib-$np.bin" 2>&1)
    else
      "$dir/mpirun.sh" 2 120 "$prog" $small --gemm "$lib" \
        --save-params "$tmp/fixed-$lib-$np.bin" > /dev/null 2>&1 < /dev/null
      out=$("$dir/mpirun.sh" 2 120 "$prog" $small --gemm tune --gemm-cache "$tmp/$lib.txt" \
            --save-params "$tmp/tuned-$lib-$np.bin" 2>&1 < /dev/null)
    fi
    has "$out" "from the cache" && [ -s "$tmp/fixed-$lib-$np.bin" ] &&
      cmp -s "$tmp/fixed-$lib-$np.bin" "$tmp/tuned-$lib-$np.bin" && ok ||
      bad "$np rank(s): a cache of $lib everywhere did not give --gemm $lib's bits: $out"
  done
  if [ "$onednn" = 1 ]; then
    ! cmp -s "$tmp/fixed-openblas-$np.bin" "$tmp/fixed-onednn-$np.bin" && ok ||
      bad "$np rank(s): OpenBLAS and oneDNN give the same bits here: the routing is not observable"
  fi
done

# 3. cut, foreign and unwritable caches: warnings, the run goes on, a bad file is replaced
grep -v '^end$' "$tmp/c.txt" > "$tmp/cut.txt"
out=$("$prog" $small --gemm tune --gemm-cache "$tmp/cut.txt" 2>&1)
[ $? -eq 0 ] && has "$out" "warning: GEMM tune: .*cut.txt.*: the cache is ignored" &&
  has "$out" "timed in" && tail -n 1 "$tmp/cut.txt" | grep -q '^end$' && ok ||
  bad "a cut cache was not ignored with a warning and rewritten: $out"
sed 's/^host .*/host another-machine/' "$tmp/c.txt" > "$tmp/foreign.txt"
out=$("$prog" $small --gemm tune --gemm-cache "$tmp/foreign.txt" 2>&1)
[ $? -eq 0 ] && has "$out" "written for another machine or setting: line 2 is \"host another-machine\"" &&
  has "$out" "timed in" && ok || bad "a foreign cache was not ignored with a warning: $out"
out=$("$prog" $small --gemm tune --gemm-cache /proc/mpitrain-none/c.txt 2>&1)
[ $? -eq 0 ] && has "$out" "warning: GEMM tune: the cache could not be written" && ok ||
  bad "an unwritable cache did not give a warning and a finished run: $out"
out=$("$prog" $small --gemm fast 2>&1)
[ $? -eq 2 ] && has "$out" "auto, openblas, onednn or tune" && ok ||
  bad "a bad --gemm was not refused with status 2: $out"

# 4. two ranks whose timings disagree install rank 0's table (fault-injection hooks)
. "$dir/fault_injection.sh"
if fault_injection_built && [ "$onednn" = 1 ]; then
  MPT_TEST_GEMM_TUNE_BIAS=1 MPT_TEST_GEMM_TABLE="$tmp/table" \
    "$dir/mpirun.sh" 2 120 "$prog" $small --gemm tune --gemm-cache "$tmp/bias.txt" \
    > "$tmp/bias.out" 2>&1 < /dev/null
  [ -s "$tmp/table.0" ] && cmp -s "$tmp/table.0" "$tmp/table.1" &&
    ! grep -q onednn "$tmp/table.1" && ok ||
    bad "2 ranks: the tables differ or are not rank 0's: $(cat "$tmp/table.0" "$tmp/table.1" "$tmp/bias.out")"
else
  echo "SKIP (part): the 2-rank table agreement needs configure --enable-fault-injection and oneDNN"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
