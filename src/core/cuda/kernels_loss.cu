/* CUDA kernels for softmax cross-entropy (forward and backward) and the accuracy count, with
 * their extern "C" launchers (kernels.h); the same results as src/core/cpu/ops_cpu.c.
 *
 * Forward: one warp per row. As on the CPU the row maximum starts from x[0], p = expf(x - max)
 * is stored and summed in double (z), p *= (float)(1 / z), and the row's loss is
 * log(z) - (x[label] - max) in double (finite even where the probability underflows): the
 * last two are src/core/kernel_math.h's, which the CPU reads too. Row
 * losses are summed per block in double into the stream's partials, then one block adds the
 * partials and divides by n: deterministic for a given n.
 *
 * Labels are not checked on the host (that would need a synchronisation): a label outside
 * [0, k) is never used as an index; its row's loss is NaN, so the mean loss is NaN and the
 * trainer's non-finite check reports it; backward skips its one-hot term. count_correct reads
 * its result back anyway, so it reports the first bad row as MPT_EINVAL, as the CPU does. */
#include <math_constants.h>

#include "core/cuda/kernels_common.cuh"

__global__ void k_softmax_xent(const float *logits, const int32_t *labels, int64_t n, int64_t k,
                               float *probs, double *partials) {
  __shared__ double shared[32];
  const unsigned full = 0xffffffffu;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  double loss = 0; /* this warp's rows, in lane 0 */
  for (int64_t row = (int64_t)blockIdx.x * warps + warp; row < n;
       row += (int64_t)gridDim.x * warps) {
    const float *x = logits + row * k;
    float *p = probs + row * k;
    float mx = x[0];
    for (int64_t j = 1 + lane; j < k; j += 32) mx = x[j] > mx ? x[j] : mx;
    for (int off = 16; off > 0; off >>= 1) {
      const float o = __shfl_xor_sync(full, mx, off);
      mx = o > mx ? o : mx;
    }
    double z = 0;
    for (int64_t j = lane; j < k; j += 32) {
      const float e = expf(x[j] - mx);
      p[j] = e;
      z += e;
    }
    for (int off = 16; off > 0; off >>= 1) z += __shfl_xor_sync(full, z, off);
    const float inv = mpt__softmax_inv(z);
    for (int64_t j = lane; j < k; j += 32) p[j] *= inv;
    if (lane == 0) {
      const int32_t lab = labels[row];
      loss += (lab >= 0 && lab < k) ? mpt__softmax_xent_row_loss(z, x[lab], mx) : CUDART_NAN;
    }
  }
  loss = mpt_cuk_block_sum(loss, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = loss;
}

/* *loss = (float)(sum of partials[0..count) / n), one block. */
__global__ void k_mean_finish(const double *partials, int count, int64_t n, float *loss) {
  __shared__ double shared[32];
  double acc = 0;
  for (int i = threadIdx.x; i < count; i += blockDim.x) acc += partials[i];
  acc = mpt_cuk_block_sum(acc, shared);
  if (threadIdx.x == 0) *loss = (float)(acc / (double)n);
}

/* dlogits[i, j] += g * probs[i, j], then -= g where j is the label; g = *dloss / n. */
__global__ void k_softmax_xent_backward(const float *probs, const int32_t *labels, int64_t n,
                                        int64_t k, const float *dloss, float *dlogits) {
  const float g = *dloss / (float)n;
  MPT_CUK_FOR(idx, n * k) {
    const int64_t i = idx / k, j = idx - i * k;
    float v = dlogits[idx] + g * probs[idx];
    if (j == labels[i]) v -= g;
    dlogits[idx] = v;
  }
}

/* One thread per row: the first maximum (strictly greater wins, as on the CPU) against the
 * label; hits summed per block then added atomically (integers: the order does not matter). */
__global__ void k_count_correct(const float *logits, const int32_t *labels, int64_t n,
                                int64_t k, unsigned long long *counters) {
  __shared__ unsigned long long shared[32];
  unsigned long long hits = 0;
  MPT_CUK_FOR(i, n) {
    const int32_t lab = labels[i];
    if (lab < 0 || lab >= k) {
      atomicMin(&counters[1], (unsigned long long)i);
      continue;
    }
    const float *x = logits + i * k;
    int64_t best = 0;
    for (int64_t j = 1; j < k; j++)
      if (x[j] > x[best]) best = j;
    hits += best == lab;
  }
  hits = mpt_cuk_block_sum(hits, shared);
  if (threadIdx.x == 0 && hits) atomicAdd(&counters[0], hits);
}

extern "C" {

cudaError_t mpt__cuk_softmax_xent(cudaStream_t s, const float *logits, const int32_t *labels,
                                  int64_t n, int64_t k, float *probs, double *partials,
                                  float *loss) {
  const int warps = MPT_CUK_BLOCK / 32;
  const unsigned g = mpt_cuk_grid(n, warps, MPT_CUK_MAX_PARTIALS);
  k_softmax_xent<<<g, MPT_CUK_BLOCK, 0, s>>>(logits, labels, n, k, probs, partials);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  k_mean_finish<<<1, MPT_CUK_BLOCK, 0, s>>>(partials, (int)g, n, loss);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_softmax_xent_backward(cudaStream_t s, const float *probs,
                                           const int32_t *labels, int64_t n, int64_t k,
                                           const float *dloss, float *dlogits) {
  k_softmax_xent_backward<<<mpt_cuk_grid(n * k, MPT_CUK_BLOCK, MPT_CUK_MAX_GRID), MPT_CUK_BLOCK,
                            0, s>>>(probs, labels, n, k, dloss, dlogits);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_count_correct(cudaStream_t s, const float *logits, const int32_t *labels,
                                   int64_t n, int64_t k, uint64_t *counters) {
  cudaError_t e = cudaMemsetAsync(counters, 0, sizeof *counters, s);
  if (e == cudaSuccess) e = cudaMemsetAsync(counters + 1, 0xff, sizeof *counters, s);
  if (e != cudaSuccess) return e;
  k_count_correct<<<mpt_cuk_grid(n, MPT_CUK_BLOCK, MPT_CUK_MAX_GRID), MPT_CUK_BLOCK, 0, s>>>(
      logits, labels, n, k, (unsigned long long *)counters);
  return cudaGetLastError();
}

} /* extern "C" */
