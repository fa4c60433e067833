#!/bin/sh
# Usage: tests/isa_paths.sh ISA
#
# Runs the op tests on one CPU instruction-set path: each program below with MPT_CPU_ISA=ISA
# (our kernels' clones and oneDNN's cap, include/mpitrain/ops.h "CPU instruction sets") and
# OPENBLAS_CORETYPE set to match (OpenBLAS reads it only when it loads: Haswell for avx2,
# Prescott for the baseline; avx512 leaves OpenBLAS its own choice). The plain test run already
# covers the CPU's best path, so the path the CPU picks by itself is skipped, as is a path the
# CPU lacks: both exit 77 (automake's SKIP) saying so. Programs missing from this build (no
# oneDNN: test_sgemm_dnnl) are left out. Prints each program's Check summary; exits 1 if any
# program failed (its last lines are shown), else 0.
set -u
isa=${1:-}
case $isa in avx512|avx2|baseline) ;; *) echo "usage: $0 avx512|avx2|baseline" >&2; exit 2 ;; esac
programs="test_backend_ops test_ops test_ops_conv test_ops_train test_gpt_core test_gpt_ops
          test_gpt_ops_attention test_gpt_fused
          test_attention_fused test_bf16 test_sgemm_dnnl test_layers test_optim"
if ! ./tests/test_backend_ops --offers "$isa"; then
  echo "SKIP: this CPU has no $isa path (see ./mpitrain --version)"
  exit 77
fi
best=baseline
./tests/test_backend_ops --offers avx2 && best=avx2
./tests/test_backend_ops --offers avx512 && best=avx512
if [ "$isa" = "$best" ] && [ -z "${MPT_ISA_PATHS_ALL:-}" ]; then
  echo "SKIP: $isa is this CPU's own path, which the plain tests run (MPT_ISA_PATHS_ALL=1 runs it)"
  exit 77
fi
case $isa in avx2) core=Haswell ;; baseline) core=Prescott ;; *) core=${OPENBLAS_CORETYPE:-} ;; esac
MPT_CPU_ISA=$isa
OPENBLAS_CORETYPE=$core
export MPT_CPU_ISA OPENBLAS_CORETYPE
failed=0
for p in $programs; do
  [ -x "./tests/$p" ] || continue
  out=$(timeout 900 "./tests/$p" 2>&1)
  rc=$?
  summary=$(printf '%s\n' "$out" | grep -E '^[0-9]+%: Checks: |^SKIP' | tail -n 1)
  case $rc in
    0) echo "$isa $p: ${summary:-ok}" ;;
    77) echo "$isa $p: skipped: $summary" ;;
    *) echo "$isa $p: FAILED (status $rc)"; printf '%s\n' "$out" | tail -n 15; failed=1 ;;
  esac
done
exit $failed
