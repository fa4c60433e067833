/* The op cases of tests/test_backend_ops.c (harness: tests/backend_ops.h): every op of
 * include/mpitrain/ops.h, ops_gpt.h and ops_bf16.h, and the host functions with instruction-set
 * clones, on shapes with ragged tails (not multiples of the vector widths, the warp or the
 * blocks), with the bound between backends in the table at the end.
 *
 * Bounds between backends (CUDA against the CPU). EXACT where both perform the same float
 * operations in the same order (copies, fill, scale, mul, ReLU, dropout, bias_add, im2col,
 * col2im, pooling, the embedding, counts). Elsewhere the GPU fuses multiply-adds (one rounding
 * instead of two), its expf/tanhf are within 2 ulp and its reductions add in another order (in
 * double where the CPU does), so results agree to a few float ulps of the magnitudes involved;
 * each bound is far below the O(1) change an indexing or formula error makes. GEMMs: both are
 * within the classical dot-product bound (k + 2) eps (|alpha| sum |a b| + |beta c|) of the
 * exact result (Higham, 3.1), so within twice it of each other; with |a|, |b|, |c| <= 1,
 * alpha 0.75 and beta -0.5 that is GEMM_TOL(k) below. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "mpitrain/ops.h"
#include "mpitrain/ops_bf16.h"
#include "mpitrain/ops_gpt.h"
#include "backend_ops.h"

#define E FLT_EPSILON
#define GEMM_TOL(k) (2.0 * ((k) + 2) * E * (0.75 * (k) + 0.5))
#define S bo_stream(c)

/* ---- GEMM ---- */

/* C (with pad extra columns, which must stay untouched) = 0.75 op(A) op(B) - 0.5 C. */
static mpt_status gemm_case(bo_ctx *c, const int64_t *p, int bf16) {
  const int ta = (int)p[0], tb = (int)p[1];
  const int64_t m = p[2], n = p[3], k = p[4], pad = p[5];
  const int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
  const float *a = bo_uniform(c, (ta ? k : m) * lda, -1, 1);
  const float *b = bo_uniform(c, (tb ? n : k) * ldb, -1, 1);
  float *cc = bo_uniform(c, m * ldc, -1, 1);
  MPT_RETURN_IF((bf16 ? mpt_op_gemm_bf16 : mpt_op_gemm)(S, ta, tb, m, n, k, 0.75f, a, lda, b,
                                                        ldb, -0.5f, cc, ldc));
  bo_out(c, "C", cc, m * ldc);
  return MPT_OK;
}
static mpt_status op_gemm(bo_ctx *c, const int64_t *p) { return gemm_case(c, p, 0); }
static mpt_status op_gemm_bf16(bo_ctx *c, const int64_t *p) {
  MPT_RETURN_IF(mpt_op_bf16_check(S)); /* MPT_ENOTSUP: no bf16 compute on this path */
  return gemm_case(c, p, 1);
}

/* k = 0: C = beta C (beta 0 overwrites, NaN included); the padding column stays. */
static mpt_status op_gemm_k0(bo_ctx *c, const int64_t *p) {
  (void)p;
  const float h[6] = {1, 2, 3, 4, NAN, 6};
  float *c1 = bo_values(c, h, 6), *c2 = bo_values(c, h, 6);
  MPT_RETURN_IF(mpt_op_gemm(S, 0, 0, 2, 2, 0, 1.0f, NULL, 0, NULL, 0, 0.5f, c1, 3));
  MPT_RETURN_IF(mpt_op_gemm(S, 0, 0, 2, 2, 0, 1.0f, NULL, 0, NULL, 0, 0.0f, c2, 3));
  bo_out(c, "C beta 0.5", c1, 6);
  bo_out(c, "C beta 0", c2, 6);
  return MPT_OK;
}

/* ---- elementwise, sums, bias ---- */

static mpt_status op_elementwise(bo_ctx *c, const int64_t *p) {
  const int64_t n = p[0];
  const float *x = bo_uniform(c, n, -1, 1);
  float *y = bo_uniform(c, n, -1, 1), *z = bo_filled(c, n, 0), *w = bo_filled(c, n, 0);
  float *r = bo_filled(c, n, 0), *dz = bo_uniform(c, n, -1, 1);
  const float *g = bo_values(c, &(float){0.75f}, 1);
  MPT_RETURN_IF(mpt_op_fill(S, z, n, 2.5f));
  bo_out(c, "fill", z, n);
  MPT_RETURN_IF(mpt_op_copy(S, w, x, n));
  bo_out(c, "copy", w, n);
  MPT_RETURN_IF(mpt_op_scale(S, w, n, -1.7f));
  bo_out(c, "scale", w, n);
  MPT_RETURN_IF(mpt_op_mul(S, z, x, y, n));
  bo_out(c, "mul", z, n);
  MPT_RETURN_IF(mpt_op_mul(S, w, w, y, n)); /* in place */
  bo_out(c, "mul in place", w, n);
  MPT_RETURN_IF(mpt_op_sum_backward(S, dz, n, g, -0.5f));
  bo_out(c, "sum_backward", dz, n);
  MPT_RETURN_IF(mpt_op_relu(S, r, x, n));
  bo_out(c, "relu", r, n);
  MPT_RETURN_IF(mpt_op_relu_backward(S, dz, y, r, n));
  bo_out(c, "relu_backward", dz, n);
  MPT_RETURN_IF(mpt_op_relu(S, y, y, n)); /* in place */
  bo_out(c, "relu in place", y, n);
  return MPT_OK;
}

