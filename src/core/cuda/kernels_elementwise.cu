/* CUDA kernels for the elementwise ops, sums, bias, ReLU, dropout, the gemm k == 0 scaling and
 * the finiteness check, with their extern "C" launchers (kernels.h). Each computes what the CPU
 * kernel of the same name in src/core/cpu/ops_cpu.c computes; reductions accumulate in double
 * (as the CPU does for sum and bias_backward) in a fixed order, so results are deterministic.
 * Forward ops overwrite, backward ops accumulate. Enqueued on the caller's stream. */
#include "core/cuda/kernels_common.cuh"

__global__ void k_fill(float *x, int64_t n, float v) {
  MPT_CUK_FOR(i, n) x[i] = v;
}

__global__ void k_axpy(int64_t n, float alpha, const float *x, float *y) {
  MPT_CUK_FOR(i, n) y[i] += alpha * x[i];
}

__global__ void k_scale(float *x, int64_t n, float alpha) {
  MPT_CUK_FOR(i, n) x[i] *= alpha;
}

/* y may alias a or b: each element is read then written by one thread. */
__global__ void k_mul(float *y, const float *a, const float *b, int64_t n) {
  MPT_CUK_FOR(i, n) y[i] = a[i] * b[i];
}

__global__ void k_mul_backward(float *da, const float *dy, const float *b, int64_t n) {
  MPT_CUK_FOR(i, n) da[i] += dy[i] * b[i];
}

