/* Tests of the CUDA backend's ops (src/core/cuda/ops_cuda*.c, kernels_*.cu): every CUDA op
 * against the CPU backend (the reference, itself tested against naive loops in test_ops.c and
 * test_ops_train.c) on random inputs, forward and backward. Streams, events, copies and the
 * allocator are in tests/test_cuda_stream.c. Exits 77 (automake's SKIP) and prints "SKIP: no
 * CUDA device" when no GPU is present.
 *
 * Tolerances. Where both backends perform the same float operations in the same order (copy,
 * fill, scale, mul, ReLU, dropout, bias_add, im2col, col2im, pooling, the argmax count) results
 * must be EQUAL. Elsewhere the bound is stated next to each comparison: the GPU fuses multiply-
 * adds (one rounding instead of two), its expf is within 2 ulp, and its reductions add in a
 * different order (both in double); each bound is a few float ulps of the magnitudes involved,
 * far below the O(1) change that an indexing or formula error makes.
 *
 * Check runs the tests without forking (CK_NOFORK): a CUDA context does not survive fork(). */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "core/cuda/cuda_internal.h"
#include "mpitrain/core.h"
#include "mpitrain/ops.h"

#define OK(expr) ck_assert_msg((expr) == MPT_OK, "%s failed: %s", #expr, mpt_last_error())
#define E FLT_EPSILON
#define TIMEOUT_MS 60000.0

static const mpt_device GPU = {MPT_DEVICE_CUDA, 0};
static mpt_stream *S; /* a compute stream on cuda:0, fresh for every test */

static void setup(void) { OK(mpt_stream_init(&S, GPU, MPT_STREAM_INLINE)); }
static void teardown(void) {
  mpt_stream_free(S);
  S = NULL;
}

/* ---- host and device buffers ---- */

static void *halloc(size_t nbytes) {
  void *p = calloc(1, nbytes ? nbytes : 1);
  ck_assert_ptr_nonnull(p);
  return p;
}
static float *hrand(int64_t n, uint64_t seed, float lo, float hi) {
  float *x = halloc((size_t)n * sizeof *x);
  mpt_rng r;
  mpt_rng_seed(&r, seed);
  mpt_rng_fill_uniform(&r, x, n, lo, hi);
  return x;
}
/* Multiples of 1/4 in [-2, 2]: many ties for the argmax tests. */
static float *hdyadic(int64_t n, uint64_t seed) {
  float *x = halloc((size_t)n * sizeof *x);
  mpt_rng r;
  mpt_rng_seed(&r, seed);
  for (int64_t i = 0; i < n; i++) x[i] = ((float)mpt_rng_below(&r, 17) - 8.0f) / 4.0f;
  return x;
}
static float *hdup(const float *x, int64_t n) {
  float *y = halloc((size_t)n * sizeof *y);
  memcpy(y, x, (size_t)n * sizeof *y);
  return y;
}
static void *up(const void *h, size_t nbytes) {
  void *d = NULL;
  OK(mpt_device_alloc(GPU, nbytes, &d));
  OK(mpt_op_memcpy(S, GPU, d, mpt_device_cpu(), h, nbytes));
  return d;
}
static void down(void *h, const void *d, size_t nbytes) {
  OK(mpt_op_memcpy(S, mpt_device_cpu(), h, GPU, d, nbytes));
  OK(mpt_stream_synchronize(S, TIMEOUT_MS));
}
static float *upf(const float *h, int64_t n) { return up(h, (size_t)n * sizeof *h); }
static void dfree(void *d) { mpt_device_free(GPU, d); }

/* Fails unless |got - want| <= atol + rtol |want| everywhere (NaN must meet NaN). */
static void expect_close(const char *what, const float *got, const float *want, int64_t n,
                         double rtol, double atol) {
  for (int64_t i = 0; i < n; i++) {
    if (isnan(want[i]) && isnan(got[i])) continue;
    const double d = fabs((double)got[i] - want[i]);
    if (!(d <= atol + rtol * fabs((double)want[i])))
      ck_abort_msg("%s[%lld]: cuda %.9g, cpu %.9g (bound %.3g + %.3g |cpu|)", what,
                   (long long)i, (double)got[i], (double)want[i], atol, rtol);
  }
}
/* Downloads device buffer d (n floats) and compares it with the CPU's result. */
static void expect_dev(const char *what, const float *d, const float *want, int64_t n,
                       double rtol, double atol) {
  float *got = halloc((size_t)n * sizeof *got);
  down(got, d, (size_t)n * sizeof *got);
  expect_close(what, got, want, n, rtol, atol);
  free(got);
}

/* ---- GEMM ---- */

/* Both backends are within the classical dot-product bound (k + 2) eps (|alpha| sum|a b| +
 * |beta c|) of the exact result (Higham, 3.1), so they are within twice it of each other.
 * Padding columns of C must stay untouched. */