/* The two that fuse a multiply-add on the GPU. */
static mpt_status op_axpy_mul_backward(bo_ctx *c, const int64_t *p) {
  const int64_t n = p[0];
  const float *x = bo_uniform(c, n, -1, 1), *y = bo_uniform(c, n, -1, 1);
  float *z = bo_uniform(c, n, -1, 1), *w = bo_uniform(c, n, -1, 1);
  MPT_RETURN_IF(mpt_op_axpy(S, n, 0.3f, x, z));
  bo_out(c, "axpy", z, n);
  MPT_RETURN_IF(mpt_op_mul_backward(S, w, x, y, n));
  bo_out(c, "mul_backward", w, n);
  return MPT_OK;
}

static mpt_status op_dropout(bo_ctx *c, const int64_t *p) {
  const int64_t n = p[0];
  const float prob = (float)p[1] / 10.0f;
  const float *x = bo_uniform(c, n, -1, 1);
  float *y = bo_filled(c, n, 0), *mask = bo_filled(c, n, 0);
  MPT_RETURN_IF(mpt_op_dropout(S, x, y, mask, n, prob, 42 + (uint64_t)p[1]));
  bo_out(c, "y", y, n);
  bo_out(c, "mask", mask, n);
  return MPT_OK;
}

/* Both sum in double and round once; the empty sum writes 0. */
static mpt_status op_sum(bo_ctx *c, const int64_t *p) {
  const int64_t n = p[0];
  const float *x = n ? bo_uniform(c, n, -0.5f, 1.0f) : NULL;
  float *out = bo_filled(c, 1, 7.0f);
  MPT_RETURN_IF(mpt_op_sum(S, x, n, out));
  bo_out(c, "sum", out, 1);
  return MPT_OK;
}

static mpt_status op_bias(bo_ctx *c, const int64_t *p) {
  const int64_t rows = p[0], cols = p[1], inner = p[2], n = rows * cols * inner;
  float *y = bo_uniform(c, n, -1, 1), *db = bo_uniform(c, cols, -1, 1);
  const float *bias = bo_uniform(c, cols, -1, 1);
  MPT_RETURN_IF(mpt_op_bias_backward(S, db, y, rows, cols, inner));
  bo_out(c, "bias_backward", db, cols);
  MPT_RETURN_IF(mpt_op_bias_add(S, y, bias, rows, cols, inner));
  bo_out(c, "bias_add", y, n);
  return MPT_OK;
}

/* ---- convolution windows, library convolutions, pooling ---- */

static mpt_status geom(mpt_conv_geom *g, int64_t ch, int64_t h, int64_t w, int64_t kh,
                       int64_t kw, int64_t stride, int64_t pad) {
  *g = (mpt_conv_geom){.channels = ch, .height = h, .width = w, .kernel_h = kh,
                       .kernel_w = kw, .stride = stride, .pad = pad};
  return mpt_conv_geom_resolve(g);
}

static mpt_status op_im2col(bo_ctx *c, const int64_t *p) {
  mpt_conv_geom g;
  MPT_RETURN_IF(geom(&g, p[0], p[1], p[2], p[3], p[4], p[5], p[6]));
  const int64_t nx = g.channels * g.height * g.width;
  const int64_t ncol = g.channels * g.kernel_h * g.kernel_w * g.out_h * g.out_w;
  const float *x = bo_uniform(c, nx, -1, 1), *col0 = bo_uniform(c, ncol, -1, 1);
  float *col = bo_filled(c, ncol, 0), *dx = bo_uniform(c, nx, -1, 1);
  MPT_RETURN_IF(mpt_op_col2im(S, &g, col0, dx)); /* accumulates into dx */
  bo_out(c, "col2im", dx, nx);
  MPT_RETURN_IF(mpt_op_im2col(S, &g, x, col));
  bo_out(c, "im2col", col, ncol);
  return MPT_OK;
}

static mpt_status op_conv2d(bo_ctx *c, const int64_t *p) {
  if (!mpt_op_conv2d_available(S)) return MPT_ENOTSUP;
  const int64_t n = p[0], o = p[4];
  mpt_conv_geom g;
  MPT_RETURN_IF(geom(&g, p[1], p[2], p[3], p[5], p[5], p[6], p[7]));
  const int64_t nx = n * g.channels * g.height * g.width;
  const int64_t nw = o * g.channels * g.kernel_h * g.kernel_w, ny = n * o * g.out_h * g.out_w;
  const float *x = bo_uniform(c, nx, -1, 1), *w = bo_uniform(c, nw, -1, 1);
  const float *b = bo_uniform(c, o, -1, 1), *dy = bo_uniform(c, ny, -1, 1);
  float *y = bo_filled(c, ny, 0), *dx = bo_uniform(c, nx, -1, 1);
  float *dw = bo_uniform(c, nw, -1, 1), *db = bo_uniform(c, o, -1, 1);
  MPT_RETURN_IF(mpt_op_conv2d_forward(S, &g, n, o, x, w, b, y));
  MPT_RETURN_IF(mpt_op_conv2d_backward_data(S, &g, n, o, w, dy, dx));
  MPT_RETURN_IF(mpt_op_conv2d_backward_weights(S, &g, n, o, x, dy, dw, db));
  bo_out(c, "y", y, ny);
  bo_out(c, "dx", dx, nx);
  bo_out(c, "dw", dw, nw);
  bo_out(c, "db", db, o);
  return MPT_OK;
}

