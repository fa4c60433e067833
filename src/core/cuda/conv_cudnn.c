/* Whole-batch convolutions on CUDA (ops.h mpt_op_conv2d_*): cuDNN (the library PyTorch uses on
 * GPUs) for the forward pass and both backward passes, with im2col + cuBLAS GEMM per image as
 * the fallback (and the reference the tests compare against, tests/test_cuda_ops.c).
 *
 * cuDNN: one handle per stream, created on the stream's first convolution and bound to it
 * (cudnnSetStream). Per stream, a plan per shape (N, C, H, W, O, kh, kw, stride, pad): the
 * tensor, filter and convolution descriptors and the three algorithms, chosen once by cuDNN's
 * heuristics (cudnnGet*Algorithm_v7, the first that is supported in FMA math: plain FP32, no
 * TF32, so the results equal im2col + GEMM up to summation order) with a workspace under
 * WORKSPACE_MAX_NBYTES. The workspace comes from the caching allocator per call (freed after
 * the enqueue: stream-ordered reuse is the allocator's contract). A shape for which cuDNN has
 * no algorithm, or a call that cuDNN refuses as not supported, goes to the im2col path; other
 * cuDNN errors are returned (MPT_EDEVICE naming the call).
 *
 * Legacy cuDNN API (deprecated in cuDNN 9 but present, warnings off unless
 * CUDNN_WARN_DEPRECATED): the graph API would need its own plan cache for the same result.
 * Threads: a stream is used by one thread at a time; its handle and plans are its own. */
#include "config.h"

#include <stdlib.h>
#include <string.h>

#include "core/cuda/cuda_internal.h"
#include "mpitrain/core.h"

#define DEV(s) ((s)->h.device.index)

/* ---- the im2col path (fallback and reference) ---- */

static mpt_status col_buffer(mpt_stream *s, const mpt_conv_geom *g, float **col) {
  const size_t nbytes =
      (size_t)(g->channels * g->kernel_h * g->kernel_w * g->out_h * g->out_w) * sizeof(float);
  return mpt__cuda_alloc(DEV(s), nbytes, (void **)col);
}

mpt_status mpt__cuda_conv2d_forward_im2col(mpt_stream *s, const mpt_conv_geom *g, int64_t n,
                                           int64_t o, const float *x, const float *w,
                                           const float *b, float *y) {
  const int64_t kdim = g->channels * g->kernel_h * g->kernel_w, l = g->out_h * g->out_w;
  const int64_t x_img = g->channels * g->height * g->width;
  float *col = NULL;
  MPT_RETURN_IF(col_buffer(s, g, &col));
  mpt_status st = MPT_OK;
  for (int64_t i = 0; i < n && st == MPT_OK; i++) {
    st = mpt__cuda_im2col(s, g, x + i * x_img, col);
    if (st == MPT_OK)
      st = mpt__cuda_gemm(s, 0, 0, o, l, kdim, 1.0f, w, kdim, col, l, 0.0f, y + i * o * l, l);
  }
  if (st == MPT_OK && b) st = mpt__cuda_bias_add(s, y, b, n, o, l);
  mpt__cuda_free(DEV(s), col);
  return st;
}

mpt_status mpt__cuda_conv2d_backward_data_im2col(mpt_stream *s, const mpt_conv_geom *g,
                                                 int64_t n, int64_t o, const float *w,
                                                 const float *dy, float *dx) {
  const int64_t kdim = g->channels * g->kernel_h * g->kernel_w, l = g->out_h * g->out_w;
  const int64_t x_img = g->channels * g->height * g->width;
  float *col = NULL;
  MPT_RETURN_IF(col_buffer(s, g, &col));
  mpt_status st = MPT_OK;
  for (int64_t i = 0; i < n && st == MPT_OK; i++) {
    st = mpt__cuda_gemm(s, 1, 0, kdim, l, o, 1.0f, w, kdim, dy + i * o * l, l, 0.0f, col, l);
    if (st == MPT_OK) st = mpt__cuda_col2im(s, g, col, dx + i * x_img);
  }
  mpt__cuda_free(DEV(s), col);
  return st;
}