/* partials[blockIdx.x] = this block's share of the sum, in double. */
__global__ void k_sum_partials(const float *x, int64_t n, double *partials) {
  __shared__ double shared[32];
  double acc = 0;
  MPT_CUK_FOR(i, n) acc += x[i];
  acc = mpt_cuk_block_sum(acc, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = acc;
}

/* *out = (float)(sum of partials[0..count)), one block. */
__global__ void k_sum_finish(const double *partials, int count, float *out) {
  __shared__ double shared[32];
  double acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = mpt_cuk_block_sum(acc, shared);
  if (threadIdx.x == 0) *out = (float)acc;
}

/* dy is a device scalar: read by every thread (cached), as the CPU reads *dy once. */
__global__ void k_sum_backward(float *dx, int64_t n, const float *dy, float scale) {
  const float g = scale * *dy;
  MPT_CUK_FOR(i, n) dx[i] += g;
}

/* y viewed as [rows, cols, inner]: element i belongs to channel (i / inner) % cols. */
__global__ void k_bias_add(float *y, const float *bias, int64_t count, int64_t cols,
                           int64_t inner) {
  MPT_CUK_FOR(i, count) y[i] += bias[(i / inner) % cols];
}

/* inner == 1 with many columns: thread c sums column c over the rows (coalesced across c). */
__global__ void k_bias_backward_cols(float *dbias, const float *dy, int64_t rows, int64_t cols) {
  MPT_CUK_FOR(c, cols) {
    double acc = 0;
    for (int64_t r = 0; r < rows; r++) acc += dy[r * cols + c];
    dbias[c] += (float)acc;
  }
}

/* One block per channel c (looping when cols exceeds the grid): the channel's rows * inner
 * values, element j at row j / inner, offset j % inner. The loop over c is uniform across the
 * block, as mpt_cuk_block_sum requires. */
__global__ void k_bias_backward_channels(float *dbias, const float *dy, int64_t rows,
                                         int64_t cols, int64_t inner) {
  __shared__ double shared[32];
  const int64_t per_channel = rows * inner;
  for (int64_t c = blockIdx.x; c < cols; c += gridDim.x) {
    double acc = 0;
    for (int64_t j = threadIdx.x; j < per_channel; j += blockDim.x) {
      const int64_t r = j / inner, i = j - r * inner;
      acc += dy[(r * cols + c) * inner + i];
    }
    acc = mpt_cuk_block_sum(acc, shared);
    if (threadIdx.x == 0) dbias[c] += (float)acc;
  }
}

/* x < 0 ? 0 : x keeps NaN, as the CPU (and torch.relu) do. y may equal x. */
__global__ void k_relu(float *y, const float *x, int64_t n) {
  MPT_CUK_FOR(i, n) {
    const float v = x[i];
    y[i] = v < 0.0f ? 0.0f : v;
  }
}

__global__ void k_relu_backward(float *dx, const float *dy, const float *y, int64_t n) {
  MPT_CUK_FOR(i, n) dx[i] += y[i] > 0.0f ? dy[i] : 0.0f;
}

__global__ void k_dropout(const float *x, float *y, float *mask, int64_t n, float p, float keep,
                          uint64_t seed) {
  MPT_CUK_FOR(i, n) {
    const float m = mpt__dropout_mask(seed, (uint64_t)i, p, keep);
    mask[i] = m;
    y[i] = x[i] * m;
  }
}

__global__ void k_scale_matrix(float *c, int64_t m, int64_t n, int64_t ldc, float beta) {
  MPT_CUK_FOR(idx, m * n) {
    const int64_t i = idx / n, j = idx - i * n;
    float *p = c + i * ldc + j;
    *p = beta == 0.0f ? 0.0f : *p * beta; /* as BLAS: beta == 0 overwrites NaN */
  }
}

/* Sets *flag when a value is not finite; many threads may store the same 1 (benign). */
__global__ void k_check_finite(const float *x, int64_t n, uint64_t *flag) {
  MPT_CUK_FOR(i, n) {
    if (!isfinite(x[i])) *flag = 1;
  }
}

static unsigned grid_of(int64_t n) { return mpt_cuk_grid(n, MPT_CUK_BLOCK, MPT_CUK_MAX_GRID); }

extern "C" {

cudaError_t mpt__cuk_fill(cudaStream_t s, float *x, int64_t n, float value) {
  k_fill<<<grid_of(n), MPT_CUK_BLOCK, 0, s>>>(x, n, value);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_axpy(cudaStream_t s, int64_t n, float alpha, const float *x, float *y) {
  k_axpy<<<grid_of(n), MPT_CUK_BLOCK, 0, s>>>(n, alpha, x, y);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_scale(cudaStream_t s, float *x, int64_t n, float alpha) {
  k_scale<<<grid_of(n), MPT_CUK_BLOCK, 0, s>>>(x, n, alpha);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_mul(cudaStream_t s, float *y, const float *a, const float *b, int64_t n) {
  k_mul<<<grid_of(n), MPT_CUK_BLOCK, 0, s>>>(y, a, b, n);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_mul_backward(cudaStream_t s, float *da, const float *dy, const float *b,
                                  int64_t n) {
  k_mul_backward<<<grid_of(n), MPT_CUK_BLOCK, 0, s>>>(da, dy, b, n);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_sum(cudaStream_t s, const float *x, int64_t n, double *partials,
                         float *out) {
  const unsigned g = mpt_cuk_grid(n, MPT_CUK_BLOCK, MPT_CUK_MAX_PARTIALS);
  k_sum_partials<<<g, MPT_CUK_BLOCK, 0, s>>>(x, n, partials);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  k_sum_finish<<<1, MPT_CUK_BLOCK, 0, s>>>(partials, (int)g, out);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_sum_backward(cudaStream_t s, float *dx, int64_t n, const float *dy,
                                  float scale) {
  k_sum_backward<<<grid_of(n), MPT_CUK_BLOCK, 0, s>>>(dx, n, dy, scale);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_bias_add(cudaStream_t s, float *y, const float *bias, int64_t rows,
                              int64_t cols, int64_t inner) {
  const int64_t count = rows * cols * inner;
  k_bias_add<<<grid_of(count), MPT_CUK_BLOCK, 0, s>>>(y, bias, count, cols, inner);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_bias_backward(cudaStream_t s, float *dbias, const float *dy, int64_t rows,
                                   int64_t cols, int64_t inner) {
  if (inner == 1 && cols >= MPT_CUK_BLOCK) {
    k_bias_backward_cols<<<grid_of(cols), MPT_CUK_BLOCK, 0, s>>>(dbias, dy, rows, cols);
  } else {
    const unsigned g = (unsigned)(cols < 65535 ? cols : 65535);
    k_bias_backward_channels<<<g, MPT_CUK_BLOCK, 0, s>>>(dbias, dy, rows, cols, inner);
  }
  return cudaGetLastError();
}

cudaError_t mpt__cuk_relu(cudaStream_t s, float *y, const float *x, int64_t n) {
  k_relu<<<grid_of(n), MPT_CUK_BLOCK, 0, s>>>(y, x, n);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_relu_backward(cudaStream_t s, float *dx, const float *dy, const float *y,
                                   int64_t n) {
  k_relu_backward<<<grid_of(n), MPT_CUK_BLOCK, 0, s>>>(dx, dy, y, n);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_dropout(cudaStream_t s, const float *x, float *y, float *mask, int64_t n,
                             float p, float keep, uint64_t seed) {
  k_dropout<<<grid_of(n), MPT_CUK_BLOCK, 0, s>>>(x, y, mask, n, p, keep, seed);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_scale_matrix(cudaStream_t s, float *c, int64_t m, int64_t n, int64_t ldc,
                                  float beta) {
  k_scale_matrix<<<grid_of(m * n), MPT_CUK_BLOCK, 0, s>>>(c, m, n, ldc, beta);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_check_finite(cudaStream_t s, const float *x, int64_t n, uint64_t *flag) {
  cudaError_t e = cudaMemsetAsync(flag, 0, sizeof *flag, s);
  if (e != cudaSuccess) return e;
  k_check_finite<<<grid_of(n), MPT_CUK_BLOCK, 0, s>>>(x, n, flag);
  return cudaGetLastError();
}

} /* extern "C" */
