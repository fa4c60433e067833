/* CPU optimizer steps over flat float buffers, with the semantics (and the float operation
 * order) of PyTorch 1.13's single-tensor torch.optim.SGD and torch.optim.AdamW (Loshchilov &
 * Hutter, 2019). Scalars derived from hyper-parameters (bias corrections) are computed in double
 * and rounded once, as PyTorch does in Python.
 *
 * SGD works in blocks of SGD_BLOCK elements through a stack buffer so that each pass is a plain
 * loop with its options decided outside it (vectorised at -O2, see vec.h); the block stays in
 * L1. AdamW: GCC does not vectorise sqrtf while it may set errno, so on the AVX-512 and AVX2
 * paths (isa.h: the CPU has it and MPT_CPU_ISA does not ask for less) the loop is written with
 * intrinsics, 16 or 8 floats at a time (one body, ADAMW_VEC), with the scalar loop's operations
 * in the same order (IEEE add, mul, div and sqrt, no FMA; src/core/kernel_math.h's
 * mpt__adamw_element, which CUDA shares): the same bits as the scalar loop, which does the rest
 * and every other CPU (tests/test_ops_train.c and tests/test_backend_ops.c compare them).
 * AdamW splits large calls over the CPU threads (pool.h; elements are independent, so the same
 * bits at every thread count); SGD runs on the calling thread. ops.c has checked the
 * arguments. */
#include <math.h>
#if defined(__GNUC__) && defined(__x86_64__)
#include <immintrin.h>
#define ADAMW_SIMD 1
#endif

#include "core/cpu/cpu.h"
#include "core/cpu/isa.h"
#include "core/cpu/pool.h"
#include "core/cpu/vec.h"
#include "mpitrain/core.h"
#include "mpitrain/ops.h"

enum { SGD_BLOCK = 1024 };

mpt_status mpt__cpu_sgd_step(mpt_stream *s, float *restrict param, const float *restrict grad,
                             float *restrict momentum_buf, int64_t count, float lr,
                             float momentum, float dampening, float weight_decay, int nesterov,
                             int first) {
  (void)s;
  const float damp = 1.0f - dampening;
  float d[SGD_BLOCK]; /* the update direction of one block */
  for (int64_t i0 = 0; i0 < count; i0 += SGD_BLOCK) {
    const int64_t nb = count - i0 < SGD_BLOCK ? count - i0 : SGD_BLOCK;
    float *p = param + i0;
    const float *g = grad + i0;
    if (weight_decay != 0.0f)
      MPT_VEC_FOR(j, nb, d[j] = g[j] + weight_decay * p[j]);
    else
      MPT_VEC_FOR(j, nb, d[j] = g[j]);
    if (momentum != 0.0f) {
      float *buf = momentum_buf + i0;
      if (first)
        MPT_VEC_FOR(j, nb, buf[j] = d[j]);
      else
        MPT_VEC_FOR(j, nb, buf[j] = momentum * buf[j] + damp * d[j]);
      if (nesterov)
        MPT_VEC_FOR(j, nb, d[j] = d[j] + momentum * buf[j]);
      else
        MPT_VEC_FOR(j, nb, d[j] = buf[j]);
    }
    MPT_VEC_FOR(j, nb, p[j] = p[j] - lr * d[j]);
  }
  return MPT_OK;
}

#ifdef ADAMW_SIMD
/* The first count - count % W elements of the AdamW step, W floats at a time (see
 * mpt__cpu_adamw_step for the scalar formula); returns how many it did. One body for both
 * widths: VEC the register type, P the intrinsics' prefix (_mm512, _mm256). */
#define ADAMW_VEC(name, isa, VEC, W, P)                                                         \
  __attribute__((target(isa))) static int64_t name(                                             \
      float *restrict param, const float *restrict grad, float *restrict m, float *restrict v,  \
      int64_t count, float decay, float beta1, float b1c, float beta2, float b2c,              \
      float bc2_sqrt, float eps, float step_size) {                                             \
    const VEC kdecay = P##_set1_ps(decay), kb1 = P##_set1_ps(beta1);                          \
    const VEC kb1c = P##_set1_ps(b1c), kb2 = P##_set1_ps(beta2);                               \
    const VEC kb2c = P##_set1_ps(b2c), kbc2 = P##_set1_ps(bc2_sqrt);                           \
    const VEC keps = P##_set1_ps(eps), kstep = P##_set1_ps(step_size);                         \
    int64_t i = 0;                                                                              \
    for (; i + W <= count; i += W) {                                                            \
      const VEC g = P##_loadu_ps(grad + i);                                                    \
      const VEC p = P##_mul_ps(P##_loadu_ps(param + i), kdecay);                               \
      const VEC mi = P##_add_ps(P##_mul_ps(kb1, P##_loadu_ps(m + i)), P##_mul_ps(kb1c, g));   \
      const VEC vi =                                                                            \
          P##_add_ps(P##_mul_ps(kb2, P##_loadu_ps(v + i)), P##_mul_ps(P##_mul_ps(kb2c, g), g)); \
      P##_storeu_ps(m + i, mi);                                                                 \
      P##_storeu_ps(v + i, vi);                                                                 \
      const VEC denom = P##_add_ps(P##_div_ps(P##_sqrt_ps(vi), kbc2), keps);                  \
      P##_storeu_ps(param + i, P##_sub_ps(p, P##_mul_ps(kstep, P##_div_ps(mi, denom))));       \
    }                                                                                           \
    return i;                                                                                   \
  }
