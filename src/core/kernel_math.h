/* The per-element arithmetic that the CPU backend (C, src/core/cpu) and the CUDA backend (nvcc,
 * src/core/cuda/kernels_*.cu) must do alike, written once: both compilers read this header, so
 * a change reaches both backends or neither. The loops, reductions and their order stay with
 * each backend (a vectorised loop on the CPU, a block tree on the GPU); what is here is each
 * element's formula and each row's or channel's finishing arithmetic, in the order the CPU
 * reference does it (nvcc still fuses a multiply and an add where the CPU rounds twice: the op
 * table's bounds, tests/backend_op_cases.c, allow for that).
 *
 * Every function is inlined (always, on the CPU: the instruction-set clones of src/core/cpu/
 * isa.h must not call an out-of-line copy built for the baseline) and pure. */
#ifndef MPT_CORE_KERNEL_MATH_H
#define MPT_CORE_KERNEL_MATH_H

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define MPT__HD static __host__ __device__ __forceinline__
#elif defined(__GNUC__)
#define MPT__HD static inline __attribute__((always_inline))
#else
#define MPT__HD static inline
#endif

/* ---- dropout ---- */

/* Counter-based uniform in [0, 1): splitmix64 of seed + (i + 1) * golden ratio, top 24 bits.
 * The same mask on every backend and at every split of the work. */
MPT__HD float mpt__hash_uniform(uint64_t seed, uint64_t i) {
  uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return (float)(z >> 40) * (1.0f / 16777216.0f);
}

/* The scale of a kept element, 1 / (1 - p), computed once per call (on the host). */
MPT__HD float mpt__dropout_keep(float p) { return 1.0f / (1.0f - p); }

/* Element i's mask value: keep (from mpt__dropout_keep) with probability 1 - p, else 0. */
MPT__HD float mpt__dropout_mask(uint64_t seed, uint64_t i, float p, float keep) {
  return mpt__hash_uniform(seed, i) >= p ? keep : 0.0f;
}

/* ---- batch normalisation (PyTorch's semantics) ----
 * A channel's N values have mean = sum / N and biased variance var = sum((x - mean)^2) / N,
 * both summed in double by the backend (two passes). */

MPT__HD double mpt__bn_invstd(double var, float eps) { return 1.0 / sqrt(var + eps); }

/* running = (1 - momentum) running + momentum batch; the variance kept is the unbiased one. */
MPT__HD float mpt__bn_running_mean(float running, float momentum, double mean) {
  return (float)((1.0 - momentum) * running + momentum * mean);
}
MPT__HD float mpt__bn_running_var(float running, float momentum, double var, double n) {
  return (float)((1.0 - momentum) * running + momentum * var * n / (n - 1.0));
}

/* y = (x - mean) scale + beta, scale = gamma invstd (training) or gamma / sqrt(running_var +
 * eps) (evaluation), each rounded to float once per channel. */
MPT__HD float mpt__bn_scale(float gamma, double invstd) { return (float)(gamma * invstd); }
MPT__HD float mpt__bn_eval_scale(float gamma, float running_var, float eps) {
  return (float)(gamma / sqrt((double)running_var + eps));
}
MPT__HD float mpt__bn_apply(float x, float mean, float scale, float beta) {
  return (x - mean) * scale + beta;
}

/* Backward, one element: k (dy - mean(dy) - xhat mean(dy xhat)), k = gamma invstd, xhat =
 * (x - mean) invstd; the means over the channel are rounded to float once per channel. */
MPT__HD float mpt__bn_dx(float k, float dy, float x, float mean, float invstd, float mean_dy,
                         float mean_dy_xhat) {
  return k * (dy - mean_dy - (x - mean) * invstd * mean_dy_xhat);
}

/* ---- softmax cross-entropy (ops.h mpt_op_softmax_xent) ----
 * A row's probabilities are exp(x - max) / z with z = sum exp(x - max) in double; its loss
 * -log softmax[label] = log(z) - (x[label] - max), finite even where the probability
 * underflows to 0. */
MPT__HD float mpt__softmax_inv(double z) { return (float)(1.0 / z); }
MPT__HD double mpt__softmax_xent_row_loss(double z, float x_label, float max) {
  return log(z) - ((double)x_label - max);
}
/* The vocabulary cross-entropy (ops_gpt.h mpt_op_xent_vocab) keeps each row's max and 1 / z
 * (mpt__softmax_inv) for backward, which recomputes p = exp(x - max) (1 / z); its row's
 * logsumexp is max + log(z), in double. */
MPT__HD double mpt__softmax_lse(float max, double z) { return (double)max + log(z); }

/* ---- LayerNorm (ops_gpt.h) ----
 * rstd = 1 / sqrt(var + eps) of a row's c values, var = sum((x - mean)^2) / c summed in double;
 * backward: dx += rstd (dy w - mean(dy w) - xhat mean(dy w xhat)), the means rounded to float
 * once per row. */
MPT__HD float mpt__ln_rstd(double sum_sq_dev, int64_t c, float eps) {
  return (float)(1.0 / sqrt(sum_sq_dev / (double)c + (double)eps));
}
MPT__HD float mpt__ln_dx(float rstd, float gw, float mean_gw, float xhat, float mean_gw_xhat) {
  return rstd * (gw - mean_gw - xhat * mean_gw_xhat);
}

/* ---- GELU, tanh approximation (ops_gpt.h) ----
 * gelu(v) = v s with s = sigmoid(2u) = 1 / (1 + e), e = exp(-2u), u = sqrt(2/pi) (v + 0.044715
 * v^3); gelu'(v) = s + 2 v s (1 - s) u', with 1 - s = e s (no cancellation where s is near 1).
 * Each backend brings its exp (the CPU's vectorisable one of src/core/cpu/vmath.h, CUDA's
 * expf) and its select for 1 - s where e is infinite. */
#define MPT__GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
#define MPT__GELU_CUBE 0.044715f
MPT__HD float mpt__gelu_u(float v) {
  return MPT__GELU_SCALE * (v + MPT__GELU_CUBE * v * v * v);
}
MPT__HD float mpt__gelu_du(float v) {
  return MPT__GELU_SCALE * (1.0f + 3.0f * MPT__GELU_CUBE * v * v);
}
/* gelu'(v) from s, 1 - s and u'. */
MPT__HD float mpt__gelu_grad(float v, float s, float one_minus_s, float du) {
  return s + 2.0f * v * s * one_minus_s * du;
}

/* ---- AdamW (Loshchilov & Hutter, 2019; PyTorch's torch.optim.AdamW) ----
 * One element, given the decayed parameter p (param (1 - lr wd)), the bias corrections folded
 * into step_size = lr / (1 - beta1^t) and bc2_sqrt = sqrt(1 - beta2^t), b1c = 1 - beta1,
 * b2c = 1 - beta2 (rounded on the host): m and v updated in place, the new parameter returned.
 * The CPU's AVX-512 loop (optim_cpu.c) repeats these operations in this order. */
MPT__HD float mpt__adamw_element(float p, float g, float *m, float *v, float beta1, float b1c,
                                 float beta2, float b2c, float bc2_sqrt, float eps,
                                 float step_size) {
  const float mi = beta1 * *m + b1c * g;
  const float vi = beta2 * *v + b2c * g * g;
  *m = mi;
  *v = vi;
  const float denom = sqrtf(vi) / bc2_sqrt + eps;
  return p - step_size * (mi / denom);
}

#endif
