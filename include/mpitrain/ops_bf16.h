/* mpitrain bf16 compute: GEMMs and convolutions whose inputs are rounded to bfloat16 and whose
 * products are accumulated in float32 (mixed precision as in Micikevicius et al., "Mixed
 * Precision Training", 2018, with bf16 in place of fp16 as in Kalamkar et al., "A Study of
 * BFLOAT16 for Deep Learning Training", 2019). Everything else stays float32: the arrays these
 * ops read and write are float32 (rounding happens inside), so parameters, gradients and the
 * optimizer state stay float32 master copies. The layers choose per tape
 * (mpt_tape_set_precision, nn.h); these are the ops they call.
 *
 * Rounding: float32 -> bf16 rounds to nearest even (mpt_bf16_from_f32, core.h). A bf16 value has
 * 8 significant bits (7 stored), so its relative rounding error is at most u = 2^-8 (half an
 * ulp; 1 + 2^-8 + 2^-23 rounds to 1 + 2^-7, an error of about 2^-8); the product of two
 * bf16 values is exact in float32 (16 <= 24 bits); the sum of K products in float32 adds at most
 * gamma_K = K 2^-24 / (1 - K 2^-24) relative to sum |a||b|. Hence, for each element of C:
 *   |C_bf16 - C_exact| <= (2u + u^2 + gamma_K (1 + u)^2) |alpha| sum_k |a_ik| |b_kj|
 * (plus the rounding of beta * C), and the float32 result is within gamma_K sum |a||b| of exact.
 * When every input is exactly a bf16 value and all partial sums are exact in float32 (small
 * integers, say) the result equals the float32 op's bit for bit. Subnormal inputs and products
 * may be flushed to zero on the CPU (AVX-512 BF16 instructions run with DAZ/FTZ).
 *
 * Backends: CPU through oneDNN 2.x (matmul and convolution primitives with bf16 sources and
 * weights and float32 destinations: AVX-512 BF16 kernels); CUDA through cuBLAS
 * (cublasGemmEx with CUDA_R_16BF inputs, CUDA_R_32F output, CUBLAS_COMPUTE_32F) after a
 * rounding kernel; no CUDA bf16 library convolution yet (MPT_ENOTSUP; conv2d on the tape falls
 * back to im2col + the bf16 GEMM there). Threads: as the float32 ops
 * (ops.h); the CPU plans are per calling thread and per shape, so concurrent callers are safe.
 * Errors: as the float32 ops, plus MPT_ENOTSUP from every op when mpt_op_bf16_check fails. */
#ifndef MPITRAIN_OPS_BF16_H
#define MPITRAIN_OPS_BF16_H

#include "mpitrain/core.h"
#include "mpitrain/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Arithmetic of the GEMMs and convolutions (the trainer's --precision). */
typedef enum mpt_precision { MPT_PRECISION_FP32 = 0, MPT_PRECISION_BF16 = 1 } mpt_precision;

/* "fp32" / "bf16"; "unknown" for any other value. */
MPT_API const char *mpt_precision_name(mpt_precision p);
/* Parses "fp32" or "bf16" into *p. Errors: MPT_EINVAL (anything else; NULL). */
MPT_API mpt_status mpt_precision_parse(const char *text, mpt_precision *p);

/* MPT_OK when the stream's device runs bf16 GEMMs and convolutions natively (NULL: the CPU).
 * Else MPT_ENOTSUP
 * with a message that says why: a CPU without AVX-512 BF16 (checked by cpuid and by oneDNN's
 * effective ISA; the library refuses a slow emulation), a build without oneDNN, a backend
 * without bf16 ops. Cheap after the first call; any thread. */
MPT_API mpt_status mpt_op_bf16_check(mpt_stream *stream);

/* mpt_op_gemm (ops.h: same arguments, shapes, leading dimensions and k == 0 rule) with A and B
 * rounded to bf16 and the products accumulated in float32:
 *   C (M x N) = alpha * bf16(op(A)) bf16(op(B)) + beta * C.
 * Errors: those of mpt_op_gemm; MPT_ENOTSUP (mpt_op_bf16_check, or CUDA extents beyond int). */
MPT_API mpt_status mpt_op_gemm_bf16(mpt_stream *stream, int trans_a, int trans_b, int64_t m,
                                    int64_t n, int64_t k, float alpha, const float *a,
                                    int64_t lda, const float *b, int64_t ldb, float beta,
                                    float *c, int64_t ldc);
/* mpt_op_gemm for MPT_PRECISION_FP32, mpt_op_gemm_bf16 for MPT_PRECISION_BF16; MPT_EINVAL for
 * any other precision. */
MPT_API mpt_status mpt_op_gemm_ex(mpt_stream *stream, mpt_precision precision, int trans_a,
                                  int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                                  const float *a, int64_t lda, const float *b, int64_t ldb,
                                  float beta, float *c, int64_t ldc);

