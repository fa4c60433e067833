/* The CUDA kernels' launchers: extern "C" functions defined in the kernels_*.cu files, called
 * by the backend's C files. Each enqueues its kernel(s) on stream `s` of the current device and
 * returns cudaGetLastError() (launch errors; execution errors surface at the next wait).
 *
 * Arguments are as in include/mpitrain/ops.h (device pointers, element counts), already checked
 * by ops.c: extents non-negative, pointers set, at least one element of work, geometry
 * resolved. Scalars derived from hyper-parameters (bias corrections, 1/(1-p)) are computed by
 * the caller exactly as the CPU backend computes them, so both backends see the same floats.
 * Scratch arguments point into the stream's device scratch (cuda_internal.h). */
#ifndef MPT_CORE_CUDA_KERNELS_H
#define MPT_CORE_CUDA_KERNELS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "mpitrain/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* kernels_elementwise.cu */
cudaError_t mpt__cuk_fill(cudaStream_t s, float *x, int64_t n, float value);
cudaError_t mpt__cuk_axpy(cudaStream_t s, int64_t n, float alpha, const float *x, float *y);
cudaError_t mpt__cuk_scale(cudaStream_t s, float *x, int64_t n, float alpha);
cudaError_t mpt__cuk_mul(cudaStream_t s, float *y, const float *a, const float *b, int64_t n);
cudaError_t mpt__cuk_mul_backward(cudaStream_t s, float *da, const float *dy, const float *b,
                                  int64_t n);
/* *out = (float) sum in double; partials: double[MPT__CUDA_MAX_PARTIALS] scratch. n >= 1. */
cudaError_t mpt__cuk_sum(cudaStream_t s, const float *x, int64_t n, double *partials,
                         float *out);
cudaError_t mpt__cuk_sum_backward(cudaStream_t s, float *dx, int64_t n, const float *dy,
                                  float scale);
cudaError_t mpt__cuk_bias_add(cudaStream_t s, float *y, const float *bias, int64_t rows,
                              int64_t cols, int64_t inner);
cudaError_t mpt__cuk_bias_backward(cudaStream_t s, float *dbias, const float *dy, int64_t rows,
                                   int64_t cols, int64_t inner);
cudaError_t mpt__cuk_relu(cudaStream_t s, float *y, const float *x, int64_t n);
cudaError_t mpt__cuk_relu_backward(cudaStream_t s, float *dx, const float *dy, const float *y,
                                   int64_t n);
/* keep = 1 / (1 - p), computed by the caller in float. */
cudaError_t mpt__cuk_dropout(cudaStream_t s, const float *x, float *y, float *mask, int64_t n,
                             float p, float keep, uint64_t seed);
/* C (m x n, row stride ldc) = beta * C; beta == 0 overwrites (gemm with k == 0). */
cudaError_t mpt__cuk_scale_matrix(cudaStream_t s, float *c, int64_t m, int64_t n, int64_t ldc,
                                  float beta);
/* *flag (device uint64) = 1 if any x[i] is NaN or infinite, else 0. */
cudaError_t mpt__cuk_check_finite(cudaStream_t s, const float *x, int64_t n, uint64_t *flag);

/* kernels_bf16.cu: dst (rows x cols, tight, bf16 bits) = round to nearest even of src (row
 * stride ld). */
cudaError_t mpt__cuk_round_bf16(cudaStream_t s, const float *src, int64_t rows, int64_t cols,
                                int64_t ld, uint16_t *dst);
/* out[i] = round to nearest even of (sum over q = 0 .. world-1, in that order, in float32, of
 * pieces[q * stride + i] widened), divided by world first when avg; i < n (the bfloat16
 * reduction rounded once of the NCCL backend). */
cudaError_t mpt__cuk_bf16_sum_pieces(cudaStream_t s, const uint16_t *pieces, int world,
                                     int64_t stride, int64_t n, int avg, uint16_t *out);

/* kernels_conv.cu */
cudaError_t mpt__cuk_im2col(cudaStream_t s, mpt_conv_geom g, const float *x, float *col);
cudaError_t mpt__cuk_col2im(cudaStream_t s, mpt_conv_geom g, const float *col, float *dx);
cudaError_t mpt__cuk_maxpool(cudaStream_t s, mpt_conv_geom g, int64_t planes, const float *x,
                             float *y, int32_t *argmax);
cudaError_t mpt__cuk_maxpool_backward(cudaStream_t s, mpt_conv_geom g, int64_t planes,
                                      const float *dy, const int32_t *argmax, float *dx);

/* kernels_norm.cu (c >= 1 channels; n * inner >= 1, >= 2 in training) */
cudaError_t mpt__cuk_batchnorm_train(cudaStream_t s, const float *x, int64_t n, int64_t c,
                                     int64_t inner, const float *gamma, const float *beta,
                                     float eps, float momentum, float *running_mean,
                                     float *running_var, float *y, float *save_mean,
                                     float *save_invstd);
