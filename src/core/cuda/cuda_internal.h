/* CUDA backend internals: the stream and event structs behind the opaque handles, the backend's
 * slot functions (assembled into mpt__cuda_backend by cuda_backend.c) and the helpers shared by
 * its files. Only src/core/cuda/ includes this header; other layers use core/cuda/cuda.h.
 *
 * Invariants:
 * - A CUDA stream owns one cudaStream_t on device h.device.index, a lazily created cuBLAS handle
 *   bound to it, a device scratch buffer (reduction partials and counters) and a pinned host
 *   scratch (results read back by count_correct / check_finite). Work enqueued on the stream
 *   uses the scratch in stream order, so one buffer per stream suffices.
 * - The sticky status lives in a reference-counted cell shared by the stream and by every event
 *   recorded on it, so an event outlives its stream safely and still reports its status.
 * - Every entry point makes the stream's (or event's) device current first (cudaSetDevice). */
#ifndef MPT_CORE_CUDA_INTERNAL_H
#define MPT_CORE_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>

#include "core/backend.h"
#include "core/cuda/cuda.h"
#include "core/cuda/cuda_check.h"

/* Reduction partials per kernel (one per block; kernels.h launches at most this many). */
#define MPT__CUDA_MAX_PARTIALS 1024
/* Deadline of the host-side waits that an op makes itself (count_correct, check_finite read a
 * result back): generous, only a hung device reaches it. */
#define MPT__CUDA_RESULT_TIMEOUT_MS 600000.0

/* The sticky status of a stream; events recorded on the stream hold a reference. */
typedef struct mpt__cuda_cell {
  pthread_mutex_t mutex;
  int refs;
  mpt_status status;
  char detail[1024];
} mpt__cuda_cell;

/* A host function queued with cudaLaunchHostFunc (or a wait on a CPU event). */
typedef struct mpt__cuda_host_work {
  struct mpt_stream *stream;
  mpt_host_fn fn;      /* NULL: wait on cpu_event */
  void *arg;
  mpt_event *cpu_event;
  uint64_t token; /* cpu_event's record captured at enqueue (mpt__event_capture) */
  double timeout_ms;
  struct mpt__cuda_host_work *next; /* free list */
} mpt__cuda_host_work;

struct mpt_stream {
  mpt__stream_header h;
  cudaStream_t cs;
  cublasHandle_t blas;     /* NULL until the first gemm */
  cudaEvent_t sync_event;  /* recorded by synchronize and by result read-backs, then polled */
  mpt__cuda_cell *cell;
  atomic_int failed;       /* mirror of cell->status != MPT_OK, read without the lock */
  void *scratch;           /* device: double[MPT__CUDA_MAX_PARTIALS] then 4 x uint64 */
  void *host_scratch;      /* pinned host: 4 x uint64 */
  pthread_mutex_t work_mutex; /* guards work_free */
  mpt__cuda_host_work *work_free;
  void *dnn;                        /* cudnnHandle_t, NULL until the first convolution */
  struct mpt__cudnn_plan *dnn_plans; /* conv_cudnn.c: per-shape descriptors and algorithms */
  struct mpt_stream *next_live; /* the allocator's per-device list of live streams */
};

struct mpt_event {
  mpt__event_header h;
  cudaEvent_t ev;       /* timing enabled, for mpt_event_elapsed_ms */
  pthread_mutex_t mutex; /* guards cell (record and synchronize may run on two threads) */
  mpt__cuda_cell *cell; /* of the stream it was last recorded on; NULL before */
};

/* Byte offsets in the stream's device scratch. */
#define MPT__CUDA_SCRATCH_PARTIALS 0
#define MPT__CUDA_SCRATCH_COUNTERS (MPT__CUDA_MAX_PARTIALS * sizeof(double))
#define MPT__CUDA_SCRATCH_NBYTES (MPT__CUDA_SCRATCH_COUNTERS + 4 * sizeof(uint64_t))

/* ---- cuda_backend.c ---- */
int mpt__cuda_count(void);
/* Makes device `index` current on the calling thread. Errors: MPT_EINVAL (not present),
 * MPT_EDEVICE. */
mpt_status mpt__cuda_use(int index);
/* Polls `ev` (cudaEventQuery, sleeping between polls) until it completes or timeout_ms passes
 * (negative: no deadline). `what` names the wait in the MPT_ETIMEOUT message. */
mpt_status mpt__cuda_poll_event(cudaEvent_t ev, int device, double timeout_ms, const char *what);

/* ---- cuda_alloc.c: the caching allocator ---- */
mpt_status mpt__cuda_alloc(int index, size_t nbytes, void **ptr);
void mpt__cuda_free(int index, void *ptr);
/* Live streams take part in the allocator's fences (see cuda_alloc.c). */
void mpt__cuda_alloc_add_stream(int index, mpt_stream *s);
void mpt__cuda_alloc_remove_stream(int index, mpt_stream *s);

