/* CPU backend internals: the op kernels (ops_cpu.c, conv_cpu.c, norm_cpu.c, optim_cpu.c) and
 * the streams and events (stream_cpu.c), assembled into mpt__cpu_backend by cpu_backend.c.
 * Op kernels ignore the stream argument: on the CPU the work runs on the caller's thread. */
#ifndef MPT_CORE_CPU_H
#define MPT_CORE_CPU_H

#include "core/backend.h"
#include "core/cpu/isa.h"

int mpt__cpu_count(void);
mpt_status mpt__cpu_alloc(int index, size_t nbytes, void **ptr);
void mpt__cpu_free(int index, void *ptr);

mpt_status mpt__cpu_stream_init(mpt_stream **stream, mpt_device device, mpt_stream_kind kind);
void mpt__cpu_stream_free(mpt_stream *stream);
void mpt__cpu_stream_abandon(mpt_stream *stream);
mpt_status mpt__cpu_stream_launch_host(mpt_stream *stream, mpt_host_fn fn, void *arg);
mpt_status mpt__cpu_stream_launch_host_kept(mpt_stream *stream, mpt_host_fn fn, void *arg,
                                            mpt__keeper_fn keeper, void *keeper_arg);
mpt_status mpt__cpu_stream_synchronize(mpt_stream *stream, double timeout_ms);
mpt_status mpt__cpu_stream_error(const mpt_stream *stream);
mpt_status mpt__cpu_stream_wait_event(mpt_stream *stream, mpt_event *event, double timeout_ms);
mpt_status mpt__cpu_event_init(mpt_event **event, mpt_device device);
void mpt__cpu_event_free(mpt_event *event);
mpt_status mpt__cpu_event_record(mpt_event *event, mpt_stream *stream);
mpt_status mpt__cpu_event_synchronize(mpt_event *event, double timeout_ms);
int mpt__cpu_event_query(mpt_event *event);
mpt_status mpt__cpu_event_elapsed_ms(mpt_event *start, mpt_event *end, double *ms);
mpt_status mpt__cpu_event_capture(mpt_event *event, uint64_t *token);
mpt_status mpt__cpu_event_wait_captured(mpt_event *event, uint64_t token, double timeout_ms);

