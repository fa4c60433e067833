/* CUDA op wrappers of the transformer ops (include/mpitrain/ops_gpt.h): as in ops_cuda_nn.c
 * each re-raises the stream's sticky error, makes its device current and enqueues the kernels
 * of kernels_gpt.cu on the stream; src/core/ops_gpt.c has checked the arguments. None of them
 * synchronises: ids outside their range give NaN (kernels_gpt.cu) rather than an error. */
#include "core/cuda/cuda_internal.h"
#include "core/cuda/kernels.h"
#include "mpitrain/core.h"

#define DEV(s) ((s)->h.device.index)

#define LAUNCH(s, call)                              \
  do {                                               \
    MPT_RETURN_IF(mpt__cuda_stream_enter(s));        \
    MPT_CUDA_RETURN_IF(call, DEV(s));                \
    return MPT_OK;                                   \
  } while (0)

mpt_status mpt__cuda_embedding_gpt(mpt_stream *s, const int32_t *tokens, int64_t b, int64_t t,
                                   int64_t c, int64_t vocab, const float *wte, const float *wpe,
                                   float *y) {
  LAUNCH(s, mpt__cuk_embedding_gpt(s->cs, tokens, b, t, c, vocab, wte, wpe, y));
}

mpt_status mpt__cuda_embedding_gpt_backward(mpt_stream *s, const int32_t *tokens, int64_t b,
                                            int64_t t, int64_t c, int64_t vocab,
                                            const float *dy, float *dwte, float *dwpe) {
  LAUNCH(s, mpt__cuk_embedding_gpt_backward(s->cs, tokens, b, t, c, vocab, dy, dwte, dwpe));
}

mpt_status mpt__cuda_layernorm(mpt_stream *s, const float *x, int64_t rows, int64_t c,
                               const float *w, const float *bias, float eps, float *y,
                               float *mean, float *rstd) {
  LAUNCH(s, mpt__cuk_layernorm(s->cs, x, rows, c, w, bias, eps, y, mean, rstd));
}

mpt_status mpt__cuda_layernorm_backward(mpt_stream *s, const float *dy, const float *x,
                                        int64_t rows, int64_t c, const float *w,
                                        const float *mean, const float *rstd, float *dx,
                                        float *dw, float *dbias) {
  LAUNCH(s, mpt__cuk_layernorm_backward(s->cs, dy, x, rows, c, w, mean, rstd, dx, dw, dbias));
}

mpt_status mpt__cuda_gelu(mpt_stream *s, float *y, const float *x, int64_t count) {
  LAUNCH(s, mpt__cuk_gelu(s->cs, y, x, count));
}

mpt_status mpt__cuda_gelu_backward(mpt_stream *s, float *dx, const float *dy, const float *x,
                                   int64_t count) {
  LAUNCH(s, mpt__cuk_gelu_backward(s->cs, dx, dy, x, count));
}

mpt_status mpt__cuda_add_layernorm(mpt_stream *s, const float *a, const float *b, int64_t rows,
                                   int64_t c, const float *w, const float *bias, float eps,
                                   float *sum, float *y, float *mean, float *rstd) {
  LAUNCH(s, mpt__cuk_add_layernorm(s->cs, a, b, rows, c, w, bias, eps, sum, y, mean, rstd));
}

mpt_status mpt__cuda_bias_gelu(mpt_stream *s, float *y, const float *x, const float *bias,
                               int64_t rows, int64_t cols) {
  LAUNCH(s, mpt__cuk_bias_gelu(s->cs, y, x, bias, rows, cols));
}

mpt_status mpt__cuda_bias_gelu_backward(mpt_stream *s, float *dx, const float *dy,
                                        const float *x, const float *bias, int64_t rows,
                                        int64_t cols, float *dbias) {
  LAUNCH(s, mpt__cuk_bias_gelu_backward(s->cs, dx, dy, x, bias, rows, cols, dbias));
}

mpt_status mpt__cuda_causal_softmax(mpt_stream *s, float *a, int64_t planes, int64_t t) {
  LAUNCH(s, mpt__cuk_causal_softmax(s->cs, a, planes, t));
}

mpt_status mpt__cuda_causal_softmax_backward(mpt_stream *s, const float *a, float *d,
                                             int64_t planes, int64_t t) {
  LAUNCH(s, mpt__cuk_causal_softmax_backward(s->cs, a, d, planes, t));
}

mpt_status mpt__cuda_xent_vocab(mpt_stream *s, const float *logits, const int32_t *targets,
                                int64_t n, int64_t vp, int64_t v, float *stats, float *loss) {
  double *partials = (double *)((char *)s->scratch + MPT__CUDA_SCRATCH_PARTIALS);
  LAUNCH(s, mpt__cuk_xent_vocab(s->cs, logits, targets, n, vp, v, stats, partials, loss));
}

mpt_status mpt__cuda_xent_vocab_backward(mpt_stream *s, const float *logits,
                                         const int32_t *targets, int64_t n, int64_t vp,
                                         int64_t v, const float *stats, const float *dloss,
                                         float *dlogits) {
  LAUNCH(s, mpt__cuk_xent_vocab_backward(s->cs, logits, targets, n, vp, v, stats, dloss,
                                         dlogits));
}