/* ---- cuda_stream.c ---- */
mpt_status mpt__cuda_stream_init(mpt_stream **stream, mpt_device device, mpt_stream_kind kind);
void mpt__cuda_stream_free(mpt_stream *stream);
mpt_status mpt__cuda_stream_launch_host(mpt_stream *stream, mpt_host_fn fn, void *arg);
mpt_status mpt__cuda_stream_synchronize(mpt_stream *stream, double timeout_ms);
mpt_status mpt__cuda_stream_error(const mpt_stream *stream);
mpt_status mpt__cuda_stream_wait_event(mpt_stream *stream, mpt_event *event, double timeout_ms);
mpt_status mpt__cuda_event_init(mpt_event **event, mpt_device device);
void mpt__cuda_event_free(mpt_event *event);
mpt_status mpt__cuda_event_record(mpt_event *event, mpt_stream *stream);
mpt_status mpt__cuda_event_synchronize(mpt_event *event, double timeout_ms);
int mpt__cuda_event_query(mpt_event *event);
mpt_status mpt__cuda_event_elapsed_ms(mpt_event *start, mpt_event *end, double *ms);
mpt_status mpt__cuda_event_capture(mpt_event *event, uint64_t *token);
mpt_status mpt__cuda_event_wait_captured(mpt_event *event, uint64_t token, double timeout_ms);
/* Called first by every op: re-raises the stream's sticky error, makes its device current. */
mpt_status mpt__cuda_stream_enter(mpt_stream *s);
/* Waits (with a deadline) until everything enqueued on s so far has run; for ops that hand a
 * result to the host. Returns the sticky status. */
mpt_status mpt__cuda_stream_drain(mpt_stream *s, double timeout_ms, const char *what);