cudaError_t mpt__cuk_batchnorm_eval(cudaStream_t s, const float *x, int64_t n, int64_t c,
                                    int64_t inner, const float *gamma, const float *beta,
                                    float eps, const float *running_mean,
                                    const float *running_var, float *y);
cudaError_t mpt__cuk_batchnorm_backward(cudaStream_t s, const float *dy, const float *x,
                                        int64_t n, int64_t c, int64_t inner,
                                        const float *gamma, const float *save_mean,
                                        const float *save_invstd, float *dx, float *dgamma,
                                        float *dbeta);

/* kernels_loss.cu. A label outside [0, k) is never used as an index: its row's loss is NaN
 * (so the mean loss is NaN) and backward skips its one-hot term. */
cudaError_t mpt__cuk_softmax_xent(cudaStream_t s, const float *logits, const int32_t *labels,
                                  int64_t n, int64_t k, float *probs, double *partials,
                                  float *loss);
cudaError_t mpt__cuk_softmax_xent_backward(cudaStream_t s, const float *probs,
                                           const int32_t *labels, int64_t n, int64_t k,
                                           const float *dloss, float *dlogits);
/* counters[0] = rows whose first-maximum argmax equals the label; counters[1] = the first row
 * with a label outside [0, k), or UINT64_MAX if none. Both are (re)set by the launcher. */
cudaError_t mpt__cuk_count_correct(cudaStream_t s, const float *logits, const int32_t *labels,
                                   int64_t n, int64_t k, uint64_t *counters);

/* kernels_optim.cu */
cudaError_t mpt__cuk_sgd_step(cudaStream_t s, float *param, const float *grad,
                              float *momentum_buf, int64_t n, float lr, float momentum,
                              float dampening, float weight_decay, int nesterov, int first);
/* decay = 1 - lr * wd, step_size = lr / bc1, bc2_sqrt = sqrt(bc2): as the CPU computes them. */
cudaError_t mpt__cuk_adamw_step(cudaStream_t s, float *param, const float *grad, float *m,
                                float *v, int64_t n, float decay, float step_size,
                                float bc2_sqrt, float beta1, float beta2, float eps);

/* kernels_gpt.cu: the transformer ops (include/mpitrain/ops_gpt.h). partials:
 * double[MPT__CUDA_MAX_PARTIALS] scratch. */
cudaError_t mpt__cuk_embedding_gpt(cudaStream_t s, const int32_t *tokens, int64_t b, int64_t t,
                                   int64_t c, int64_t vocab, const float *wte, const float *wpe,
                                   float *y);
cudaError_t mpt__cuk_embedding_gpt_backward(cudaStream_t s, const int32_t *tokens, int64_t b,
                                            int64_t t, int64_t c, int64_t vocab,
                                            const float *dy, float *dwte, float *dwpe);
cudaError_t mpt__cuk_layernorm(cudaStream_t s, const float *x, int64_t rows, int64_t c,
                               const float *w, const float *bias, float eps, float *y,
                               float *mean, float *rstd);
cudaError_t mpt__cuk_layernorm_backward(cudaStream_t s, const float *dy, const float *x,
                                        int64_t rows, int64_t c, const float *w,
                                        const float *mean, const float *rstd, float *dx,
                                        float *dw, float *dbias);
cudaError_t mpt__cuk_gelu(cudaStream_t s, float *y, const float *x, int64_t n);
cudaError_t mpt__cuk_gelu_backward(cudaStream_t s, float *dx, const float *dy, const float *x,
                                   int64_t n);
cudaError_t mpt__cuk_add_layernorm(cudaStream_t s, const float *a, const float *b, int64_t rows,
                                   int64_t c, const float *w, const float *bias, float eps,
                                   float *sum, float *y, float *mean, float *rstd);
cudaError_t mpt__cuk_bias_gelu(cudaStream_t s, float *y, const float *x, const float *bias,
                               int64_t rows, int64_t cols);
cudaError_t mpt__cuk_bias_gelu_backward(cudaStream_t s, float *dx, const float *dy,
                                        const float *x, const float *bias, int64_t rows,
                                        int64_t cols, float *dbias);
cudaError_t mpt__cuk_causal_softmax(cudaStream_t s, float *a, int64_t planes, int64_t t);
cudaError_t mpt__cuk_causal_softmax_backward(cudaStream_t s, const float *a, float *d,
                                             int64_t planes, int64_t t);
cudaError_t mpt__cuk_xent_vocab(cudaStream_t s, const float *logits, const int32_t *targets,
                                int64_t n, int64_t vp, int64_t v, float *stats, double *partials,
                                float *loss);
cudaError_t mpt__cuk_xent_vocab_backward(cudaStream_t s, const float *logits,
                                         const int32_t *targets, int64_t n, int64_t vp,
                                         int64_t v, const float *stats, const float *dloss,
                                         float *dlogits);

#ifdef __cplusplus
}
#endif

#endif
