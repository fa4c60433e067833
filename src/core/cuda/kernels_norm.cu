/* CUDA kernels for batch normalisation (Ioffe & Szegedy, 2015) with PyTorch's semantics, and
 * their extern "C" launchers (kernels.h): the same double-precision statistics (two passes:
 * mean, then squared deviations) as src/core/cpu/norm_cpu.c, and the same per-channel and
 * per-element arithmetic (src/core/kernel_math.h, which both read); only the summation order
 * differs (a block tree instead of a loop).
 *
 * x is viewed as [n, c, inner]; channel ch holds n * inner values, value j of the channel at
 * (j / inner, ch, j % inner). Training and backward run one block per channel (looping over
 * channels when c exceeds the grid; the loop is uniform across the block, as the block sums
 * require). y may alias x: every value is read before its thread writes it. */
#include "core/cuda/kernels_common.cuh"

#define NORM_BLOCK 512

__device__ __forceinline__ int64_t at_of(int64_t j, int64_t c, int64_t ch, int64_t inner) {
  const int64_t r = j / inner, i = j - r * inner;
  return (r * c + ch) * inner + i;
}

__global__ void k_batchnorm_train(const float *x, int64_t n, int64_t c, int64_t inner,
                                  const float *gamma, const float *beta, float eps,
                                  float momentum, float *running_mean, float *running_var,
                                  float *y, float *save_mean, float *save_invstd) {
  __shared__ double shared[32];
  const int64_t per = n * inner;
  const double N = (double)per;
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    double sum = 0;
    for (int64_t j = threadIdx.x; j < per; j += blockDim.x) sum += x[at_of(j, c, ch, inner)];
    const double mean = mpt_cuk_block_sum(sum, shared) / N;
    double ss = 0;
    for (int64_t j = threadIdx.x; j < per; j += blockDim.x) {
      const double d = x[at_of(j, c, ch, inner)] - mean;
      ss += d * d;
    }
    const double var = mpt_cuk_block_sum(ss, shared) / N; /* biased: normalises the batch */
    const double invstd = mpt__bn_invstd(var, eps);
    if (threadIdx.x == 0) {
      save_mean[ch] = (float)mean;
      save_invstd[ch] = (float)invstd;
      if (running_mean) running_mean[ch] = mpt__bn_running_mean(running_mean[ch], momentum, mean);
      if (running_var) running_var[ch] = mpt__bn_running_var(running_var[ch], momentum, var, N);
    }
    const float m = (float)mean, scale = mpt__bn_scale(gamma[ch], invstd), b = beta[ch];
    for (int64_t j = threadIdx.x; j < per; j += blockDim.x) {
      const int64_t at = at_of(j, c, ch, inner);
      y[at] = mpt__bn_apply(x[at], m, scale, b);
    }
  }
}

__global__ void k_batchnorm_eval(const float *x, int64_t count, int64_t c, int64_t inner,
                                 const float *gamma, const float *beta, float eps,
                                 const float *running_mean, const float *running_var,
                                 float *y) {
  MPT_CUK_FOR(i, count) {
    const int64_t ch = (i / inner) % c;
    const float scale = mpt__bn_eval_scale(gamma[ch], running_var[ch], eps);
    y[i] = mpt__bn_apply(x[i], running_mean[ch], scale, beta[ch]);
  }
}

/* With xhat = (x - mean) * invstd and sums over the channel's N values:
 *   dbeta += sum(dy), dgamma += sum(dy * xhat),
 *   dx += gamma * invstd * (dy - sum(dy) / N - xhat * sum(dy * xhat) / N). */
__global__ void k_batchnorm_backward(const float *dy, const float *x, int64_t n, int64_t c,
                                     int64_t inner, const float *gamma, const float *save_mean,
                                     const float *save_invstd, float *dx, float *dgamma,
                                     float *dbeta) {
  __shared__ double shared[32];
  const int64_t per = n * inner;
  const double N = (double)per;
  for (int64_t ch = blockIdx.x; ch < c; ch += gridDim.x) {
    const float m = save_mean[ch], invstd = save_invstd[ch];
    double sum_dy = 0, sum_dy_xhat = 0;
    for (int64_t j = threadIdx.x; j < per; j += blockDim.x) {
      const int64_t at = at_of(j, c, ch, inner);
      sum_dy += dy[at];
      sum_dy_xhat += (double)dy[at] * ((x[at] - m) * invstd);
    }
    sum_dy = mpt_cuk_block_sum(sum_dy, shared);
    sum_dy_xhat = mpt_cuk_block_sum(sum_dy_xhat, shared);
    if (threadIdx.x == 0) {
      if (dbeta) dbeta[ch] += (float)sum_dy;
      if (dgamma) dgamma[ch] += (float)sum_dy_xhat;
    }
    if (!dx) continue; /* uniform across the block */
    const float k = gamma[ch] * invstd, mean_dy = (float)(sum_dy / N);
    const float mean_dy_xhat = (float)(sum_dy_xhat / N);
    for (int64_t j = threadIdx.x; j < per; j += blockDim.x) {
      const int64_t at = at_of(j, c, ch, inner);
      dx[at] += mpt__bn_dx(k, dy[at], x[at], m, invstd, mean_dy, mean_dy_xhat);
    }
  }
}

static unsigned channel_grid(int64_t c) { return (unsigned)(c < 65535 ? c : 65535); }

extern "C" {

cudaError_t mpt__cuk_batchnorm_train(cudaStream_t s, const float *x, int64_t n, int64_t c,
                                     int64_t inner, const float *gamma, const float *beta,
                                     float eps, float momentum, float *running_mean,
                                     float *running_var, float *y, float *save_mean,
                                     float *save_invstd) {
  k_batchnorm_train<<<channel_grid(c), NORM_BLOCK, 0, s>>>(x, n, c, inner, gamma, beta, eps,
                                                           momentum, running_mean, running_var,
                                                           y, save_mean, save_invstd);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_batchnorm_eval(cudaStream_t s, const float *x, int64_t n, int64_t c,
                                    int64_t inner, const float *gamma, const float *beta,
                                    float eps, const float *running_mean,
                                    const float *running_var, float *y) {
  const int64_t count = n * c * inner;
  k_batchnorm_eval<<<mpt_cuk_grid(count, MPT_CUK_BLOCK, MPT_CUK_MAX_GRID), MPT_CUK_BLOCK, 0,
                     s>>>(x, count, c, inner, gamma, beta, eps, running_mean, running_var, y);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_batchnorm_backward(cudaStream_t s, const float *dy, const float *x,
                                        int64_t n, int64_t c, int64_t inner,
                                        const float *gamma, const float *save_mean,
                                        const float *save_invstd, float *dx, float *dgamma,
                                        float *dbeta) {
  k_batchnorm_backward<<<channel_grid(c), NORM_BLOCK, 0, s>>>(
      dy, x, n, c, inner, gamma, save_mean, save_invstd, dx, dgamma, dbeta);
  return cudaGetLastError();
}

} /* extern "C" */