/* ---- ops_cuda.c, ops_cuda_nn.c: same meaning as the mpt_op_* of ops.h ---- */
mpt_status mpt__cuda_memcpy(mpt_stream *s, mpt_device dst_device, void *dst, mpt_device src_device, const void *src, size_t nbytes);
mpt_status mpt__cuda_gemm(mpt_stream *s, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
mpt_status mpt__cuda_fill(mpt_stream *s, float *x, int64_t count, float value);
mpt_status mpt__cuda_copy(mpt_stream *s, float *dst, const float *src, int64_t count);
mpt_status mpt__cuda_axpy(mpt_stream *s, int64_t count, float alpha, const float *x, float *y);
mpt_status mpt__cuda_scale(mpt_stream *s, float *x, int64_t count, float alpha);
mpt_status mpt__cuda_mul(mpt_stream *s, float *y, const float *a, const float *b, int64_t count);
mpt_status mpt__cuda_mul_backward(mpt_stream *s, float *da, const float *dy, const float *b, int64_t count);
mpt_status mpt__cuda_sum(mpt_stream *s, const float *x, int64_t count, float *out);
mpt_status mpt__cuda_sum_backward(mpt_stream *s, float *dx, int64_t count, const float *dy, float scale);
mpt_status mpt__cuda_bias_add(mpt_stream *s, float *y, const float *bias, int64_t rows, int64_t cols, int64_t inner);
mpt_status mpt__cuda_bias_backward(mpt_stream *s, float *dbias, const float *dy, int64_t rows, int64_t cols, int64_t inner);
mpt_status mpt__cuda_relu(mpt_stream *s, float *y, const float *x, int64_t count);
mpt_status mpt__cuda_relu_backward(mpt_stream *s, float *dx, const float *dy, const float *y, int64_t count);
mpt_status mpt__cuda_dropout(mpt_stream *s, const float *x, float *y, float *mask, int64_t count, float p, uint64_t seed);
mpt_status mpt__cuda_check_finite(mpt_stream *s, const float *x, int64_t count, int *nonfinite);
/* ops_cuda.c: bf16 GEMM through cublasGemmEx (include/mpitrain/ops_bf16.h) and its device check. */
mpt_status mpt__cuda_bf16_check(mpt_stream *s);
mpt_status mpt__cuda_gemm_bf16(mpt_stream *s, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
/* conv_cudnn.c: the library convolution slots (cuDNN, with im2col + GEMM as the fallback), the
 * im2col versions of the same (the fallback, and the reference of the tests), and the release
 * of a stream's cuDNN handle and plans. */
mpt_status mpt__cuda_conv2d_forward(mpt_stream *s, const mpt_conv_geom *g, int64_t n, int64_t o,
                                    const float *x, const float *w, const float *b, float *y);
mpt_status mpt__cuda_conv2d_backward_data(mpt_stream *s, const mpt_conv_geom *g, int64_t n,
                                          int64_t o, const float *w, const float *dy, float *dx);
mpt_status mpt__cuda_conv2d_backward_weights(mpt_stream *s, const mpt_conv_geom *g, int64_t n,
                                             int64_t o, const float *x, const float *dy,
                                             float *dw, float *db);
mpt_status mpt__cuda_conv2d_forward_im2col(mpt_stream *s, const mpt_conv_geom *g, int64_t n,
                                           int64_t o, const float *x, const float *w,
                                           const float *b, float *y);
mpt_status mpt__cuda_conv2d_backward_data_im2col(mpt_stream *s, const mpt_conv_geom *g,
                                                 int64_t n, int64_t o, const float *w,
                                                 const float *dy, float *dx);
mpt_status mpt__cuda_conv2d_backward_weights_im2col(mpt_stream *s, const mpt_conv_geom *g,
                                                    int64_t n, int64_t o, const float *x,
                                                    const float *dy, float *dw, float *db);
void mpt__cudnn_stream_free(mpt_stream *s);
mpt_status mpt__cuda_im2col(mpt_stream *s, const mpt_conv_geom *g, const float *x, float *col);
mpt_status mpt__cuda_col2im(mpt_stream *s, const mpt_conv_geom *g, const float *col, float *dx);
mpt_status mpt__cuda_maxpool(mpt_stream *s, const mpt_conv_geom *g, int64_t planes, const float *x, float *y, int32_t *argmax);
mpt_status mpt__cuda_maxpool_backward(mpt_stream *s, const mpt_conv_geom *g, int64_t planes, const float *dy, const int32_t *argmax, float *dx);
mpt_status mpt__cuda_batchnorm_train(mpt_stream *s, const float *x, int64_t n, int64_t c, int64_t inner, const float *gamma, const float *beta, float eps, float momentum, float *running_mean, float *running_var, float *y, float *save_mean, float *save_invstd);
mpt_status mpt__cuda_batchnorm_eval(mpt_stream *s, const float *x, int64_t n, int64_t c, int64_t inner, const float *gamma, const float *beta, float eps, const float *running_mean, const float *running_var, float *y);
mpt_status mpt__cuda_batchnorm_backward(mpt_stream *s, const float *dy, const float *x, int64_t n, int64_t c, int64_t inner, const float *gamma, const float *save_mean, const float *save_invstd, float *dx, float *dgamma, float *dbeta);
mpt_status mpt__cuda_softmax_xent(mpt_stream *s, const float *logits, const int32_t *labels, int64_t n, int64_t k, float *probs, float *loss);
mpt_status mpt__cuda_softmax_xent_backward(mpt_stream *s, const float *probs, const int32_t *labels, int64_t n, int64_t k, const float *dloss, float *dlogits);
mpt_status mpt__cuda_count_correct(mpt_stream *s, const float *logits, const int32_t *labels, int64_t n, int64_t k, int64_t *correct);
mpt_status mpt__cuda_sgd_step(mpt_stream *s, float *param, const float *grad, float *momentum_buf, int64_t count, float lr, float momentum, float dampening, float weight_decay, int nesterov, int first);
mpt_status mpt__cuda_adamw_step(mpt_stream *s, float *param, const float *grad, float *m, float *v, int64_t count, float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step);
/* ---- ops_cuda_gpt.c: the transformer ops (include/mpitrain/ops_gpt.h) ---- */
mpt_status mpt__cuda_embedding_gpt(mpt_stream *s, const int32_t *tokens, int64_t b, int64_t t, int64_t c, int64_t vocab, const float *wte, const float *wpe, float *y);
mpt_status mpt__cuda_embedding_gpt_backward(mpt_stream *s, const int32_t *tokens, int64_t b, int64_t t, int64_t c, int64_t vocab, const float *dy, float *dwte, float *dwpe);
mpt_status mpt__cuda_layernorm(mpt_stream *s, const float *x, int64_t rows, int64_t c, const float *w, const float *bias, float eps, float *y, float *mean, float *rstd);
mpt_status mpt__cuda_layernorm_backward(mpt_stream *s, const float *dy, const float *x, int64_t rows, int64_t c, const float *w, const float *mean, const float *rstd, float *dx, float *dw, float *dbias);
mpt_status mpt__cuda_gelu(mpt_stream *s, float *y, const float *x, int64_t count);
mpt_status mpt__cuda_gelu_backward(mpt_stream *s, float *dx, const float *dy, const float *x, int64_t count);
mpt_status mpt__cuda_add_layernorm(mpt_stream *s, const float *a, const float *b, int64_t rows, int64_t c, const float *w, const float *bias, float eps, float *sum, float *y, float *mean, float *rstd);
mpt_status mpt__cuda_bias_gelu(mpt_stream *s, float *y, const float *x, const float *bias, int64_t rows, int64_t cols);
mpt_status mpt__cuda_bias_gelu_backward(mpt_stream *s, float *dx, const float *dy, const float *x, const float *bias, int64_t rows, int64_t cols, float *dbias);
mpt_status mpt__cuda_causal_softmax(mpt_stream *s, float *a, int64_t planes, int64_t t);
mpt_status mpt__cuda_causal_softmax_backward(mpt_stream *s, const float *a, float *d, int64_t planes, int64_t t);
mpt_status mpt__cuda_xent_vocab(mpt_stream *s, const float *logits, const int32_t *targets, int64_t n, int64_t vp, int64_t v, float *stats, float *loss);
mpt_status mpt__cuda_xent_vocab_backward(mpt_stream *s, const float *logits, const int32_t *targets, int64_t n, int64_t vp, int64_t v, const float *stats, const float *dloss, float *dlogits);

#endif
