/* Tests of the CUDA backend's behaviour that has no CPU counterpart to compare with
 * (src/core/cuda/ops_cuda*.c, kernels_*.cu): cuDNN's convolutions against the backend's own
 * im2col + GEMM path and its cached plans, and what the kernels do with bad labels (they do not
 * synchronise to check them). Every op against the CPU backend is in the op table,
 * tests/test_backend_ops.c (tests/test_backend_ops_cuda.sh); streams, events, copies and the
 * allocator are in tests/test_cuda_stream.c. Exits 77 (automake's SKIP) and prints "SKIP: no
 * CUDA device" when no GPU is present. Check runs the tests without forking (CK_NOFORK): a CUDA
 * context does not survive fork(). */
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
#include "check_util.h"

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
      ck_abort_msg("%s[%lld]: %.9g, want %.9g (bound %.3g + %.3g |want|)", what, (long long)i,
                   (double)got[i], (double)want[i], atol, rtol);
  }
}
/* Downloads device buffer d (n floats) and compares it with want. */
static void expect_dev(const char *what, const float *d, const float *want, int64_t n,
                       double rtol, double atol) {
  float *got = halloc((size_t)n * sizeof *got);
  down(got, d, (size_t)n * sizeof *got);
  expect_close(what, got, want, n, rtol, atol);
  free(got);
}

/* The library convolutions on CUDA (cuDNN: forward, backward data, backward
 * weights with the bias, the algorithm chosen once per shape and cached) against the im2col +
 * GEMM path (the fallback, which the op table checks against the CPU), on shapes with padding,
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

/* count_correct reads its result back, so it names the first bad row as the CPU does, and
 * leaves the count untouched. */
START_TEST(test_count_correct_rejects_bad_labels) {
  const int64_t n = 5000, k = 10;
  float *x = hdyadic(n * k, 160);
  int32_t *lab = halloc((size_t)n * sizeof *lab);
  lab[4321] = 10;
  lab[4500] = -1;
  float *d_x = upf(x, n * k);
  int32_t *d_lab = up(lab, (size_t)n * sizeof *lab);
  int64_t got = 5;
  ck_assert_int_eq(mpt_op_count_correct(S, d_x, d_lab, n, k, &got), MPT_EINVAL);
  ck_assert_msg(strstr(mpt_last_error(), "row 4321 has label 10"), "%s", mpt_last_error());
  ck_assert_int_eq(got, 5);
  dfree(d_x), dfree(d_lab);
  free(x), free(lab);
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
  tcase_add_test(tc, test_library_convolutions_match_im2col);
  tcase_add_test(tc, test_softmax_xent_bad_label_gives_nan_loss);
  tcase_add_test(tc, test_count_correct_rejects_bad_labels);
  suite_add_tcase(suite, tc);
  SRunner *sr = srunner_create(suite);
  srunner_set_fork_status(sr, CK_NOFORK); /* a CUDA context does not survive fork() */
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
