/* Tests of the convolution and pooling ops of the core (src/core/ops.c and the CPU kernels in
 * src/core/cpu/): the geometry, im2col / col2im, the library's 2-D convolution and max pooling,
 * each against a naive reference loop written here, in double where rounding matters. The
 * other ops are tested in tests/test_ops.c.
 *
 * Tolerances: where a kernel only moves or adds values, the inputs are small multiples of 1/4
 * (dyadic_fill, tests/ops_util.h) so every partial sum is exact in float and results must be
 * EQUAL whatever the summation order. Elsewhere each comparison states its bound next to it,
 * a few float ulps of the quantities involved, so an indexing or formula error, which moves
 * results by O(1), cannot hide inside them. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/core.h"
#include "mpitrain/ops.h"
#include "check_util.h"
#include "ops_util.h"

/* ---- im2col / col2im ---- */

static const mpt_conv_geom geoms[] = {
    {.channels = 2, .height = 5, .width = 6, .kernel_h = 3, .kernel_w = 3, .stride = 1, .pad = 1},
    {.channels = 3, .height = 7, .width = 6, .kernel_h = 3, .kernel_w = 2, .stride = 2, .pad = 1},
    {.channels = 1, .height = 4, .width = 4, .kernel_h = 2, .kernel_w = 2, .stride = 2, .pad = 0},
    {.channels = 2, .height = 3, .width = 3, .kernel_h = 2, .kernel_w = 2, .stride = 1, .pad = 2},
    {.channels = 1, .height = 8, .width = 5, .kernel_h = 5, .kernel_w = 1, .stride = 3, .pad = 2},
    {.channels = 2, .height = 4, .width = 19, .kernel_h = 3, .kernel_w = 3, .stride = 1, .pad = 1},
    /* "same" width (stride 1, kernel_w = 2 pad + 1): the shifted-plane fast path */
    {.channels = 3, .height = 6, .width = 7, .kernel_h = 5, .kernel_w = 5, .stride = 1, .pad = 2},
    {.channels = 2, .height = 9, .width = 5, .kernel_h = 7, .kernel_w = 3, .stride = 1, .pad = 1},
    {.channels = 2, .height = 3, .width = 2, .kernel_h = 5, .kernel_w = 5, .stride = 1, .pad = 2},
    {.channels = 1, .height = 1, .width = 1, .kernel_h = 3, .kernel_w = 3, .stride = 1, .pad = 1},
    {.channels = 1, .height = 2, .width = 3, .kernel_h = 7, .kernel_w = 7, .stride = 1, .pad = 3},
    /* same width, but kernel_w * out_h * W > 8192: col2im takes the general loop */
    {.channels = 1, .height = 40, .width = 70, .kernel_h = 3, .kernel_w = 3, .stride = 1, .pad = 1},
};

/* Visits every (col index, x index or -1 for padding) pair of the Caffe layout. */
#define FOR_EACH_TAP(g, body)                                                              \
  for (int64_t c = 0; c < (g).channels; c++)                                               \
    for (int64_t i = 0; i < (g).kernel_h; i++)                                             \
      for (int64_t j = 0; j < (g).kernel_w; j++)                                           \
        for (int64_t oy = 0; oy < (g).out_h; oy++)                                         \
          for (int64_t ox = 0; ox < (g).out_w; ox++) {                                     \
            const int64_t iy = oy * (g).stride - (g).pad + i, ix = ox * (g).stride - (g).pad + j; \
            const int64_t ci = (((c * (g).kernel_h + i) * (g).kernel_w + j) * (g).out_h + oy) * \
                                   (g).out_w + ox;                                         \
            const int64_t xi = (iy < 0 || iy >= (g).height || ix < 0 || ix >= (g).width)    \
                                   ? -1 : (c * (g).height + iy) * (g).width + ix;          \
            body;                                                                          \
          }

