/* CUDA op wrappers, part 1: copies, GEMM through cuBLAS, the elementwise ops, sums, bias,
 * ReLU, dropout and the finiteness check. Each re-raises the stream's sticky error, makes the
 * stream's device current, and enqueues its work on the stream (kernels in kernels_*.cu); the
 * arguments were checked by src/core/ops.c. Every CUDA and cuBLAS call is checked and its
 * failure recorded with the statement, file:line and device (cuda_check.h).
 *
 * memcpy: cudaMemcpyAsync with cudaMemcpyDefault (unified addressing tells host from device,
 * and device from device across GPUs), ordered on the stream. Pinned staging: host memory from
 * mpt__cuda_host_alloc (or registered with CUDA) is copied by DMA asynchronously; for pageable
 * host memory the driver stages through its own pinned buffers, and then a host -> device copy
 * returns once the source has been staged and a device -> host copy returns once the data has
 * arrived, so the caller may reuse or read the host buffer as soon as the call returns (reading
 * a device -> host result into pinned memory still needs a stream synchronize first).
 *
 * GEMM: cuBLAS is column-major; a row-major M x N matrix with row stride ld is the column-major
 * N x M matrix with the same ld. So row-major C = op(A) op(B) is computed as column-major
 * C^T = op(B)^T op(A)^T: cublasSgemm with the operands swapped, m and n swapped and the same
 * transpose flags. Plain FP32 (the default math mode: no TF32), one cuBLAS handle per stream,
 * created on the stream's first gemm and bound to it. k == 0 scales C by beta in a kernel
 * (beta == 0 overwrites, as in BLAS; A and B are not read). */
#include <limits.h>

#include "core/cuda/cuda_internal.h"
#include "core/cuda/kernels.h"
#include "mpitrain/core.h"

#define DEV(s) ((s)->h.device.index)

/* Wraps a kernel launcher: enter the stream, launch, check. */
#define LAUNCH(s, call)                              \
  do {                                               \
    MPT_RETURN_IF(mpt__cuda_stream_enter(s));        \
    MPT_CUDA_RETURN_IF(call, DEV(s));                \
    return MPT_OK;                                   \
  } while (0)

static double *partials_of(mpt_stream *s) {
  return (double *)((char *)s->scratch + MPT__CUDA_SCRATCH_PARTIALS);
}

static uint64_t *counters_of(mpt_stream *s) {
  return (uint64_t *)((char *)s->scratch + MPT__CUDA_SCRATCH_COUNTERS);
}

mpt_status mpt__cuda_memcpy(mpt_stream *s, mpt_device dst_device, void *dst,
                            mpt_device src_device, const void *src, size_t nbytes) {
  MPT_RETURN_IF(mpt__cuda_stream_enter(s));
  if (dst == src && dst_device.type == src_device.type && dst_device.index == src_device.index)
    return MPT_OK;
  MPT_CUDA_RETURN_IF(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDefault, s->cs), DEV(s));
  return MPT_OK;
}

/* The stream's cuBLAS handle, created and bound to the stream on first use. */
static mpt_status blas_of(mpt_stream *s, cublasHandle_t *handle) {
  mpt_status st = MPT_OK;
  pthread_mutex_lock(&s->work_mutex);
  if (!s->blas) {
    cublasHandle_t h = NULL;
    cublasStatus_t e = cublasCreate(&h);
    if (e == CUBLAS_STATUS_SUCCESS) {
      e = cublasSetStream(h, s->cs);
      if (e != CUBLAS_STATUS_SUCCESS) {
        (void)cublasDestroy(h);
        st = mpt__cublas_fail(e, "cublasSetStream(h, s->cs)", __FILE__, __LINE__, DEV(s));
      } else {
        s->blas = h;
      }
    } else {
      st = mpt__cublas_fail(e, "cublasCreate(&h)", __FILE__, __LINE__, DEV(s));
    }
  }
  *handle = s->blas;
  pthread_mutex_unlock(&s->work_mutex);
  return st;
}

mpt_status mpt__cuda_gemm(mpt_stream *s, int trans_a, int trans_b, int64_t m, int64_t n,
                          int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                          int64_t ldb, float beta, float *c, int64_t ldc) {
  MPT_RETURN_IF(mpt__cuda_stream_enter(s));
  if (k == 0) {
    MPT_CUDA_RETURN_IF(mpt__cuk_scale_matrix(s->cs, c, m, n, ldc, beta), DEV(s));
    return MPT_OK;
  }
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX ||
      ldc > INT_MAX)
    return MPT_FAIL(MPT_ENOTSUP, "gemm: m=%lld n=%lld k=%lld (ld %lld/%lld/%lld) exceed "
                    "cuBLAS's 32-bit int", (long long)m, (long long)n, (long long)k,
                    (long long)lda, (long long)ldb, (long long)ldc);
  cublasHandle_t h;
  MPT_RETURN_IF(blas_of(s, &h));
  MPT_CUBLAS_RETURN_IF(cublasSgemm(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)k,
                                   &alpha, b, (int)ldb, a, (int)lda, &beta, c, (int)ldc),
                       DEV(s));
  return MPT_OK;
}