/* Ties (the first maximum wins everywhere) and NaNs (propagate; a later NaN wins). */
static mpt_status op_maxpool(bo_ctx *c, const int64_t *p) {
  mpt_conv_geom g;
  MPT_RETURN_IF(geom(&g, 1, p[0], p[1], p[2], p[2], p[3], 0));
  const int64_t planes = p[4], nx = planes * g.height * g.width;
  const int64_t ny = planes * g.out_h * g.out_w;
  float *hx = bo_host_dyadic(c, nx);
  hx[3] = NAN;
  hx[nx - 1] = NAN;
  const float *x = bo_values(c, hx, nx), *dy = bo_uniform(c, ny, -1, 1);
  float *y = bo_filled(c, ny, 0), *dx = bo_uniform(c, nx, -1, 1);
  int32_t *am = bo_bytes(c, ny * (int64_t)sizeof *am);
  MPT_RETURN_IF(mpt_op_maxpool(S, &g, planes, x, y, am));
  MPT_RETURN_IF(mpt_op_maxpool_backward(S, &g, planes, dy, am, dx)); /* accumulates */
  bo_out(c, "y", y, ny);
  bo_out_i32(c, "argmax", am, ny);
  bo_out(c, "dx", dx, nx);
  return MPT_OK;
}

/* ---- batch normalisation ---- */

static mpt_status op_batchnorm(bo_ctx *c, const int64_t *p) {
  const int64_t n = p[0], ch = p[1], inner = p[2], cnt = n * ch * inner;
  const float *x = bo_uniform(c, cnt, -1, 2), *gamma = bo_uniform(c, ch, 0.5f, 1.5f);
  const float *beta = bo_uniform(c, ch, -0.5f, 0.5f), *dy = bo_uniform(c, cnt, -1, 1);
  float *rm = bo_uniform(c, ch, -0.1f, 0.1f), *rv = bo_uniform(c, ch, 0.9f, 1.1f);
  float *y = bo_filled(c, cnt, 0), *ye = bo_filled(c, cnt, 0), *sm = bo_filled(c, ch, 0);
  float *si = bo_filled(c, ch, 0), *dx = bo_uniform(c, cnt, -1, 1);
  float *dg = bo_uniform(c, ch, -1, 1), *dbt = bo_uniform(c, ch, -1, 1);
  float *dbt2 = bo_uniform(c, ch, -1, 1);
  MPT_RETURN_IF(mpt_op_batchnorm_train(S, x, n, ch, inner, gamma, beta, 1e-5f, 0.1f, rm, rv, y,
                                       sm, si));
  bo_out(c, "save_mean", sm, ch);
  bo_out(c, "save_invstd", si, ch);
  bo_out(c, "running_mean", rm, ch);
  bo_out(c, "running_var", rv, ch);
  bo_out(c, "y", y, cnt);
  MPT_RETURN_IF(mpt_op_batchnorm_backward(S, dy, x, n, ch, inner, gamma, sm, si, dx, dg, dbt));
  bo_out(c, "dx", dx, cnt);
  bo_out(c, "dgamma", dg, ch);
  bo_out(c, "dbeta", dbt, ch);
  MPT_RETURN_IF(mpt_op_batchnorm_backward(S, dy, x, n, ch, inner, gamma, sm, si, NULL, NULL,
                                          dbt2));
  bo_out(c, "dbeta alone", dbt2, ch);
  MPT_RETURN_IF(mpt_op_batchnorm_eval(S, x, n, ch, inner, gamma, beta, 1e-5f, rm, rv, ye));
  bo_out(c, "eval y", ye, cnt);
  return MPT_OK;
}

/* Training in place (y = x) without running statistics, where the backend allows it: the CPU
 * kernel's pointers are restrict, so there the output is a separate buffer. */
static mpt_status op_batchnorm_in_place(bo_ctx *c, const int64_t *p) {
  const int64_t n = p[0], ch = p[1], inner = p[2], cnt = n * ch * inner;
  float *x = bo_uniform(c, cnt, -1, 2);
  const float *gamma = bo_uniform(c, ch, 0.5f, 1.5f), *beta = bo_uniform(c, ch, -0.5f, 0.5f);
  float *y = bo_device(c).type == MPT_DEVICE_CPU ? bo_filled(c, cnt, 0) : x;
  float *sm = bo_filled(c, ch, 0), *si = bo_filled(c, ch, 0);
  MPT_RETURN_IF(mpt_op_batchnorm_train(S, x, n, ch, inner, gamma, beta, 1e-5f, 0.1f, NULL, NULL,
                                       y, sm, si));
  bo_out(c, "y", y, cnt);
  bo_out(c, "save_mean", sm, ch);
  return MPT_OK;
}

/* ---- softmax cross-entropy, accuracy ---- */