START_TEST(test_conv_geom_resolve_computes_output_and_rejects_bad_windows) {
  mpt_conv_geom g = {.channels = 1, .height = 5, .width = 8, .kernel_h = 3, .kernel_w = 3,
                     .stride = 2, .pad = 1};
  OK(mpt_conv_geom_resolve(&g));
  ck_assert_int_eq(g.out_h, 3); /* (5 + 2 - 3) / 2 + 1 */
  ck_assert_int_eq(g.out_w, 4); /* (8 + 2 - 3) / 2 + 1 */
  mpt_conv_geom bad = g;
  bad.kernel_h = 8; /* 5 + 2 < 8 */
  expect_einval(mpt_conv_geom_resolve(&bad), "does not fit");
  bad = g;
  bad.stride = 0;
  expect_einval(mpt_conv_geom_resolve(&bad), "stride = 0");
  bad = g;
  bad.pad = -1;
  expect_einval(mpt_conv_geom_resolve(&bad), "pad = -1");
  expect_einval(mpt_conv_geom_resolve(NULL), "NULL");
}
END_TEST

START_TEST(test_im2col_and_col2im_match_naive) {
  for (size_t t = 0; t < sizeof geoms / sizeof geoms[0]; t++) {
    mpt_conv_geom g = geoms[t];
    OK(mpt_conv_geom_resolve(&g));
    const int64_t nx = g.channels * g.height * g.width;
    const int64_t ncol = g.channels * g.kernel_h * g.kernel_w * g.out_h * g.out_w;
    float *x = alloc_f(nx), *col = alloc_f(ncol), *dx = alloc_f(nx), *want = alloc_f(nx);
    dyadic_fill(x, nx, 31 + t);
    for (int64_t q = 0; q < ncol; q++) col[q] = NAN; /* every entry must be written */
    OK(mpt_op_im2col(NULL, &g, x, col));
    FOR_EACH_TAP(g, {
      const float w = xi < 0 ? 0.0f : x[xi];
      ck_assert_msg(col[ci] == w, "geom %zu: col[%lld] = %g, want %g", t, (long long)ci,
                    (double)col[ci], (double)w);
    });
    dyadic_fill(col, ncol, 41 + t);
    dyadic_fill(dx, nx, 51 + t);
    memcpy(want, dx, (size_t)nx * sizeof *dx);
    FOR_EACH_TAP(g, if (xi >= 0) want[xi] += col[ci]);
    OK(mpt_op_col2im(NULL, &g, col, dx)); /* accumulates into dx */
    for (int64_t q = 0; q < nx; q++)
      ck_assert_msg(dx[q] == want[q], "geom %zu: dx[%lld] = %g, want %g", t, (long long)q,
                    (double)dx[q], (double)want[q]);
    free(x);
    free(col);
    free(dx);
    free(want);
  }
}
END_TEST

/* <im2col(x), c> == <x, col2im(c)> on random reals. Both sides in double; the right side
 * carries col2im's float rounding, at most kh*kw terms per pixel, so the bound is
 * kh * kw * FLT_EPSILON * sum |im2col(x)_i c_i|. */
START_TEST(test_col2im_is_the_adjoint_of_im2col) {
  for (size_t t = 0; t < sizeof geoms / sizeof geoms[0]; t++) {
    mpt_conv_geom g = geoms[t];
    OK(mpt_conv_geom_resolve(&g));
    const int64_t nx = g.channels * g.height * g.width;
    const int64_t ncol = g.channels * g.kernel_h * g.kernel_w * g.out_h * g.out_w;
    float *x = alloc_f(nx), *col = alloc_f(ncol), *c = alloc_f(ncol), *dx = alloc_f(nx);
    rand_fill(x, nx, 61 + t, -1, 1);
    rand_fill(c, ncol, 71 + t, -1, 1);
    memset(dx, 0, (size_t)nx * sizeof *dx);
    OK(mpt_op_im2col(NULL, &g, x, col));
    OK(mpt_op_col2im(NULL, &g, c, dx));
    double lhs = 0, rhs = 0, mag = 0;
    for (int64_t q = 0; q < ncol; q++) {
      lhs += (double)col[q] * c[q];
      mag += fabs((double)col[q] * c[q]);
    }
    for (int64_t q = 0; q < nx; q++) rhs += (double)x[q] * dx[q];
    CLOSE(lhs, rhs, (double)(g.kernel_h * g.kernel_w) * FLT_EPSILON * mag + 1e-12,
          "geom %zu", t);
    free(x);
    free(col);
    free(c);
    free(dx);
  }
}
END_TEST

