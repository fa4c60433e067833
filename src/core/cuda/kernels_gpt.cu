/* CUDA kernels of the transformer ops (include/mpitrain/ops_gpt.h) with their extern "C"
 * launchers (kernels.h); the same results as src/core/cpu/gpt_cpu.c, the reference.
 *
 * Determinism: no atomics. The embedding's backward gives each thread one channel of dwte (all
 * rows in increasing order, as the CPU adds them, so the sums are bit-identical to the CPU's)
 * and one (position, channel) of dwpe. LayerNorm's dweight/dbias give each thread one channel
 * and walk the rows in order. Row statistics (LayerNorm, softmax, logsumexp) are one warp per
 * row, summed in double by shuffles: the same value as the CPU's double sum up to the order.
 *
 * Ids are not checked on the host (that would need a synchronisation): an id outside its range
 * is never used as an index; the embedding writes NaN for that row and the cross-entropy's row
 * loss is NaN, so the trainer's non-finite check reports it. */
#include <math_constants.h>

#include "core/cuda/kernels_common.cuh"

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_CUBE 0.044715f

/* for (row = this warp's first row; row < n; row += all warps of the grid) */
#define WARP_ROWS(row, n)                                                                   \
  for (int64_t row = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); row < (n); \
       row += (int64_t)gridDim.x * (blockDim.x >> 5))

__device__ __forceinline__ double warp_allsum(double v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}
__device__ __forceinline__ float warp_allmax(float v) {
  for (int off = 16; off > 0; off >>= 1) {
    const float o = __shfl_xor_sync(0xffffffffu, v, off);
    v = o > v ? o : v;
  }
  return v;
}

__global__ void k_embedding(const int32_t *tokens, int64_t n, int64_t t, int64_t c,
                            int64_t vocab, const float *wte, const float *wpe, float *y) {
  MPT_CUK_FOR(idx, n * c) {
    const int64_t r = idx / c, i = idx - r * c;
    const int32_t tok = tokens[r];
    y[idx] = (tok >= 0 && tok < vocab) ? wte[(int64_t)tok * c + i] + wpe[(r % t) * c + i]
                                       : CUDART_NAN_F;
  }
}

/* One thread per channel i: dwte[tokens[r], i] += dy[r, i] for r = 0, 1, ... */
__global__ void k_embedding_backward_wte(const int32_t *tokens, int64_t n, int64_t c,
                                         int64_t vocab, const float *dy, float *dwte) {
  MPT_CUK_FOR(i, c) {
    for (int64_t r = 0; r < n; r++) {
      const int32_t tok = tokens[r];
      if (tok >= 0 && tok < vocab) dwte[(int64_t)tok * c + i] += dy[r * c + i];
    }
  }
}

/* One thread per (position p, channel i): dwpe[p, i] += dy[b*t + p, i] for b = 0, 1, ... */
__global__ void k_embedding_backward_wpe(int64_t b, int64_t t, int64_t c, const float *dy,
                                         float *dwpe) {
  MPT_CUK_FOR(idx, t * c) {
    float acc = dwpe[idx];
    for (int64_t bb = 0; bb < b; bb++) acc += dy[bb * t * c + idx];
    dwpe[idx] = acc;
  }
}

__global__ void k_layernorm(const float *x, int64_t rows, int64_t c, const float *w,
                            const float *bias, float eps, float *y, float *mean, float *rstd) {
  const int lane = threadIdx.x & 31;
  WARP_ROWS(r, rows) {
    const float *xr = x + r * c;
    float *yr = y + r * c;
    double s = 0;
    for (int64_t i = lane; i < c; i += 32) s += xr[i];
    const float m = (float)(warp_allsum(s) / (double)c);
    double v = 0;
    for (int64_t i = lane; i < c; i += 32) {
      const double d = (double)(xr[i] - m);
      v += d * d;
    }
    const float rs = (float)(1.0 / sqrt(warp_allsum(v) / (double)c + (double)eps));
    for (int64_t i = lane; i < c; i += 32) yr[i] = (xr[i] - m) * rs * w[i] + bias[i];
    if (lane == 0) {
      mean[r] = m;
      rstd[r] = rs;
    }
  }
}