mpt_status mpt__cuda_conv2d_backward_weights_im2col(mpt_stream *s, const mpt_conv_geom *g,
                                                    int64_t n, int64_t o, const float *x,
                                                    const float *dy, float *dw, float *db) {
  const int64_t kdim = g->channels * g->kernel_h * g->kernel_w, l = g->out_h * g->out_w;
  const int64_t x_img = g->channels * g->height * g->width;
  if (db) MPT_RETURN_IF(mpt__cuda_bias_backward(s, db, dy, n, o, l));
  float *col = NULL;
  MPT_RETURN_IF(col_buffer(s, g, &col));
  mpt_status st = MPT_OK;
  for (int64_t i = 0; i < n && st == MPT_OK; i++) {
    st = mpt__cuda_im2col(s, g, x + i * x_img, col);
    if (st == MPT_OK)
      st = mpt__cuda_gemm(s, 0, 1, o, kdim, l, 1.0f, dy + i * o * l, l, col, l, 1.0f, dw, kdim);
  }
  mpt__cuda_free(DEV(s), col);
  return st;
}

#ifdef MPT_HAVE_CUDNN
#include <cudnn.h>

#define WORKSPACE_MAX_NBYTES ((size_t)512 << 20)

typedef struct mpt__cudnn_plan {
  int64_t key[9]; /* n, C, H, W, O, kh, kw, stride, pad */
  cudnnTensorDescriptor_t x, y, b;
  cudnnFilterDescriptor_t w;
  cudnnConvolutionDescriptor_t conv;
  int has_fwd, has_data, has_filter; /* cuDNN has an algorithm for this shape */
  cudnnConvolutionFwdAlgo_t fwd;
  cudnnConvolutionBwdDataAlgo_t data;
  cudnnConvolutionBwdFilterAlgo_t filter;
  size_t ws_fwd, ws_data, ws_filter;
  struct mpt__cudnn_plan *next;
} mpt__cudnn_plan;

static mpt_status cudnn_fail(cudnnStatus_t e, const char *what, int dev) {
  return MPT_FAIL(e == CUDNN_STATUS_ALLOC_FAILED ? MPT_ENOMEM : MPT_EDEVICE,
                  "%s failed on cuda:%d: %s", what, dev, cudnnGetErrorString(e));
}