mpt_status mpt__cpu_memcpy(mpt_stream *s, mpt_device dst_device, void *dst, mpt_device src_device, const void *src, size_t nbytes);
mpt_status mpt__cpu_gemm(mpt_stream *s, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
mpt_status mpt__cpu_fill(mpt_stream *s, float *x, int64_t count, float value);
mpt_status mpt__cpu_copy(mpt_stream *s, float *dst, const float *src, int64_t count);
mpt_status mpt__cpu_axpy(mpt_stream *s, int64_t count, float alpha, const float *x, float *y);
mpt_status mpt__cpu_scale(mpt_stream *s, float *x, int64_t count, float alpha);
mpt_status mpt__cpu_mul(mpt_stream *s, float *y, const float *a, const float *b, int64_t count);
mpt_status mpt__cpu_mul_backward(mpt_stream *s, float *da, const float *dy, const float *b, int64_t count);
mpt_status mpt__cpu_sum(mpt_stream *s, const float *x, int64_t count, float *out);
mpt_status mpt__cpu_sum_backward(mpt_stream *s, float *dx, int64_t count, const float *dy, float scale);
mpt_status mpt__cpu_bias_add(mpt_stream *s, float *y, const float *bias, int64_t rows, int64_t cols, int64_t inner);
mpt_status mpt__cpu_bias_backward(mpt_stream *s, float *dbias, const float *dy, int64_t rows, int64_t cols, int64_t inner);
mpt_status mpt__cpu_relu(mpt_stream *s, float *y, const float *x, int64_t count);
mpt_status mpt__cpu_relu_backward(mpt_stream *s, float *dx, const float *dy, const float *y, int64_t count);
mpt_status mpt__cpu_im2col(mpt_stream *s, const mpt_conv_geom *g, const float *x, float *col);
mpt_status mpt__cpu_col2im(mpt_stream *s, const mpt_conv_geom *g, const float *col, float *dx);
/* conv_dnnl.c, built with oneDNN only (MPT_HAVE_ONEDNN). */
mpt_status mpt__cpu_conv2d_forward(mpt_stream *s, const mpt_conv_geom *g, int64_t n, int64_t o, const float *x, const float *w, const float *b, float *y);
mpt_status mpt__cpu_conv2d_backward_data(mpt_stream *s, const mpt_conv_geom *g, int64_t n, int64_t o, const float *w, const float *dy, float *dx);
mpt_status mpt__cpu_conv2d_backward_weights(mpt_stream *s, const mpt_conv_geom *g, int64_t n, int64_t o, const float *x, const float *dy, float *dw, float *db);
/* gemm_dnnl.c (bf16 GEMM, the BF16 CPU check) and conv_dnnl.c (bf16 convolutions), built with
 * oneDNN only. */
mpt_status mpt__cpu_bf16_check(mpt_stream *s);
/* sgemm_dnnl.c, built with oneDNN only: whether mpt__cpu_gemm sends an fp32 product (k >= 1) to
 * oneDNN (mpt_cpu_gemm_for's answer, gemm_choice.c), and that path (cblas_sgemm's arguments, row-major; MPT_EDEVICE if oneDNN fails). */
int mpt__cpu_sgemm_dnnl_wanted(int64_t m, int64_t n, int64_t k);
/* gemm_choice.c: whether an fp32 product goes to oneDNN (mpt_cpu_gemm_for), noting its shape
 * and transposes while mpt_cpu_gemm_record is on; the fixed rule of MPT_CPU_GEMM_AUTO. */
int mpt__cpu_gemm_route(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k);
mpt_cpu_gemm mpt__cpu_gemm_rule(int64_t m, int64_t n, int64_t k);
/* ops_cpu.c: the product on OpenBLAS's cblas_sgemm (its thread buffer secured first); k >= 1,
 * sizes within int. */
mpt_status mpt__cpu_sgemm_openblas(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
/* The OpenMP threads that path uses for an m x n x k product: OpenBLAS's count, 1 when small. */
int mpt__cpu_sgemm_dnnl_threads(int64_t m, int64_t n, int64_t k);
mpt_status mpt__cpu_sgemm_dnnl(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
mpt_status mpt__cpu_gemm_bf16(mpt_stream *s, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
mpt_status mpt__cpu_bf16_round(mpt_stream *s, const float *x, uint16_t *y, int64_t count);
mpt_status mpt__cpu_gemm_bf16_batched(mpt_stream *s, int trans_a, int trans_b, int64_t batch, int64_t m, int64_t n, int64_t k, float alpha, const uint16_t *a, int64_t lda, int64_t stride_a, const uint16_t *b, int64_t ldb, int64_t stride_b, float beta, float *c, int64_t ldc, int64_t stride_c);
mpt_status mpt__cpu_heads_split_bf16(mpt_stream *s, const float *x, int64_t nb, int64_t nt, int64_t parts, int64_t nh, int64_t hs, uint16_t *y);
mpt_status mpt__cpu_heads_merge(mpt_stream *s, const float *x, int64_t nb, int64_t nt, int64_t parts, int64_t nh, int64_t hs, float beta, float *y);
mpt_status mpt__cpu_conv2d_forward_bf16(mpt_stream *s, const mpt_conv_geom *g, int64_t n, int64_t o, const float *x, const float *w, const float *b, float *y);
mpt_status mpt__cpu_conv2d_backward_data_bf16(mpt_stream *s, const mpt_conv_geom *g, int64_t n, int64_t o, const float *w, const float *dy, float *dx);
mpt_status mpt__cpu_conv2d_backward_weights_bf16(mpt_stream *s, const mpt_conv_geom *g, int64_t n, int64_t o, const float *x, const float *dy, float *dw, float *db);
mpt_status mpt__cpu_maxpool(mpt_stream *s, const mpt_conv_geom *g, int64_t planes, const float *x, float *y, int32_t *argmax);
mpt_status mpt__cpu_maxpool_backward(mpt_stream *s, const mpt_conv_geom *g, int64_t planes, const float *dy, const int32_t *argmax, float *dx);
mpt_status mpt__cpu_batchnorm_train(mpt_stream *s, const float *x, int64_t n, int64_t c, int64_t inner, const float *gamma, const float *beta, float eps, float momentum, float *running_mean, float *running_var, float *y, float *save_mean, float *save_invstd);
mpt_status mpt__cpu_batchnorm_eval(mpt_stream *s, const float *x, int64_t n, int64_t c, int64_t inner, const float *gamma, const float *beta, float eps, const float *running_mean, const float *running_var, float *y);
mpt_status mpt__cpu_batchnorm_backward(mpt_stream *s, const float *dy, const float *x, int64_t n, int64_t c, int64_t inner, const float *gamma, const float *save_mean, const float *save_invstd, float *dx, float *dgamma, float *dbeta);
mpt_status mpt__cpu_softmax_xent(mpt_stream *s, const float *logits, const int32_t *labels, int64_t n, int64_t k, float *probs, float *loss);
mpt_status mpt__cpu_softmax_xent_backward(mpt_stream *s, const float *probs, const int32_t *labels, int64_t n, int64_t k, const float *dloss, float *dlogits);
mpt_status mpt__cpu_count_correct(mpt_stream *s, const float *logits, const int32_t *labels, int64_t n, int64_t k, int64_t *correct);
mpt_status mpt__cpu_dropout(mpt_stream *s, const float *x, float *y, float *mask, int64_t count, float p, uint64_t seed);
mpt_status mpt__cpu_sgd_step(mpt_stream *s, float *param, const float *grad, float *momentum_buf, int64_t count, float lr, float momentum, float dampening, float weight_decay, int nesterov, int first);
mpt_status mpt__cpu_adamw_step(mpt_stream *s, float *param, const float *grad, float *m, float *v, int64_t count, float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step);
mpt_status mpt__cpu_check_finite(mpt_stream *s, const float *x, int64_t count, int *nonfinite);
/* llama_cpu.c: the Llama ops (include/mpitrain/ops_llama.h). */
mpt_status mpt__cpu_rmsnorm(mpt_stream *s, const float *x, int64_t rows, int64_t c, const float *w, float eps, float *y, float *rstd);
mpt_status mpt__cpu_rmsnorm_backward(mpt_stream *s, const float *dy, const float *x, int64_t rows, int64_t c, const float *w, const float *rstd, float *dx, float *dw);
mpt_status mpt__cpu_rope(mpt_stream *s, float *x, int64_t b, int64_t t, int64_t heads, int64_t d, float theta, const float *inv_freq, int inverse);
mpt_status mpt__cpu_swiglu(mpt_stream *s, float *y, const float *gate, const float *up, int64_t count);
mpt_status mpt__cpu_swiglu_backward(mpt_stream *s, const float *dy, const float *gate, const float *up, int64_t count, float *dgate, float *dup);
/* gpt_cpu.c: the transformer ops (include/mpitrain/ops_gpt.h). */
mpt_status mpt__cpu_embedding_gpt(mpt_stream *s, const int32_t *tokens, int64_t b, int64_t t, int64_t c, int64_t vocab, const float *wte, const float *wpe, float *y);
mpt_status mpt__cpu_embedding_gpt_backward(mpt_stream *s, const int32_t *tokens, int64_t b, int64_t t, int64_t c, int64_t vocab, const float *dy, float *dwte, float *dwpe);
mpt_status mpt__cpu_layernorm(mpt_stream *s, const float *x, int64_t rows, int64_t c, const float *w, const float *bias, float eps, float *y, float *mean, float *rstd);
mpt_status mpt__cpu_layernorm_backward(mpt_stream *s, const float *dy, const float *x, int64_t rows, int64_t c, const float *w, const float *mean, const float *rstd, float *dx, float *dw, float *dbias);
mpt_status mpt__cpu_gelu(mpt_stream *s, float *y, const float *x, int64_t count);
mpt_status mpt__cpu_gelu_backward(mpt_stream *s, float *dx, const float *dy, const float *x, int64_t count);
mpt_status mpt__cpu_gelu_backward_write(mpt_stream *s, float *dx, const float *dy, const float *x, int64_t count);
mpt_status mpt__cpu_add_layernorm(mpt_stream *s, const float *a, const float *b, int64_t rows, int64_t c, const float *w, const float *bias, float eps, float *sum, float *y, float *mean, float *rstd);
mpt_status mpt__cpu_bias_gelu(mpt_stream *s, float *y, const float *x, const float *bias, int64_t rows, int64_t cols);
mpt_status mpt__cpu_bias_gelu_backward(mpt_stream *s, float *dx, const float *dy, const float *x, const float *bias, int64_t rows, int64_t cols, float *dbias);
mpt_status mpt__cpu_causal_softmax(mpt_stream *s, float *a, int64_t planes, int64_t t);
mpt_status mpt__cpu_causal_softmax_backward(mpt_stream *s, const float *a, float *d, int64_t planes, int64_t t);
mpt_status mpt__cpu_xent_vocab(mpt_stream *s, const float *logits, const int32_t *targets, int64_t n, int64_t vp, int64_t v, float *stats, float *loss);
mpt_status mpt__cpu_xent_vocab_backward(mpt_stream *s, const float *logits, const int32_t *targets, int64_t n, int64_t vp, int64_t v, const float *stats, const float *dloss, float *dlogits);
/* attn_cpu.c: the fused causal attention (ops_gpt.h). */
mpt_status mpt__cpu_causal_attention(mpt_stream *s, const float *qkv, int64_t b, int64_t t, int64_t c, int64_t nh, float *y, float *stats);
mpt_status mpt__cpu_causal_attention_backward(mpt_stream *s, const float *qkv, const float *stats, const float *dy, int64_t b, int64_t t, int64_t c, int64_t nh, float beta, float *dqkv);
mpt_status mpt__cpu_xent_vocab_backward_write(mpt_stream *s, const float *logits, const int32_t *targets, int64_t n, int64_t vp, int64_t v, const float *stats, const float *dloss, float *dlogits);

#endif
