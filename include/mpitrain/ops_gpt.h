/* mpitrain core ops of the transformer layers (include/mpitrain/transformer.h builds its ops on
 * the tape from these and mpt_op_gemm). The conventions of ops.h hold: float32 row-major
 * arrays on the stream's device (a NULL stream is the CPU, now), element counts, forward ops
 * overwrite their outputs, backward ops ACCUMULATE (+=) into their gradient outputs, arguments
 * are checked (MPT_EINVAL: NULL pointers with work to do, extents outside [0, 2^31), a bad
 * scalar) and empty work returns MPT_OK at once; a backend without the op gives MPT_ENOTSUP;
 * CUDA errors as in ops.h. Asynchronous on CUDA (none of these waits for the stream). Index arrays
 * (tokens, targets) are int32 on the same device; the CPU checks their range (MPT_EINVAL naming
 * the position), CUDA does not read them back (an index out of range is never used to address
 * memory: its output is NaN there).
 *
 * Every result is deterministic: sums over rows go in a fixed order (no atomics), on every
 * backend. Formulas: GPT-2 as llm.c (Karpathy, train_gpt2.c) writes it; see transformer.h. */
#ifndef MPITRAIN_OPS_GPT_H
#define MPITRAIN_OPS_GPT_H

#include "mpitrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y[r, :] = wte[tokens[r], :] + wpe[r % t, :] for the rows r of a [b, t] token array; wte
 * [>= vocab, c], wpe [>= t, c], y [b*t, c]. As llm.c's encoder_forward. The CPU refuses a
 * token outside [0, vocab) (MPT_EINVAL naming the position); vocab >= 1. */
MPT_API mpt_status mpt_op_embedding_gpt(mpt_stream *stream, const int32_t *tokens, int64_t b,
                                        int64_t t, int64_t c, int64_t vocab, const float *wte,
                                        const float *wpe, float *y);
/* dwte[tokens[r], :] += dy[r, :] and dwpe[r % t, :] += dy[r, :], rows in increasing order for
 * each channel; dwte or dwpe may be NULL (not needed). */
MPT_API mpt_status mpt_op_embedding_gpt_backward(mpt_stream *stream, const int32_t *tokens,
                                                 int64_t b, int64_t t, int64_t c, int64_t vocab,
                                                 const float *dy, float *dwte, float *dwpe);

/* Layer normalisation (Ba et al., 2016; llm.c's layernorm_forward) of the rows of x [rows, c]
 * (c >= 1; biased variance; eps finite and >= 0, else MPT_EINVAL); w, bias [c]:
 * y = (x - mean) * rstd * w + bias; mean [rows] and rstd [rows] = 1/sqrt(var + eps) are written
 * for backward. Row statistics are summed in double. */
MPT_API mpt_status mpt_op_layernorm(mpt_stream *stream, const float *x, int64_t rows, int64_t c,
                                    const float *w, const float *bias, float eps, float *y,
                                    float *mean, float *rstd);
/* dx += rstd (g - mean_c(g) - xhat mean_c(g xhat)), g = dy w; dw += sum_rows dy xhat;
 * dbias += sum_rows dy (llm.c's layernorm_backward). dx, dw, dbias may each be NULL. Errors
 * also: MPT_ENOMEM (the CPU's partial sums of dw, dbias). */
MPT_API mpt_status mpt_op_layernorm_backward(mpt_stream *stream, const float *dy, const float *x,
                                             int64_t rows, int64_t c, const float *w,
                                             const float *mean, const float *rstd, float *dx,
                                             float *dw, float *dbias);

/* The tanh approximation of GELU (Hendrycks & Gimpel, 2016), as GPT-2, llm.c's gelu_forward and
 * PyTorch's GELU(approximate='tanh'): y = 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715
 * x^3), computed as x * sigmoid(2u) (the same function: one expf instead of a tanhf); y may
 * equal x. */
MPT_API mpt_status mpt_op_gelu(mpt_stream *stream, float *y, const float *x, int64_t count);
/* dx += dy * gelu'(x). */
MPT_API mpt_status mpt_op_gelu_backward(mpt_stream *stream, float *dx, const float *dy,
                                        const float *x, int64_t count);