static mpt_status op_softmax_xent(bo_ctx *c, const int64_t *p) {
  const int64_t n = p[0], k = p[1];
  float *hx = bo_host_uniform(c, n * k, -4, 4);
  hx[0] = 80.0f; /* large logits: only the max-subtracted form survives */
  if (n * k > 2) hx[2] = -80.0f;
  const float *x = bo_values(c, hx, n * k), *dloss = bo_values(c, &(float){1.5f}, 1);
  const int32_t *lab = bo_ids(c, n, k);
  float *probs = bo_filled(c, n * k, 0), *loss = bo_filled(c, 1, 0);
  float *dl = bo_uniform(c, n * k, -1, 1);
  MPT_RETURN_IF(mpt_op_softmax_xent(S, x, lab, n, k, probs, loss));
  bo_out(c, "probs", probs, n * k);
  bo_out(c, "loss", loss, 1);
  MPT_RETURN_IF(mpt_op_softmax_xent_backward(S, probs, lab, n, k, dloss, dl));
  bo_out(c, "dlogits", dl, n * k);
  return MPT_OK;
}

/* About a third of the rows are hits; ties: the first maximum wins. */
static mpt_status op_count_correct(bo_ctx *c, const int64_t *p) {
  const int64_t n = p[0], k = p[1];
  const float *hx = bo_host_dyadic(c, n * k);
  int32_t *hl = bo_host_bytes(c, n * (int64_t)sizeof *hl);
  for (int64_t i = 0; i < n; i++) {
    int64_t best = 0;
    for (int64_t j = 1; j < k; j++)
      if (hx[i * k + j] > hx[i * k + best]) best = j;
    hl[i] = (int32_t)(i % 3 == 0 ? best : (best + 1 + i % (k - 1)) % k);
  }
  const float *x = bo_values(c, hx, n * k);
  const int32_t *lab = bo_ids_values(c, hl, n);
  int64_t correct = 5; /* accumulates */
  MPT_RETURN_IF(mpt_op_count_correct(S, x, lab, n, k, &correct));
  bo_out_host(c, "correct", (double)correct);
  return MPT_OK;
}

/* ---- optimizers, finiteness ---- */

static mpt_status op_sgd(bo_ctx *c, const int64_t *p) {
  const int64_t n = p[0];
  static const float v[][4] = {{0.1f, 0, 0, 0}, {0.1f, 0.9f, 0, 0}, {0.05f, 0.9f, 0, 1e-2f},
                               {0.1f, 0.5f, 0.3f, 1e-3f}};
  const float *o = v[p[1]];
  const int nesterov = p[1] == 2;
  float *param = bo_uniform(c, n, -1, 1), *buf = bo_uniform(c, n, -1, 1);
  for (int step = 0; step < 3; step++) {
    const float *g = bo_uniform(c, n, -1, 1);
    MPT_RETURN_IF(mpt_op_sgd_step(S, param, g, buf, n, o[0], o[1], o[2], o[3], nesterov,
                                  step == 0));
  }
  bo_out(c, "param", param, n);
  bo_out(c, "momentum", buf, n);
  return MPT_OK;
}

static mpt_status op_adamw(bo_ctx *c, const int64_t *p) {
  const int64_t n = p[0];
  float *param = bo_uniform(c, n, -1, 1), *m = bo_filled(c, n, 0), *v = bo_filled(c, n, 0);
  for (int64_t step = 1; step <= 3; step++) {
    const float *g = bo_uniform(c, n, -1, 1);
    MPT_RETURN_IF(mpt_op_adamw_step(S, param, g, m, v, n, 1e-2f, 0.9f, 0.999f, 1e-8f, 1e-2f,
                                    step));
  }
  bo_out(c, "param", param, n);
  bo_out(c, "m", m, n);
  bo_out(c, "v", v, n);
  return MPT_OK;
}

/* p[1]: none, a NaN at the end, -inf in the middle. */
static mpt_status op_check_finite(bo_ctx *c, const int64_t *p) {
  const int64_t n = p[0];
  float *h = bo_host_uniform(c, n, -1e30f, 1e30f);
  if (p[1] == 1) h[n - 1] = NAN;
  if (p[1] == 2) h[n / 2] = -INFINITY;
  const float *x = bo_values(c, h, n);
  int nonfinite = -1;
  MPT_RETURN_IF(mpt_op_check_finite(S, x, n, &nonfinite));
  bo_out_host(c, "nonfinite", nonfinite);
  return MPT_OK;
}

/* ---- transformer ops (ops_gpt.h) ---- */

/* p: b, t, c, vocab (wte has vocab + 14 rows: padding). A repeated token adds up. */
static mpt_status op_embedding(bo_ctx *c, const int64_t *p) {
  const int64_t b = p[0], t = p[1], ch = p[2], v = p[3], vp = v + 14, n = b * t;
  int32_t *ht = bo_host_bytes(c, n * (int64_t)sizeof *ht);
  for (int64_t i = 0; i < n; i++) ht[i] = (int32_t)((i * 7 + 3) % v);
  ht[1] = ht[0];
  const int32_t *tok = bo_ids_values(c, ht, n);
  const float *wte = bo_uniform(c, vp * ch, -1, 1), *wpe = bo_uniform(c, t * ch, -1, 1);
  const float *dy = bo_uniform(c, n * ch, -1, 1);
  float *y = bo_filled(c, n * ch, 0), *dwte = bo_uniform(c, vp * ch, -1, 1);
  float *dwpe = bo_uniform(c, t * ch, -1, 1);
  MPT_RETURN_IF(mpt_op_embedding_gpt(S, tok, b, t, ch, v, wte, wpe, y));
  bo_out(c, "y", y, n * ch);
  MPT_RETURN_IF(mpt_op_embedding_gpt_backward(S, tok, b, t, ch, v, dy, dwte, dwpe));
  bo_out(c, "dwte", dwte, vp * ch);
  bo_out(c, "dwpe", dwpe, t * ch);
  return MPT_OK;
}

