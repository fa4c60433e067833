/* fp32 GEMM on the CPU through oneDNN's BLAS-like dnnl_sgemm (ops.h mpt_op_gemm, reached from
 * mpt__cpu_gemm in ops_cpu.c). Compiled only with oneDNN (MPT_HAVE_ONEDNN; src/core/local.mk);
 * without it, and for the products mpt__cpu_sgemm_dnnl_wanted declines, OpenBLAS's cblas_sgemm
 * does the work.
 *
 * Why: on the GEMMs of a GPT training step (bench/gemm_bench.c, mpt_gemm_bench: the forward,
 * dX and dW of every Linear at M = B*T = 2048, gpt-mini and gpt2 shapes) oneDNN 2.6's sgemm
 * (its AVX-512 JIT kernels) measured 5-12 % faster than OpenBLAS 0.3.21 here; see
 * bench/README.md for the figures and commands. dnnl_sgemm takes row-major operands with
 * leading dimensions and transposes exactly as cblas_sgemm does, so nothing is copied and no
 * plan needs caching. The sums are the same products in a possibly different order: results
 * agree with OpenBLAS to fp32 rounding (tests/test_sgemm_dnnl.c states the bound), not bit for
 * bit.
 *
 * Threads: oneDNN runs on OpenMP; its thread count is set to OpenBLAS's (mpt_cpu_set_threads,
 * mpt_cpu_gemm_threads) at each call, as for the bf16 GEMM and the convolutions, so one setting
 * governs both libraries; a small product (at most SMALL_MACS multiply-adds) runs on one thread.
 * The same count gives the same bits, call after call; another count may not: oneDNN 2.6 chooses
 * its work split, and so the order of the sums, from the thread count and the ISA (with
 * ONEDNN_MAX_CPU_ISA=AVX2, as on an AVX2-only CPU, a 64 x 64 x 65536 product gives other bits
 * at 2 threads than at 1), so the GEMMs are not promised the same bits across thread counts
 * (ops.h, "CPU threads"; tests/test_sgemm_dnnl.c checks each count against the exact result
 * instead). Runs synchronously on the calling thread (and its OpenMP team), with the
 * asynchronous signals blocked (core/threads.h: oneDNN's fp32 kernels move the stack pointer
 * into the heap). */
#include <cblas.h>
#include <omp.h>

#include "core/cpu/cpu.h"
#include "core/cpu/dnnl_check.h"
#include "core/threads.h"

/* Products of at most this many multiply-adds run on one thread (mpt__cpu_sgemm_dnnl_threads):
 * 2^22, a 64 x 1024 x 64 attention block at T 1024. Every Linear of the GPTs is above 10^8. */
#define SMALL_MACS 4194304.0

int mpt__cpu_sgemm_dnnl_wanted(int64_t m, int64_t n, int64_t k) {
  return mpt_cpu_gemm_for(m, n, k) == MPT_CPU_GEMM_ONEDNN; /* gemm_choice.c */
}

int mpt__cpu_sgemm_dnnl_threads(int64_t m, int64_t n, int64_t k) {
  int threads = openblas_get_num_threads();
  if (threads < 1) threads = 1;
  /* A small product runs on the calling thread alone: waking the OpenMP team and meeting at its
   * barrier costs more than the second core gives (the attention's 64-row blocks, 64 x 512 x 64
   * at T 512: 112 GFLOP/s on 2 threads against 144 on one, wall clock, mpt_gemm_bench). */
  if ((double)m * (double)n * (double)k <= SMALL_MACS) threads = 1;
  return threads;
}

mpt_status mpt__cpu_sgemm_dnnl(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                               float alpha, const float *a, int64_t lda, const float *b,
                               int64_t ldb, float beta, float *c, int64_t ldc) {
  MPT_RETURN_IF(mpt_cpu_isa_init()); /* caps oneDNN before its first call (isa.c) */
  const int threads = mpt__cpu_sgemm_dnnl_threads(m, n, k);
  if (omp_get_max_threads() != threads) omp_set_num_threads(threads);
  /* with the asynchronous signals blocked: a signal taken inside oneDNN's JIT kernel corrupts
   * the heap (core/threads.h); the OpenMP team started from here inherits the mask */
  sigset_t old;
  mpt__signals_block(&old);
  const dnnl_status_t st = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha,
                                      a, lda, b, ldb, beta, c, ldc);
  mpt__signals_restore(&old);
  MPT_DNNL_OK(st);
  return MPT_OK;
}
