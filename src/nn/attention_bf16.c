/* The bf16 products of the causal attention (attention.c) on a tape of precision bf16 whose
 * backend has bf16 operands rounded once (mpt_op_bf16_rounded_available, ops_bf16.h):
 *
 *   forward:  qkv is rounded to bf16 once (all heads, all sequences; kept for backward);
 *             per sequence b, S = scale Q K^T is one strided-batched GEMM over the heads per
 *             block of rows (the heads are the batch: Q_h = q + h hs, leading dimension 3C);
 *             the causal softmax stays float32 (attention.c's A, saved as before); A is rounded
 *             to bf16 and Y_h = A V is again one batched GEMM per block of rows.
 *   backward: dY rounded once; per sequence, A rounded again (saving a bf16 copy of every
 *             layer's A would add 2 B H T^2 bytes per layer), dA = dY_h V^T and dV += A^T dY_h
 *             batched over the heads; dS (float32 softmax backward, all heads at once) rounded;
 *             dQ += scale dS K, dK += scale dS^T Q batched over the heads.
 * Each product's inputs are the bf16 roundings of what the float32 path multiplies, accumulated
 * in float32 (ops_bf16.h's bound, K = hs or up to T); softmax and its backward are float32 on
 * float32 inputs. The causal block triangle is attention.c's, in blocks of BF16_BLOCK rows.
 * All work goes on the tape's stream, in the calling thread. */
#include <math.h>
#include <stdint.h>

#include "mpitrain/ops_bf16.h"
#include "mpitrain/ops_gpt.h"
#include "nn/gpt_ops.h"

/* Rows per block of the triangular products: larger than the float32 path's 64, since a bf16
 * call does all heads at once and its set-up is paid per call. */
#define BF16_BLOCK 128

static int64_t block_rows(int64_t nt, int64_t r0) {
  return nt - r0 < BF16_BLOCK ? nt - r0 : BF16_BLOCK;
}

mpt_status mpt__attn_forward_bf16(mpt_tape *tape, const float *x, int64_t nb, int64_t nt,
                                  int64_t c, int64_t nh, float *att, float *out,
                                  const uint16_t **x16_out) {
  mpt_stream *s = mpt_tape_stream(tape);
  const int64_t c3 = 3 * c, hs = c / nh, tt = nt * nt;
  const float scale = (float)(1.0 / sqrt((double)hs));
  uint16_t *x16 = NULL, *a16 = NULL;
  MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)(nb * nt * c3) * sizeof(uint16_t), (void **)&x16));
  MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)(nh * tt) * sizeof(uint16_t), (void **)&a16));
  MPT_RETURN_IF(mpt_op_bf16_round(s, x, x16, nb * nt * c3));
  for (int64_t b = 0; b < nb; b++) {
    const uint16_t *q = x16 + b * nt * c3, *kk = q + c, *v = q + 2 * c;
    float *a = att + b * nh * tt;
    /* S_h[r0, +rows) [rows, cols] = scale Q_h[r0, +rows) K_h[0, cols)^T for every head h */
    for (int64_t r0 = 0; r0 < nt; r0 += BF16_BLOCK) {
      const int64_t rows = block_rows(nt, r0), cols = r0 + rows;
      MPT_RETURN_IF(mpt_op_gemm_bf16_batched(s, 0, 1, nh, rows, cols, hs, scale, q + r0 * c3, c3,
                                             hs, kk, c3, hs, 0.0f, a + r0 * nt, nt, tt));
    }
    MPT_RETURN_IF(mpt_op_causal_softmax(s, a, nh, nt));
    MPT_RETURN_IF(mpt_op_bf16_round(s, a, a16, nh * tt));
    /* Y_h[r0, +rows) = A_h[rows, cols] V_h[0, cols) */
    for (int64_t r0 = 0; r0 < nt; r0 += BF16_BLOCK) {
      const int64_t rows = block_rows(nt, r0), cols = r0 + rows;
      MPT_RETURN_IF(mpt_op_gemm_bf16_batched(s, 0, 0, nh, rows, hs, cols, 1.0f, a16 + r0 * nt,
                                             nt, tt, v, c3, hs, 0.0f,
                                             out + (b * nt + r0) * c, c, hs));
    }
  }
  *x16_out = x16;
  return MPT_OK;
}