static mpt_status op_layernorm(bo_ctx *c, const int64_t *p) {
  const int64_t rows = p[0], ch = p[1], n = rows * ch;
  const float *x = bo_uniform(c, n, -2, 3), *w = bo_uniform(c, ch, -1, 1);
  const float *b = bo_uniform(c, ch, -1, 1), *dy = bo_uniform(c, n, -1, 1);
  float *y = bo_filled(c, n, 0), *mean = bo_filled(c, rows, 0), *rstd = bo_filled(c, rows, 0);
  float *dx = bo_uniform(c, n, -1, 1), *dw = bo_uniform(c, ch, -1, 1);
  float *db = bo_uniform(c, ch, -1, 1), *dx2 = bo_uniform(c, n, -1, 1);
  MPT_RETURN_IF(mpt_op_layernorm(S, x, rows, ch, w, b, 1e-5f, y, mean, rstd));
  bo_out(c, "y", y, n);
  bo_out(c, "mean", mean, rows);
  bo_out(c, "rstd", rstd, rows);
  MPT_RETURN_IF(mpt_op_layernorm_backward(S, dy, x, rows, ch, w, mean, rstd, dx, dw, db));
  bo_out(c, "dx", dx, n);
  bo_out(c, "dw", dw, ch);
  bo_out(c, "dbias", db, ch);
  MPT_RETURN_IF(mpt_op_layernorm_backward(S, dy, x, rows, ch, w, mean, rstd, dx2, NULL, NULL));
  bo_out(c, "dx alone", dx2, n);
  return MPT_OK;
}

static mpt_status op_add_layernorm(bo_ctx *c, const int64_t *p) {
  const int64_t rows = p[0], ch = p[1], n = rows * ch;
  const float *a = bo_uniform(c, n, -2, 3), *b = bo_uniform(c, n, -1, 1);
  const float *w = bo_uniform(c, ch, -1, 1), *lb = bo_uniform(c, ch, -1, 1);
  float *sum = bo_filled(c, n, 0), *y = bo_filled(c, n, 0), *mean = bo_filled(c, rows, 0);
  float *rstd = bo_filled(c, rows, 0);
  MPT_RETURN_IF(mpt_op_add_layernorm(S, a, b, rows, ch, w, lb, 1e-5f, sum, y, mean, rstd));
  bo_out(c, "sum", sum, n);
  bo_out(c, "y", y, n);
  bo_out(c, "mean", mean, rows);
  bo_out(c, "rstd", rstd, rows);
  return MPT_OK;
}

static mpt_status op_gelu(bo_ctx *c, const int64_t *p) {
  const int64_t n = p[0];
  const float *x = bo_uniform(c, n, -6, 6), *dy = bo_uniform(c, n, -1, 1);
  float *y = bo_filled(c, n, 0), *dx = bo_uniform(c, n, -1, 1), *dxw = bo_uniform(c, n, -1, 1);
  MPT_RETURN_IF(mpt_op_gelu(S, y, x, n));
  bo_out(c, "y", y, n);
  MPT_RETURN_IF(mpt_op_gelu_backward(S, dx, dy, x, n));
  bo_out(c, "dx (added)", dx, n);
  MPT_RETURN_IF(mpt_op_gelu_backward_beta(S, dxw, dy, x, n, 0.0f));
  bo_out(c, "dx (written)", dxw, n);
  return MPT_OK;
}

/* rows > 256 takes the blocked bias gradient. */
static mpt_status op_bias_gelu(bo_ctx *c, const int64_t *p) {
  const int64_t rows = p[0], cols = p[1], n = rows * cols;
  const float *x = bo_uniform(c, n, -3, 3), *bias = bo_uniform(c, cols, -1, 1);
  const float *dy = bo_uniform(c, n, -1, 1);
  float *y = bo_filled(c, n, 0), *dx = bo_filled(c, n, 0), *db = bo_uniform(c, cols, -1, 1);
  MPT_RETURN_IF(mpt_op_bias_gelu(S, y, x, bias, rows, cols));
  bo_out(c, "y", y, n);
  MPT_RETURN_IF(mpt_op_bias_gelu_backward(S, dx, dy, x, bias, rows, cols, db));
  bo_out(c, "dx", dx, n);
  bo_out(c, "dbias", db, cols);
  return MPT_OK;
}

static mpt_status op_causal_softmax(bo_ctx *c, const int64_t *p) {
  const int64_t planes = p[0], t = p[1], n = planes * t * t;
  float *s = bo_uniform(c, n, -4, 4), *d = bo_uniform(c, n, -1, 1);
  MPT_RETURN_IF(mpt_op_causal_softmax(S, s, planes, t));
  bo_out(c, "softmax", s, n); /* the mask: exact zeros on every backend */
  MPT_RETURN_IF(mpt_op_causal_softmax_backward(S, s, d, planes, t));
  bo_out(c, "backward", d, n);
  return MPT_OK;
}