__global__ void k_layernorm_backward_dx(const float *dy, const float *x, int64_t rows, int64_t c,
                                        const float *w, const float *mean, const float *rstd,
                                        float *dx) {
  const int lane = threadIdx.x & 31;
  WARP_ROWS(r, rows) {
    const float *xr = x + r * c, *g = dy + r * c;
    const float m = mean[r], rs = rstd[r];
    double gs = 0, gxs = 0;
    for (int64_t i = lane; i < c; i += 32) {
      const float xhat = (xr[i] - m) * rs, gw = g[i] * w[i];
      gs += gw;
      gxs += (double)gw * xhat;
    }
    const float gm = (float)(warp_allsum(gs) / (double)c);
    const float gxm = (float)(warp_allsum(gxs) / (double)c);
    float *dxr = dx + r * c;
    for (int64_t i = lane; i < c; i += 32) {
      const float xhat = (xr[i] - m) * rs;
      dxr[i] += rs * (g[i] * w[i] - gm - xhat * gxm);
    }
  }
}

/* One thread per channel, rows in order. */
__global__ void k_layernorm_backward_params(const float *dy, const float *x, int64_t rows,
                                            int64_t c, const float *mean, const float *rstd,
                                            float *dw, float *dbias) {
  MPT_CUK_FOR(i, c) {
    float aw = dw ? dw[i] : 0.0f, ab = dbias ? dbias[i] : 0.0f;
    for (int64_t r = 0; r < rows; r++) {
      const float g = dy[r * c + i];
      aw += g * ((x[r * c + i] - mean[r]) * rstd[r]);
      ab += g;
    }
    if (dw) dw[i] = aw;
    if (dbias) dbias[i] = ab;
  }
}

/* As src/core/cpu/gpt_cpu.c: 0.5 (1 + tanh(u)) = sigmoid(2u), 1 - s = exp(-2u) s. */
__device__ __forceinline__ float gelu_sig(float v, float *one_minus, float *du) {
  const float u = GELU_SCALE * (v + GELU_CUBE * v * v * v), e = expf(-2.0f * u);
  const float sg = 1.0f / (1.0f + e);
  *one_minus = sg > 0.0f ? e * sg : 1.0f;
  *du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * v * v);
  return sg;
}

__global__ void k_gelu(float *y, const float *x, int64_t n) {
  MPT_CUK_FOR(i, n) {
    float om, du;
    y[i] = x[i] * gelu_sig(x[i], &om, &du);
  }
}

__global__ void k_gelu_backward(float *dx, const float *dy, const float *x, int64_t n) {
  MPT_CUK_FOR(i, n) {
    float om, du;
    const float v = x[i], sg = gelu_sig(v, &om, &du);
    dx[i] += dy[i] * (sg + 2.0f * v * sg * om * du);
  }
}

/* The fused ops: elementwise kernels, then the unfused kernels' reductions (LayerNorm's rows,
 * the bias gradient's columns), so the results match the unfused CUDA ops. */
__global__ void k_add3(float *sum, const float *a, const float *b, int64_t n) {
  MPT_CUK_FOR(i, n) sum[i] = a[i] + b[i];
}

__global__ void k_bias_gelu(float *y, const float *x, const float *bias, int64_t n,
                            int64_t cols) {
  MPT_CUK_FOR(i, n) {
    float om, du;
    const float v = x[i] + bias[i % cols];
    y[i] = v * gelu_sig(v, &om, &du);
  }
}

__global__ void k_bias_gelu_backward(float *dx, const float *dy, const float *x,
                                     const float *bias, int64_t n, int64_t cols) {
  MPT_CUK_FOR(i, n) {
    float om, du;
    const float v = x[i] + bias[i % cols], sg = gelu_sig(v, &om, &du);
    dx[i] = dy[i] * (sg + 2.0f * v * sg * om * du);
  }
}

/* One warp per row r of the [planes * t, t] matrix; row i = r % t keeps columns [0, i]. */
__global__ void k_causal_softmax(float *a, int64_t rows, int64_t t) {
  const int lane = threadIdx.x & 31;
  WARP_ROWS(r, rows) {
    const int64_t last = r % t;
    float *row = a + r * t;
    float mx = row[0];
    for (int64_t j = lane; j <= last; j += 32) mx = row[j] > mx ? row[j] : mx;
    mx = warp_allmax(mx);
    double s = 0;
    for (int64_t j = lane; j <= last; j += 32) {
      const float e = expf(row[j] - mx);
      row[j] = e;
      s += e;
    }
    const float inv = (float)(1.0 / warp_allsum(s));
    for (int64_t j = lane; j < t; j += 32) row[j] = j <= last ? row[j] * inv : 0.0f;
  }
}