mpt_status mpt__attn_backward_bf16(mpt_tape *tape, const uint16_t *x16, const float *att,
                                   const float *dy, int64_t nb, int64_t nt, int64_t c,
                                   int64_t nh, float beta, float *dqkv) {
  mpt_stream *s = mpt_tape_stream(tape);
  const int64_t c3 = 3 * c, hs = c / nh, tt = nt * nt;
  const float scale = (float)(1.0 / sqrt((double)hs));
  uint16_t *dy16 = NULL, *m16 = NULL;
  float *ds = NULL;
  MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)(nb * nt * c) * sizeof(uint16_t), (void **)&dy16));
  MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)(nh * tt) * sizeof(uint16_t), (void **)&m16));
  MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)(nh * tt) * sizeof(float), (void **)&ds));
  MPT_RETURN_IF(mpt_op_bf16_round(s, dy, dy16, nb * nt * c));
  for (int64_t b = 0; b < nb; b++) {
    const uint16_t *q = x16 + b * nt * c3, *kk = q + c, *v = q + 2 * c, *g = dy16 + b * nt * c;
    float *dq = dqkv + b * nt * c3, *dk = dq + c, *dv = dq + 2 * c;
    const float *a = att + b * nh * tt;
    MPT_RETURN_IF(mpt_op_bf16_round(s, a, m16, nh * tt)); /* m16 = A */
    for (int64_t r0 = 0; r0 < nt; r0 += BF16_BLOCK) {
      const int64_t rows = block_rows(nt, r0), cols = r0 + rows;
      /* dA_h [rows, cols] = dY_h [rows, hs] V_h[0, cols)^T */
      MPT_RETURN_IF(mpt_op_gemm_bf16_batched(s, 0, 1, nh, rows, cols, hs, 1.0f, g + r0 * c, c,
                                             hs, v, c3, hs, 0.0f, ds + r0 * nt, nt, tt));
      /* dV_h[r0, +rows) += A_h[r0.., r0, +rows)^T dY_h[r0..] */
      MPT_RETURN_IF(mpt_op_gemm_bf16_batched(s, 1, 0, nh, rows, hs, nt - r0, 1.0f,
                                             m16 + r0 * nt + r0, nt, tt, g + r0 * c, c, hs, beta,
                                             dv + r0 * c3, c3, hs));
    }
    /* dS = A * (dA - rowsum(A * dA)), 0 above the diagonal, every head */
    MPT_RETURN_IF(mpt_op_causal_softmax_backward(s, a, ds, nh, nt));
    MPT_RETURN_IF(mpt_op_bf16_round(s, ds, m16, nh * tt)); /* m16 = dS */
    for (int64_t r0 = 0; r0 < nt; r0 += BF16_BLOCK) {
      const int64_t rows = block_rows(nt, r0), cols = r0 + rows;
      /* dQ_h[r0, +rows) += scale dS_h[rows, cols] K_h[0, cols) */
      MPT_RETURN_IF(mpt_op_gemm_bf16_batched(s, 0, 0, nh, rows, hs, cols, scale, m16 + r0 * nt,
                                             nt, tt, kk, c3, hs, beta, dq + r0 * c3, c3, hs));
      /* dK_h[r0, +rows) += scale dS_h[r0.., r0, +rows)^T Q_h[r0..] */
      MPT_RETURN_IF(mpt_op_gemm_bf16_batched(s, 1, 0, nh, rows, hs, nt - r0, scale,
                                             m16 + r0 * nt + r0, nt, tt, q + r0 * c3, c3, hs,
                                             beta, dk + r0 * c3, c3, hs));
    }
  }
  return MPT_OK;
}