/* Logits in [-scale, scale]; padding columns hold 1e30: never read, never written. */
static mpt_status op_xent_vocab(bo_ctx *c, const int64_t *p) {
  const int64_t n = p[0], v = p[1], vp = p[2];
  const float scale = (float)p[3];
  float *hl = bo_host_uniform(c, n * vp, -scale, scale);
  for (int64_t r = 0; r < n; r++)
    for (int64_t j = v; j < vp; j++) hl[r * vp + j] = 1e30f;
  const float *logits = bo_values(c, hl, n * vp), *dloss = bo_values(c, &(float){0.5f}, 1);
  const int32_t *tg = bo_ids(c, n, v);
  float *st = bo_filled(c, 2 * n, 0), *loss = bo_filled(c, 1, 0);
  float *dl = bo_uniform(c, n * vp, -1, 1), *dlw = bo_uniform(c, n * vp, -1, 1);
  MPT_RETURN_IF(mpt_op_xent_vocab(S, logits, tg, n, vp, v, st, loss));
  bo_out(c, "stats (max, 1 / sum)", st, 2 * n);
  bo_out(c, "loss", loss, 1);
  MPT_RETURN_IF(mpt_op_xent_vocab_backward(S, logits, tg, n, vp, v, st, dloss, dl));
  bo_out(c, "dlogits (added)", dl, n * vp);
  MPT_RETURN_IF(mpt_op_xent_vocab_backward_beta(S, logits, tg, n, vp, v, st, dloss, dlw, 0.0f));
  bo_out(c, "dlogits (written)", dlw, n * vp);
  return MPT_OK;
}

/* p: b, t, c, heads. */
static mpt_status op_causal_attention(bo_ctx *c, const int64_t *p) {
  if (!mpt_op_causal_attention_available(S)) return MPT_ENOTSUP;
  const int64_t b = p[0], t = p[1], ch = p[2], nh = p[3];
  const float *qkv = bo_uniform(c, b * t * 3 * ch, -1, 1), *dy = bo_uniform(c, b * t * ch, -1, 1);
  float *y = bo_filled(c, b * t * ch, 0), *stats = bo_filled(c, b * nh * t * 2, 0);
  float *dqkv = bo_uniform(c, b * t * 3 * ch, -1, 1);
  MPT_RETURN_IF(mpt_op_causal_attention(S, qkv, b, t, ch, nh, y, stats));
  bo_out(c, "y", y, b * t * ch);
  bo_out(c, "stats", stats, b * nh * t * 2);
  MPT_RETURN_IF(mpt_op_causal_attention_backward(S, qkv, stats, dy, b, t, ch, nh, 1.0f, dqkv));
  bo_out(c, "dqkv", dqkv, b * t * 3 * ch);
  return MPT_OK;
}

/* ---- bf16 operands rounded once (ops_bf16.h) ---- */

/* Rounding (NaN and ties included), a batched product of rounded operands, the head layouts. */
static mpt_status op_bf16_rounded(bo_ctx *c, const int64_t *p) {
  if (mpt_op_bf16_check(S) != MPT_OK || !mpt_op_bf16_rounded_available(S)) return MPT_ENOTSUP;
  const int64_t nb = p[0], nt = p[1], nh = p[2], hs = p[3], parts = 3;
  const int64_t count = nb * nt * parts * nh * hs;
  float *hx = bo_host_uniform(c, count, -2, 2);
  hx[0] = NAN;
  hx[1] = 1.00390625f; /* 1 + 2^-8: a tie, to even */
  const float *x = bo_values(c, hx, count);
  uint16_t *r = bo_bytes(c, count * 2), *split = bo_bytes(c, count * 2);
  float *merged = bo_uniform(c, count, -1, 1);
  MPT_RETURN_IF(mpt_op_bf16_round(S, x, r, count));
  bo_out_u16(c, "round", r, count);
  MPT_RETURN_IF(mpt_op_heads_split_bf16(S, x, nb, nt, parts, nh, hs, split));
  bo_out_u16(c, "heads_split", split, count);
  MPT_RETURN_IF(mpt_op_heads_merge(S, x, nb, nt, parts, nh, hs, 1.0f, merged));
  bo_out(c, "heads_merge", merged, count);
  /* per (b, h): q k^T over the split operands, [nt, nt] each */
  const int64_t batch = nb * nh, plane = nt * hs;
  float *sc = bo_uniform(c, batch * nt * nt, -1, 1);
  MPT_RETURN_IF(mpt_op_gemm_bf16_batched(S, 0, 1, batch, nt, nt, hs, 0.5f, split, hs, plane,
                                         split + batch * plane, hs, plane, -1.0f, sc, nt,
                                         nt * nt));
  bo_out(c, "batched q k^T", sc, batch * nt * nt);
  return MPT_OK;
}

/* ---- host functions with instruction-set clones ---- */

