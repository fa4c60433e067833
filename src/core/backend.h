/* The device backend table (DESIGN.md "Backends are tables of functions"). Each backend fills
 * one; only device.c knows which were built (the registry). Public wrappers in ops.c, device.c
 * and stream.c check arguments, return early on empty work, then dispatch here. Slots marked
 * optional may be NULL (the wrapper then returns MPT_ENOTSUP). */
#ifndef MPT_CORE_BACKEND_H
#define MPT_CORE_BACKEND_H

#include "core/keeper.h"
#include "core/kernel_math.h" /* the per-element arithmetic every backend shares */
#include "mpitrain/core.h"
#include "mpitrain/ops.h"
#include "mpitrain/ops_bf16.h"
#include "mpitrain/ops_gpt.h"

typedef struct mpt__device_backend {
  const char *name;
  /* Devices present at run time. */
  int (*count)(void);
  mpt_status (*alloc)(int index, size_t nbytes, void **ptr);
  void (*free)(int index, void *ptr);
  /* Optional (NULL: nothing to do): make device `index` current on the calling thread. */
  mpt_status (*set_current)(int index);

  /* Streams and events: the backend allocates its own structs behind the opaque handles. */
  mpt_status (*stream_init)(mpt_stream **stream, mpt_device device, mpt_stream_kind kind);
  void (*stream_free)(mpt_stream *stream);
  /* Optional (NULL: the stream is simply leaked): detach the worker, drop queued work, leak the
   * struct (core.h mpt_stream_abandon). */
  void (*stream_abandon)(mpt_stream *stream);
  mpt_status (*stream_launch_host)(mpt_stream *stream, mpt_host_fn fn, void *arg);
  /* Optional (NULL: stream_launch_host, the keeper unused): a host function whose deadline the
   * waiters keep (core/keeper.h). */
  mpt_status (*stream_launch_host_kept)(mpt_stream *stream, mpt_host_fn fn, void *arg,
                                        mpt__keeper_fn keeper, void *keeper_arg);
  mpt_status (*stream_synchronize)(mpt_stream *stream, double timeout_ms);
  mpt_status (*stream_error)(const mpt_stream *stream);
  mpt_status (*stream_wait_event)(mpt_stream *stream, mpt_event *event, double timeout_ms);
  mpt_status (*event_init)(mpt_event **event, mpt_device device);
  void (*event_free)(mpt_event *event);
  mpt_status (*event_record)(mpt_event *event, mpt_stream *stream);
  mpt_status (*event_synchronize)(mpt_event *event, double timeout_ms);
  int (*event_query)(mpt_event *event);
  mpt_status (*event_elapsed_ms)(mpt_event *start, mpt_event *end, double *ms);
  /* Optional (NULL: a later wait binds to the event's latest record when it runs): a token for
   * the event's CURRENT record, and a wait for that record only, even if the event was
   * re-recorded since. The token must be waited for exactly once (a wait with timeout 0 only
   * releases it). For waits across backends, captured when the wait is enqueued. */
  mpt_status (*event_capture)(mpt_event *event, uint64_t *token);
  mpt_status (*event_wait_captured)(mpt_event *event, uint64_t token, double timeout_ms);

  /* Ops: same meaning and argument order as the public mpt_op_* in ops.h. */
  mpt_status (*memcpy)(mpt_stream *s, mpt_device dst_device, void *dst, mpt_device src_device,
                       const void *src, size_t nbytes);
  mpt_status (*gemm)(mpt_stream *s, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                     float alpha, const float *a, int64_t lda, const float *b, int64_t ldb,
                     float beta, float *c, int64_t ldc);
  mpt_status (*fill)(mpt_stream *s, float *x, int64_t count, float value);
  mpt_status (*copy)(mpt_stream *s, float *dst, const float *src, int64_t count);
  mpt_status (*axpy)(mpt_stream *s, int64_t count, float alpha, const float *x, float *y);
  mpt_status (*scale)(mpt_stream *s, float *x, int64_t count, float alpha);
  mpt_status (*mul)(mpt_stream *s, float *y, const float *a, const float *b, int64_t count);
  mpt_status (*mul_backward)(mpt_stream *s, float *da, const float *dy, const float *b,
                             int64_t count);
  mpt_status (*sum)(mpt_stream *s, const float *x, int64_t count, float *out);
  mpt_status (*sum_backward)(mpt_stream *s, float *dx, int64_t count, const float *dy,
                             float scale);
  mpt_status (*bias_add)(mpt_stream *s, float *y, const float *bias, int64_t rows, int64_t cols,
                         int64_t inner);
  mpt_status (*bias_backward)(mpt_stream *s, float *dbias, const float *dy, int64_t rows,
                              int64_t cols, int64_t inner);
  mpt_status (*relu)(mpt_stream *s, float *y, const float *x, int64_t count);
  mpt_status (*relu_backward)(mpt_stream *s, float *dx, const float *dy, const float *y,
                              int64_t count);
  mpt_status (*im2col)(mpt_stream *s, const mpt_conv_geom *g, const float *x, float *col);
  mpt_status (*col2im)(mpt_stream *s, const mpt_conv_geom *g, const float *col, float *dx);
  /* Optional: whole-batch library convolutions (g resolved, n and o >= 1). */
  mpt_status (*conv2d_forward)(mpt_stream *s, const mpt_conv_geom *g, int64_t n, int64_t o,
                               const float *x, const float *w, const float *b, float *y);
  mpt_status (*conv2d_backward_data)(mpt_stream *s, const mpt_conv_geom *g, int64_t n,
                                     int64_t o, const float *w, const float *dy, float *dx);
  mpt_status (*conv2d_backward_weights)(mpt_stream *s, const mpt_conv_geom *g, int64_t n,
                                        int64_t o, const float *x, const float *dy, float *dw,
                                        float *db);
  mpt_status (*maxpool)(mpt_stream *s, const mpt_conv_geom *g, int64_t planes, const float *x,
                        float *y, int32_t *argmax);
  mpt_status (*maxpool_backward)(mpt_stream *s, const mpt_conv_geom *g, int64_t planes,
                                 const float *dy, const int32_t *argmax, float *dx);
  mpt_status (*batchnorm_train)(mpt_stream *s, const float *x, int64_t n, int64_t c,
                                int64_t inner, const float *gamma, const float *beta, float eps,
                                float momentum, float *running_mean, float *running_var,
                                float *y, float *save_mean, float *save_invstd);
  mpt_status (*batchnorm_eval)(mpt_stream *s, const float *x, int64_t n, int64_t c,
                               int64_t inner, const float *gamma, const float *beta, float eps,
                               const float *running_mean, const float *running_var, float *y);
  mpt_status (*batchnorm_backward)(mpt_stream *s, const float *dy, const float *x, int64_t n,
                                   int64_t c, int64_t inner, const float *gamma,
                                   const float *save_mean, const float *save_invstd, float *dx,
                                   float *dgamma, float *dbeta);
  mpt_status (*softmax_xent)(mpt_stream *s, const float *logits, const int32_t *labels,
                             int64_t n, int64_t k, float *probs, float *loss);
  mpt_status (*softmax_xent_backward)(mpt_stream *s, const float *probs, const int32_t *labels,
                                      int64_t n, int64_t k, const float *dloss, float *dlogits);
  mpt_status (*count_correct)(mpt_stream *s, const float *logits, const int32_t *labels,
                              int64_t n, int64_t k, int64_t *correct);
  mpt_status (*dropout)(mpt_stream *s, const float *x, float *y, float *mask, int64_t count,
                        float p, uint64_t seed);
  mpt_status (*sgd_step)(mpt_stream *s, float *param, const float *grad, float *momentum_buf,
                         int64_t count, float lr, float momentum, float dampening,
                         float weight_decay, int nesterov, int first);
  mpt_status (*adamw_step)(mpt_stream *s, float *param, const float *grad, float *m, float *v,
                           int64_t count, float lr, float beta1, float beta2, float eps,
                           float weight_decay, int64_t step);
  mpt_status (*check_finite)(mpt_stream *s, const float *x, int64_t count, int *nonfinite);

  /* Optional: bf16 compute (include/mpitrain/ops_bf16.h), same meaning and order. bf16_check
   * says whether the device runs them natively (MPT_ENOTSUP with the reason, else MPT_OK). */
  mpt_status (*bf16_check)(mpt_stream *s);
  mpt_status (*gemm_bf16)(mpt_stream *s, int trans_a, int trans_b, int64_t m, int64_t n,
                          int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                          int64_t ldb, float beta, float *c, int64_t ldc);
  /* Optional within the optional: bf16 operands rounded once by the caller (a backend without
   * them leaves the layers on gemm_bf16). */
  mpt_status (*bf16_round)(mpt_stream *s, const float *x, uint16_t *y, int64_t count);
  mpt_status (*gemm_bf16_batched)(mpt_stream *s, int trans_a, int trans_b, int64_t batch,
                                  int64_t m, int64_t n, int64_t k, float alpha,
                                  const uint16_t *a, int64_t lda, int64_t stride_a,
                                  const uint16_t *b, int64_t ldb, int64_t stride_b, float beta,
                                  float *c, int64_t ldc, int64_t stride_c);
  mpt_status (*heads_split_bf16)(mpt_stream *s, const float *x, int64_t nb, int64_t nt,
                                 int64_t parts, int64_t nh, int64_t hs, uint16_t *y);
  mpt_status (*heads_merge)(mpt_stream *s, const float *x, int64_t nb, int64_t nt,
                            int64_t parts, int64_t nh, int64_t hs, float beta, float *y);
  mpt_status (*conv2d_forward_bf16)(mpt_stream *s, const mpt_conv_geom *g, int64_t n, int64_t o,
                                    const float *x, const float *w, const float *b, float *y);
  mpt_status (*conv2d_backward_data_bf16)(mpt_stream *s, const mpt_conv_geom *g, int64_t n,
                                          int64_t o, const float *w, const float *dy, float *dx);
  mpt_status (*conv2d_backward_weights_bf16)(mpt_stream *s, const mpt_conv_geom *g, int64_t n,
                                             int64_t o, const float *x, const float *dy,
                                             float *dw, float *db);

  /* Optional: the transformer ops of include/mpitrain/ops_gpt.h, same meaning and order. */
  mpt_status (*embedding_gpt)(mpt_stream *s, const int32_t *tokens, int64_t b, int64_t t,
                              int64_t c, int64_t vocab, const float *wte, const float *wpe,
                              float *y);
  mpt_status (*embedding_gpt_backward)(mpt_stream *s, const int32_t *tokens, int64_t b,
                                       int64_t t, int64_t c, int64_t vocab, const float *dy,
                                       float *dwte, float *dwpe);
  mpt_status (*layernorm)(mpt_stream *s, const float *x, int64_t rows, int64_t c,
                          const float *w, const float *bias, float eps, float *y, float *mean,
                          float *rstd);
  mpt_status (*layernorm_backward)(mpt_stream *s, const float *dy, const float *x, int64_t rows,
                                   int64_t c, const float *w, const float *mean,
                                   const float *rstd, float *dx, float *dw, float *dbias);
  mpt_status (*gelu)(mpt_stream *s, float *y, const float *x, int64_t count);
  mpt_status (*gelu_backward)(mpt_stream *s, float *dx, const float *dy, const float *x,
                              int64_t count);
  mpt_status (*causal_softmax)(mpt_stream *s, float *a, int64_t planes, int64_t t);
  mpt_status (*causal_softmax_backward)(mpt_stream *s, const float *a, float *d, int64_t planes,
                                        int64_t t);
  mpt_status (*xent_vocab)(mpt_stream *s, const float *logits, const int32_t *targets,
                           int64_t n, int64_t vp, int64_t v, float *stats, float *loss);
  mpt_status (*xent_vocab_backward)(mpt_stream *s, const float *logits, const int32_t *targets,
                                    int64_t n, int64_t vp, int64_t v, const float *stats,
                                    const float *dloss, float *dlogits);
  /* Optional: the Llama ops of ops_llama.h, same meaning and order; rope's last argument is 1
   * for the backward (the inverse rotation); a non-NULL inv_freq [d/2] replaces theta (the
   * angle is then the float product p inv_freq[i], mpt_op_rope_freqs). */
  mpt_status (*rmsnorm)(mpt_stream *s, const float *x, int64_t rows, int64_t c, const float *w,
                        float eps, float *y, float *rstd);
  mpt_status (*rmsnorm_backward)(mpt_stream *s, const float *dy, const float *x, int64_t rows,
                                 int64_t c, const float *w, const float *rstd, float *dx,
                                 float *dw);
  mpt_status (*rope)(mpt_stream *s, float *x, int64_t b, int64_t t, int64_t heads, int64_t d,
                     float theta, const float *inv_freq, int inverse);
  mpt_status (*swiglu)(mpt_stream *s, float *y, const float *gate, const float *up,
                       int64_t count);
  mpt_status (*swiglu_backward)(mpt_stream *s, const float *dy, const float *gate,
                                const float *up, int64_t count, float *dgate, float *dup);
  /* Optional: the fused ops of ops_gpt.h (mpt_op_add_layernorm, mpt_op_bias_gelu and its
   * backward), same meaning and order. */
  mpt_status (*add_layernorm)(mpt_stream *s, const float *a, const float *b, int64_t rows,
                              int64_t c, const float *w, const float *bias, float eps,
                              float *sum, float *y, float *mean, float *rstd);
  mpt_status (*bias_gelu)(mpt_stream *s, float *y, const float *x, const float *bias,
                          int64_t rows, int64_t cols);
  mpt_status (*bias_gelu_backward)(mpt_stream *s, float *dx, const float *dy, const float *x,
                                   const float *bias, int64_t rows, int64_t cols,
                                   float *dbias);
  /* Optional: gelu_backward / xent_vocab_backward that WRITE (=) every element of dx / dlogits
   * (0 in the padded columns [v, vp)) instead of adding, without reading it first. Without
   * them mpt_op_*_beta with beta 0 zero-fills, then adds. */
  mpt_status (*gelu_backward_write)(mpt_stream *s, float *dx, const float *dy, const float *x,
                                    int64_t count);
  mpt_status (*xent_vocab_backward_write)(mpt_stream *s, const float *logits,
                                          const int32_t *targets, int64_t n, int64_t vp,
                                          int64_t v, const float *stats, const float *dloss,
                                          float *dlogits);
  /* Optional: the fused causal attention of ops_gpt.h (mpt_op_causal_attention_available);
   * without it the layer runs the reference (src/nn/attention.c) on gemm and causal_softmax. */
  mpt_status (*causal_attention)(mpt_stream *s, const float *qkv, int64_t b, int64_t t,
                                 int64_t c, int64_t nh, float *y, float *stats);
  mpt_status (*causal_attention_backward)(mpt_stream *s, const float *qkv, const float *stats,
                                          const float *dy, int64_t b, int64_t t, int64_t c,
                                          int64_t nh, float beta, float *dqkv);
} mpt__device_backend;

