#!/bin/sh
# The fuzz targets (fuzz/): builds them with clang + libFuzzer + ASan + UBSan (fuzz/build.sh,
# into ./fuzz-build of the build directory) and runs each one, from its seed corpus, for
# MPT_FUZZ_SECONDS seconds (default 60) with fuzz/run.sh: fuzz_idx (the IDX reader and dataset
# loader), fuzz_ckpt (the checkpoint loader), fuzz_cli (the command-line parser), fuzz_llmc (llm.c token shards and model files), fuzz_safetensors (safetensors files). A target
# passes when the fuzzer found no crash, hang, leak, sanitizer report or broken invariant in
# that time; a failure prints the fuzzer's report and the reproducer's path.
# Skipped (exit 77) where clang or libFuzzer is missing (Debian: apt-get install clang
# libclang-rt-14-dev). Prints "N passed, N failed".
set -u
top=${srcdir:-$(dirname "$0")/..}
seconds=${MPT_FUZZ_SECONDS:-60}
out=${MPT_FUZZ_BUILD:-$PWD/fuzz-build}
mkdir -p "$out"

"$top/fuzz/build.sh" "$out" >"$out/build.log" 2>&1
rc=$?
if [ "$rc" -eq 77 ]; then
  echo "SKIP: clang with libFuzzer is not available:"
  cat "$out/build.log"
  exit 77
fi
if [ "$rc" -ne 0 ]; then
  echo "FAIL: fuzz/build.sh failed (status $rc):"
  tail -n 40 "$out/build.log"
  echo "0 passed, 1 failed"
  exit 1
fi

pass=0
fail=0
for target in fuzz_idx fuzz_ckpt fuzz_cli fuzz_llmc fuzz_safetensors; do
  if "$top/fuzz/run.sh" "$target" "$seconds" "$out"; then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
  fi
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