static mpt_status op_host_bf16_arrays(bo_ctx *c, const int64_t *p) {
  const int64_t n = p[0];
  float *x = bo_host_uniform(c, n, -3, 3), *y = bo_host_uniform(c, n, -3, 3);
  x[0] = NAN;
  x[1] = INFINITY;
  x[2] = 3.4e38f; /* rounds up to infinity */
  uint16_t *a = bo_host_bytes(c, 2 * n), *b = bo_host_bytes(c, 2 * n);
  float *w = bo_host_bytes(c, n * (int64_t)sizeof *w);
  mpt_bf16_round_array(x, a, n);
  mpt_bf16_round_array(y, b, n);
  mpt_bf16_add_array(a, b, n);
  mpt_bf16_widen_array(b, w, n);
  double bits = 0;
  for (int64_t i = 0; i < n; i++) bits = bits * 31.0 + a[i] + 7.0 * b[i];
  bo_out_host(c, "rounded and added (hash)", bits);
  bo_out_host(c, "widened[n - 1]", w[n - 1]);
  return MPT_OK;
}

static mpt_status op_host_sum_squares(bo_ctx *c, const int64_t *p) {
  const int64_t n = p[0];
  const float *x = bo_host_uniform(c, n, -3, 3);
  bo_out_host(c, "sum of squares", mpt_cpu_sum_squares(x, n));
  return MPT_OK;
}

/* ---- the table ---- */

#define CASE(op, params, ...) {#op, op_##op, params, __VA_ARGS__}
#define GEMM4(m, n, k, pad)                                                               \
  CASE(gemm, "ta tb m n k pad", {0, 0, m, n, k, pad}, 0, GEMM_TOL(k), 0),                 \
      CASE(gemm, "ta tb m n k pad", {0, 1, m, n, k, pad}, 0, GEMM_TOL(k), 0),             \
      CASE(gemm, "ta tb m n k pad", {1, 0, m, n, k, pad}, 0, GEMM_TOL(k), 0),             \
      CASE(gemm, "ta tb m n k pad", {1, 1, m, n, k, pad}, 0, GEMM_TOL(k), 0)
/* the column sums of bias_backward in float: within (N + 2) eps of N O(1) terms */
#define BIAS_TOL(rows, inner) ((rows) * (inner) + 2.0) * E * ((rows) * (inner) + 1.0)

