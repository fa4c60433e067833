/* The bf16 products of linear_nd (gpt_ops.c) on a tape of precision bf16 whose backend takes
 * bf16 operands (mpt_op_bf16_rounded_available, ops_bf16.h): each operand is rounded once per
 * step instead of once per GEMM that reads it.
 *   forward:  x [rows, in] and W [out, in] are rounded into the arena (kept for backward), then
 *             y = x16 W16^T;
 *   backward: dy [rows, out] is rounded once for both products: dx = beta dx + dy16 W16,
 *             dW += dy16^T x16.
 * The results are those of mpt_op_gemm_bf16 on the float inputs (the same roundings, float32
 * accumulation); for the GPT's tied head (W = wte, 50304 x C) the forward's rounding of wte
 * serves its dX product, and dlogits (rows x 50304) is rounded once, not twice. The arena holds
 * 2 bytes per element of every linear's input and weight until the tape's reset; the rounded
 * dy is scratch (mpt_tape_scratch), reused by the next backward. */
#include "mpitrain/ops_bf16.h"
#include "nn/gpt_ops.h"

mpt_status mpt__linear_forward_bf16(mpt_tape *tape, const float *x, const float *w,
                                    int64_t rows, int64_t in, int64_t out, float *y,
                                    const uint16_t **x16_out, const uint16_t **w16_out) {
  mpt_stream *s = mpt_tape_stream(tape);
  uint16_t *x16 = NULL, *w16 = NULL;
  MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)(rows * in) * sizeof(uint16_t), (void **)&x16));
  MPT_RETURN_IF(mpt_tape_alloc(tape, (size_t)(out * in) * sizeof(uint16_t), (void **)&w16));
  MPT_RETURN_IF(mpt_op_bf16_round(s, x, x16, rows * in));
  MPT_RETURN_IF(mpt_op_bf16_round(s, w, w16, out * in));
  /* y [rows, out] = x16 [rows, in] W16 [out, in]^T */
  MPT_RETURN_IF(mpt_op_gemm_bf16_batched(s, 0, 1, 1, rows, out, in, 1.0f, x16, in, 0, w16, in, 0,
                                         0.0f, y, out, 0));
  *x16_out = x16;
  *w16_out = w16;
  return MPT_OK;
}

mpt_status mpt__linear_backward_bf16(mpt_tape *tape, const uint16_t *x16, const uint16_t *w16,
                                     const float *dy, int64_t rows, int64_t in, int64_t out,
                                     float beta_x, float *dx, float *dw) {
  if (!dx && !dw) return MPT_OK;
  mpt_stream *s = mpt_tape_stream(tape);
  uint16_t *dy16 = NULL;
  MPT_RETURN_IF(mpt_tape_scratch(tape, (size_t)(rows * out) * sizeof(uint16_t), (void **)&dy16));
  MPT_RETURN_IF(mpt_op_bf16_round(s, dy, dy16, rows * out));
  /* dx [rows, in] = beta_x dx + dy16 [rows, out] W16 [out, in] */
  if (dx) MPT_RETURN_IF(mpt_op_gemm_bf16_batched(s, 0, 0, 1, rows, in, out, 1.0f, dy16, out, 0,
                                                 w16, in, 0, beta_x, dx, in, 0));
  /* dW [out, in] += dy16^T [out, rows] x16 [rows, in] */
  if (dw) MPT_RETURN_IF(mpt_op_gemm_bf16_batched(s, 1, 0, 1, out, in, rows, 1.0f, dy16, out, 0,
                                                 x16, in, 0, 1.0f, dw, in, 0));
  return MPT_OK;
}
