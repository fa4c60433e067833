/* The rounding kernel of the CUDA bf16 GEMM (ops_cuda.c mpt__cuda_gemm_bf16): a row-major
 * rows x cols float matrix with row stride ld becomes a tight bf16 matrix, each value rounded
 * to nearest even (__float2bfloat16_rn; NaN stays NaN), the rounding of mpt_bf16_from_f32. */
#include <cuda_bf16.h>

#include "core/cuda/kernels_common.cuh"

__global__ void k_round_bf16(const float *src, int64_t rows, int64_t cols, int64_t ld,
                             __nv_bfloat16 *dst) {
  MPT_CUK_FOR(idx, rows * cols) {
    const int64_t i = idx / cols, j = idx - i * cols;
    dst[idx] = __float2bfloat16_rn(src[i * ld + j]);
  }
}

extern "C" cudaError_t mpt__cuk_round_bf16(cudaStream_t s, const float *src, int64_t rows,
                                           int64_t cols, int64_t ld, uint16_t *dst) {
  const unsigned grid = mpt_cuk_grid(rows * cols, MPT_CUK_BLOCK, MPT_CUK_MAX_GRID);
  k_round_bf16<<<grid, MPT_CUK_BLOCK, 0, s>>>(src, rows, cols, ld, (__nv_bfloat16 *)dst);
  return cudaGetLastError();
}

/* The owner's step of the bfloat16 reduction rounded once (comm_nccl_coll.c): element i of the
 * W pieces (piece q at pieces + q * stride) widened, added in float32 in rank order, divided by
 * W for an average, rounded once (nearest even), as comm_mpi.c's run_bf16_reduce. */
__global__ void k_bf16_sum_pieces(const __nv_bfloat16 *pieces, int world, int64_t stride,
                                  int64_t n, int avg, __nv_bfloat16 *out) {
  MPT_CUK_FOR(i, n) {
    float acc = __bfloat162float(pieces[i]);
    for (int q = 1; q < world; q++) acc = __fadd_rn(acc, __bfloat162float(pieces[q * stride + i]));
    out[i] = __float2bfloat16_rn(avg ? __fdiv_rn(acc, (float)world) : acc);
  }
}

extern "C" cudaError_t mpt__cuk_bf16_sum_pieces(cudaStream_t s, const uint16_t *pieces,
                                                int world, int64_t stride, int64_t n, int avg,
                                                uint16_t *out) {
  const unsigned grid = mpt_cuk_grid(n, MPT_CUK_BLOCK, MPT_CUK_MAX_GRID);
  k_bf16_sum_pieces<<<grid, MPT_CUK_BLOCK, 0, s>>>((const __nv_bfloat16 *)pieces, world, stride,
                                                   n, avg, (__nv_bfloat16 *)out);
  return cudaGetLastError();
}
