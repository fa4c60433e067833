#!/bin/sh
# Runs one fuzz target for a while, starting from its seed corpus.
#
#   fuzz/run.sh TARGET SECONDS [BUILD_DIR]
#
# TARGET is fuzz_idx, fuzz_ckpt, fuzz_cli, fuzz_llmc or fuzz_safetensors, built by fuzz/build.sh into BUILD_DIR (default
# ./fuzz-build, built first if the binary is missing). New interesting inputs go to
# BUILD_DIR/corpus/TARGET (kept between runs; the committed seeds in fuzz/corpus/TARGET are
# only read), crash, leak and timeout reproducers to BUILD_DIR/artifacts/ (their names are
# printed), the fuzzer's log to BUILD_DIR/TARGET.log.
# Limits: SECONDS of fuzzing in total, 10 s per input (a slower input counts as a hang),
# 2048 MiB of memory, inputs of at most FUZZ_MAX_LEN bytes (default 16384).
# Exit status: 0 when nothing was found, 1 when the fuzzer found a crash, hang, leak or memory
# blow-up (the last lines of the log are printed), 2 on bad usage. Prints one summary line:
#   "TARGET: N executions in S s, corpus C inputs, nothing found" (or "FOUND: ...").
# Reproduce a finding with: BUILD_DIR/TARGET ARTIFACT_FILE
set -u

here=$(cd "$(dirname "$0")" && pwd)
if [ $# -lt 2 ]; then
  echo "usage: fuzz/run.sh TARGET SECONDS [BUILD_DIR]" >&2
  exit 2
fi
target=$1
seconds=$2
out=${3:-$PWD/fuzz-build}
case "$target" in fuzz_idx | fuzz_ckpt | fuzz_cli | fuzz_llmc | fuzz_safetensors) ;; *)
  echo "fuzz/run.sh: unknown target '$target' (fuzz_idx, fuzz_ckpt, fuzz_cli, fuzz_llmc or fuzz_safetensors)" >&2
  exit 2
  ;;
esac
case "$seconds" in '' | *[!0-9]*)
  echo "fuzz/run.sh: SECONDS must be a whole number, got '$seconds'" >&2
  exit 2
  ;;
esac
if [ ! -x "$out/$target" ]; then
  "$here/build.sh" "$out" || exit $?
fi

work="$out/corpus/$target"
mkdir -p "$work" "$out/artifacts"
log="$out/$target.log"
# UBSan and ASan stop at the first error (build.sh: -fno-sanitize-recover); leaks are checked.
# The fast unwinder is used (make check sets the slow one for its own tests: tests/fuzz.mk).
ASAN_OPTIONS=${FUZZ_ASAN_OPTIONS:-detect_leaks=1}
UBSAN_OPTIONS=${FUZZ_UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export ASAN_OPTIONS UBSAN_OPTIONS
start=$(date +%s)
"$out/$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -max_len="${FUZZ_MAX_LEN:-16384}" -error_exitcode=1 -timeout_exitcode=1 \
  -print_final_stats=1 -artifact_prefix="$out/artifacts/$target-" \
  "$work" "$here/corpus/$target" >"$log" 2>&1
rc=$?
elapsed=$(($(date +%s) - start))
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
corpus=$(find "$work" -type f | wc -l)
if [ "$rc" -eq 0 ]; then
  echo "$target: ${execs:-?} executions in ${elapsed} s, corpus $corpus inputs, nothing found"
  exit 0
fi
echo "$target: FOUND a problem after ${execs:-?} executions in ${elapsed} s (exit status $rc);" \
  "log $log:"
grep -E 'ERROR|WARNING|SUMMARY|fuzz invariant|runtime error|Test unit written|artifact' "$log" |
  head -n 20
tail -n 30 "$log"
exit 1