/* ---- bf16 operands rounded once by the caller ----
 * A GEMM's operand that several GEMMs read (a layer's weight in forward and in backward, the
 * gradient of a layer's output in its dX and dW products, the attention's q, k, v over all
 * heads) is rounded once with mpt_op_bf16_round into a bf16 array (uint16_t, the bits of
 * mpt_bf16_from_f32) and the GEMMs take it as it is: the same results as mpt_op_gemm_bf16 on
 * the float inputs (same rounding, same accumulation), less rounding work and no copies. */

/* 1 when the stream's backend has mpt_op_bf16_round, mpt_op_gemm_bf16_batched and the head
 * layouts below (the CPU with oneDNN and a BF16 CPU), else 0 (the layers then use
 * mpt_op_gemm_bf16). */
MPT_API int mpt_op_bf16_rounded_available(mpt_stream *stream);
/* y[i] = bf16(x[i]) for i < count, to nearest even (mpt_bf16_from_f32's bits; NaN stays NaN),
 * on the calling thread (memory-bound; see gemm_dnnl.c). Errors: MPT_EINVAL
 * (count < 0, NULL with count > 0), MPT_ENOTSUP (mpt_op_bf16_check). */
MPT_API mpt_status mpt_op_bf16_round(mpt_stream *stream, const float *x, uint16_t *y,
                                     int64_t count);
/* For i < batch (as cublasGemmStridedBatchedEx, row-major as mpt_op_gemm):
 *   C_i (M x N, f32) = alpha * op(A_i) op(B_i) + beta * C_i,
 * A_i = a + i stride_a, B_i = b + i stride_b (bf16, leading dimensions lda, ldb), C_i = c + i
 * stride_c (leading dimension ldc); products accumulated in float32 as mpt_op_gemm_bf16. The
 * C_i must not overlap. k == 0 scales each C_i by beta. Errors: as mpt_op_gemm_bf16
 * (MPT_EINVAL for a negative extent or stride, a short leading dimension, NULL), MPT_ENOTSUP
 * where mpt_op_bf16_rounded_available is 0. */
MPT_API mpt_status mpt_op_gemm_bf16_batched(mpt_stream *stream, int trans_a, int trans_b,
                                            int64_t batch, int64_t m, int64_t n, int64_t k,
                                            float alpha, const uint16_t *a, int64_t lda,
                                            int64_t stride_a, const uint16_t *b, int64_t ldb,
                                            int64_t stride_b, float beta, float *c, int64_t ldc,
                                            int64_t stride_c);

/* Head-major layouts for batched products over attention heads (dense operands, which the
 * CPU's fastest bf16 kernels need): x [B, T, parts, H, hs] (float32; parts 3 for q, k, v side by
 * side in a row, 1 for one [B, T, C]) becomes y [parts, B, H, T, hs] rounded to bf16 (as
 * mpt_op_bf16_round); merge moves float32 values back: y [B, T, parts, H, hs] = beta y + x
 * [parts, B, H, T, hs] (beta 0 writes; y's NaNs do not leak). Errors: MPT_EINVAL (negative
 * extent, overflow, NULL with a non-empty shape), MPT_ENOTSUP (a backend without them: see
 * mpt_op_bf16_rounded_available). */
MPT_API mpt_status mpt_op_heads_split_bf16(mpt_stream *stream, const float *x, int64_t nb,
                                           int64_t nt, int64_t parts, int64_t nh, int64_t hs,
                                           uint16_t *y);
MPT_API mpt_status mpt_op_heads_merge(mpt_stream *stream, const float *x, int64_t nb, int64_t nt,
                                      int64_t parts, int64_t nh, int64_t hs, float beta,
                                      float *y);

/* The library convolutions of ops.h (mpt_op_conv2d_*: same shapes, accumulation and errors)
 * with x, w and dy rounded to bf16 and float32 accumulation; y, dx, dw and db are float32, the
 * bias is added in float32. CPU: oneDNN's bf16 convolutions (the reorders into its blocked
 * layouts round to nearest even). Errors: those of mpt_op_conv2d_*, MPT_ENOTSUP where
 * mpt_op_conv2d_bf16_available is 0 or mpt_op_bf16_check fails.
 * mpt_op_conv2d_bf16_available: 1 when the stream's backend has them (the CPU with oneDNN),
 * else 0 (the layers then use im2col + mpt_op_gemm_bf16). */
MPT_API int mpt_op_conv2d_bf16_available(mpt_stream *stream);
MPT_API mpt_status mpt_op_conv2d_forward_bf16(mpt_stream *stream, const mpt_conv_geom *g,
                                              int64_t n, int64_t o, const float *x,
                                              const float *w, const float *b, float *y);
MPT_API mpt_status mpt_op_conv2d_backward_data_bf16(mpt_stream *stream, const mpt_conv_geom *g,
                                                    int64_t n, int64_t o, const float *w,
                                                    const float *dy, float *dx);
MPT_API mpt_status mpt_op_conv2d_backward_weights_bf16(mpt_stream *stream,
                                                       const mpt_conv_geom *g, int64_t n,
                                                       int64_t o, const float *x,
                                                       const float *dy, float *dw, float *db);

#ifdef __cplusplus
}
#endif

#endif /* MPITRAIN_OPS_BF16_H */
