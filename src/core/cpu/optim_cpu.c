/* CPU optimizer steps over flat float buffers, with the semantics (and the float operation
 * order) of PyTorch 1.13's single-tensor torch.optim.SGD and torch.optim.AdamW (Loshchilov &
 * Hutter, 2019). Scalars derived from hyper-parameters (bias corrections) are computed in double
 * and rounded once, as PyTorch does in Python.
 *
 * SGD works in blocks of SGD_BLOCK elements through a stack buffer so that each pass is a plain
 * loop with its options decided outside it (vectorised at -O2, see vec.h); the block stays in
 * L1. AdamW stays scalar: sqrtf does not vectorise while it may set errno. Runs on the calling
 * thread; ops.c has checked the arguments. */
#include <math.h>

#include "core/cpu/cpu.h"
#include "core/cpu/vec.h"
#include "core/error.h"

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

mpt_status mpt__cpu_adamw_step(mpt_stream *s, float *restrict param, const float *restrict grad,
                               float *restrict m, float *restrict v, int64_t count, float lr,
                               float beta1, float beta2, float eps, float weight_decay,
                               int64_t step) {
  (void)s;
  const float decay = (float)(1.0 - (double)lr * weight_decay);
  const double bc1 = 1.0 - pow(beta1, (double)step), bc2 = 1.0 - pow(beta2, (double)step);
  const float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
  const float b1c = 1.0f - beta1, b2c = 1.0f - beta2;
  for (int64_t i = 0; i < count; i++) {
    const float g = grad[i];
    const float p = param[i] * decay;
    m[i] = beta1 * m[i] + b1c * g;
    v[i] = beta2 * v[i] + b2c * g * g;
    const float denom = sqrtf(v[i]) / bc2_sqrt + eps;
    param[i] = p - step_size * (m[i] / denom);
  }
  return MPT_OK;
}
