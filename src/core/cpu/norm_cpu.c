/* CPU kernels for batch normalisation (Ioffe & Szegedy, 2015) with PyTorch's semantics: the
 * batch statistics use the biased variance to normalise and the unbiased one for running_var;
 * running = (1 - momentum) * running + momentum * batch. x is viewed as [n, c, inner] and the
 * statistics are per channel over n * inner values.
 *
 * Statistics are accumulated in double (two passes: mean, then squared deviations, which does
 * not cancel like E[x^2] - E[x]^2); each channel's and element's arithmetic is kernel_math.h's,
 * which the CUDA kernels share; the per-element loops are float and vectorise (vec.h,
 * when inner >= 8: the 2-D case; for inner == 1 the channel stride defeats it). ops.c has
 * checked the arguments (n * inner >= 2 in training). Runs on the calling thread. */
#include <math.h>

#include "core/cpu/cpu.h"
#include "core/cpu/vec.h"
#include "mpitrain/core.h"

mpt_status mpt__cpu_batchnorm_train(mpt_stream *s, const float *restrict x, int64_t n,
                                    int64_t c, int64_t inner, const float *gamma,
                                    const float *beta, float eps, float momentum,
                                    float *running_mean, float *running_var,
                                    float *restrict y, float *save_mean, float *save_invstd) {
  (void)s;
  const double N = (double)(n * inner);
  for (int64_t ch = 0; ch < c; ch++) {
    double sum = 0;
    for (int64_t r = 0; r < n; r++) {
      const float *xp = x + (r * c + ch) * inner;
      for (int64_t i = 0; i < inner; i++) sum += xp[i];
    }
    const double mean = sum / N;
    double ss = 0;
    for (int64_t r = 0; r < n; r++) {
      const float *xp = x + (r * c + ch) * inner;
      for (int64_t i = 0; i < inner; i++) {
        const double d = xp[i] - mean;
        ss += d * d;
      }
    }
    const double var = ss / N; /* biased: normalises the batch */
    const double invstd = mpt__bn_invstd(var, eps);
    save_mean[ch] = (float)mean;
    save_invstd[ch] = (float)invstd;
    if (running_mean) running_mean[ch] = mpt__bn_running_mean(running_mean[ch], momentum, mean);
    if (running_var) running_var[ch] = mpt__bn_running_var(running_var[ch], momentum, var, N);

    const float m = (float)mean, scale = mpt__bn_scale(gamma[ch], invstd), b = beta[ch];
    for (int64_t r = 0; r < n; r++) {
      const float *xp = x + (r * c + ch) * inner;
      float *yp = y + (r * c + ch) * inner;
      MPT_VEC_FOR(i, inner, yp[i] = mpt__bn_apply(xp[i], m, scale, b));
    }
  }
  return MPT_OK;
}

mpt_status mpt__cpu_batchnorm_eval(mpt_stream *s, const float *restrict x, int64_t n,
                                   int64_t c, int64_t inner, const float *gamma,
                                   const float *beta, float eps, const float *running_mean,
                                   const float *running_var, float *restrict y) {
  (void)s;
  for (int64_t ch = 0; ch < c; ch++) {
    const float m = running_mean[ch], b = beta[ch];
    const float scale = mpt__bn_eval_scale(gamma[ch], running_var[ch], eps);
    for (int64_t r = 0; r < n; r++) {
      const float *xp = x + (r * c + ch) * inner;
      float *yp = y + (r * c + ch) * inner;
      MPT_VEC_FOR(i, inner, yp[i] = mpt__bn_apply(xp[i], m, scale, b));
    }
  }
  return MPT_OK;
}

/* With xhat = (x - mean) * invstd and sums over the channel's N values:
 *   dbeta = sum(dy), dgamma = sum(dy * xhat),
 *   dx = gamma * invstd * (dy - dbeta / N - xhat * dgamma / N). */
mpt_status mpt__cpu_batchnorm_backward(mpt_stream *s, const float *restrict dy,
                                       const float *restrict x, int64_t n, int64_t c,
                                       int64_t inner, const float *gamma,
                                       const float *save_mean, const float *save_invstd,
                                       float *restrict dx, float *dgamma, float *dbeta) {
  (void)s;
  const double N = (double)(n * inner);
  for (int64_t ch = 0; ch < c; ch++) {
    const float m = save_mean[ch], invstd = save_invstd[ch];
    double sum_dy = 0, sum_dy_xhat = 0;
    for (int64_t r = 0; r < n; r++) {
      const float *xp = x + (r * c + ch) * inner, *dp = dy + (r * c + ch) * inner;
      for (int64_t i = 0; i < inner; i++) {
        sum_dy += dp[i];
        sum_dy_xhat += (double)dp[i] * ((xp[i] - m) * invstd);
      }
    }
    if (dbeta) dbeta[ch] += (float)sum_dy;
    if (dgamma) dgamma[ch] += (float)sum_dy_xhat;
    if (!dx) continue;
    const float k = gamma[ch] * invstd, mean_dy = (float)(sum_dy / N);
    const float mean_dy_xhat = (float)(sum_dy_xhat / N);
    for (int64_t r = 0; r < n; r++) {
      const float *xp = x + (r * c + ch) * inner, *dp = dy + (r * c + ch) * inner;
      float *dxp = dx + (r * c + ch) * inner;
      MPT_VEC_FOR(i, inner,
                  dxp[i] += mpt__bn_dx(k, dp[i], xp[i], m, invstd, mean_dy, mean_dy_xhat));
    }
  }
  return MPT_OK;
}
