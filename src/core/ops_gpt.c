/* The public wrappers of include/mpitrain/ops_gpt.h, as src/core/ops.c does for ops.h: each
 * checks its arguments (MPT_EINVAL naming the op and the bad value), returns MPT_OK at once
 * when there is no work, then dispatches to the stream's backend (NULL stream: the CPU); a
 * backend without the slot gives MPT_ENOTSUP. A backend kernel therefore always sees positive
 * extents and non-NULL pointers for everything it must touch. No state. */
#include "core/backend.h"
#include "mpitrain/core.h"
#include "mpitrain/ops.h"

#define REQUIRE(cond, fmt, ...)                                                       \
  do {                                                                                \
    if (!(cond)) return MPT_FAIL(MPT_EINVAL, "%s: " fmt, __func__, __VA_ARGS__);      \
  } while (0)
#define REQUIRE_PTR(p) REQUIRE((p) != NULL, "%s is NULL", #p)
#define REQUIRE_NONNEG(v) REQUIRE((v) >= 0, "%s = %lld is negative", #v, (long long)(v))
/* Extents whose products below stay far from overflow (2^31 each, 2^62 in all). */
#define REQUIRE_EXTENT(v) REQUIRE((v) >= 0 && (v) <= INT32_MAX, "%s = %lld outside [0, 2^31)", \
                                  #v, (long long)(v))

#define DISPATCH(slot, ...)                                                                \
  do {                                                                                     \
    const mpt__device_backend *b_ = mpt__backend_of_stream(stream);                        \
    if (!b_ || !b_->slot)                                                                  \
      return MPT_FAIL(MPT_ENOTSUP, "%s: not available on the %s backend", __func__,        \
                      b_ ? b_->name : "unbuilt");                                          \
    return b_->slot(stream, __VA_ARGS__);                                                  \
  } while (0)

mpt_status mpt_op_embedding_gpt(mpt_stream *stream, const int32_t *tokens, int64_t b,
                                int64_t t, int64_t c, int64_t vocab, const float *wte,
                                const float *wpe, float *y) {
  REQUIRE_EXTENT(b);
  REQUIRE_EXTENT(t);
  REQUIRE_EXTENT(c);
  REQUIRE(vocab >= 1, "vocab = %lld must be >= 1", (long long)vocab);
  if (b == 0 || t == 0 || c == 0) return MPT_OK;
  REQUIRE_PTR(tokens);
  REQUIRE_PTR(wte);
  REQUIRE_PTR(wpe);
  REQUIRE_PTR(y);
  DISPATCH(embedding_gpt, tokens, b, t, c, vocab, wte, wpe, y);
}

mpt_status mpt_op_embedding_gpt_backward(mpt_stream *stream, const int32_t *tokens, int64_t b,
                                         int64_t t, int64_t c, int64_t vocab, const float *dy,
                                         float *dwte, float *dwpe) {
  REQUIRE_EXTENT(b);
  REQUIRE_EXTENT(t);
  REQUIRE_EXTENT(c);
  REQUIRE(vocab >= 1, "vocab = %lld must be >= 1", (long long)vocab);
  if (b == 0 || t == 0 || c == 0 || (!dwte && !dwpe)) return MPT_OK;
  REQUIRE_PTR(tokens);
  REQUIRE_PTR(dy);
  DISPATCH(embedding_gpt_backward, tokens, b, t, c, vocab, dy, dwte, dwpe);
}

mpt_status mpt_op_layernorm(mpt_stream *stream, const float *x, int64_t rows, int64_t c,
                            const float *w, const float *bias, float eps, float *y, float *mean,
                            float *rstd) {
  REQUIRE_EXTENT(rows);
  REQUIRE_EXTENT(c);
  REQUIRE(eps >= 0.0f && eps < 1e30f, "eps = %g must be finite and >= 0", (double)eps);
  if (rows == 0) return MPT_OK;
  REQUIRE(c >= 1, "c = %lld must be >= 1", (long long)c);
  REQUIRE_PTR(x);
  REQUIRE_PTR(w);
  REQUIRE_PTR(bias);
  REQUIRE_PTR(y);
  REQUIRE_PTR(mean);
  REQUIRE_PTR(rstd);
  DISPATCH(layernorm, x, rows, c, w, bias, eps, y, mean, rstd);
}

mpt_status mpt_op_layernorm_backward(mpt_stream *stream, const float *dy, const float *x,
                                     int64_t rows, int64_t c, const float *w, const float *mean,
                                     const float *rstd, float *dx, float *dw, float *dbias) {
  REQUIRE_EXTENT(rows);
  REQUIRE_EXTENT(c);
  if (rows == 0 || c == 0 || (!dx && !dw && !dbias)) return MPT_OK;
  REQUIRE_PTR(dy);
  REQUIRE_PTR(x);
  REQUIRE_PTR(w);
  REQUIRE_PTR(mean);
  REQUIRE_PTR(rstd);
  DISPATCH(layernorm_backward, dy, x, rows, c, w, mean, rstd, dx, dw, dbias);
}