/* ---- whole-batch library convolution (oneDNN on the CPU) ---- */

/* |got - want| within 1e-5 of the sum of the magnitudes of the terms (the float rounding any
 * summation order can make), plus 1e-6. */
static void expect_close(const char *what, size_t t, const float *got, const double *want,
                         const double *mag, int64_t count) {
  for (int64_t q = 0; q < count; q++)
    ck_assert_msg(fabs(got[q] - want[q]) <= 1e-5 * mag[q] + 1e-6,
                  "case %zu %s[%lld] = %.8g, want %.8g (tol %.3g)", t, what, (long long)q,
                  (double)got[q], want[q], 1e-5 * mag[q] + 1e-6);
}

/* Double-precision convolution of x [n, C, H, W] with w [o, C, kh, kw] and b [o]: ry = the
 * output, my = the sum of the magnitudes of its terms (the scale of its rounding). With dy
 * (may be NULL) it also adds the input gradient to rdx, the weight gradient to rdw and the bias
 * gradient to rdb, their magnitudes to mdx, mdw, mdb. */
static void conv_reference(const mpt_conv_geom *g, int64_t n, int64_t o, const float *x,
                           const float *w, const float *b, const float *dy, double *ry,
                           double *my, double *rdx, double *mdx, double *rdw, double *mdw,
                           double *rdb, double *mdb) {
  const int64_t c = g->channels, h = g->height, wd = g->width, kh = g->kernel_h, kw = g->kernel_w;
  for (int64_t in = 0; in < n; in++)
    for (int64_t oc = 0; oc < o; oc++)
      for (int64_t oy = 0; oy < g->out_h; oy++)
        for (int64_t ox = 0; ox < g->out_w; ox++) {
          const int64_t yi = ((in * o + oc) * g->out_h + oy) * g->out_w + ox;
          ry[yi] = b[oc];
          my[yi] = fabs(b[oc]);
          if (dy) rdb[oc] += dy[yi], mdb[oc] += fabs(dy[yi]);
          for (int64_t ic = 0; ic < c; ic++)
            for (int64_t i = 0; i < kh; i++)
              for (int64_t j = 0; j < kw; j++) {
                const int64_t yy = oy * g->stride - g->pad + i, xx = ox * g->stride - g->pad + j;
                if (yy < 0 || yy >= h || xx < 0 || xx >= wd) continue;
                const int64_t xi = ((in * c + ic) * h + yy) * wd + xx;
                const int64_t wi = ((oc * c + ic) * kh + i) * kw + j;
                ry[yi] += (double)x[xi] * w[wi];
                my[yi] += fabs((double)x[xi] * w[wi]);
                if (!dy) continue;
                rdx[xi] += (double)w[wi] * dy[yi];
                mdx[xi] += fabs((double)w[wi] * dy[yi]);
                rdw[wi] += (double)x[xi] * dy[yi];
                mdw[wi] += fabs((double)x[xi] * dy[yi]);
              }
        }
}

/* Forward, backward data and backward weights against double-precision loops, on random
 * values, with dx, dw and db starting non-zero (they accumulate); C = 1 with an input gradient,
 * stride 2 and 3, no padding, non-square kernels, the cnn model's 5x5 pad 2 layers. Without a
 * library convolution in the build, every op must say MPT_ENOTSUP. */
