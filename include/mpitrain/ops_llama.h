/* mpitrain core ops of Llama-style transformer layers: RMSNorm, rotary position embeddings
 * (RoPE) and the SwiGLU gate. The conventions of ops_gpt.h hold: float32 row-major arrays on
 * the stream's device (a NULL stream is the CPU), forward ops overwrite their outputs, backward
 * ops ACCUMULATE (+=) into their gradient outputs, arguments are checked (MPT_EINVAL naming the
 * op and the value) and empty work returns MPT_OK at once. These ops exist on the CPU only: on
 * a CUDA stream they return MPT_ENOTSUP ("not available on the cuda backend").
 *
 * Results are deterministic: sums over a row go in double in index order, sums over rows in
 * increasing row order. Formulas: Zhang & Sennrich (2019) for RMSNorm, Su et al. (2021) for RoPE
 * in the half-split layout Hugging Face's Llama uses, Shazeer (2020) for SwiGLU. */
#ifndef MPITRAIN_OPS_LLAMA_H
#define MPITRAIN_OPS_LLAMA_H

#include "mpitrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* RMSNorm of the rows of x [rows, c] (c >= 1; eps finite and >= 0, else MPT_EINVAL):
 * y = x * rstd * w, rstd = 1 / sqrt(mean_c(x^2) + eps), w [c]; rstd [rows] is written for the
 * backward. The mean of squares is summed in double. y may equal x. */
MPT_API mpt_status mpt_op_rmsnorm(mpt_stream *stream, const float *x, int64_t rows, int64_t c,
                                  const float *w, float eps, float *y, float *rstd);
/* With xhat = x rstd and g = dy w: dx += rstd (g - xhat mean_c(g xhat)); dw += sum_rows dy xhat
 * (rows in increasing order). dx or dw may be NULL (not needed). x and rstd are the forward's. */
MPT_API mpt_status mpt_op_rmsnorm_backward(mpt_stream *stream, const float *dy, const float *x,
                                           int64_t rows, int64_t c, const float *w,
                                           const float *rstd, float *dx, float *dw);

/* Rotary position embedding, in place on x [b, t, heads, d] (d even, >= 2; theta finite and
 * > 1, else MPT_EINVAL): the token at position p (its index in t) has, for i in [0, d/2), the
 * angle a = p theta^(-2i/d) (computed in double, then cos and sin rounded to float), and the
 * pair (x1, x2) = (x[i], x[i + d/2]) of each head becomes (x1 cos a - x2 sin a,
 * x2 cos a + x1 sin a): Hugging Face's rotate_half layout. */
MPT_API mpt_status mpt_op_rope(mpt_stream *stream, float *x, int64_t b, int64_t t,
                               int64_t heads, int64_t d, float theta);
/* The backward, in place on dx [b, t, heads, d] (the gradient of the rotated values becomes the
 * gradient of the inputs): the inverse rotation, (d1, d2) -> (d1 cos a + d2 sin a,
 * d2 cos a - d1 sin a). Unlike the other backwards it overwrites (a rotation is its own
 * gradient's transpose, so no extra buffer is needed). */
MPT_API mpt_status mpt_op_rope_backward(mpt_stream *stream, float *dx, int64_t b, int64_t t,
                                        int64_t heads, int64_t d, float theta);

/* The SwiGLU gate: y[k] = silu(gate[k]) up[k], silu(a) = a / (1 + exp(-a)), count elements;
 * y may equal gate or up. */
MPT_API mpt_status mpt_op_swiglu(mpt_stream *stream, float *y, const float *gate,
                                 const float *up, int64_t count);
/* dgate += dy up silu'(gate), silu'(a) = s (1 + a (1 - s)) with s the sigmoid of a;
 * dup += dy silu(gate). dgate or dup may be NULL (not needed). */
MPT_API mpt_status mpt_op_swiglu_backward(mpt_stream *stream, const float *dy,
                                          const float *gate, const float *up, int64_t count,
                                          float *dgate, float *dup);

#ifdef __cplusplus
}
#endif

#endif /* MPITRAIN_OPS_LLAMA_H */
