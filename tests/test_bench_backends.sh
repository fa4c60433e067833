#!/bin/sh
# The measuring tools compute what they time: mpt_gemm_bench's every backend this build has
# (openblas, oneDNN's matmul and sgemm, mpt_op_gemm, and BLIS, libxsmm when configure found
# them; MKL when $MPT_BENCH_MKL names it) gives each product of the mlp's step and of gpt-mini's
# attention blocks within 1e-5 of OpenBLAS's, relative to its largest value (its `err` column),
# and its header says cblas_sgemm is OpenBLAS's; mpt_fused_bench's fused ops give the unfused
# ops' bits (its `same` column and exit status). One repetition each: no timing is checked.
# Skipped (77) where mpt_gemm_bench is not built (no oneDNN). Prints "N passed, N failed".
set -u
build=$(pwd)
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*"; }
if [ ! -x "$build/mpt_gemm_bench" ]; then
  echo "skip: mpt_gemm_bench is not built (configure found no oneDNN)"
  exit 77
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/mpt_backends.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

backends=openblas,dnnl,sgemm,mpt
for b in blis xsmm; do
  "$build/mpt_gemm_bench" --backends "openblas,$b" --only none --reps 1 >/dev/null 2>&1 &&
    backends="$backends,$b"
done
[ -n "${MPT_BENCH_MKL:-}" ] && backends="$backends,mkl"
echo "backends: $backends"

# check_errs FILE WHAT: every err column of every product row within 1e-5
check_errs() {
  if grep -q 'cblas_sgemm from .*openblas' "$1"; then ok; else
    bad "$2: cblas_sgemm is not OpenBLAS's: $(grep -o 'cblas_sgemm from [^ ]*' "$1")"
  fi
  rows=$(awk '!/^#/ && $1 != "attn" && NF > 8' "$1" | wc -l)
  worst=$(awk '!/^#/ && $1 != "attn" && NF > 8 { for (i = 10; i <= NF; i += 2) if ($i + 0 > w) w = $i + 0 }
               END { printf "%.1e", w + 0 }' "$1")
  if [ "$rows" -gt 0 ] && awk -v w="$worst" 'BEGIN { exit !(w <= 1e-5) }'; then
    ok; echo "ok: $2: $rows products, largest err $worst"
  else
    bad "$2: $rows products, largest err $worst (want <= 1e-5)"; cat "$1"
  fi
}

"$build/mpt_gemm_bench" --model mlp --threads 1 --reps 1 --backends "$backends" >"$tmp/mlp" 2>&1 ||
  bad "mpt_gemm_bench --model mlp: exit $?"
check_errs "$tmp/mlp" "mlp"
# gpt-mini's Linears at 256 rows (one sequence), then its attention blocks (no err column:
# the same calls as the Linears' backends, checked above; here: they run)
"$build/mpt_gemm_bench" --model gpt-mini --rows 256 --threads 1 --reps 1 \
  --backends "$backends" >"$tmp/gpt" 2>&1 || bad "mpt_gemm_bench --model gpt-mini: exit $?"
check_errs "$tmp/gpt" "gpt-mini, M 256"
if grep -q '^# attention' "$tmp/gpt"; then ok; else bad "gpt-mini: no attention footer"; fi

if [ -x "$build/mpt_fused_bench" ]; then
  if "$build/mpt_fused_bench" --model gpt-mini --rows 256 --reps 1 >"$tmp/fused" 2>&1 &&
    [ "$(awk '$NF == "yes"' "$tmp/fused" | wc -l)" -eq 3 ]; then
    ok; echo "ok: mpt_fused_bench: the fused ops give the unfused bits"
  else
    bad "mpt_fused_bench: $(cat "$tmp/fused")"
  fi
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