START_TEST(test_conv2d_library_matches_double_loops) {
  /* n, c, h, w, o, kh, kw, stride, pad */
  const int64_t cases[][9] = {{3, 1, 28, 28, 4, 5, 5, 1, 2}, {2, 16, 14, 14, 8, 5, 5, 1, 2},
                              {2, 3, 7, 6, 5, 3, 2, 2, 1},   {1, 2, 5, 5, 3, 5, 5, 1, 0},
                              {4, 3, 9, 9, 2, 3, 3, 3, 1},   {5, 17, 6, 5, 33, 1, 1, 1, 0},
                              {32, 1, 12, 12, 8, 5, 5, 1, 2}, {32, 8, 6, 6, 16, 5, 5, 1, 2}};
  for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
    const int64_t *k = cases[t];
    const int64_t n = k[0], c = k[1], h = k[2], w = k[3], o = k[4], kh = k[5], kw = k[6];
    mpt_conv_geom g = {.channels = c, .height = h, .width = w, .kernel_h = kh, .kernel_w = kw,
                       .stride = k[7], .pad = k[8]};
    OK(mpt_conv_geom_resolve(&g));
    const int64_t oh = g.out_h, ow = g.out_w;
    const int64_t nx = n * c * h * w, nw = o * c * kh * kw, ny = n * o * oh * ow;
    float *x = alloc_f(nx), *wt = alloc_f(nw), *b = alloc_f(o), *y = alloc_f(ny);
    float *dy = alloc_f(ny), *dx = alloc_f(nx), *dw = alloc_f(nw), *db = alloc_f(o);
    double *ry = calloc((size_t)ny, sizeof(double)), *my = calloc((size_t)ny, sizeof(double));
    double *rdx = calloc((size_t)nx, sizeof(double)), *mdx = calloc((size_t)nx, sizeof(double));
    double *rdw = calloc((size_t)nw, sizeof(double)), *mdw = calloc((size_t)nw, sizeof(double));
    double *rdb = calloc((size_t)o, sizeof(double)), *mdb = calloc((size_t)o, sizeof(double));
    double *dw0 = calloc((size_t)nw, sizeof(double));
    mpt_rng r;
    mpt_rng_seed(&r, 700 + t);
    mpt_rng_fill_uniform(&r, x, nx, -1.0f, 1.0f);
    mpt_rng_fill_uniform(&r, wt, nw, -1.0f, 1.0f);
    mpt_rng_fill_uniform(&r, b, o, -1.0f, 1.0f);
    mpt_rng_fill_uniform(&r, dy, ny, -1.0f, 1.0f);
    mpt_rng_fill_uniform(&r, dx, nx, -1.0f, 1.0f);
    mpt_rng_fill_uniform(&r, dw, nw, -1.0f, 1.0f);
    mpt_rng_fill_uniform(&r, db, o, -1.0f, 1.0f);
    if (!mpt_op_conv2d_available(NULL)) {
      ck_assert_int_eq(mpt_op_conv2d_forward(NULL, &g, n, o, x, wt, b, y), MPT_ENOTSUP);
      ck_assert_int_eq(mpt_op_conv2d_backward_data(NULL, &g, n, o, wt, dy, dx), MPT_ENOTSUP);
      ck_assert_int_eq(mpt_op_conv2d_backward_weights(NULL, &g, n, o, x, dy, dw, db),
                       MPT_ENOTSUP);
    } else {
      for (int64_t q = 0; q < nx; q++) rdx[q] = dx[q], mdx[q] = fabs(dx[q]);
      for (int64_t q = 0; q < nw; q++) rdw[q] = dw0[q] = dw[q], mdw[q] = fabs(dw[q]);
      for (int64_t q = 0; q < o; q++) rdb[q] = db[q], mdb[q] = fabs(db[q]);
      conv_reference(&g, n, o, x, wt, b, dy, ry, my, rdx, mdx, rdw, mdw, rdb, mdb);
      /* twice: the second call reuses the cached plan */
      for (int rep = 0; rep < 2; rep++) {
        for (int64_t q = 0; q < ny; q++) y[q] = NAN; /* overwritten, not accumulated */
        OK(mpt_op_conv2d_forward(NULL, &g, n, o, x, wt, b, y));
        expect_close("y", t, y, ry, my, ny);
      }
      OK(mpt_op_conv2d_backward_data(NULL, &g, n, o, wt, dy, dx));
      expect_close("dx", t, dx, rdx, mdx, nx);
      OK(mpt_op_conv2d_backward_weights(NULL, &g, n, o, x, dy, dw, db));
      expect_close("dw", t, dw, rdw, mdw, nw);
      expect_close("db", t, db, rdb, mdb, o);
      /* without a bias: the forward leaves it out, the weight gradient still accumulates */
      OK(mpt_op_conv2d_forward(NULL, &g, n, o, x, wt, NULL, y));
      for (int64_t q = 0; q < ny; q++) ry[q] -= b[(q / (oh * ow)) % o];
      expect_close("y without bias", t, y, ry, my, ny);
      /* dw holds dw0 + grad now; once more without db: dw0 + 2 grad, db untouched */
      for (int64_t q = 0; q < nw; q++) rdw[q] += rdw[q] - dw0[q], mdw[q] *= 2.0;
      float db_before = db[0];
      OK(mpt_op_conv2d_backward_weights(NULL, &g, n, o, x, dy, dw, NULL));
      expect_close("dw again", t, dw, rdw, mdw, nw);
      ck_assert(db[0] == db_before);
    }
    /* bad arguments */
    ck_assert_int_eq(mpt_op_conv2d_forward(NULL, &g, 0, o, x, wt, b, y), MPT_EINVAL);
    ck_assert_int_eq(mpt_op_conv2d_backward_data(NULL, &g, n, o, wt, NULL, dx), MPT_EINVAL);
    mpt_conv_geom bad = g;
    bad.out_h += 1;
    ck_assert_int_eq(mpt_op_conv2d_backward_weights(NULL, &bad, n, o, x, dy, dw, db),
                     MPT_EINVAL);
    free(x), free(wt), free(b), free(y), free(dy), free(dx), free(dw), free(db);
    free(ry), free(my), free(rdx), free(mdx), free(rdw), free(mdw), free(rdb), free(mdb);
    free(dw0);
  }
}
END_TEST