mpt_status mpt_op_gelu(mpt_stream *stream, float *y, const float *x, int64_t count) {
  REQUIRE_NONNEG(count);
  if (count == 0) return MPT_OK;
  REQUIRE_PTR(y);
  REQUIRE_PTR(x);
  DISPATCH(gelu, y, x, count);
}

mpt_status mpt_op_gelu_backward(mpt_stream *stream, float *dx, const float *dy, const float *x,
                                int64_t count) {
  REQUIRE_NONNEG(count);
  if (count == 0) return MPT_OK;
  REQUIRE_PTR(dx);
  REQUIRE_PTR(dy);
  REQUIRE_PTR(x);
  DISPATCH(gelu_backward, dx, dy, x, count);
}

mpt_status mpt_op_causal_softmax(mpt_stream *stream, float *s, int64_t planes, int64_t t) {
  REQUIRE_EXTENT(planes);
  REQUIRE_EXTENT(t);
  if (planes == 0 || t == 0) return MPT_OK;
  REQUIRE_PTR(s);
  DISPATCH(causal_softmax, s, planes, t);
}

mpt_status mpt_op_causal_softmax_backward(mpt_stream *stream, const float *a, float *d,
                                          int64_t planes, int64_t t) {
  REQUIRE_EXTENT(planes);
  REQUIRE_EXTENT(t);
  if (planes == 0 || t == 0) return MPT_OK;
  REQUIRE_PTR(a);
  REQUIRE_PTR(d);
  DISPATCH(causal_softmax_backward, a, d, planes, t);
}

mpt_status mpt_op_xent_vocab(mpt_stream *stream, const float *logits, const int32_t *targets,
                             int64_t n, int64_t vp, int64_t v, float *stats, float *loss) {
  REQUIRE_EXTENT(n);
  REQUIRE_EXTENT(vp);
  REQUIRE(v >= 1 && v <= vp, "v = %lld outside [1, vp = %lld]", (long long)v, (long long)vp);
  REQUIRE(n >= 1, "n = %lld must be >= 1 (the mean of no position)", (long long)n);
  REQUIRE_PTR(logits);
  REQUIRE_PTR(targets);
  REQUIRE_PTR(stats);
  REQUIRE_PTR(loss);
  DISPATCH(xent_vocab, logits, targets, n, vp, v, stats, loss);
}

mpt_status mpt_op_xent_vocab_backward(mpt_stream *stream, const float *logits,
                                      const int32_t *targets, int64_t n, int64_t vp, int64_t v,
                                      const float *stats, const float *dloss, float *dlogits) {
  REQUIRE_EXTENT(n);
  REQUIRE_EXTENT(vp);
  REQUIRE(v >= 1 && v <= vp, "v = %lld outside [1, vp = %lld]", (long long)v, (long long)vp);
  if (n == 0) return MPT_OK;
  REQUIRE_PTR(logits);
  REQUIRE_PTR(targets);
  REQUIRE_PTR(stats);
  REQUIRE_PTR(dloss);
  REQUIRE_PTR(dlogits);
  DISPATCH(xent_vocab_backward, logits, targets, n, vp, v, stats, dloss, dlogits);
}

/* beta 0 through the backend's write slot when it has one, else zero-fill and add. */
mpt_status mpt_op_gelu_backward_beta(mpt_stream *stream, float *dx, const float *dy,
                                     const float *x, int64_t count, float beta) {
  REQUIRE(beta == 0.0f || beta == 1.0f, "beta = %g must be 0 or 1", (double)beta);
  if (beta == 1.0f) return mpt_op_gelu_backward(stream, dx, dy, x, count);
  REQUIRE_NONNEG(count);
  if (count == 0) return MPT_OK;
  REQUIRE_PTR(dx);
  REQUIRE_PTR(dy);
  REQUIRE_PTR(x);
  const mpt__device_backend *b = mpt__backend_of_stream(stream);
  if (b && b->gelu_backward_write) return b->gelu_backward_write(stream, dx, dy, x, count);
  MPT_RETURN_IF(mpt_op_fill(stream, dx, count, 0.0f));
  return mpt_op_gelu_backward(stream, dx, dy, x, count);
}

mpt_status mpt_op_xent_vocab_backward_beta(mpt_stream *stream, const float *logits,
                                           const int32_t *targets, int64_t n, int64_t vp,
                                           int64_t v, const float *stats, const float *dloss,
                                           float *dlogits, float beta) {
  REQUIRE(beta == 0.0f || beta == 1.0f, "beta = %g must be 0 or 1", (double)beta);
  if (beta == 1.0f)
    return mpt_op_xent_vocab_backward(stream, logits, targets, n, vp, v, stats, dloss, dlogits);
  REQUIRE_EXTENT(n);
  REQUIRE_EXTENT(vp);
  REQUIRE(v >= 1 && v <= vp, "v = %lld outside [1, vp = %lld]", (long long)v, (long long)vp);
  if (n == 0) return MPT_OK;
  REQUIRE_PTR(logits);
  REQUIRE_PTR(targets);
  REQUIRE_PTR(stats);
  REQUIRE_PTR(dloss);
  REQUIRE_PTR(dlogits);
  const mpt__device_backend *b = mpt__backend_of_stream(stream);
  if (b && b->xent_vocab_backward_write)
    return b->xent_vocab_backward_write(stream, logits, targets, n, vp, v, stats, dloss, dlogits);
  MPT_RETURN_IF(mpt_op_fill(stream, dlogits, n * vp, 0.0f));
  return mpt_op_xent_vocab_backward(stream, logits, targets, n, vp, v, stats, dloss, dlogits);
}

