/* Which library computes an fp32 CPU product (include/mpitrain/ops.h, "CPU GEMM library"):
 * the process-wide setting and the fixed rule of MPT_CPU_GEMM_AUTO. mpt__cpu_gemm (ops_cpu.c)
 * and the attention's block products (attn_cpu.c) ask through mpt__cpu_sgemm_dnnl_wanted.
 *
 * The rule, from mpt_gemm_bench at one thread (bench/results/gemm_mlp.txt): with oneDNN's AVX-512
 * kernels its sgemm beats OpenBLAS on every model's step (mlp 1.09x, gpt-mini 1.10x); with its
 * AVX2 kernels it loses on the mlp's small products (0.92x; fc2's dX and dW at about 70 GFLOP/s
 * against OpenBLAS's 100) and stays level or ahead on gpt-mini's Linears (1.01x) and attention
 * blocks (1.01x). So under AVX2 the products below AVX2_ONEDNN_MIN_MACS multiply-adds go to
 * OpenBLAS: 2^27 lies between the mlp's largest product (64 x 512 x 784, 2.6e7) and gpt-mini's
 * smallest Linear (2048 x 384 x 384, 3.0e8). oneDNN's instruction set is read once, after
 * mpt_cpu_isa_init has capped it; it cannot change later in the process. */
#include "config.h"

#include <stdatomic.h>

#include "core/cpu/cpu.h"
#include "mpitrain/ops.h"

#ifdef MPT_HAVE_ONEDNN
#include <oneapi/dnnl/dnnl.h>
#endif

#define AVX2_ONEDNN_MIN_MACS 134217728.0 /* 2^27 */

static atomic_int setting = MPT_CPU_GEMM_AUTO;
static atomic_int onednn_avx512 = -1; /* -1: not read yet */

mpt_status mpt_cpu_set_gemm(mpt_cpu_gemm gemm) {
  if (gemm != MPT_CPU_GEMM_AUTO && gemm != MPT_CPU_GEMM_OPENBLAS && gemm != MPT_CPU_GEMM_ONEDNN)
    return MPT_FAIL(MPT_EINVAL, "mpt_cpu_set_gemm: %d is not an mpt_cpu_gemm", (int)gemm);
#ifndef MPT_HAVE_ONEDNN
  if (gemm == MPT_CPU_GEMM_ONEDNN)
    return MPT_FAIL(MPT_ENOTSUP, "mpt_cpu_set_gemm: oneDNN's GEMM asked for, but this build has "
                    "no oneDNN (configure --with-onednn; Debian: libdnnl-dev)");
#endif
  atomic_store(&setting, (int)gemm);
  return MPT_OK;
}

mpt_cpu_gemm mpt_cpu_gemm_setting(void) { return (mpt_cpu_gemm)atomic_load(&setting); }

const char *mpt_cpu_gemm_name(mpt_cpu_gemm gemm) {
  switch (gemm) {
    case MPT_CPU_GEMM_AUTO: return "auto";
    case MPT_CPU_GEMM_OPENBLAS: return "openblas";
    case MPT_CPU_GEMM_ONEDNN: return "onednn";
  }
  return "unknown";
}

#ifdef MPT_HAVE_ONEDNN
/* Whether oneDNN runs AVX-512 kernels (after the cap of mpt_cpu_isa_init). */
static int onednn_has_avx512(void) {
  int v = atomic_load_explicit(&onednn_avx512, memory_order_relaxed);
  if (v < 0) {
    (void)mpt_cpu_isa_init(); /* a bad MPT_CPU_ISA reaches the caller through its own call */
    const unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    v = (isa & (unsigned)dnnl_cpu_isa_avx512_core) == (unsigned)dnnl_cpu_isa_avx512_core;
    atomic_store_explicit(&onednn_avx512, v, memory_order_relaxed);
  }
  return v;
}
#endif

mpt_cpu_gemm mpt_cpu_gemm_for(int64_t m, int64_t n, int64_t k) {
#ifdef MPT_HAVE_ONEDNN
  /* A matrix-vector product (the gradient clipping's dot, m = n = 1) is a memory-bound stream:
   * OpenBLAS's GEMV path is as good and does not wake the OpenMP team. */
  if (m <= 1 || n <= 1 || k <= 0) return MPT_CPU_GEMM_OPENBLAS;
  const mpt_cpu_gemm s = mpt_cpu_gemm_setting();
  if (s != MPT_CPU_GEMM_AUTO) return s;
  if (onednn_has_avx512()) return MPT_CPU_GEMM_ONEDNN;
  return (double)m * (double)n * (double)k < AVX2_ONEDNN_MIN_MACS ? MPT_CPU_GEMM_OPENBLAS
                                                                  : MPT_CPU_GEMM_ONEDNN;
#else
  (void)m, (void)n, (void)k;
  return MPT_CPU_GEMM_OPENBLAS;
#endif
}