/* 60 batch sizes, more than the per-thread plan cache keeps (48): old plans are evicted and
 * built again (twice round), and every output still equals the double-loop reference. */
START_TEST(test_conv2d_library_plan_cache_eviction) {
  if (!mpt_op_conv2d_available(NULL)) return; /* ENOTSUP is checked by the test above */
  mpt_conv_geom g = {.channels = 2, .height = 5, .width = 5, .kernel_h = 3, .kernel_w = 3,
                     .stride = 1, .pad = 1};
  OK(mpt_conv_geom_resolve(&g));
  enum { N = 60, IMG = 2 * 25, OUT = 3 * 25 };
  const int64_t o = 3;
  float w[54], b[3], x[N * IMG], y[N * OUT];
  double ref[N * OUT], mag[N * OUT];
  mpt_rng r;
  mpt_rng_seed(&r, 901);
  mpt_rng_fill_uniform(&r, w, 54, -1.0f, 1.0f);
  mpt_rng_fill_uniform(&r, b, 3, -1.0f, 1.0f);
  mpt_rng_fill_uniform(&r, x, N * IMG, -1.0f, 1.0f);
  conv_reference(&g, N, o, x, w, b, NULL, ref, mag, NULL, NULL, NULL, NULL, NULL, NULL);
  for (int round = 0; round < 2; round++)
    for (int64_t n = 1; n <= N; n++) {
      for (int64_t q = 0; q < n * OUT; q++) y[q] = NAN;
      OK(mpt_op_conv2d_forward(NULL, &g, n, o, x, w, b, y));
      for (int64_t q = 0; q < n * OUT; q++)
        ck_assert_msg(fabs(y[q] - ref[q]) <= 1e-5 * mag[q] + 1e-6,
                      "round %d, batch %lld: y[%lld] = %g, want %g", round, (long long)n,
                      (long long)q, (double)y[q], ref[q]);
    }
}
END_TEST