/* Fused ops (bit for bit the unfused compositions they replace, on the CPU; tests/
 * test_gpt_fused.c checks it at 1 and 2 threads). CUDA runs them as an elementwise kernel
 * followed by the unfused op's reduction kernel (same results as the unfused CUDA ops).
 *
 * The residual add and the LayerNorm that follows it, in one pass over the rows:
 * sum = a + b (as mpt_op_copy then mpt_op_axpy with alpha 1), then mpt_op_layernorm of sum
 * into y, mean, rstd. a, b, sum and y are [rows, c]; sum may equal a or b; y must not
 * overlap a, b or sum. Threads: rows split (independent). Saves the copy, and LayerNorm's
 * read of sum from memory (each row is normalised while it is in cache). Errors: MPT_EINVAL
 * (NULL pointers, eps, negative sizes, y equal to a, b or sum), MPT_ENOTSUP. */
MPT_API mpt_status mpt_op_add_layernorm(mpt_stream *stream, const float *a, const float *b,
                                        int64_t rows, int64_t c, const float *w,
                                        const float *bias, float eps, float *sum, float *y,
                                        float *mean, float *rstd);

/* The GELU of a Linear's output with its bias: y[r, j] = gelu(x[r, j] + bias[j]) for x
 * [rows, cols] (the product x W^T, without the bias) and bias [cols]; x is not modified, so
 * backward recomputes x + bias instead of reading a stored pre-activation. The same bits as
 * mpt_op_bias_add (inner 1) then mpt_op_gelu; y may equal x. Threads: rows split.
 * Errors: MPT_EINVAL (NULL pointers, negative sizes), MPT_ENOTSUP. */
MPT_API mpt_status mpt_op_bias_gelu(mpt_stream *stream, float *y, const float *x,
                                    const float *bias, int64_t rows, int64_t cols);
/* Its backward: dx[r, j] = dy[r, j] gelu'(x[r, j] + bias[j]), WRITTEN (dx is not read: the
 * gradient of a pre-activation that only this op uses), and, when dbias is not NULL,
 * dbias[j] += sum_r dx[r, j] in mpt_op_bias_backward's order (up to 256 rows: row by row
 * into dbias; more: blocks of 256 rows each summed from 0, the blocks added in order): the same
 * bits as mpt_op_gelu_backward_beta (beta 0) of x + bias then mpt_op_bias_backward, in one pass
 * over dy and x. dx must not overlap dy, x or bias. Threads: blocks of 256 rows (the same bits
 * at every thread count). Errors: MPT_EINVAL (NULL pointers, negative sizes, dx equal to dy or
 * x), MPT_ENOMEM (the blocks' partial sums), MPT_ENOTSUP. */
MPT_API mpt_status mpt_op_bias_gelu_backward(mpt_stream *stream, float *dx, const float *dy,
                                             const float *x, const float *bias, int64_t rows,
                                             int64_t cols, float *dbias);

/* In place on `planes` matrices [t, t]: row i becomes the softmax of its entries [0, i] (max
 * subtracted, sum in double) and 0 after column i (the causal mask). */
MPT_API mpt_status mpt_op_causal_softmax(mpt_stream *stream, float *s, int64_t planes,
                                         int64_t t);
/* In place: d (dL/d(softmax), [planes, t, t]) becomes dL/d(scores) = a * (d - rowsum(a * d))
 * for columns [0, i] of row i, 0 after; a is the forward's output. */
MPT_API mpt_status mpt_op_causal_softmax_backward(mpt_stream *stream, const float *a, float *d,
                                                  int64_t planes, int64_t t);

/* Causal multi-head self-attention, fused (transformer.h mpt_nn_causal_attention's formulas):
 * qkv [b, t, 3c] holds q, k, v in channels [0, c), [c, 2c), [2c, 3c); head h of nh is channels
 * [h hs, (h + 1) hs) of each, hs = c / nh. Writes y [b, t, c] = softmax over t2 <= t of
 * q k^T / sqrt(hs), times v, per head; and stats [b, nh, t, 2], each row's softmax maximum and
 * 1 / sum, which backward needs. The attention matrix is never stored (scratch of O(t^2) floats
 * per thread): backward recomputes it from q, k and the stats, the recomputation of
 * FlashAttention (Dao et al., 2022) without its online softmax (a block of rows sees all its
 * columns at once). On the CPU the results are those of the reference (src/nn/attention.c: the
 * blocked GEMMs with mpt_op_causal_softmax) bit for bit. Only where
 * mpt_op_causal_attention_available; else MPT_ENOTSUP. Errors also: MPT_EINVAL (extents, nh not
 * dividing c, NULL pointers), MPT_ENOMEM (scratch). */