static void gemm_case(int ta, int tb, int64_t m, int64_t n, int64_t k, int64_t pad) {
  const int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
  const int64_t na = (ta ? k : m) * lda, nb = (tb ? n : k) * ldb, nc = m * ldc;
  float *a = hrand(na, 1 + ta, -1, 1), *b = hrand(nb, 3 + tb, -1, 1), *c = hrand(nc, 5, -1, 1);
  float *c0 = hdup(c, nc);
  float *da = upf(a, na), *db = upf(b, nb), *dc = upf(c, nc);
  const float alpha = 0.75f, beta = -0.5f;
  OK(mpt_op_gemm(NULL, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
  OK(mpt_op_gemm(S, ta, tb, m, n, k, alpha, da, lda, db, ldb, beta, dc, ldc));
  float *got = halloc((size_t)nc * sizeof *got);
  down(got, dc, (size_t)nc * sizeof *got);
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < ldc; j++) {
      const float g = got[i * ldc + j], w = c[i * ldc + j];
      if (j >= n) {
        ck_assert_msg(g == c0[i * ldc + j], "padding C[%lld, %lld] was written", (long long)i,
                      (long long)j);
        continue;
      }
      double mag = 0;
      for (int64_t p = 0; p < k; p++)
        mag += fabs((double)(ta ? a[p * lda + i] : a[i * lda + p]) *
                    (tb ? b[j * ldb + p] : b[p * ldb + j]));
      const double tol = 2.0 * (double)(k + 2) * E * (alpha * mag + fabs(beta * c0[i * ldc + j]));
      ck_assert_msg(fabs((double)g - w) <= tol, "C[%lld, %lld] ta=%d tb=%d m=%lld n=%lld "
                    "k=%lld: cuda %.9g, cpu %.9g", (long long)i, (long long)j, ta, tb,
                    (long long)m, (long long)n, (long long)k, (double)g, (double)w);
    }
  dfree(da);
  dfree(db);
  dfree(dc);
  free(a);
  free(b);
  free(c);
  free(c0);
  free(got);
}

START_TEST(test_gemm_matches_cpu_for_all_transposes) {
  for (int ta = 0; ta < 2; ta++)
    for (int tb = 0; tb < 2; tb++) {
      gemm_case(ta, tb, 7, 5, 9, 3);
      gemm_case(ta, tb, 67, 45, 130, 5);
      gemm_case(ta, tb, 1, 33, 2, 1);
      gemm_case(ta, tb, 128, 10, 784, 0);
    }
}
END_TEST

START_TEST(test_gemm_with_k_zero_scales_c_by_beta) {
  float c[6] = {1, 2, 3, 4, NAN, 6}, got[6];
  float *dc = upf(c, 6);
  OK(mpt_op_gemm(S, 0, 0, 2, 2, 0, 1.0f, NULL, 0, NULL, 0, 0.5f, dc, 3));
  down(got, dc, sizeof got);
  const float want[6] = {0.5f, 1, 3, 2, NAN, 6}; /* padding column 2 untouched */
  expect_close("C", got, want, 6, 0, 0);
  OK(mpt_op_gemm(S, 0, 0, 2, 2, 0, 1.0f, NULL, 0, NULL, 0, 0.0f, dc, 3));
  down(got, dc, sizeof got);
  ck_assert(got[0] == 0 && got[1] == 0 && got[3] == 0 && got[4] == 0); /* NaN overwritten */
  dfree(dc);
}
END_TEST

/* ---- elementwise, sums, bias ---- */

START_TEST(test_elementwise_ops_match_cpu) {
  enum { N = 100003 }; /* several blocks and a ragged tail */
  float *x = hrand(N, 11, -1, 1), *y = hrand(N, 12, -1, 1), *z = hrand(N, 13, -1, 1);
  float *dx = upf(x, N), *dy = upf(y, N), *dz = upf(z, N);
  OK(mpt_op_fill(NULL, z, N, 2.5f));
  OK(mpt_op_fill(S, dz, N, 2.5f));
  expect_dev("fill", dz, z, N, 0, 0);
  OK(mpt_op_copy(NULL, z, x, N));
  OK(mpt_op_copy(S, dz, dx, N));
  expect_dev("copy", dz, z, N, 0, 0);
  OK(mpt_op_axpy(NULL, N, 0.3f, y, z)); /* fused on the GPU: one rounding less */
  OK(mpt_op_axpy(S, N, 0.3f, dy, dz));
  expect_dev("axpy", dz, z, N, 2 * E, 2 * E);
  OK(mpt_op_scale(NULL, z, N, -1.7f));
  OK(mpt_op_scale(S, dz, N, -1.7f));
  expect_dev("scale", dz, z, N, 0, 0);
  OK(mpt_op_mul(NULL, z, x, y, N));
  OK(mpt_op_mul(S, dz, dx, dy, N));
  expect_dev("mul", dz, z, N, 0, 0);
  OK(mpt_op_mul(NULL, z, z, y, N)); /* in place */
  OK(mpt_op_mul(S, dz, dz, dy, N));
  expect_dev("mul in place", dz, z, N, 0, 0);
  OK(mpt_op_mul_backward(NULL, z, x, y, N)); /* z += x y, fused on the GPU */
  OK(mpt_op_mul_backward(S, dz, dx, dy, N));
  expect_dev("mul_backward", dz, z, N, 2 * E, 2 * E);
  float g = 0.75f, *dg = upf(&g, 1);
  OK(mpt_op_sum_backward(NULL, z, N, &g, -0.5f));
  OK(mpt_op_sum_backward(S, dz, N, dg, -0.5f));
  expect_dev("sum_backward", dz, z, N, 0, 0);
  float *r = halloc(N * sizeof *r), *dr = upf(r, N);
  OK(mpt_op_relu(NULL, r, x, N));
  OK(mpt_op_relu(S, dr, dx, N));
  expect_dev("relu", dr, r, N, 0, 0);
  OK(mpt_op_relu_backward(NULL, z, y, r, N));
  OK(mpt_op_relu_backward(S, dz, dy, dr, N));
  expect_dev("relu_backward", dz, z, N, 0, 0);
  OK(mpt_op_relu(NULL, y, y, N)); /* in place */
  OK(mpt_op_relu(S, dy, dy, N));
  expect_dev("relu in place", dy, y, N, 0, 0);
  float *mask = halloc(N * sizeof *mask), *dmask = upf(mask, N);
  for (int pi = 0; pi < 2; pi++) { /* the same counter-based draw on both backends */
    const float p = pi ? 0.3f : 0.0f;
    OK(mpt_op_dropout(NULL, x, z, mask, N, p, 42 + pi));
    OK(mpt_op_dropout(S, dx, dz, dmask, N, p, 42 + pi));
    expect_dev("dropout y", dz, z, N, 0, 0);
    expect_dev("dropout mask", dmask, mask, N, 0, 0);
  }
  dfree(dx), dfree(dy), dfree(dz), dfree(dg), dfree(dr), dfree(dmask);
  free(x), free(y), free(z), free(r), free(mask);
}
END_TEST

/* Both sum in double and round once: the floats agree to one ulp. The empty sum writes 0. */
START_TEST(test_sum_matches_cpu_in_double) {
  const int64_t sizes[] = {1, 1000, (1 << 20) + 3};
  for (int t = 0; t < 3; t++) {
    const int64_t n = sizes[t];
    float *x = hrand(n, 20 + t, -0.5f, 1.0f), *dx = upf(x, n), want, got = 7, *dout = upf(&got, 1);
    OK(mpt_op_sum(NULL, x, n, &want));
    OK(mpt_op_sum(S, dx, n, dout));
    expect_dev("sum", dout, &want, 1, 2 * E, 0);
    dfree(dx);
    dfree(dout);
    free(x);
  }
  float seven = 7, zero = 0, *dout = upf(&seven, 1);
  OK(mpt_op_sum(S, NULL, 0, dout));
  expect_dev("empty sum", dout, &zero, 1, 0, 0);
  dfree(dout);
}
END_TEST

START_TEST(test_bias_add_and_backward_match_cpu) {
  /* inner == 1 with few and with many columns (the two kernels), conv-like, degenerate */
  const int64_t shapes[][3] = {{5, 7, 1}, {3, 300, 1}, {4, 6, 49}, {1, 1, 1}, {64, 10, 1}};
  for (int t = 0; t < 5; t++) {
    const int64_t rows = shapes[t][0], cols = shapes[t][1], inner = shapes[t][2];
    const int64_t n = rows * cols * inner;
    float *y = hrand(n, 30 + t, -1, 1), *bias = hrand(cols, 40 + t, -1, 1);
    float *db = hrand(cols, 50 + t, -1, 1);
    float *dy_ = upf(y, n), *dbias = upf(bias, cols), *ddb = upf(db, cols);
    OK(mpt_op_bias_backward(NULL, db, y, rows, cols, inner));
    OK(mpt_op_bias_backward(S, ddb, dy_, rows, cols, inner));
    /* the CPU adds in float for inner == 1: within (N + 2) eps of the column's sum of
     * magnitudes, at most N = rows * inner */
    const double nn = (double)(rows * inner);
    expect_dev("bias_backward", ddb, db, cols, 2 * E, (nn + 2) * E * (nn + 1));
    OK(mpt_op_bias_add(NULL, y, bias, rows, cols, inner));
    OK(mpt_op_bias_add(S, dy_, dbias, rows, cols, inner));
    expect_dev("bias_add", dy_, y, n, 0, 0);
    dfree(dy_), dfree(dbias), dfree(ddb);
    free(y), free(bias), free(db);
  }
}
END_TEST

/* ---- convolution windows and pooling: same operations in the same order, so EQUAL ---- */

START_TEST(test_im2col_and_col2im_match_cpu_exactly) {
  const int64_t geoms[][7] = {/* C, H, W, kh, kw, stride, pad */
                              {3, 7, 6, 3, 2, 1, 1}, {2, 9, 8, 3, 3, 2, 1},
                              {4, 5, 5, 5, 5, 3, 2}, {5, 6, 4, 1, 1, 1, 0},
                              {1, 28, 28, 5, 5, 1, 2}};
  for (int t = 0; t < 5; t++) {
    mpt_conv_geom g = {.channels = geoms[t][0], .height = geoms[t][1], .width = geoms[t][2],
                       .kernel_h = geoms[t][3], .kernel_w = geoms[t][4],
                       .stride = geoms[t][5], .pad = geoms[t][6]};
    OK(mpt_conv_geom_resolve(&g));
    const int64_t nx = g.channels * g.height * g.width;
    const int64_t ncol = g.channels * g.kernel_h * g.kernel_w * g.out_h * g.out_w;
    float *x = hrand(nx, 60 + t, -1, 1), *col = hrand(ncol, 70 + t, -1, 1);
    float *dxh = hrand(nx, 80 + t, -1, 1);
    float *dx = upf(x, nx), *dcol = upf(col, ncol), *ddx = upf(dxh, nx);
    OK(mpt_op_col2im(NULL, &g, col, dxh)); /* accumulates into dx */
    OK(mpt_op_col2im(S, &g, dcol, ddx));
    expect_dev("col2im", ddx, dxh, nx, 0, 0);
    OK(mpt_op_im2col(NULL, &g, x, col));
    OK(mpt_op_im2col(S, &g, dx, dcol));
    expect_dev("im2col", dcol, col, ncol, 0, 0);
    dfree(dx), dfree(dcol), dfree(ddx);
    free(x), free(col), free(dxh);
  }
}
END_TEST

/* Issue 17 item 13: the library convolutions on CUDA (cuDNN: forward, backward data, backward
 * weights with the bias, the algorithm chosen once per shape and cached) against the im2col +
 * GEMM path (the fallback, itself checked against the CPU above), on shapes with padding,
 * strides, 1x1 and 5x5 kernels. Float rounding only: relative 1e-4. A second call of the same
 * shape reuses the cached plan and gives bit-identical results. */
START_TEST(test_library_convolutions_match_im2col) {
#ifdef MPT_HAVE_CUDNN
  ck_assert_int_eq(mpt_op_conv2d_available(S), 1);
#endif
  if (!mpt_op_conv2d_available(S)) return; /* built without cuDNN: nothing to compare */
  const int64_t cases[][8] = {/* n, C, H, W, O, k, stride, pad */
                              {3, 3, 7, 6, 5, 3, 1, 1}, {2, 2, 9, 8, 4, 3, 2, 1},
                              {4, 1, 28, 28, 6, 5, 1, 2}, {2, 4, 5, 5, 3, 1, 1, 0}};
  for (int t = 0; t < 4; t++) {
    const int64_t n = cases[t][0], o = cases[t][4];
    mpt_conv_geom g = {.channels = cases[t][1], .height = cases[t][2], .width = cases[t][3],
                       .kernel_h = cases[t][5], .kernel_w = cases[t][5],
                       .stride = cases[t][6], .pad = cases[t][7]};
    OK(mpt_conv_geom_resolve(&g));
    const int64_t nx = n * g.channels * g.height * g.width;
    const int64_t nw = o * g.channels * g.kernel_h * g.kernel_w, ny = n * o * g.out_h * g.out_w;
    float *x = hrand(nx, 100 + t, -1, 1), *w = hrand(nw, 110 + t, -1, 1);
    float *b = hrand(o, 120 + t, -1, 1), *dy = hrand(ny, 130 + t, -1, 1);
    float *dx0 = hrand(nx, 140 + t, -1, 1), *dw0 = hrand(nw, 150 + t, -1, 1);
    float *db0 = hrand(o, 160 + t, -1, 1);
    float *dX = upf(x, nx), *dW = upf(w, nw), *dB = upf(b, o), *dDY = upf(dy, ny);
    float *y1 = upf(dy, ny), *y2 = upf(dy, ny), *y3 = upf(dy, ny);
    float *dx1 = upf(dx0, nx), *dx2 = upf(dx0, nx), *dw1 = upf(dw0, nw), *dw2 = upf(dw0, nw);
    float *db1 = upf(db0, o), *db2 = upf(db0, o);
    OK(mpt__cuda_conv2d_forward_im2col(S, &g, n, o, dX, dW, dB, y1));
    OK(mpt_op_conv2d_forward(S, &g, n, o, dX, dW, dB, y2));
    OK(mpt_op_conv2d_forward(S, &g, n, o, dX, dW, dB, y3)); /* the cached plan */
    OK(mpt__cuda_conv2d_backward_data_im2col(S, &g, n, o, dW, dDY, dx1));
    OK(mpt_op_conv2d_backward_data(S, &g, n, o, dW, dDY, dx2));
    OK(mpt__cuda_conv2d_backward_weights_im2col(S, &g, n, o, dX, dDY, dw1, db1));
    OK(mpt_op_conv2d_backward_weights(S, &g, n, o, dX, dDY, dw2, db2));
    float *hy1 = halloc((size_t)ny * 4), *hy3 = halloc((size_t)ny * 4);
    float *hx1 = halloc((size_t)nx * 4), *hw1 = halloc((size_t)nw * 4), *hb1 = halloc((size_t)o * 4);
    down(hy1, y1, (size_t)ny * 4);
    down(hy3, y3, (size_t)ny * 4);
    down(hx1, dx1, (size_t)nx * 4);
    down(hw1, dw1, (size_t)nw * 4);
    down(hb1, db1, (size_t)o * 4);
    expect_dev("cudnn forward", y2, hy1, ny, 1e-4, 1e-4);
    expect_dev("cudnn forward (cached plan)", y2, hy3, ny, 0, 0);
    expect_dev("cudnn backward data", dx2, hx1, nx, 1e-4, 1e-4);
    expect_dev("cudnn backward weights", dw2, hw1, nw, 1e-4, 1e-4);
    expect_dev("cudnn backward bias", db2, hb1, o, 1e-4, 1e-4);
    /* and the im2col path moved them (the comparison says something) */
    ck_assert_msg(fabs(hx1[0] - dx0[0]) + fabs(hw1[0] - dw0[0]) > 1e-6, "nothing accumulated");
    dfree(dX), dfree(dW), dfree(dB), dfree(dDY), dfree(y1), dfree(y2), dfree(y3);
    dfree(dx1), dfree(dx2), dfree(dw1), dfree(dw2), dfree(db1), dfree(db2);
    free(x), free(w), free(b), free(dy), free(dx0), free(dw0), free(db0);
    free(hy1), free(hy3), free(hx1), free(hw1), free(hb1);
  }
}
END_TEST

START_TEST(test_maxpool_forward_backward_match_cpu_exactly) {
  const int64_t geoms[][5] = {/* H, W, k, stride, planes */
                              {8, 8, 2, 2, 6}, {9, 7, 3, 2, 4}, {6, 6, 3, 1, 3}, {5, 9, 2, 3, 2}};
  for (int t = 0; t < 4; t++) {
    mpt_conv_geom g = {.channels = 1, .height = geoms[t][0], .width = geoms[t][1],
                       .kernel_h = geoms[t][2], .kernel_w = geoms[t][2], .stride = geoms[t][3]};
    OK(mpt_conv_geom_resolve(&g));
    const int64_t planes = geoms[t][4], nx = planes * g.height * g.width;
    const int64_t ny = planes * g.out_h * g.out_w;
    float *x = hdyadic(nx, 90 + t); /* ties: the first maximum must win on both */
    x[3] = NAN;                     /* NaN propagates (a later NaN wins) */
    x[nx - 1] = NAN;
    float *y = halloc((size_t)ny * sizeof *y), *dyh = hrand(ny, 100 + t, -1, 1);
    float *dxh = hrand(nx, 110 + t, -1, 1);
    int32_t *am = halloc((size_t)ny * sizeof *am), *gam = halloc((size_t)ny * sizeof *gam);
    float *dx = upf(x, nx), *dy = upf(y, ny), *dgrad = upf(dyh, ny), *ddx = upf(dxh, nx);
    int32_t *dam = up(am, (size_t)ny * sizeof *am);
    OK(mpt_op_maxpool(NULL, &g, planes, x, y, am));
    OK(mpt_op_maxpool(S, &g, planes, dx, dy, dam));
    expect_dev("maxpool y", dy, y, ny, 0, 0);
    down(gam, dam, (size_t)ny * sizeof *gam);
    for (int64_t i = 0; i < ny; i++)
      ck_assert_msg(gam[i] == am[i], "argmax[%lld]: cuda %d, cpu %d", (long long)i, gam[i],
                    am[i]);
    OK(mpt_op_maxpool_backward(NULL, &g, planes, dyh, am, dxh)); /* accumulates */
    OK(mpt_op_maxpool_backward(S, &g, planes, dgrad, dam, ddx));
    expect_dev("maxpool_backward", ddx, dxh, nx, 0, 0);
    dfree(dx), dfree(dy), dfree(dgrad), dfree(ddx), dfree(dam);
    free(x), free(y), free(dyh), free(dxh), free(am), free(gam);
  }
}
END_TEST

/* ---- batch normalisation ---- */

/* Statistics are double sums rounded once (a float ulp apart at most); y and dx are a few
 * fused operations on O(10) values: bounds of 1e-5 absolute, where an error moves O(1). */
START_TEST(test_batchnorm_matches_cpu) {
  const int64_t shapes[][3] = {{8, 3, 25}, {16, 5, 1}, {64, 2, 784}, {2, 1, 1}};
  for (int t = 0; t < 4; t++) {
    const int64_t n = shapes[t][0], c = shapes[t][1], inner = shapes[t][2], cnt = n * c * inner;
    float *x = hrand(cnt, 120 + t, -1, 2), *gamma = hrand(c, 121, 0.5f, 1.5f);
    float *beta = hrand(c, 122, -0.5f, 0.5f), *rm = hrand(c, 123, -0.1f, 0.1f);
    float *rv = hrand(c, 124, 0.9f, 1.1f), *y = halloc((size_t)cnt * sizeof *y);
    float *sm = halloc((size_t)c * sizeof *sm), *si = halloc((size_t)c * sizeof *si);
    float *dyh = hrand(cnt, 125, -1, 1), *dxh = hrand(cnt, 126, -1, 1);
    float *dgam = hrand(c, 127, -1, 1), *dbet = hrand(c, 128, -1, 1);
    float *d_x = upf(x, cnt), *d_gamma = upf(gamma, c), *d_beta = upf(beta, c);
    float *d_rm = upf(rm, c), *d_rv = upf(rv, c), *d_y = upf(y, cnt), *d_sm = upf(sm, c);
    float *d_si = upf(si, c), *d_dy = upf(dyh, cnt), *d_dx = upf(dxh, cnt);
    float *d_dgam = upf(dgam, c), *d_dbet = upf(dbet, c);
    OK(mpt_op_batchnorm_train(NULL, x, n, c, inner, gamma, beta, 1e-5f, 0.1f, rm, rv, y, sm,
                              si));
    OK(mpt_op_batchnorm_train(S, d_x, n, c, inner, d_gamma, d_beta, 1e-5f, 0.1f, d_rm, d_rv,
                              d_y, d_sm, d_si));
    expect_dev("save_mean", d_sm, sm, c, 2 * E, 1e-7);
    expect_dev("save_invstd", d_si, si, c, 2 * E, 0);
    expect_dev("running_mean", d_rm, rm, c, 2 * E, 1e-7);
    expect_dev("running_var", d_rv, rv, c, 2 * E, 0);
    expect_dev("batchnorm y", d_y, y, cnt, 1e-5, 1e-5);
    OK(mpt_op_batchnorm_backward(NULL, dyh, x, n, c, inner, gamma, sm, si, dxh, dgam, dbet));
    OK(mpt_op_batchnorm_backward(S, d_dy, d_x, n, c, inner, d_gamma, d_sm, d_si, d_dx, d_dgam,
                                 d_dbet));
    expect_dev("batchnorm dx", d_dx, dxh, cnt, 1e-5, 1e-5);
    /* sums of up to 50176 O(1) terms, rounded once: one float ulp of the sum */
    expect_dev("batchnorm dgamma", d_dgam, dgam, c, 4 * E, 1e-4);
    expect_dev("batchnorm dbeta", d_dbet, dbet, c, 4 * E, 1e-4);
    OK(mpt_op_batchnorm_backward(NULL, dyh, x, n, c, inner, gamma, sm, si, NULL, NULL, dbet));
    OK(mpt_op_batchnorm_backward(S, d_dy, d_x, n, c, inner, d_gamma, d_sm, d_si, NULL, NULL,
                                 d_dbet));
    expect_dev("batchnorm dbeta only", d_dbet, dbet, c, 4 * E, 1e-4);
    OK(mpt_op_batchnorm_eval(NULL, x, n, c, inner, gamma, beta, 1e-5f, rm, rv, y));
    OK(mpt_op_batchnorm_eval(S, d_x, n, c, inner, d_gamma, d_beta, 1e-5f, d_rm, d_rv, d_y));
    expect_dev("batchnorm eval y", d_y, y, cnt, 1e-5, 1e-5);
    /* in place on the GPU (y = x), no running statistics; the CPU kernel's pointers are
     * restrict, so its reference is computed out of place */
    OK(mpt_op_batchnorm_train(S, d_x, n, c, inner, d_gamma, d_beta, 1e-5f, 0.1f, NULL, NULL,
                              d_x, d_sm, d_si));
    OK(mpt_op_batchnorm_train(NULL, x, n, c, inner, gamma, beta, 1e-5f, 0.1f, NULL, NULL, y,
                              sm, si));
    expect_dev("batchnorm in place", d_x, y, cnt, 1e-5, 1e-5);
    dfree(d_x), dfree(d_gamma), dfree(d_beta), dfree(d_rm), dfree(d_rv), dfree(d_y);
    dfree(d_sm), dfree(d_si), dfree(d_dy), dfree(d_dx), dfree(d_dgam), dfree(d_dbet);
    free(x), free(gamma), free(beta), free(rm), free(rv), free(y), free(sm), free(si);
    free(dyh), free(dxh), free(dgam), free(dbet);
  }
}
END_TEST

/* ---- softmax cross-entropy, accuracy ---- */

static int32_t *hlabels(int64_t n, int64_t k, uint64_t seed) {
  int32_t *l = halloc((size_t)n * sizeof *l);
  mpt_rng r;
  mpt_rng_seed(&r, seed);
  for (int64_t i = 0; i < n; i++) l[i] = (int32_t)mpt_rng_below(&r, (uint64_t)k);
  return l;
}

/* GPU expf is within 2 ulp: probabilities within 8 eps relative; the loss is a mean of
 * log(z) - x terms of size ~log k, within 1e-6. Backward adds g p once (fused): 2 eps. */
START_TEST(test_softmax_xent_matches_cpu) {
  const int64_t shapes[][2] = {{1, 10}, {37, 3}, {300, 10}, {20, 1000}, {9000, 10}};
  for (int t = 0; t < 5; t++) {
    const int64_t n = shapes[t][0], k = shapes[t][1];
    float *x = hrand(n * k, 130 + t, -4, 4), *p = halloc((size_t)(n * k) * sizeof *p), loss;
    x[0] = 80.0f; /* large logits: only the max-subtracted form survives */
    if (n * k > 2) x[2] = -80.0f;
    int32_t *lab = hlabels(n, k, 140 + t);
    float *dl = hrand(n * k, 150 + t, -1, 1), dloss = 1.5f;
    float *d_x = upf(x, n * k), *d_p = upf(p, n * k), *d_loss = upf(&loss, 1);
    float *d_dl = upf(dl, n * k), *d_dloss = upf(&dloss, 1);
    int32_t *d_lab = up(lab, (size_t)n * sizeof *lab);
    OK(mpt_op_softmax_xent(NULL, x, lab, n, k, p, &loss));
    OK(mpt_op_softmax_xent(S, d_x, d_lab, n, k, d_p, d_loss));
    expect_dev("probs", d_p, p, n * k, 8 * E, 1e-30);
    expect_dev("loss", d_loss, &loss, 1, 1e-6, 1e-6);
    OK(mpt_op_softmax_xent_backward(NULL, p, lab, n, k, &dloss, dl));
    OK(mpt_op_softmax_xent_backward(S, d_p, d_lab, n, k, d_dloss, d_dl));
    expect_dev("dlogits", d_dl, dl, n * k, 4 * E, 4 * E);
    dfree(d_x), dfree(d_p), dfree(d_loss), dfree(d_dl), dfree(d_dloss), dfree(d_lab);
    free(x), free(p), free(lab), free(dl);
  }
}
END_TEST

/* The CUDA forward does not synchronise to check labels: a bad one makes the loss NaN. */
START_TEST(test_softmax_xent_bad_label_gives_nan_loss) {
  float x[6] = {1, 2, 3, 4, 5, 6}, loss = 0;
  int32_t lab[2] = {1, 3};
  float *d_x = upf(x, 6), *d_p = upf(x, 6), *d_loss = upf(&loss, 1);
  int32_t *d_lab = up(lab, sizeof lab);
  OK(mpt_op_softmax_xent(S, d_x, d_lab, 2, 3, d_p, d_loss));
  down(&loss, d_loss, sizeof loss);
  ck_assert_msg(isnan(loss), "loss %g with label 3 of 3 classes", (double)loss);
  dfree(d_x), dfree(d_p), dfree(d_loss), dfree(d_lab);
}
END_TEST

START_TEST(test_count_correct_matches_cpu_and_rejects_bad_labels) {
  const int64_t n = 5000, k = 10;
  float *x = hdyadic(n * k, 160); /* ties: the first maximum wins on both */
  int32_t *lab = hlabels(n, k, 161);
  for (int64_t i = 0; i < n; i += 3) { /* make about a third of the rows hits */
    int64_t best = 0;
    for (int64_t j = 1; j < k; j++)
      if (x[i * k + j] > x[i * k + best]) best = j;
    lab[i] = (int32_t)best;
  }
  float *d_x = upf(x, n * k);
  int32_t *d_lab = up(lab, (size_t)n * sizeof *lab);
  int64_t want = 5, got = 5; /* both accumulate */
  OK(mpt_op_count_correct(NULL, x, lab, n, k, &want));
  OK(mpt_op_count_correct(S, d_x, d_lab, n, k, &got));
  ck_assert_int_eq(got, want);
  ck_assert_int_ge(want, 5 + n / 3);
  lab[4321] = 10;
  lab[4500] = -1;
  dfree(d_lab);
  d_lab = up(lab, (size_t)n * sizeof *lab);
  ck_assert_int_eq(mpt_op_count_correct(S, d_x, d_lab, n, k, &got), MPT_EINVAL);
  ck_assert_msg(strstr(mpt_last_error(), "row 4321 has label 10"), "%s", mpt_last_error());
  ck_assert_int_eq(got, want); /* untouched on error */
  dfree(d_x), dfree(d_lab);
  free(x), free(lab);
}
END_TEST

/* ---- optimizers, finiteness ---- */

/* Three steps of each variant; fused multiply-adds differ by an ulp per operation. */
START_TEST(test_optimizer_steps_match_cpu) {
  enum { N = 10007 };
  const struct { float lr, mom, damp, wd; int nesterov; } v[] = {
      {0.1f, 0, 0, 0, 0}, {0.1f, 0.9f, 0, 0, 0}, {0.05f, 0.9f, 0, 1e-2f, 1},
      {0.1f, 0.5f, 0.3f, 1e-3f, 0}};
  for (int t = 0; t < 4; t++) {
    float *p = hrand(N, 170, -1, 1), *buf = hrand(N, 171, -1, 1), *d_p = upf(p, N);
    float *d_buf = upf(buf, N);
    for (int step = 0; step < 3; step++) {
      float *g = hrand(N, 172 + step, -1, 1), *d_g = upf(g, N);
      OK(mpt_op_sgd_step(NULL, p, g, buf, N, v[t].lr, v[t].mom, v[t].damp, v[t].wd,
                         v[t].nesterov, step == 0));
      OK(mpt_op_sgd_step(S, d_p, d_g, d_buf, N, v[t].lr, v[t].mom, v[t].damp, v[t].wd,
                         v[t].nesterov, step == 0));
      dfree(d_g);
      free(g);
    }
    expect_dev("sgd param", d_p, p, N, 1e-6, 1e-6);
    expect_dev("sgd momentum", d_buf, buf, N, 1e-6, 1e-6);
    dfree(d_p), dfree(d_buf);
    free(p), free(buf);
  }
  float *p = hrand(N, 180, -1, 1), *m = halloc(N * sizeof *m), *vv = halloc(N * sizeof *vv);
  float *d_p = upf(p, N), *d_m = upf(m, N), *d_v = upf(vv, N);
  for (int64_t step = 1; step <= 3; step++) {
    float *g = hrand(N, 180 + (uint64_t)step, -1, 1), *d_g = upf(g, N);
    OK(mpt_op_adamw_step(NULL, p, g, m, vv, N, 1e-2f, 0.9f, 0.999f, 1e-8f, 1e-2f, step));
    OK(mpt_op_adamw_step(S, d_p, d_g, d_m, d_v, N, 1e-2f, 0.9f, 0.999f, 1e-8f, 1e-2f, step));
    dfree(d_g);
    free(g);
  }
  expect_dev("adamw param", d_p, p, N, 1e-6, 1e-6);
  expect_dev("adamw m", d_m, m, N, 1e-6, 1e-7);
  expect_dev("adamw v", d_v, vv, N, 1e-6, 1e-9);
  dfree(d_p), dfree(d_m), dfree(d_v);
  free(p), free(m), free(vv);
}
END_TEST

START_TEST(test_check_finite_matches_cpu) {
  enum { N = 100000 };
  float *x = hrand(N, 190, -1e30f, 1e30f), *d_x = upf(x, N);
  int want = -1, got = -1;
  OK(mpt_op_check_finite(S, d_x, N, &got));
  ck_assert_int_eq(got, 0);
  const int64_t at[2] = {N - 1, N / 2};
  const float bad[2] = {NAN, -INFINITY};
  for (int t = 0; t < 2; t++) {
    x[at[t]] = bad[t];
    dfree(d_x);
    d_x = upf(x, N);
    OK(mpt_op_check_finite(NULL, x, N, &want));
    OK(mpt_op_check_finite(S, d_x, N, &got));
    ck_assert_int_eq(want, 1);
    ck_assert_int_eq(got, want);
    x[at[t]] = 0;
  }
  dfree(d_x);
  free(x);
}
END_TEST

int main(void) {
  /* Decide before Check starts: no suite (and no CUDA work) without a GPU. */
  if (mpt_device_count(MPT_DEVICE_CUDA) == 0) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  Suite *suite = suite_create("cuda_ops");
  TCase *tc = tcase_create("cuda");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_gemm_matches_cpu_for_all_transposes);
  tcase_add_test(tc, test_gemm_with_k_zero_scales_c_by_beta);
  tcase_add_test(tc, test_elementwise_ops_match_cpu);
  tcase_add_test(tc, test_sum_matches_cpu_in_double);
  tcase_add_test(tc, test_bias_add_and_backward_match_cpu);
  tcase_add_test(tc, test_im2col_and_col2im_match_cpu_exactly);
  tcase_add_test(tc, test_library_convolutions_match_im2col);
  tcase_add_test(tc, test_maxpool_forward_backward_match_cpu_exactly);
  tcase_add_test(tc, test_batchnorm_matches_cpu);
  tcase_add_test(tc, test_softmax_xent_matches_cpu);
  tcase_add_test(tc, test_softmax_xent_bad_label_gives_nan_loss);
  tcase_add_test(tc, test_count_correct_matches_cpu_and_rejects_bad_labels);
  tcase_add_test(tc, test_optimizer_steps_match_cpu);
  tcase_add_test(tc, test_check_finite_matches_cpu);
  suite_add_tcase(suite, tc);
  SRunner *sr = srunner_create(suite);
  srunner_set_fork_status(sr, CK_NOFORK); /* a CUDA context does not survive fork() */
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
