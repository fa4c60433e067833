/* STUB: replaced by the checked wrappers. */
#include "core/backend.h"
#include "core/error.h"

mpt_status mpt_op_memcpy(mpt_stream *stream, mpt_device dst_device, void *dst, mpt_device src_device, const void *src, size_t nbytes) { return MPT_FAIL(MPT_ENOTSUP, "memcpy"); }
mpt_status mpt_op_gemm(mpt_stream *stream, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) { return MPT_FAIL(MPT_ENOTSUP, "gemm"); }
mpt_status mpt_op_fill(mpt_stream *stream, float *x, int64_t count, float value) { return MPT_FAIL(MPT_ENOTSUP, "fill"); }
mpt_status mpt_op_copy(mpt_stream *stream, float *dst, const float *src, int64_t count) { return MPT_FAIL(MPT_ENOTSUP, "copy"); }
mpt_status mpt_op_axpy(mpt_stream *stream, int64_t count, float alpha, const float *x, float *y) { return MPT_FAIL(MPT_ENOTSUP, "axpy"); }
mpt_status mpt_op_scale(mpt_stream *stream, float *x, int64_t count, float alpha) { return MPT_FAIL(MPT_ENOTSUP, "scale"); }
mpt_status mpt_op_mul(mpt_stream *stream, float *y, const float *a, const float *b, int64_t count) { return MPT_FAIL(MPT_ENOTSUP, "mul"); }
mpt_status mpt_op_mul_backward(mpt_stream *stream, float *da, const float *dy, const float *b, int64_t count) { return MPT_FAIL(MPT_ENOTSUP, "mul_backward"); }
mpt_status mpt_op_sum(mpt_stream *stream, const float *x, int64_t count, float *out) { return MPT_FAIL(MPT_ENOTSUP, "sum"); }
mpt_status mpt_op_sum_backward(mpt_stream *stream, float *dx, int64_t count, const float *dy, float scale) { return MPT_FAIL(MPT_ENOTSUP, "sum_backward"); }
mpt_status mpt_op_bias_add(mpt_stream *stream, float *y, const float *bias, int64_t rows, int64_t cols, int64_t inner) { return MPT_FAIL(MPT_ENOTSUP, "bias_add"); }
mpt_status mpt_op_bias_backward(mpt_stream *stream, float *dbias, const float *dy, int64_t rows, int64_t cols, int64_t inner) { return MPT_FAIL(MPT_ENOTSUP, "bias_backward"); }
mpt_status mpt_op_relu(mpt_stream *stream, float *y, const float *x, int64_t count) { return MPT_FAIL(MPT_ENOTSUP, "relu"); }
mpt_status mpt_op_relu_backward(mpt_stream *stream, float *dx, const float *dy, const float *y, int64_t count) { return MPT_FAIL(MPT_ENOTSUP, "relu_backward"); }
mpt_status mpt_op_im2col(mpt_stream *stream, const mpt_conv_geom *g, const float *x, float *col) { return MPT_FAIL(MPT_ENOTSUP, "im2col"); }
mpt_status mpt_op_col2im(mpt_stream *stream, const mpt_conv_geom *g, const float *col, float *dx) { return MPT_FAIL(MPT_ENOTSUP, "col2im"); }
mpt_status mpt_op_maxpool(mpt_stream *stream, const mpt_conv_geom *g, int64_t planes, const float *x, float *y, int32_t *argmax) { return MPT_FAIL(MPT_ENOTSUP, "maxpool"); }
mpt_status mpt_op_maxpool_backward(mpt_stream *stream, const mpt_conv_geom *g, int64_t planes, const float *dy, const int32_t *argmax, float *dx) { return MPT_FAIL(MPT_ENOTSUP, "maxpool_backward"); }
mpt_status mpt_op_batchnorm_train(mpt_stream *stream, const float *x, int64_t n, int64_t c, int64_t inner, const float *gamma, const float *beta, float eps, float momentum, float *running_mean, float *running_var, float *y, float *save_mean, float *save_invstd) { return MPT_FAIL(MPT_ENOTSUP, "batchnorm_train"); }
mpt_status mpt_op_batchnorm_eval(mpt_stream *stream, const float *x, int64_t n, int64_t c, int64_t inner, const float *gamma, const float *beta, float eps, const float *running_mean, const float *running_var, float *y) { return MPT_FAIL(MPT_ENOTSUP, "batchnorm_eval"); }
mpt_status mpt_op_batchnorm_backward(mpt_stream *stream, const float *dy, const float *x, int64_t n, int64_t c, int64_t inner, const float *gamma, const float *save_mean, const float *save_invstd, float *dx, float *dgamma, float *dbeta) { return MPT_FAIL(MPT_ENOTSUP, "batchnorm_backward"); }
mpt_status mpt_op_softmax_xent(mpt_stream *stream, const float *logits, const int32_t *labels, int64_t n, int64_t k, float *probs, float *loss) { return MPT_FAIL(MPT_ENOTSUP, "softmax_xent"); }
mpt_status mpt_op_softmax_xent_backward(mpt_stream *stream, const float *probs, const int32_t *labels, int64_t n, int64_t k, const float *dloss, float *dlogits) { return MPT_FAIL(MPT_ENOTSUP, "softmax_xent_backward"); }
mpt_status mpt_op_count_correct(mpt_stream *stream, const float *logits, const int32_t *labels, int64_t n, int64_t k, int64_t *correct) { return MPT_FAIL(MPT_ENOTSUP, "count_correct"); }
mpt_status mpt_op_dropout(mpt_stream *stream, const float *x, float *y, float *mask, int64_t count, float p, uint64_t seed) { return MPT_FAIL(MPT_ENOTSUP, "dropout"); }
mpt_status mpt_op_sgd_step(mpt_stream *stream, float *param, const float *grad, float *momentum_buf, int64_t count, float lr, float momentum, float dampening, float weight_decay, int nesterov, int first) { return MPT_FAIL(MPT_ENOTSUP, "sgd_step"); }
mpt_status mpt_op_adamw_step(mpt_stream *stream, float *param, const float *grad, float *m, float *v, int64_t count, float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step) { return MPT_FAIL(MPT_ENOTSUP, "adamw_step"); }
mpt_status mpt_op_check_finite(mpt_stream *stream, const float *x, int64_t count, int *nonfinite) { return MPT_FAIL(MPT_ENOTSUP, "check_finite"); }
mpt_status mpt_conv_geom_resolve(mpt_conv_geom *g) { (void)g; return MPT_ENOTSUP; }