/* ---- max pooling ---- */

START_TEST(test_maxpool_first_maximum_wins_on_ties) {
  const float x[16] = {1, 1, 2, 0, /**/ 1, 1, 0, 2, /**/ 5, 3, 7, 7, /**/ 5, 4, 7, 7};
  mpt_conv_geom g = {.channels = 1, .height = 4, .width = 4, .kernel_h = 2, .kernel_w = 2,
                     .stride = 2};
  OK(mpt_conv_geom_resolve(&g));
  float y[4], dx[16];
  int32_t am[4];
  g.channels = 0; /* ignored by pooling */
  OK(mpt_op_maxpool(NULL, &g, 1, x, y, am));
  const float want_y[4] = {1, 2, 5, 7};
  const int32_t want_am[4] = {0, 2, 8, 10};
  for (int i = 0; i < 4; i++) {
    ck_assert_float_eq(y[i], want_y[i]);
    ck_assert_int_eq(am[i], want_am[i]);
  }
  const float dy[4] = {1, 2, 3, 4};
  for (int i = 0; i < 16; i++) dx[i] = 0.5f;
  OK(mpt_op_maxpool_backward(NULL, &g, 1, dy, am, dx));
  for (int i = 0; i < 16; i++) {
    float want = 0.5f;
    for (int o = 0; o < 4; o++)
      if (want_am[o] == i) want += dy[o];
    ck_assert_float_eq(dx[i], want);
  }
}
END_TEST

/* A NaN in a window wins over every number, and of several NaNs the last in row-major tap order
 * (each NaN is "taken"), as in the general loop; 2x2/stride 2 (its own loop) and 3x3/stride 2. */
START_TEST(test_maxpool_nan_propagates_in_every_tap) {
  const int64_t ks[2] = {2, 3};
  for (int t = 0; t < 2; t++) {
    mpt_conv_geom g = {.channels = 1, .height = 5, .width = 9, .kernel_h = ks[t],
                       .kernel_w = ks[t], .stride = 2};
    OK(mpt_conv_geom_resolve(&g));
    const int64_t hw = g.height * g.width, outs = g.out_h * g.out_w, k = ks[t];
    float *x = alloc_f(hw), *y = alloc_f(outs);
    int32_t *am = malloc((size_t)outs * sizeof *am);
    for (int64_t tap = 0; tap < k * k; tap++)
      for (int64_t second = -1; second < k * k; second++) {
        if (second == tap) continue;
        for (int64_t q = 0; q < hw; q++) x[q] = (float)(q % 7) - 3.0f;
        /* every window gets a NaN at tap `tap` and, if second >= 0, another at `second` */
        for (int64_t oy = 0; oy < g.out_h; oy++)
          for (int64_t ox = 0; ox < g.out_w; ox++) {
            const int64_t at0 = (oy * 2) * g.width + ox * 2;
            x[at0 + (tap / k) * g.width + tap % k] = NAN;
            if (second >= 0) x[at0 + (second / k) * g.width + second % k] = NAN;
          }
        OK(mpt_op_maxpool(NULL, &g, 1, x, y, am));
        for (int64_t oy = 0; oy < g.out_h; oy++)
          for (int64_t ox = 0; ox < g.out_w; ox++) {
            const int64_t o = oy * g.out_w + ox, at0 = (oy * 2) * g.width + ox * 2;
            int64_t last = -1; /* the last NaN of the window in tap order */
            for (int64_t i = 0; i < k; i++)
              for (int64_t j = 0; j < k; j++)
                if (isnan(x[at0 + i * g.width + j])) last = at0 + i * g.width + j;
            ck_assert_msg(isnan(y[o]), "k %lld tap %lld: y[%lld] = %g, want NaN", (long long)k,
                          (long long)tap, (long long)o, (double)y[o]);
            ck_assert_msg(am[o] == last, "k %lld taps %lld,%lld: argmax[%lld] = %d, want %lld",
                          (long long)k, (long long)tap, (long long)second, (long long)o, am[o],
                          (long long)last);
          }
      }
    free(x);
    free(y);
    free(am);
  }
}
END_TEST