const bo_case bo_cases[] = {
    GEMM4(7, 5, 9, 3),
    GEMM4(67, 45, 130, 5),
    GEMM4(1, 33, 2, 1),
    GEMM4(128, 10, 784, 0),
    CASE(gemm_k0, "", {0}, 0, 0, BO_EXACT),
    CASE(gemm_bf16, "ta tb m n k pad", {0, 1, 67, 45, 130, 5}, 0, GEMM_TOL(130), 0),
    CASE(gemm_bf16, "ta tb m n k pad", {1, 0, 33, 64, 96, 0}, 0, GEMM_TOL(96), 0),
    CASE(elementwise, "n", {100003}, 0, 0, BO_EXACT),
    CASE(elementwise, "n", {7}, 0, 0, BO_EXACT),
    CASE(axpy_mul_backward, "n", {100003}, 2 * E, 2 * E, 0),
    CASE(dropout, "n p10", {100003, 0}, 0, 0, BO_EXACT),
    CASE(dropout, "n p10", {100003, 3}, 0, 0, BO_EXACT),
    CASE(sum, "n", {0}, 0, 0, BO_EXACT),
    CASE(sum, "n", {1}, 2 * E, 0, 0),
    CASE(sum, "n", {1000}, 2 * E, 0, 0),
    CASE(sum, "n", {(1 << 20) + 3}, 2 * E, 0, 0),
    CASE(bias, "rows cols inner", {5, 7, 1}, 2 * E, BIAS_TOL(5, 1), 0),
    CASE(bias, "rows cols inner", {3, 300, 1}, 2 * E, BIAS_TOL(3, 1), 0),
    CASE(bias, "rows cols inner", {4, 6, 49}, 2 * E, BIAS_TOL(4, 49), 0),
    CASE(bias, "rows cols inner", {1, 1, 1}, 2 * E, BIAS_TOL(1, 1), 0),
    CASE(bias, "rows cols inner", {64, 10, 1}, 2 * E, BIAS_TOL(64, 1), 0),
    CASE(im2col, "c h w kh kw stride pad", {3, 7, 6, 3, 2, 1, 1}, 0, 0, BO_EXACT),
    CASE(im2col, "c h w kh kw stride pad", {2, 9, 8, 3, 3, 2, 1}, 0, 0, BO_EXACT),
    CASE(im2col, "c h w kh kw stride pad", {4, 5, 5, 5, 5, 3, 2}, 0, 0, BO_EXACT),
    CASE(im2col, "c h w kh kw stride pad", {5, 6, 4, 1, 1, 1, 0}, 0, 0, BO_EXACT),
    CASE(im2col, "c h w kh kw stride pad", {1, 28, 28, 5, 5, 1, 2}, 0, 0, BO_EXACT),
    CASE(conv2d, "n c h w o k stride pad", {3, 3, 7, 6, 5, 3, 1, 1}, 1e-4, 1e-4, 0),
    CASE(conv2d, "n c h w o k stride pad", {2, 2, 9, 8, 4, 3, 2, 1}, 1e-4, 1e-4, 0),
    CASE(conv2d, "n c h w o k stride pad", {4, 1, 28, 28, 6, 5, 1, 2}, 1e-4, 1e-4, 0),
    CASE(conv2d, "n c h w o k stride pad", {2, 4, 5, 5, 3, 1, 1, 0}, 1e-4, 1e-4, 0),
    CASE(maxpool, "h w k stride planes", {8, 8, 2, 2, 6}, 0, 0, BO_EXACT),
    CASE(maxpool, "h w k stride planes", {9, 7, 3, 2, 4}, 0, 0, BO_EXACT),
    CASE(maxpool, "h w k stride planes", {6, 6, 3, 1, 3}, 0, 0, BO_EXACT),
    CASE(maxpool, "h w k stride planes", {5, 9, 2, 3, 2}, 0, 0, BO_EXACT),
    /* statistics: double sums rounded once; y, dx: a few fused operations on O(10) values;
     * dgamma, dbeta: sums of up to 50176 O(1) terms, a float ulp of the sum */
    CASE(batchnorm, "n c inner", {8, 3, 25}, 1e-5, 1e-4, 0),
    CASE(batchnorm, "n c inner", {16, 5, 1}, 1e-5, 1e-4, 0),
    CASE(batchnorm, "n c inner", {64, 2, 784}, 1e-5, 1e-4, 0),
    CASE(batchnorm, "n c inner", {2, 1, 1}, 1e-5, 1e-4, 0),
    CASE(batchnorm_in_place, "n c inner", {8, 3, 25}, 1e-5, 1e-4, 0),
    /* expf within 2 ulp: probabilities within 8 eps; the loss, a mean of terms of size log k,
     * within 1e-6; backward adds g p once (fused) */
    CASE(softmax_xent, "n k", {1, 10}, 8 * E, 1e-6, 0),
    CASE(softmax_xent, "n k", {37, 3}, 8 * E, 1e-6, 0),
    CASE(softmax_xent, "n k", {300, 10}, 8 * E, 1e-6, 0),
    CASE(softmax_xent, "n k", {20, 1000}, 8 * E, 1e-6, 0),
    CASE(softmax_xent, "n k", {9000, 10}, 8 * E, 1e-6, 0),
    CASE(count_correct, "n k", {5000, 10}, 0, 0, BO_EXACT),
    /* three steps; fused multiply-adds differ by an ulp per operation */
    CASE(sgd, "n variant", {10007, 0}, 1e-6, 1e-6, 0),
    CASE(sgd, "n variant", {10007, 1}, 1e-6, 1e-6, 0),
    CASE(sgd, "n variant", {10007, 2}, 1e-6, 1e-6, 0),
    CASE(sgd, "n variant", {10007, 3}, 1e-6, 1e-6, 0),
    CASE(adamw, "n", {10007}, 1e-6, 1e-6, 0),
    CASE(adamw, "n", {13}, 1e-6, 1e-6, 0),
    CASE(check_finite, "n bad", {100000, 0}, 0, 0, BO_EXACT),
    CASE(check_finite, "n bad", {100000, 1}, 0, 0, BO_EXACT),
    CASE(check_finite, "n bad", {100000, 2}, 0, 0, BO_EXACT),
    /* transformer ops: sizes off the warp and the vector widths (C 40, T 37) */
    CASE(embedding, "b t c vocab", {3, 7, 40, 50}, 0, 0, BO_EXACT),
    CASE(layernorm, "rows c", {21, 40}, 1e-5, 1e-5, 0),
    CASE(layernorm, "rows c", {300, 97}, 1e-5, 1e-5, 0),
    CASE(add_layernorm, "rows c", {21, 40}, 1e-5, 1e-6, 0),
    CASE(gelu, "n", {840}, 1e-5, 1e-5, 0),
    CASE(gelu, "n", {100003}, 1e-5, 1e-5, 0),
    CASE(bias_gelu, "rows cols", {21, 40}, 1e-5, 1e-5, 0),
    CASE(bias_gelu, "rows cols", {300, 37}, 1e-5, 1e-5, 0),
    CASE(causal_softmax, "planes t", {6, 37}, 1e-5, 1e-7, 0),
    CASE(causal_softmax, "planes t", {2, 130}, 1e-5, 1e-7, 0),
    CASE(xent_vocab, "n v vp scale", {21, 50, 64, 5}, 1e-5, 1e-7, 0),
    CASE(xent_vocab, "n v vp scale", {5, 1000, 1024, 5}, 1e-5, 1e-7, 0),
    CASE(xent_vocab, "n v vp scale", {21, 50, 64, 10000}, 1e-5, 1e-7, 0),
    CASE(causal_attention, "b t c heads", {2, 37, 48, 4}, 1e-5, 1e-6, 0),
    CASE(causal_attention, "b t c heads", {1, 130, 64, 2}, 1e-5, 1e-6, 0),
    CASE(bf16_rounded, "b t heads hs", {2, 9, 2, 16}, 1e-5, 1e-5, 0),
    /* host functions: the CPU's instruction-set clones */
    CASE(host_bf16_arrays, "n", {1003}, 0, 0, BO_HOST),
    CASE(host_sum_squares, "n", {1003}, 0, 0, BO_HOST),
    CASE(host_sum_squares, "n", {15}, 0, 0, BO_HOST),
};

const int bo_ncases = (int)(sizeof bo_cases / sizeof bo_cases[0]);
