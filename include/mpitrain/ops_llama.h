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

/* The scaling of RoPE's frequencies (Hugging Face's rope_scaling / rope_parameters):
 * MPT_ROPE_DEFAULT is the plain theta^(-2i/d) (the four numbers are unused and may be 0);
 * MPT_ROPE_LLAMA3 is Llama 3.1 / 3.2's rule (rope_type "llama3"; see mpt_rope_inv_freq). */
typedef enum mpt_rope_type { MPT_ROPE_DEFAULT = 0, MPT_ROPE_LLAMA3 = 1 } mpt_rope_type;
typedef struct mpt_rope_scaling {
  mpt_rope_type type;
  float factor;          /* llama3: the long wavelengths' divisor [factor], finite, >= 1 */
  float low_freq_factor; /* llama3: [low_freq_factor], finite, > 0 */
  float high_freq_factor; /* llama3: [high_freq_factor], finite, > low_freq_factor */
  int original_max_position_embeddings; /* llama3: the pretraining context, >= 1 */
} mpt_rope_scaling;

/* Checks a scaling: a known type and, for MPT_ROPE_LLAMA3, the ranges above. A NULL scaling is
 * the default one (MPT_OK). Errors: MPT_EINVAL naming the field at fault and its value. */
MPT_API mpt_status mpt_rope_scaling_check(const mpt_rope_scaling *scaling);

/* RoPE's d/2 inverse frequencies, written to inv_freq[0 .. d/2), in float32 exactly as Hugging
 * Face's transformers forms them: e_i = (float)(2i) / d, f_i = 1 / (float)theta^e_i (the power
 * rounded to float). With MPT_ROPE_LLAMA3 (NULL or MPT_ROPE_DEFAULT: f_i as is), in float32
 * with the constants rounded to float: the wavelength w_i = 2 pi / f_i against
 * lo = original_max_position_embeddings / low_freq_factor and
 * hi = original_max_position_embeddings / high_freq_factor:
 *   w_i > lo: f_i / factor;   w_i < hi: f_i;   otherwise, with
 *   s = (original_max_position_embeddings / w_i - low_freq_factor)
 *       / (high_freq_factor - low_freq_factor):   ((1 - s) f_i) / factor + s f_i.
 * d even and >= 2, theta finite and > 1, the scaling as mpt_rope_scaling_check; else
 * MPT_EINVAL (NULL inv_freq too). */
MPT_API mpt_status mpt_rope_inv_freq(int64_t d, float theta, const mpt_rope_scaling *scaling,
                                     float *inv_freq);

/* mpt_op_rope with the inverse frequencies given: inv_freq [d/2] (mpt_rope_inv_freq; each
 * finite, else MPT_EINVAL), the angle of position p and pair i the float32 product
 * a = (float)p * inv_freq[i] (as Hugging Face forms it), cos a and sin a computed in double and
 * rounded to float. The rotation and layout are mpt_op_rope's. */
MPT_API mpt_status mpt_op_rope_freqs(mpt_stream *stream, float *x, int64_t b, int64_t t,
                                     int64_t heads, int64_t d, const float *inv_freq);
/* Its backward: mpt_op_rope_backward's inverse rotation, in place, with these angles. */
MPT_API mpt_status mpt_op_rope_freqs_backward(mpt_stream *stream, float *dx, int64_t b,
                                              int64_t t, int64_t heads, int64_t d,
                                              const float *inv_freq);

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
