/* Device-side helpers shared by the kernels_*.cu files: launch geometry, grid-stride loops, warp
 * and block sums; and src/core/kernel_math.h, the per-element arithmetic the CPU backend shares
 * (the dropout draw, batch normalisation, LayerNorm, GELU, AdamW...). Compiled by nvcc only. */
#ifndef MPT_CORE_CUDA_KERNELS_COMMON_CUH
#define MPT_CORE_CUDA_KERNELS_COMMON_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "core/cuda/kernels.h"
#include "core/kernel_math.h"

/* Threads per block of the elementwise kernels; a multiple of 32. */
#define MPT_CUK_BLOCK 256
/* Reduction kernels launch at most this many blocks (= MPT__CUDA_MAX_PARTIALS). */
#define MPT_CUK_MAX_PARTIALS 1024
/* Grid-stride loops keep the grid bounded; indices are 64-bit. */
#define MPT_CUK_MAX_GRID (1 << 20)

static inline unsigned mpt_cuk_grid(int64_t n, int block, int64_t cap) {
  int64_t g = (n + block - 1) / block;
  if (g > cap) g = cap;
  if (g < 1) g = 1;
  return (unsigned)g;
}

/* for (i = this thread's first index; i < n; i += all threads of the grid) */
#define MPT_CUK_FOR(i, n)                                                         \
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);       \
       i += (int64_t)gridDim.x * blockDim.x)

template <typename T>
__device__ __forceinline__ T mpt_cuk_warp_sum(T v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_down_sync(0xffffffffu, v, off);
  return v; /* complete in lane 0 */
}

/* The sum of v over the block, returned to every thread. Every thread of the block must call
 * it (blockDim.x a multiple of 32, at most 1024); `shared` holds 32 values. It may be called
 * repeatedly with the same `shared`: the leading barrier keeps a call from overwriting values
 * the previous call's readers still need. */
template <typename T>
__device__ __forceinline__ T mpt_cuk_block_sum(T v, T *shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
  v = mpt_cuk_warp_sum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  if (warp == 0) {
    T t = lane < nwarps ? shared[lane] : T(0);
    t = mpt_cuk_warp_sum(t);
    if (lane == 0) shared[0] = t;
  }
  __syncthreads();
  return shared[0];
}

#endif
