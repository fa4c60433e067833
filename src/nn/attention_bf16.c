/* The bf16 products of the causal attention (attention.c) on a tape of precision bf16 whose
 * backend has bf16 operands rounded once (mpt_op_bf16_rounded_available, ops_bf16.h).
 *
 * The CPU's fast bf16 kernels (oneDNN's brgemm: AMX or AVX-512 BF16) take only dense operands,
 * and a head's q, k, v are interleaved in qkv's rows; so qkv is moved into head-major planes
 * while it is rounded (mpt_op_heads_split_bf16: [3, B, H, T, hs], kept for backward), every
 * product is one batched GEMM over the heads of a sequence on dense [H, T, hs] / [H, T, T]
 * operands, and the float32 results are moved back (mpt_op_heads_merge). The products are full
 * T x T (the float32 path's block triangle would need strided, slower operands): what lies
 * above the diagonal is computed and then ignored, as the masked softmax and its backward
 * write zeros there and read only up to the diagonal.
 *   forward, per sequence b:  S = scale Q K^T (float32, into att, which backward keeps as
 *             before); A = causal softmax (float32); Y_h = bf16(A) V;
 *   backward, per sequence b: dY rounded into head-major planes; dA = dY_h V^T, dV = A^T dY_h
 *             (bf16(A) kept from forward: 2 B H T^2 bytes per layer, half of A's float32
 *             copy); dS = A * (dA - rowsum(A * dA)) in float32, rounded; dQ =
 *             scale dS K, dK = scale dS^T Q; dq, dk, dv merged into dqkv with beta.
 * Each product's inputs are the bf16 roundings of what the float32 path multiplies, accumulated
 * in float32 (ops_bf16.h's bound, K = hs or T). All work goes on the tape's stream, in the
 * calling thread; the arena holds the head-major copies and per-sequence scratch. */
#include <math.h>
#include <stdint.h>

#include "mpitrain/ops_bf16.h"
#include "mpitrain/ops_gpt.h"
#include "nn/gpt_ops.h"

mpt_status mpt__attn_forward_bf16(mpt_tape *tape, const float *x, int64_t nb, int64_t nt,
                                  int64_t c, int64_t nh, float *att, float *out,
                                  const uint16_t **x16_out, const uint16_t **a16_out) {
  mpt_stream *s = mpt_tape_stream(tape);
  const int64_t hs = c / nh, tt = nt * nt, plane = nt * hs, part = nb * nh * plane;
  const float scale = (float)(1.0 / sqrt((double)hs));
  uint16_t *x16 = NULL, *a16 = NULL;
  float *yh = NULL;
  MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)(3 * part) * sizeof(uint16_t), (void **)&x16));
  MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)(nb * nh * tt) * sizeof(uint16_t), (void **)&a16));
  MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)(nh * plane) * sizeof(float), (void **)&yh));
  MPT_RETURN_IF(mpt_op_heads_split_bf16(s, x, nb, nt, 3, nh, hs, x16));
  for (int64_t b = 0; b < nb; b++) {
    const uint16_t *q = x16 + b * nh * plane, *kk = q + part, *v = q + 2 * part;
    float *a = att + b * nh * tt;
    /* S_h [T, T] = scale Q_h [T, hs] K_h^T, every head h of sequence b */
    MPT_RETURN_IF(mpt_op_gemm_bf16_batched(s, 0, 1, nh, nt, nt, hs, scale, q, hs, plane, kk, hs,
                                           plane, 0.0f, a, nt, tt));
    MPT_RETURN_IF(mpt_op_causal_softmax(s, a, nh, nt));
    uint16_t *ab = a16 + b * nh * tt;
    MPT_RETURN_IF(mpt_op_bf16_round(s, a, ab, nh * tt));
    /* Y_h [T, hs] = A_h [T, T] V_h [T, hs], then into out's rows */
    MPT_RETURN_IF(mpt_op_gemm_bf16_batched(s, 0, 0, nh, nt, hs, nt, 1.0f, ab, nt, tt, v, hs,
                                           plane, 0.0f, yh, hs, plane));
    MPT_RETURN_IF(mpt_op_heads_merge(s, yh, 1, nt, 1, nh, hs, 0.0f, out + b * nt * c));
  }
  *x16_out = x16;
  *a16_out = a16;
  return MPT_OK;
}

mpt_status mpt__attn_backward_bf16(mpt_tape *tape, const uint16_t *x16, const uint16_t *a16,
                                   const float *att,
                                   const float *dy, int64_t nb, int64_t nt, int64_t c,
                                   int64_t nh, float beta, float *dqkv) {
  mpt_stream *s = mpt_tape_stream(tape);
  const int64_t hs = c / nh, tt = nt * nt, plane = nt * hs, part = nb * nh * plane;
  const float scale = (float)(1.0 / sqrt((double)hs));
  /* one scratch block (mpt_tape_scratch): ds, g [H T T + 3 H T hs floats], m16, dy16 */
  float *ds = NULL, *g = NULL;
  uint16_t *m16 = NULL, *dy16 = NULL;
  const size_t floats = (size_t)(nh * tt + 3 * nh * plane);
  MPT_RETURN_IF(mpt_tape_scratch(tape, floats * sizeof(float) +
                                 (size_t)(nh * tt + nh * plane) * sizeof(uint16_t),
                                 (void **)&ds));
  g = ds + nh * tt;
  m16 = (uint16_t *)(ds + floats);
  dy16 = m16 + nh * tt;
  float *dq = g, *dk = g + nh * plane, *dv = g + 2 * nh * plane; /* [3, H, T, hs] */
  for (int64_t b = 0; b < nb; b++) {
    const uint16_t *q = x16 + b * nh * plane, *kk = q + part, *v = q + 2 * part;
    const float *a = att + b * nh * tt;
    MPT_RETURN_IF(mpt_op_heads_split_bf16(s, dy + b * nt * c, 1, nt, 1, nh, hs, dy16));
    const uint16_t *ab = a16 + b * nh * tt;
    /* dA_h [T, T] = dY_h [T, hs] V_h^T */
    MPT_RETURN_IF(mpt_op_gemm_bf16_batched(s, 0, 1, nh, nt, nt, hs, 1.0f, dy16, hs, plane, v, hs,
                                           plane, 0.0f, ds, nt, tt));
    /* dV_h [T, hs] = A_h^T dY_h */
    MPT_RETURN_IF(mpt_op_gemm_bf16_batched(s, 1, 0, nh, nt, hs, nt, 1.0f, ab, nt, tt, dy16, hs,
                                           plane, 0.0f, dv, hs, plane));
    /* dS = A * (dA - rowsum(A * dA)), 0 above the diagonal, every head */
    MPT_RETURN_IF(mpt_op_causal_softmax_backward(s, a, ds, nh, nt));
    MPT_RETURN_IF(mpt_op_bf16_round(s, ds, m16, nh * tt));
    /* dQ_h = scale dS_h K_h;  dK_h = scale dS_h^T Q_h */
    MPT_RETURN_IF(mpt_op_gemm_bf16_batched(s, 0, 0, nh, nt, hs, nt, scale, m16, nt, tt, kk, hs,
                                           plane, 0.0f, dq, hs, plane));
    MPT_RETURN_IF(mpt_op_gemm_bf16_batched(s, 1, 0, nh, nt, hs, nt, scale, m16, nt, tt, q, hs,
                                           plane, 0.0f, dk, hs, plane));
    MPT_RETURN_IF(mpt_op_heads_merge(s, g, 1, nt, 3, nh, hs, beta, dqkv + b * nt * 3 * c));
  }
  return MPT_OK;
}