#define DNN_RETURN_IF(call, dev)                                  \
  do {                                                            \
    const cudnnStatus_t e_ = (call);                              \
    if (e_ != CUDNN_STATUS_SUCCESS) return cudnn_fail(e_, #call, (dev)); \
  } while (0)

static void plan_free(mpt__cudnn_plan *p) {
  if (p->x) cudnnDestroyTensorDescriptor(p->x);
  if (p->y) cudnnDestroyTensorDescriptor(p->y);
  if (p->b) cudnnDestroyTensorDescriptor(p->b);
  if (p->w) cudnnDestroyFilterDescriptor(p->w);
  if (p->conv) cudnnDestroyConvolutionDescriptor(p->conv);
  free(p);
}

void mpt__cudnn_stream_free(mpt_stream *s) {
  for (mpt__cudnn_plan *p = s->dnn_plans, *next; p; p = next) {
    next = p->next;
    plan_free(p);
  }
  s->dnn_plans = NULL;
  if (s->dnn) cudnnDestroy((cudnnHandle_t)s->dnn);
  s->dnn = NULL;
}

static mpt_status handle_of(mpt_stream *s, cudnnHandle_t *h) {
  if (!s->dnn) {
    cudnnHandle_t nh = NULL;
    DNN_RETURN_IF(cudnnCreate(&nh), DEV(s));
    const cudnnStatus_t e = cudnnSetStream(nh, s->cs);
    if (e != CUDNN_STATUS_SUCCESS) {
      cudnnDestroy(nh);
      return cudnn_fail(e, "cudnnSetStream", DEV(s));
    }
    s->dnn = nh;
  }
  *h = (cudnnHandle_t)s->dnn;
  return MPT_OK;
}

/* The first heuristic result that is supported, in FMA math, with a workspace that fits. */
#define PICK(perf, count, out, ws, has)                                                   \
  do {                                                                                    \
    for (int k_ = 0; k_ < (count) && !(has); k_++)                                        \
      if ((perf)[k_].status == CUDNN_STATUS_SUCCESS &&                                    \
          (perf)[k_].mathType != CUDNN_TENSOR_OP_MATH &&                                  \
          (perf)[k_].mathType != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION &&                 \
          (perf)[k_].memory <= WORKSPACE_MAX_NBYTES) {                                    \
        (out) = (perf)[k_].algo;                                                          \
        (ws) = (perf)[k_].memory;                                                         \
        (has) = 1;                                                                        \
      }                                                                                   \
  } while (0)

static mpt_status plan_make(mpt_stream *s, cudnnHandle_t h, const int64_t key[9],
                            mpt__cudnn_plan **out) {
  const int dev = DEV(s);
  mpt__cudnn_plan *p = calloc(1, sizeof *p);
  if (!p) return MPT_FAIL(MPT_ENOMEM, "cannot allocate a cuDNN plan");
  memcpy(p->key, key, sizeof p->key);
  const int n = (int)key[0], c = (int)key[1], hh = (int)key[2], ww = (int)key[3],
            o = (int)key[4], kh = (int)key[5], kw = (int)key[6], st = (int)key[7],
            pad = (int)key[8];
  mpt_status rc = MPT_OK;
#define PLAN_CHECK(call)                                  \
  do {                                                    \
    const cudnnStatus_t e_ = (call);                      \
    if (e_ != CUDNN_STATUS_SUCCESS) {                     \
      rc = cudnn_fail(e_, #call, dev);                    \
      goto fail;                                          \
    }                                                     \
  } while (0)
  PLAN_CHECK(cudnnCreateTensorDescriptor(&p->x));
  PLAN_CHECK(cudnnCreateTensorDescriptor(&p->y));
  PLAN_CHECK(cudnnCreateTensorDescriptor(&p->b));
  PLAN_CHECK(cudnnCreateFilterDescriptor(&p->w));
  PLAN_CHECK(cudnnCreateConvolutionDescriptor(&p->conv));
  PLAN_CHECK(cudnnSetTensor4dDescriptor(p->x, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, n, c, hh, ww));
  PLAN_CHECK(cudnnSetFilter4dDescriptor(p->w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, o, c, kh, kw));
  PLAN_CHECK(cudnnSetConvolution2dDescriptor(p->conv, pad, pad, st, st, 1, 1,
                                             CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  PLAN_CHECK(cudnnSetConvolutionMathType(p->conv, CUDNN_FMA_MATH));
  int yn = 0, yc = 0, yh = 0, yw = 0;
  PLAN_CHECK(cudnnGetConvolution2dForwardOutputDim(p->conv, p->x, p->w, &yn, &yc, &yh, &yw));
  PLAN_CHECK(cudnnSetTensor4dDescriptor(p->y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, yn, yc, yh, yw));
  PLAN_CHECK(cudnnSetTensor4dDescriptor(p->b, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, o, 1, 1));
  {
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int count = 0;
    PLAN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, p->x, p->w, p->conv, p->y,
                                                      CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &count,
                                                      perf));
    PICK(perf, count, p->fwd, p->ws_fwd, p->has_fwd);
  }
  {
    cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    int count = 0;
    PLAN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(
        h, p->w, p->y, p->conv, p->x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &count, perf));
    PICK(perf, count, p->data, p->ws_data, p->has_data);
  }
  {
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int count = 0;
    PLAN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(
        h, p->x, p->y, p->conv, p->w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &count, perf));
    PICK(perf, count, p->filter, p->ws_filter, p->has_filter);
  }
#undef PLAN_CHECK
  if (!p->has_fwd || !p->has_data || !p->has_filter)
    mpt_log(MPT_LOG_DEBUG,
            "cuDNN has no FP32 algorithm for conv [%d,%d,%d,%d] x [%d,%d,%d,%d] (fwd %d, "
            "data %d, filter %d): im2col for the rest", n, c, hh, ww, o, c, kh, kw,
            p->has_fwd, p->has_data, p->has_filter);
  p->next = s->dnn_plans;
  s->dnn_plans = p;
  *out = p;
  return MPT_OK;
fail:
  plan_free(p);
  return rc;
}

/* The stream's handle and the plan of this shape (made on first use). */
static mpt_status plan_of(mpt_stream *s, const mpt_conv_geom *g, int64_t n, int64_t o,
                          cudnnHandle_t *h, mpt__cudnn_plan **plan) {
  MPT_RETURN_IF(mpt__cuda_stream_enter(s));
  MPT_RETURN_IF(handle_of(s, h));
  const int64_t key[9] = {n, g->channels, g->height, g->width, o,
                          g->kernel_h, g->kernel_w, g->stride, g->pad};
  for (mpt__cudnn_plan *p = s->dnn_plans; p; p = p->next)
    if (memcmp(p->key, key, sizeof key) == 0) {
      *plan = p;
      return MPT_OK;
    }
  for (int i = 0; i < 9; i++)
    if (key[i] > 0x7fffffff) {
      *plan = NULL; /* beyond cuDNN's int dimensions: im2col */
      return MPT_OK;
    }
  return plan_make(s, *h, key, plan);
}

