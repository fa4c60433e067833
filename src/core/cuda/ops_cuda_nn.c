/* CUDA op wrappers, part 2: convolution windows, pooling, batch normalisation, softmax
 * cross-entropy, the accuracy count and the optimizer steps. As in ops_cuda.c each re-raises
 * the stream's sticky error, makes its device current and enqueues kernels (kernels_*.cu) on
 * the stream; src/core/ops.c has checked the arguments and resolved the geometry.
 *
 * count_correct writes a HOST int64, so it synchronises: the counters are copied to the
 * stream's pinned scratch and the stream is drained (deadline MPT__CUDA_RESULT_TIMEOUT_MS).
 * That is one host synchronisation per call; the trainer calls it once per batch after it has
 * read the loss (itself a synchronisation), so it adds no stall of its own. Labels outside
 * [0, k) give MPT_EINVAL naming the first such row, as on the CPU. softmax_xent does not
 * synchronise: a bad label makes the loss NaN instead (kernels_loss.cu). */
#include <math.h>

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

mpt_status mpt__cuda_im2col(mpt_stream *s, const mpt_conv_geom *g, const float *x, float *col) {
  LAUNCH(s, mpt__cuk_im2col(s->cs, *g, x, col));
}

mpt_status mpt__cuda_col2im(mpt_stream *s, const mpt_conv_geom *g, const float *col, float *dx) {
  LAUNCH(s, mpt__cuk_col2im(s->cs, *g, col, dx));
}

mpt_status mpt__cuda_maxpool(mpt_stream *s, const mpt_conv_geom *g, int64_t planes,
                             const float *x, float *y, int32_t *argmax) {
  LAUNCH(s, mpt__cuk_maxpool(s->cs, *g, planes, x, y, argmax));
}

/* An argmax that maxpool did not produce is ignored rather than refused (refusing it would
 * need a synchronisation); it cannot write outside dx. */
mpt_status mpt__cuda_maxpool_backward(mpt_stream *s, const mpt_conv_geom *g, int64_t planes,
                                      const float *dy, const int32_t *argmax, float *dx) {
  LAUNCH(s, mpt__cuk_maxpool_backward(s->cs, *g, planes, dy, argmax, dx));
}

mpt_status mpt__cuda_batchnorm_train(mpt_stream *s, const float *x, int64_t n, int64_t c,
                                     int64_t inner, const float *gamma, const float *beta,
                                     float eps, float momentum, float *running_mean,
                                     float *running_var, float *y, float *save_mean,
                                     float *save_invstd) {
  LAUNCH(s, mpt__cuk_batchnorm_train(s->cs, x, n, c, inner, gamma, beta, eps, momentum,
                                     running_mean, running_var, y, save_mean, save_invstd));
}

mpt_status mpt__cuda_batchnorm_eval(mpt_stream *s, const float *x, int64_t n, int64_t c,
                                    int64_t inner, const float *gamma, const float *beta,
                                    float eps, const float *running_mean,
                                    const float *running_var, float *y) {
  LAUNCH(s, mpt__cuk_batchnorm_eval(s->cs, x, n, c, inner, gamma, beta, eps, running_mean,
                                    running_var, y));
}

mpt_status mpt__cuda_batchnorm_backward(mpt_stream *s, const float *dy, const float *x,
                                        int64_t n, int64_t c, int64_t inner,
                                        const float *gamma, const float *save_mean,
                                        const float *save_invstd, float *dx, float *dgamma,
                                        float *dbeta) {
  LAUNCH(s, mpt__cuk_batchnorm_backward(s->cs, dy, x, n, c, inner, gamma, save_mean,
                                        save_invstd, dx, dgamma, dbeta));
}

mpt_status mpt__cuda_softmax_xent(mpt_stream *s, const float *logits, const int32_t *labels,
                                  int64_t n, int64_t k, float *probs, float *loss) {
  double *partials = (double *)((char *)s->scratch + MPT__CUDA_SCRATCH_PARTIALS);
  LAUNCH(s, mpt__cuk_softmax_xent(s->cs, logits, labels, n, k, probs, partials, loss));
}

mpt_status mpt__cuda_softmax_xent_backward(mpt_stream *s, const float *probs,
                                           const int32_t *labels, int64_t n, int64_t k,
                                           const float *dloss, float *dlogits) {
  LAUNCH(s, mpt__cuk_softmax_xent_backward(s->cs, probs, labels, n, k, dloss, dlogits));
}

mpt_status mpt__cuda_count_correct(mpt_stream *s, const float *logits, const int32_t *labels,
                                   int64_t n, int64_t k, int64_t *correct) {
  MPT_RETURN_IF(mpt__cuda_stream_enter(s));
  uint64_t *counters = (uint64_t *)((char *)s->scratch + MPT__CUDA_SCRATCH_COUNTERS);
  uint64_t *host = s->host_scratch; /* [0] hits, [1] first bad row, [2] its label */
  MPT_CUDA_RETURN_IF(mpt__cuk_count_correct(s->cs, logits, labels, n, k, counters), DEV(s));
  MPT_CUDA_RETURN_IF(cudaMemcpyAsync(host, counters, 2 * sizeof *host, cudaMemcpyDeviceToHost,
                                     s->cs),
                     DEV(s));
  MPT_RETURN_IF(mpt__cuda_stream_drain(s, MPT__CUDA_RESULT_TIMEOUT_MS, "count_correct"));
  if (host[1] != UINT64_MAX) {
    const int64_t row = (int64_t)host[1];
    int32_t *label = (int32_t *)&host[2];
    MPT_CUDA_RETURN_IF(cudaMemcpyAsync(label, labels + row, sizeof *label,
                                       cudaMemcpyDeviceToHost, s->cs),
                       DEV(s));
    MPT_RETURN_IF(mpt__cuda_stream_drain(s, MPT__CUDA_RESULT_TIMEOUT_MS, "count_correct"));
    return MPT_FAIL(MPT_EINVAL, "count_correct: row %lld has label %d outside [0, %lld)",
                    (long long)row, (int)*label, (long long)k);
  }
  *correct += (int64_t)host[0];
  return MPT_OK;
}

mpt_status mpt__cuda_sgd_step(mpt_stream *s, float *param, const float *grad,
                              float *momentum_buf, int64_t count, float lr, float momentum,
                              float dampening, float weight_decay, int nesterov, int first) {
  LAUNCH(s, mpt__cuk_sgd_step(s->cs, param, grad, momentum_buf, count, lr, momentum, dampening,
                              weight_decay, nesterov, first));
}

/* The bias corrections in double, rounded once, exactly as src/core/cpu/optim_cpu.c. */
mpt_status mpt__cuda_adamw_step(mpt_stream *s, float *param, const float *grad, float *m,
                                float *v, int64_t count, float lr, float beta1, float beta2,
                                float eps, float weight_decay, int64_t step) {
  const float decay = (float)(1.0 - (double)lr * weight_decay);
  const double bc1 = 1.0 - pow(beta1, (double)step), bc2 = 1.0 - pow(beta2, (double)step);
  const float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
  LAUNCH(s, mpt__cuk_adamw_step(s->cs, param, grad, m, v, count, decay, step_size, bc2_sqrt,
                                beta1, beta2, eps));
}