ADAMW_VEC(adamw_avx512, "avx512f", __m512, 16, _mm512)
ADAMW_VEC(adamw_avx2, "avx2", __m256, 8, _mm256)
#endif

typedef struct adamw_job {
  float *param, *m, *v;
  const float *grad;
  float decay, beta1, b1c, beta2, b2c, bc2_sqrt, eps, step_size;
} adamw_job;

/* Elements [i0, i1): independent of each other, and the vector loops and the scalar one give
 * the same bits, so any split gives the same result. */
static void adamw_range(void *arg, int64_t i0, int64_t i1) {
  const adamw_job *j = arg;
  float *restrict param = j->param + i0, *restrict m = j->m + i0, *restrict v = j->v + i0;
  const float *restrict grad = j->grad + i0;
  const int64_t count = i1 - i0;
  const float decay = j->decay, beta1 = j->beta1, b1c = j->b1c, beta2 = j->beta2;
  const float b2c = j->b2c, bc2_sqrt = j->bc2_sqrt, eps = j->eps, step_size = j->step_size;
  int64_t i = 0;
#ifdef ADAMW_SIMD
  const mpt_cpu_isa isa = mpt__cpu_isa();
  if (isa == MPT_CPU_ISA_AVX512)
    i = adamw_avx512(param, grad, m, v, count, decay, beta1, b1c, beta2, b2c, bc2_sqrt, eps,
                     step_size);
  else if (isa == MPT_CPU_ISA_AVX2)
    i = adamw_avx2(param, grad, m, v, count, decay, beta1, b1c, beta2, b2c, bc2_sqrt, eps,
                   step_size);
#endif
  for (; i < count; i++)
    param[i] = mpt__adamw_element(param[i] * decay, grad[i], &m[i], &v[i], beta1, b1c, beta2, b2c,
                                  bc2_sqrt, eps, step_size);
}


mpt_status mpt__cpu_adamw_step(mpt_stream *s, float *restrict param, const float *restrict grad,
                               float *restrict m, float *restrict v, int64_t count, float lr,
                               float beta1, float beta2, float eps, float weight_decay,
                               int64_t step) {
  (void)s;
  const double bc1 = 1.0 - pow(beta1, (double)step), bc2 = 1.0 - pow(beta2, (double)step);
  adamw_job j = {.param = param, .m = m, .v = v, .grad = grad,
                 .decay = (float)(1.0 - (double)lr * weight_decay), .beta1 = beta1,
                 .b1c = 1.0f - beta1, .beta2 = beta2, .b2c = 1.0f - beta2,
                 .bc2_sqrt = (float)sqrt(bc2), .eps = eps, .step_size = (float)(lr / bc1)};
  /* about 1.3 ns an element here (7 floats of memory traffic) */
  mpt__cpu_parallel_for(count, mpt__cpu_parallel_chunk_ps(count, 1300.0, 64, 0), adamw_range, &j);
  return MPT_OK;
}

enum { SQ_LANES = 16 };

/* 16 partial sums in double, lane j takes i = j mod 16 in increasing i, added in order; one
 * clone per instruction-set path (isa.h), behind the public wrapper. */
MPT_ISA_KERNEL(double, sum_squares, (const float *x, int64_t count), (x, count)) {
  double acc[SQ_LANES] = {0};
  int64_t i = 0;
  for (; i + SQ_LANES <= count; i += SQ_LANES)
    for (int j = 0; j < SQ_LANES; j++) acc[j] += (double)x[i + j] * (double)x[i + j];
  for (int j = 0; i < count; i++, j++) acc[j] += (double)x[i] * (double)x[i];
  double sq = 0;
  for (int j = 0; j < SQ_LANES; j++) sq += acc[j];
  return sq;
}

double mpt_cpu_sum_squares(const float *x, int64_t count) { return sum_squares(x, count); }