mpt_status mpt__cuda_fill(mpt_stream *s, float *x, int64_t count, float value) {
  LAUNCH(s, mpt__cuk_fill(s->cs, x, count, value));
}

mpt_status mpt__cuda_copy(mpt_stream *s, float *dst, const float *src, int64_t count) {
  MPT_RETURN_IF(mpt__cuda_stream_enter(s));
  if (dst == src) return MPT_OK;
  MPT_CUDA_RETURN_IF(cudaMemcpyAsync(dst, src, (size_t)count * sizeof *dst,
                                     cudaMemcpyDeviceToDevice, s->cs),
                     DEV(s));
  return MPT_OK;
}

mpt_status mpt__cuda_axpy(mpt_stream *s, int64_t count, float alpha, const float *x, float *y) {
  LAUNCH(s, mpt__cuk_axpy(s->cs, count, alpha, x, y));
}

mpt_status mpt__cuda_scale(mpt_stream *s, float *x, int64_t count, float alpha) {
  LAUNCH(s, mpt__cuk_scale(s->cs, x, count, alpha));
}

mpt_status mpt__cuda_mul(mpt_stream *s, float *y, const float *a, const float *b, int64_t count) {
  LAUNCH(s, mpt__cuk_mul(s->cs, y, a, b, count));
}

mpt_status mpt__cuda_mul_backward(mpt_stream *s, float *da, const float *dy, const float *b,
                                  int64_t count) {
  LAUNCH(s, mpt__cuk_mul_backward(s->cs, da, dy, b, count));
}

/* *out is on the device; the empty sum writes 0 (ops.c dispatches count == 0 for this). */
mpt_status mpt__cuda_sum(mpt_stream *s, const float *x, int64_t count, float *out) {
  MPT_RETURN_IF(mpt__cuda_stream_enter(s));
  if (count == 0) {
    MPT_CUDA_RETURN_IF(cudaMemsetAsync(out, 0, sizeof *out, s->cs), DEV(s));
    return MPT_OK;
  }
  MPT_CUDA_RETURN_IF(mpt__cuk_sum(s->cs, x, count, partials_of(s), out), DEV(s));
  return MPT_OK;
}

mpt_status mpt__cuda_sum_backward(mpt_stream *s, float *dx, int64_t count, const float *dy,
                                  float scale) {
  LAUNCH(s, mpt__cuk_sum_backward(s->cs, dx, count, dy, scale));
}

mpt_status mpt__cuda_bias_add(mpt_stream *s, float *y, const float *bias, int64_t rows,
                              int64_t cols, int64_t inner) {
  LAUNCH(s, mpt__cuk_bias_add(s->cs, y, bias, rows, cols, inner));
}

mpt_status mpt__cuda_bias_backward(mpt_stream *s, float *dbias, const float *dy, int64_t rows,
                                   int64_t cols, int64_t inner) {
  LAUNCH(s, mpt__cuk_bias_backward(s->cs, dbias, dy, rows, cols, inner));
}

mpt_status mpt__cuda_relu(mpt_stream *s, float *y, const float *x, int64_t count) {
  LAUNCH(s, mpt__cuk_relu(s->cs, y, x, count));
}

mpt_status mpt__cuda_relu_backward(mpt_stream *s, float *dx, const float *dy, const float *y,
                                   int64_t count) {
  LAUNCH(s, mpt__cuk_relu_backward(s->cs, dx, dy, y, count));
}

mpt_status mpt__cuda_dropout(mpt_stream *s, const float *x, float *y, float *mask, int64_t count,
                             float p, uint64_t seed) {
  const float keep = mpt__dropout_keep(p); /* as the CPU computes it (kernel_math.h) */
  LAUNCH(s, mpt__cuk_dropout(s->cs, x, y, mask, count, p, keep, seed));
}

/* *nonfinite is a host int: the flag is copied back and the stream drained (a host
 * synchronisation with a deadline, MPT__CUDA_RESULT_TIMEOUT_MS). */