__global__ void k_causal_softmax_backward(const float *a, float *d, int64_t rows, int64_t t) {
  const int lane = threadIdx.x & 31;
  WARP_ROWS(r, rows) {
    const int64_t last = r % t;
    const float *ar = a + r * t;
    float *dr = d + r * t;
    double dot = 0;
    for (int64_t j = lane; j <= last; j += 32) dot += (double)ar[j] * dr[j];
    const float fdot = (float)warp_allsum(dot);
    for (int64_t j = lane; j < t; j += 32) dr[j] = j <= last ? ar[j] * (dr[j] - fdot) : 0.0f;
  }
}

/* Per row its maximum and 1 / (the sum of exp(l - max)) into stats[2r], stats[2r + 1] (as the
 * CPU: not the logsumexp as a float, whose rounding at large logits would bias every
 * probability of backward), and the row losses summed per block (in double) into
 * partials[blockIdx.x]. */
__global__ void k_xent_vocab(const float *logits, const int32_t *targets, int64_t n, int64_t vp,
                             int64_t v, float *stats, double *partials) {
  __shared__ double shared[32];
  const int lane = threadIdx.x & 31;
  double loss = 0; /* this warp's rows, in lane 0 */
  WARP_ROWS(r, n) {
    const float *lr = logits + r * vp;
    float mx = lr[0];
    for (int64_t j = lane; j < v; j += 32) mx = lr[j] > mx ? lr[j] : mx;
    mx = warp_allmax(mx);
    double s = 0;
    for (int64_t j = lane; j < v; j += 32) s += expf(lr[j] - mx);
    s = warp_allsum(s);
    const double l = (double)mx + log(s);
    if (lane == 0) {
      stats[2 * r] = mx;
      stats[2 * r + 1] = (float)(1.0 / s);
      const int32_t tg = targets[r];
      loss += (tg >= 0 && tg < v) ? l - (double)lr[tg] : CUDART_NAN;
    }
  }
  loss = mpt_cuk_block_sum(loss, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = loss;
}

/* *loss = (float)(sum of partials[0..count) / n), one block, a fixed order. */
__global__ void k_xent_vocab_finish(const double *partials, int count, int64_t n, float *loss) {
  __shared__ double shared[32];
  double acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = mpt_cuk_block_sum(acc, shared);
  if (threadIdx.x == 0) *loss = (float)(acc / (double)n);
}

__global__ void k_xent_vocab_backward(const float *logits, const int32_t *targets, int64_t n,
                                      int64_t vp, int64_t v, const float *stats,
                                      const float *dloss, float *dlogits) {
  const float g = *dloss / (float)n;
  MPT_CUK_FOR(idx, n * v) {
    const int64_t r = idx / v, j = idx - r * v, at = r * vp + j;
    float d = dlogits[at] + g * (expf(logits[at] - stats[2 * r]) * stats[2 * r + 1]);
    if (j == targets[r]) d -= g;
    dlogits[at] = d;
  }
}

extern "C" {

static unsigned warp_grid(int64_t rows, int64_t cap) {
  return mpt_cuk_grid(rows, MPT_CUK_BLOCK / 32, cap);
}

cudaError_t mpt__cuk_embedding_gpt(cudaStream_t s, const int32_t *tokens, int64_t b, int64_t t,
                                   int64_t c, int64_t vocab, const float *wte, const float *wpe,
                                   float *y) {
  k_embedding<<<mpt_cuk_grid(b * t * c, MPT_CUK_BLOCK, MPT_CUK_MAX_GRID), MPT_CUK_BLOCK, 0, s>>>(
      tokens, b * t, t, c, vocab, wte, wpe, y);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_embedding_gpt_backward(cudaStream_t s, const int32_t *tokens, int64_t b,
                                            int64_t t, int64_t c, int64_t vocab,
                                            const float *dy, float *dwte, float *dwpe) {
  if (dwte) {
    k_embedding_backward_wte<<<mpt_cuk_grid(c, MPT_CUK_BLOCK, MPT_CUK_MAX_GRID), MPT_CUK_BLOCK,
                               0, s>>>(tokens, b * t, c, vocab, dy, dwte);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  if (dwpe)
    k_embedding_backward_wpe<<<mpt_cuk_grid(t * c, MPT_CUK_BLOCK, MPT_CUK_MAX_GRID),
                               MPT_CUK_BLOCK, 0, s>>>(b, t, c, dy, dwpe);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_layernorm(cudaStream_t s, const float *x, int64_t rows, int64_t c,
                               const float *w, const float *bias, float eps, float *y,
                               float *mean, float *rstd) {
  k_layernorm<<<warp_grid(rows, MPT_CUK_MAX_GRID), MPT_CUK_BLOCK, 0, s>>>(x, rows, c, w, bias,
                                                                          eps, y, mean, rstd);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_layernorm_backward(cudaStream_t s, const float *dy, const float *x,
                                        int64_t rows, int64_t c, const float *w,
                                        const float *mean, const float *rstd, float *dx,
                                        float *dw, float *dbias) {
  if (dx) {
    k_layernorm_backward_dx<<<warp_grid(rows, MPT_CUK_MAX_GRID), MPT_CUK_BLOCK, 0, s>>>(
        dy, x, rows, c, w, mean, rstd, dx);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  if (dw || dbias)
    k_layernorm_backward_params<<<mpt_cuk_grid(c, MPT_CUK_BLOCK, MPT_CUK_MAX_GRID),
                                  MPT_CUK_BLOCK, 0, s>>>(dy, x, rows, c, mean, rstd, dw, dbias);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_gelu(cudaStream_t s, float *y, const float *x, int64_t n) {
  k_gelu<<<mpt_cuk_grid(n, MPT_CUK_BLOCK, MPT_CUK_MAX_GRID), MPT_CUK_BLOCK, 0, s>>>(y, x, n);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_gelu_backward(cudaStream_t s, float *dx, const float *dy, const float *x,
                                   int64_t n) {
  k_gelu_backward<<<mpt_cuk_grid(n, MPT_CUK_BLOCK, MPT_CUK_MAX_GRID), MPT_CUK_BLOCK, 0, s>>>(
      dx, dy, x, n);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_add_layernorm(cudaStream_t s, const float *a, const float *b, int64_t rows,
                                   int64_t c, const float *w, const float *bias, float eps,
                                   float *sum, float *y, float *mean, float *rstd) {
  k_add3<<<mpt_cuk_grid(rows * c, MPT_CUK_BLOCK, MPT_CUK_MAX_GRID), MPT_CUK_BLOCK, 0, s>>>(
      sum, a, b, rows * c);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  return mpt__cuk_layernorm(s, sum, rows, c, w, bias, eps, y, mean, rstd);
}

cudaError_t mpt__cuk_bias_gelu(cudaStream_t s, float *y, const float *x, const float *bias,
                               int64_t rows, int64_t cols) {
  k_bias_gelu<<<mpt_cuk_grid(rows * cols, MPT_CUK_BLOCK, MPT_CUK_MAX_GRID), MPT_CUK_BLOCK, 0,
                s>>>(y, x, bias, rows * cols, cols);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_bias_gelu_backward(cudaStream_t s, float *dx, const float *dy,
                                        const float *x, const float *bias, int64_t rows,
                                        int64_t cols, float *dbias) {
  k_bias_gelu_backward<<<mpt_cuk_grid(rows * cols, MPT_CUK_BLOCK, MPT_CUK_MAX_GRID),
                         MPT_CUK_BLOCK, 0, s>>>(dx, dy, x, bias, rows * cols, cols);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess || !dbias) return e;
  return mpt__cuk_bias_backward(s, dbias, dx, rows, cols, 1);
}

cudaError_t mpt__cuk_causal_softmax(cudaStream_t s, float *a, int64_t planes, int64_t t) {
  k_causal_softmax<<<warp_grid(planes * t, MPT_CUK_MAX_GRID), MPT_CUK_BLOCK, 0, s>>>(
      a, planes * t, t);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_causal_softmax_backward(cudaStream_t s, const float *a, float *d,
                                             int64_t planes, int64_t t) {
  k_causal_softmax_backward<<<warp_grid(planes * t, MPT_CUK_MAX_GRID), MPT_CUK_BLOCK, 0, s>>>(
      a, d, planes * t, t);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_xent_vocab(cudaStream_t s, const float *logits, const int32_t *targets,
                                int64_t n, int64_t vp, int64_t v, float *stats,
                                double *partials, float *loss) {
  const unsigned g = warp_grid(n, MPT_CUK_MAX_PARTIALS);
  k_xent_vocab<<<g, MPT_CUK_BLOCK, 0, s>>>(logits, targets, n, vp, v, stats, partials);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  k_xent_vocab_finish<<<1, MPT_CUK_BLOCK, 0, s>>>(partials, (int)g, n, loss);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_xent_vocab_backward(cudaStream_t s, const float *logits,
                                         const int32_t *targets, int64_t n, int64_t vp,
                                         int64_t v, const float *stats, const float *dloss,
                                         float *dlogits) {
  k_xent_vocab_backward<<<mpt_cuk_grid(n * v, MPT_CUK_BLOCK, MPT_CUK_MAX_GRID), MPT_CUK_BLOCK,
                          0, s>>>(logits, targets, n, vp, v, stats, dloss, dlogits);
  return cudaGetLastError();
}

} /* extern "C" */