static mpt_status workspace(mpt_stream *s, size_t nbytes, void **ws) {
  *ws = NULL;
  return nbytes ? mpt__cuda_alloc(DEV(s), nbytes, ws) : MPT_OK;
}

mpt_status mpt__cuda_conv2d_forward(mpt_stream *s, const mpt_conv_geom *g, int64_t n, int64_t o,
                                    const float *x, const float *w, const float *b, float *y) {
  cudnnHandle_t h;
  mpt__cudnn_plan *p = NULL;
  MPT_RETURN_IF(plan_of(s, g, n, o, &h, &p));
  if (!p || !p->has_fwd) return mpt__cuda_conv2d_forward_im2col(s, g, n, o, x, w, b, y);
  void *ws = NULL;
  MPT_RETURN_IF(workspace(s, p->ws_fwd, &ws));
  const float one = 1.0f, zero = 0.0f;
  cudnnStatus_t e = cudnnConvolutionForward(h, &one, p->x, x, p->w, w, p->conv, p->fwd, ws,
                                            p->ws_fwd, &zero, p->y, y);
  mpt__cuda_free(DEV(s), ws);
  if (e == CUDNN_STATUS_NOT_SUPPORTED) {
    p->has_fwd = 0;
    return mpt__cuda_conv2d_forward_im2col(s, g, n, o, x, w, b, y);
  }
  if (e != CUDNN_STATUS_SUCCESS) return cudnn_fail(e, "cudnnConvolutionForward", DEV(s));
  if (b) DNN_RETURN_IF(cudnnAddTensor(h, &one, p->b, b, &one, p->y, y), DEV(s));
  return MPT_OK;
}

mpt_status mpt__cuda_conv2d_backward_data(mpt_stream *s, const mpt_conv_geom *g, int64_t n,
                                          int64_t o, const float *w, const float *dy,
                                          float *dx) {
  cudnnHandle_t h;
  mpt__cudnn_plan *p = NULL;
  MPT_RETURN_IF(plan_of(s, g, n, o, &h, &p));
  if (!p || !p->has_data) return mpt__cuda_conv2d_backward_data_im2col(s, g, n, o, w, dy, dx);
  void *ws = NULL;
  MPT_RETURN_IF(workspace(s, p->ws_data, &ws));
  const float one = 1.0f;
  cudnnStatus_t e = cudnnConvolutionBackwardData(h, &one, p->w, w, p->y, dy, p->conv, p->data,
                                                 ws, p->ws_data, &one, p->x, dx);
  mpt__cuda_free(DEV(s), ws);
  if (e == CUDNN_STATUS_NOT_SUPPORTED) {
    p->has_data = 0;
    return mpt__cuda_conv2d_backward_data_im2col(s, g, n, o, w, dy, dx);
  }
  if (e != CUDNN_STATUS_SUCCESS) return cudnn_fail(e, "cudnnConvolutionBackwardData", DEV(s));
  return MPT_OK;
}

mpt_status mpt__cuda_conv2d_backward_weights(mpt_stream *s, const mpt_conv_geom *g, int64_t n,
                                             int64_t o, const float *x, const float *dy,
                                             float *dw, float *db) {
  cudnnHandle_t h;
  mpt__cudnn_plan *p = NULL;
  MPT_RETURN_IF(plan_of(s, g, n, o, &h, &p));
  if (!p || !p->has_filter)
    return mpt__cuda_conv2d_backward_weights_im2col(s, g, n, o, x, dy, dw, db);
  void *ws = NULL;
  MPT_RETURN_IF(workspace(s, p->ws_filter, &ws));
  const float one = 1.0f;
  cudnnStatus_t e = cudnnConvolutionBackwardFilter(h, &one, p->x, x, p->y, dy, p->conv,
                                                   p->filter, ws, p->ws_filter, &one, p->w, dw);
  mpt__cuda_free(DEV(s), ws);
  if (e == CUDNN_STATUS_NOT_SUPPORTED) {
    p->has_filter = 0;
    return mpt__cuda_conv2d_backward_weights_im2col(s, g, n, o, x, dy, dw, db);
  }
  if (e != CUDNN_STATUS_SUCCESS) return cudnn_fail(e, "cudnnConvolutionBackwardFilter", DEV(s));
  if (db) DNN_RETURN_IF(cudnnConvolutionBackwardBias(h, &one, p->y, dy, &one, p->b, db), DEV(s));
  return MPT_OK;
}

#else /* no cuDNN: the library slots are the im2col path */

void mpt__cudnn_stream_free(mpt_stream *s) { (void)s; }

#endif