START_TEST(test_maxpool_overlapping_windows_match_naive) {
  const mpt_conv_geom cases[] = {
      {.channels = 1, .height = 7, .width = 7, .kernel_h = 3, .kernel_w = 3, .stride = 2},
      {.channels = 1, .height = 5, .width = 6, .kernel_h = 2, .kernel_w = 3, .stride = 1},
      {.channels = 1, .height = 4, .width = 21, .kernel_h = 2, .kernel_w = 3, .stride = 1},
      {.channels = 1, .height = 6, .width = 37, .kernel_h = 2, .kernel_w = 2, .stride = 2}};
  for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
    mpt_conv_geom g = cases[t];
    OK(mpt_conv_geom_resolve(&g));
    const int64_t planes = 3, hw = g.height * g.width, outs = g.out_h * g.out_w;
    float *x = alloc_f(planes * hw), *y = alloc_f(planes * outs), *dy = alloc_f(planes * outs);
    float *dx = alloc_f(planes * hw), *want = alloc_f(planes * hw);
    int32_t *am = malloc((size_t)(planes * outs) * sizeof *am);
    mpt_rng r;
    mpt_rng_seed(&r, 81 + t);
    for (int64_t q = 0; q < planes * hw; q++) x[q] = (float)mpt_rng_below(&r, 4); /* ties */
    dyadic_fill(dy, planes * outs, 82 + t);
    dyadic_fill(dx, planes * hw, 83 + t);
    memcpy(want, dx, (size_t)(planes * hw) * sizeof *dx);
    OK(mpt_op_maxpool(NULL, &g, planes, x, y, am));
    OK(mpt_op_maxpool_backward(NULL, &g, planes, dy, am, dx));
    for (int64_t p = 0; p < planes; p++)
      for (int64_t oy = 0; oy < g.out_h; oy++)
        for (int64_t ox = 0; ox < g.out_w; ox++) {
          int64_t best = -1;
          for (int64_t i = 0; i < g.kernel_h; i++)
            for (int64_t j = 0; j < g.kernel_w; j++) {
              const int64_t at = (oy * g.stride + i) * g.width + ox * g.stride + j;
              if (best < 0 || x[p * hw + at] > x[p * hw + best]) best = at;
            }
          const int64_t o = p * outs + oy * g.out_w + ox;
          ck_assert_int_eq(am[o], best);
          ck_assert_float_eq(y[o], x[p * hw + best]);
          want[p * hw + best] += dy[o];
        }
    for (int64_t q = 0; q < planes * hw; q++) ck_assert_float_eq(dx[q], want[q]);
    free(x);
    free(y);
    free(dy);
    free(dx);
    free(want);
    free(am);
  }
}
END_TEST

int main(void) {
  Suite *suite = suite_create("ops_conv");
  TCase *tc = tcase_create("cpu");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_conv_geom_resolve_computes_output_and_rejects_bad_windows);
  tcase_add_test(tc, test_im2col_and_col2im_match_naive);
  tcase_add_test(tc, test_col2im_is_the_adjoint_of_im2col);
  tcase_add_test(tc, test_conv2d_library_matches_double_loops);
  tcase_add_test(tc, test_conv2d_library_plan_cache_eviction);
  tcase_add_test(tc, test_maxpool_first_maximum_wins_on_ties);
  tcase_add_test(tc, test_maxpool_nan_propagates_in_every_tap);
  tcase_add_test(tc, test_maxpool_overlapping_windows_match_naive);
  suite_add_tcase(suite, tc);
  return run_suite(suite);
}