/* The registry: the backend for a device type, or NULL when it was not built. */
const mpt__device_backend *mpt__backend_get(mpt_device_type type);
/* The backend a stream belongs to (NULL stream: the CPU backend). */
const mpt__device_backend *mpt__backend_of_stream(const mpt_stream *stream);

/* A wait enqueued on one backend's stream for another backend's event (device.c): capture the
 * event's current record when the wait is ENQUEUED, then wait for that record when the wait
 * runs, so that a host running a step ahead (and re-recording the event) does not make the
 * stream wait for the next step's record, which may depend on this stream (a deadlock until
 * the timeout). Backends without the slots: token 0, and the wait is mpt_event_synchronize. */
mpt_status mpt__event_capture(mpt_event *event, uint64_t *token);
mpt_status mpt__event_wait_captured(mpt_event *event, uint64_t token, double timeout_ms);

/* Every stream struct starts with this header so the dispatcher can find its backend. */
typedef struct mpt__stream_header {
  mpt_device device;
  mpt_stream_kind kind;
} mpt__stream_header;

/* Every event struct starts with this header too. */
typedef struct mpt__event_header {
  mpt_device device;
} mpt__event_header;

extern const mpt__device_backend mpt__cpu_backend;
#ifdef MPT_HAVE_CUDA
extern const mpt__device_backend mpt__cuda_backend;
#endif


#endif