mpt_status mpt__cuda_check_finite(mpt_stream *s, const float *x, int64_t count, int *nonfinite) {
  MPT_RETURN_IF(mpt__cuda_stream_enter(s));
  uint64_t *flag = counters_of(s), *host = s->host_scratch;
  MPT_CUDA_RETURN_IF(mpt__cuk_check_finite(s->cs, x, count, flag), DEV(s));
  MPT_CUDA_RETURN_IF(cudaMemcpyAsync(host, flag, sizeof *host, cudaMemcpyDeviceToHost, s->cs),
                     DEV(s));
  MPT_RETURN_IF(mpt__cuda_stream_drain(s, MPT__CUDA_RESULT_TIMEOUT_MS, "check_finite"));
  *nonfinite = host[0] != 0;
  return MPT_OK;
}

/* ---- bf16 GEMM (include/mpitrain/ops_bf16.h) ----
 * A and B are rounded to bf16 (round to nearest even, __float2bfloat16_rn: the bits of
 * mpt_bf16_from_f32) into one stream-ordered temporary (cudaMallocAsync / cudaFreeAsync on the
 * stream, so it lives exactly as long as the GEMM that reads it), tight; then cublasGemmEx with
 * CUDA_R_16BF inputs, a CUDA_R_32F output that is C, CUBLAS_COMPUTE_32F (products accumulated
 * in float32), operands swapped for row-major as in mpt__cuda_gemm. bf16 tensor-core GEMMs need
 * compute capability 8.0 (Ampere) or newer: an older device is refused by mpt__cuda_bf16_check. */
mpt_status mpt__cuda_bf16_check(mpt_stream *s) {
  MPT_RETURN_IF(mpt__cuda_stream_enter(s));
  int major = 0;
  MPT_CUDA_RETURN_IF(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, DEV(s)),
                     DEV(s));
  if (major < 8)
    return MPT_FAIL(MPT_ENOTSUP, "bf16 compute needs a GPU of compute capability 8.0 or newer; "
                    "cuda:%d is %d.x: use --precision fp32", DEV(s), major);
  return MPT_OK;
}

mpt_status mpt__cuda_gemm_bf16(mpt_stream *s, int trans_a, int trans_b, int64_t m, int64_t n,
                               int64_t k, float alpha, const float *a, int64_t lda,
                               const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  MPT_RETURN_IF(mpt__cuda_stream_enter(s));
  if (k == 0) return mpt__cuda_gemm(s, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                                    ldc);
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX || ldc > INT_MAX)
    return MPT_FAIL(MPT_ENOTSUP, "gemm_bf16: m=%lld n=%lld k=%lld (ldc %lld) exceed cuBLAS's "
                    "32-bit int", (long long)m, (long long)n, (long long)k, (long long)ldc);
  cublasHandle_t h;
  MPT_RETURN_IF(blas_of(s, &h));
  const int64_t ra = trans_a ? k : m, ca = trans_a ? m : k; /* A as stored: ra x ca, ld lda */
  const int64_t rb = trans_b ? n : k, cb = trans_b ? k : n;
  void *tmp = NULL;
  MPT_CUDA_RETURN_IF(cudaMallocAsync(&tmp, (size_t)(ra * ca + rb * cb) * sizeof(uint16_t), s->cs),
                     DEV(s));
  uint16_t *ha = tmp, *hb = (uint16_t *)tmp + ra * ca;
  mpt_status st = MPT_OK;
  cudaError_t e = mpt__cuk_round_bf16(s->cs, a, ra, ca, lda, ha);
  if (e == cudaSuccess) e = mpt__cuk_round_bf16(s->cs, b, rb, cb, ldb, hb);
  if (e != cudaSuccess) st = mpt__cuda_fail(e, "mpt__cuk_round_bf16", __FILE__, __LINE__, DEV(s));
  if (st == MPT_OK) {
    cublasStatus_t be = cublasGemmEx(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                     trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, (int)n, (int)m, (int)k,
                                     &alpha, hb, CUDA_R_16BF, (int)cb, ha, CUDA_R_16BF, (int)ca,
                                     &beta, c, CUDA_R_32F, (int)ldc, CUBLAS_COMPUTE_32F,
                                     CUBLAS_GEMM_DEFAULT);
    if (be != CUBLAS_STATUS_SUCCESS)
      st = mpt__cublas_fail(be, "cublasGemmEx(bf16 x bf16 -> f32)", __FILE__, __LINE__, DEV(s));
  }
  e = cudaFreeAsync(tmp, s->cs);
  if (st == MPT_OK && e != cudaSuccess)
    st = mpt__cuda_fail(e, "cudaFreeAsync", __FILE__, __LINE__, DEV(s));
  return st;
}
