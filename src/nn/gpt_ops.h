/* Internals shared by the transformer ops (src/nn/gpt_ops.c, src/nn/attention.c). */
#ifndef MPT_NN_GPT_OPS_H
#define MPT_NN_GPT_OPS_H

#include "mpitrain/autograd.h"

/* MPT_EINVAL unless `v` is a float32 var with data. `op` and `what` name it in the message. */
mpt_status mpt__gpt_check_var(const char *op, const char *what, const mpt_var *v);

/* mpt_nn_causal_attention (transformer.h) always as the reference that materialises the
 * attention matrix (attention.c), never the fused op: the tests' and benchmarks' oracle. */
mpt_status mpt__causal_attention_reference(mpt_tape *tape, mpt_var *qkv, int n_head,
                                           mpt_var **y);

/* The causal attention's products in bf16 (attention_bf16.c), for a tape of precision bf16
 * whose backend has mpt_op_bf16_rounded_available. Forward: out [B, T, C] and the softmax att
 * [B, H, T, T] from qkv [B, T, 3C]; *x16 ([3, B, H, T, hs]) and *a16 ([B, H, T, T]) are qkv
 * and att rounded to bf16, in the arena, for backward. Backward: dqkv = beta dqkv + the
 * gradient, from dy [B, T, C], att, x16 and a16. */
mpt_status mpt__attn_forward_bf16(mpt_tape *tape, const float *x, int64_t nb, int64_t nt,
                                  int64_t c, int64_t nh, float *att, float *out,
                                  const uint16_t **x16, const uint16_t **a16);
mpt_status mpt__attn_backward_bf16(mpt_tape *tape, const uint16_t *x16, const uint16_t *a16,
                                   const float *att,
                                   const float *dy, int64_t nb, int64_t nt, int64_t c,
                                   int64_t nh, float beta, float *dqkv);
/* linear_nd's products in bf16 (linear_bf16.c), for the same tapes: forward y [rows, out] =
 * x W^T keeping x and W rounded (*x16, *w16, in the arena); backward dx = beta_x dx + dy W and
 * dW += dy^T x from them (NULL dx or dw: skipped). */
mpt_status mpt__linear_forward_bf16(mpt_tape *tape, const float *x, const float *w,
                                    int64_t rows, int64_t in, int64_t out, float *y,
                                    const uint16_t **x16, const uint16_t **w16);
mpt_status mpt__linear_backward_bf16(mpt_tape *tape, const uint16_t *x16, const uint16_t *w16,
                                     const float *dy, int64_t rows, int64_t in, int64_t out,
                                     float beta_x, float *dx, float *dw);

#endif