mpt_status mpt_op_add_layernorm(mpt_stream *stream, const float *a, const float *b,
                                int64_t rows, int64_t c, const float *w, const float *bias,
                                float eps, float *sum, float *y, float *mean, float *rstd) {
  REQUIRE_EXTENT(rows);
  REQUIRE_EXTENT(c);
  REQUIRE(eps >= 0.0f && eps < 1e30f, "eps = %g must be finite and >= 0", (double)eps);
  if (rows == 0) return MPT_OK;
  REQUIRE(c >= 1, "c = %lld must be >= 1", (long long)c);
  REQUIRE_PTR(a);
  REQUIRE_PTR(b);
  REQUIRE_PTR(w);
  REQUIRE_PTR(bias);
  REQUIRE_PTR(sum);
  REQUIRE_PTR(y);
  REQUIRE_PTR(mean);
  REQUIRE_PTR(rstd);
  REQUIRE(y != a && y != b && y != sum, "y must not be a, b or sum (%s)", "in place");
  DISPATCH(add_layernorm, a, b, rows, c, w, bias, eps, sum, y, mean, rstd);
}

mpt_status mpt_op_bias_gelu(mpt_stream *stream, float *y, const float *x, const float *bias,
                            int64_t rows, int64_t cols) {
  REQUIRE_EXTENT(rows);
  REQUIRE_EXTENT(cols);
  if (rows == 0 || cols == 0) return MPT_OK;
  REQUIRE_PTR(y);
  REQUIRE_PTR(x);
  REQUIRE_PTR(bias);
  DISPATCH(bias_gelu, y, x, bias, rows, cols);
}

mpt_status mpt_op_bias_gelu_backward(mpt_stream *stream, float *dx, const float *dy,
                                     const float *x, const float *bias, int64_t rows,
                                     int64_t cols, float *dbias) {
  REQUIRE_EXTENT(rows);
  REQUIRE_EXTENT(cols);
  if (rows == 0 || cols == 0) return MPT_OK;
  REQUIRE_PTR(dx);
  REQUIRE_PTR(dy);
  REQUIRE_PTR(x);
  REQUIRE_PTR(bias);
  REQUIRE(dx != dy && dx != x, "dx must not be dy or x (%s)", "written while they are read");
  DISPATCH(bias_gelu_backward, dx, dy, x, bias, rows, cols, dbias);
}

int mpt_op_causal_attention_available(mpt_stream *stream) {
  const mpt__device_backend *b = mpt__backend_of_stream(stream);
  return b && b->causal_attention && b->causal_attention_backward;
}

/* The shape checks of both directions: extents, C a positive multiple of nh. */
#define ATTENTION_CHECK()                                                                    \
  do {                                                                                       \
    REQUIRE_EXTENT(b);                                                                       \
    REQUIRE_EXTENT(t);                                                                       \
    REQUIRE_EXTENT(c);                                                                       \
    REQUIRE(nh >= 1 && nh <= c && c % nh == 0, "nh = %lld must divide c = %lld", (long long)nh, \
            (long long)c);                                                                   \
  } while (0)

mpt_status mpt_op_causal_attention(mpt_stream *stream, const float *qkv, int64_t b, int64_t t,
                                   int64_t c, int64_t nh, float *y, float *stats) {
  ATTENTION_CHECK();
  if (b == 0 || t == 0) return MPT_OK;
  REQUIRE_PTR(qkv);
  REQUIRE_PTR(y);
  REQUIRE_PTR(stats);
  DISPATCH(causal_attention, qkv, b, t, c, nh, y, stats);
}

mpt_status mpt_op_causal_attention_backward(mpt_stream *stream, const float *qkv,
                                            const float *stats, const float *dy, int64_t b,
                                            int64_t t, int64_t c, int64_t nh, float beta,
                                            float *dqkv) {
  ATTENTION_CHECK();
  REQUIRE(beta == 0.0f || beta == 1.0f, "beta = %g must be 0 or 1", (double)beta);
  if (b == 0 || t == 0) return MPT_OK;
  REQUIRE_PTR(qkv);
  REQUIRE_PTR(stats);
  REQUIRE_PTR(dy);
  REQUIRE_PTR(dqkv);
  DISPATCH(causal_attention_backward, qkv, stats, dy, b, t, c, nh, beta, dqkv);
}