MPT_API mpt_status mpt_op_causal_attention(mpt_stream *stream, const float *qkv, int64_t b,
                                           int64_t t, int64_t c, int64_t nh, float *y,
                                           float *stats);
/* dqkv [b, t, 3c] = beta dqkv + the gradient of sum(y * dy) with respect to qkv, from dy
 * [b, t, c], qkv and forward's stats (the softmax is recomputed); beta 0 (dqkv is written, not
 * read) or 1 (added). Errors: as the forward, and MPT_EINVAL for another beta. */
MPT_API mpt_status mpt_op_causal_attention_backward(mpt_stream *stream, const float *qkv,
                                                    const float *stats, const float *dy,
                                                    int64_t b, int64_t t, int64_t c, int64_t nh,
                                                    float beta, float *dqkv);
/* 1 when the stream's backend has the two ops above (the CPU), 0 otherwise. */
MPT_API int mpt_op_causal_attention_available(mpt_stream *stream);

/* Cross-entropy of logits [n, vp] against targets [n] in [0, v), v <= vp, over the columns
 * [0, v) only: *loss (one float on the device) = mean_r (lse_r - logits[r, targets[r]]), with
 * lse_r = logsumexp_{j < v} logits[r, j] = m_r + log s_r, m_r = max_{j < v} logits[r, j],
 * s_r = sum_{j < v} exp(logits[r, j] - m_r), in double. Writes stats [n, 2] = (m_r, 1 / s_r)
 * for backward: the probabilities are recomputed as exp(logits - m_r) / s_r, where logits - m_r
 * is exact near the maximum whatever the logits' magnitude (a logsumexp kept as a float would
 * carry its rounding, |lse| 2^-24, into every probability: wrong gradients at large logits).
 * The padded vocabulary of llm.c (vp = 50304 for GPT-2's v = 50257): the padding columns never
 * count. n >= 1. The CPU refuses a target outside [0, v) (MPT_EINVAL naming the row). */
MPT_API mpt_status mpt_op_xent_vocab(mpt_stream *stream, const float *logits,
                                     const int32_t *targets, int64_t n, int64_t vp, int64_t v,
                                     float *stats, float *loss);
/* dlogits[r, j] += (*dloss / n) (p[r, j] - [j == targets[r]]) for j < v, with the softmax
 * p[r, j] = exp(logits[r, j] - stats[r, 0]) * stats[r, 1] from mpt_op_xent_vocab's stats [n, 2];
 * columns [v, vp) are untouched. dloss is one float on the device. */
MPT_API mpt_status mpt_op_xent_vocab_backward(mpt_stream *stream, const float *logits,
                                              const int32_t *targets, int64_t n, int64_t vp,
                                              int64_t v, const float *stats, const float *dloss,
                                              float *dlogits);

/* The two backwards above with beta 1 (add, as they do) or 0: write every element of dx /
 * dlogits (0 in the columns [v, vp)) without reading it, for a gradient buffer that is new
 * (mpt_var_grad_beta). Backends without a write kernel zero-fill, then add. MPT_EINVAL for
 * another beta or the arguments above. */
MPT_API mpt_status mpt_op_gelu_backward_beta(mpt_stream *stream, float *dx, const float *dy,
                                             const float *x, int64_t count, float beta);
MPT_API mpt_status mpt_op_xent_vocab_backward_beta(mpt_stream *stream, const float *logits,
                                                   const int32_t *targets, int64_t n,
                                                   int64_t vp, int64_t v, const float *stats,
                                                   const float *dloss, float *dlogits,
                                                   float beta);

#ifdef __cplusplus
}
#endif

#endif /* MPITRAIN_OPS_GPT_H */
