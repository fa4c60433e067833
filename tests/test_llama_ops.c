/* Tests of the Llama core ops (include/mpitrain/ops_llama.h).
 *
 * Oracles:
 * - Closed-form cases: RMSNorm of (3, 4) is (3, 4) / sqrt(12.5); RoPE at position 0 is the
 *   identity, at position p with d = 2 it rotates (x1, x2) by p radians, with d = 4 and
 *   theta = 10000 the second pair turns by p / 100; silu(0) = 0 with gradient 1/2.
 * - RoPE's backward undoes its forward (a rotation's transpose is its inverse): within 1e-6,
 *   float rounding of two rotations of values of size 1.
 * - Every gradient of RMSNorm and SwiGLU against central finite differences of the same op in
 *   float with step 1e-2 on a loss sum(y * r): the difference quotient's float error is about
 *   1e-7 / 1e-2 = 1e-5 per value of size 1 and its truncation error h^2 f''' / 6 about 2e-5,
 *   so 2e-3 relative (plus 2e-3 absolute) only fails on a wrong formula.
 * - Llama 3's scaled frequencies in closed form: d 8, theta 2^16 gives the exact powers of two
 *   1, 1/16, 1/256, 1/4096 (wavelengths 2 pi, 32 pi, 512 pi, 8192 pi); with
 *   original_max_position_embeddings 8192, low_freq_factor 1, high_freq_factor 8, factor 8
 *   (bands: wavelength below 1024 kept, above 8192 divided by 8, between them smoothed) the
 *   first two are kept exactly, the last is exactly 2^-15, and the third is
 *   ((1 - s) / 8 + s) / 256 with s = (16 / pi - 1) / 7, within float rounding (4e-7 relative:
 *   a few roundings of size 6e-8 each).
 * - mpt_op_rope_freqs at position p rotates a pair by the float product p f_i (closed form:
 *   f = 1/2 and 1/16 are exact, so the angles p / 2 and p / 16 are), and its backward undoes it.
 * - Bad arguments are refused with MPT_EINVAL. */
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/ops_llama.h"

static void fill(float *x, int n, uint32_t seed) {
  for (int i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = (float)(seed >> 8) * (2.0f / 16777216.0f) - 1.0f;
  }
}

START_TEST(rmsnorm_closed_form) {
  const float x[2] = {3.0f, 4.0f}, w[2] = {1.0f, 2.0f};
  float y[2], rstd[1];
  ck_assert_int_eq(mpt_op_rmsnorm(NULL, x, 1, 2, w, 0.0f, y, rstd), MPT_OK);
  ck_assert_float_eq_tol(rstd[0], 1.0 / sqrt(12.5), 1e-7);
  ck_assert_float_eq_tol(y[0], 3.0 / sqrt(12.5), 1e-6);
  ck_assert_float_eq_tol(y[1], 8.0 / sqrt(12.5), 1e-6);
}
END_TEST

START_TEST(rope_closed_form) {
  /* b 1, t 3, one head, d 2: position p rotates by p radians (theta does not matter). */
  float x[6] = {1, 0, 1, 0, 0, 1};
  ck_assert_int_eq(mpt_op_rope(NULL, x, 1, 3, 1, 2, 10000.0f), MPT_OK);
  ck_assert_float_eq(x[0], 1.0);
  ck_assert_float_eq(x[1], 0.0);
  ck_assert_float_eq_tol(x[2], cos(1.0), 1e-7);
  ck_assert_float_eq_tol(x[3], sin(1.0), 1e-7);
  ck_assert_float_eq_tol(x[4], -sin(2.0), 1e-7);
  ck_assert_float_eq_tol(x[5], cos(2.0), 1e-7);
  /* d 4, theta 10000, position 1, two heads: pairs (x[0], x[2]) by 1 rad, (x[1], x[3]) by
   * 10000^(-1/2) = 0.01 rad; the second head the same. */
  float v[2 * 2 * 4];
  for (int i = 0; i < 16; i++) v[i] = (i % 4 == 0 || i % 4 == 1) ? 1.0f : 0.0f;
  ck_assert_int_eq(mpt_op_rope(NULL, v, 1, 2, 2, 4, 10000.0f), MPT_OK);
  for (int h = 0; h < 2; h++) {
    const float *p0 = v + h * 4, *p1 = v + 8 + h * 4;
    ck_assert_float_eq(p0[0], 1.0); /* position 0: identity */
    ck_assert_float_eq(p0[2], 0.0);
    ck_assert_float_eq_tol(p1[0], cos(1.0), 1e-7);
    ck_assert_float_eq_tol(p1[2], sin(1.0), 1e-7);
    ck_assert_float_eq_tol(p1[1], cos(0.01), 1e-7);
    ck_assert_float_eq_tol(p1[3], sin(0.01), 1e-7);
  }
}
END_TEST

START_TEST(rope_backward_inverts) {
  enum { B = 2, T = 5, H = 3, D = 8, N = B * T * H * D };
  float x[N], y[N];
  fill(x, N, 7);
  memcpy(y, x, sizeof x);
  ck_assert_int_eq(mpt_op_rope(NULL, y, B, T, H, D, 500000.0f), MPT_OK);
  ck_assert_int_eq(mpt_op_rope_backward(NULL, y, B, T, H, D, 500000.0f), MPT_OK);
  for (int i = 0; i < N; i++) ck_assert_float_eq_tol(y[i], x[i], 1e-6);
}
END_TEST

START_TEST(rope_llama3_frequencies_closed_form) {
  const mpt_rope_scaling sc = {MPT_ROPE_LLAMA3, 8.0f, 1.0f, 8.0f, 8192};
  float f[4];
  ck_assert_int_eq(mpt_rope_inv_freq(8, 65536.0f, &sc, f), MPT_OK);
  ck_assert(f[0] == 1.0f);              /* high frequency: kept */
  ck_assert(f[1] == 1.0f / 16.0f);      /* kept */
  ck_assert(f[3] == 1.0f / 32768.0f);   /* low frequency: 2^-12 / 8 */
  const double pi = 3.14159265358979323846, sm = (16.0 / pi - 1.0) / 7.0;
  const double want = ((1.0 - sm) / 8.0 + sm) / 256.0; /* smoothed */
  ck_assert_msg(fabs(f[2] - want) <= 4e-7 * want, "f[2] %.9g want %.9g", f[2], want);
  ck_assert(f[2] > 1.0f / 2048.0f && f[2] < 1.0f / 256.0f); /* between the two bands' values */
  /* unscaled (NULL or default): theta^(-2i/d) itself; 10000^(-1/2) = 1/100 in float */
  ck_assert_int_eq(mpt_rope_inv_freq(4, 10000.0f, NULL, f), MPT_OK);
  ck_assert(f[0] == 1.0f && f[1] == 1.0f / 100.0f);
  const mpt_rope_scaling none = {0};
  ck_assert_int_eq(mpt_rope_inv_freq(4, 10000.0f, &none, f), MPT_OK);
  ck_assert(f[0] == 1.0f && f[1] == 1.0f / 100.0f);
  /* every wavelength long: all divided by factor */
  const mpt_rope_scaling tiny_ctx = {MPT_ROPE_LLAMA3, 4.0f, 1.0f, 2.0f, 1};
  ck_assert_int_eq(mpt_rope_inv_freq(4, 10000.0f, &tiny_ctx, f), MPT_OK);
  ck_assert(f[0] == 0.25f && f[1] == 0.01f / 4.0f);
}
END_TEST

START_TEST(rope_freqs_closed_form_and_backward) {
  /* b 1, t 3, one head, d 4, f = (1/2, 1/16): position p turns (x[0], x[2]) by p / 2 and
   * (x[1], x[3]) by p / 16 */
  const float f[2] = {0.5f, 0.0625f};
  float x[12];
  for (int i = 0; i < 12; i++) x[i] = (i % 4 < 2) ? 1.0f : 0.0f;
  ck_assert_int_eq(mpt_op_rope_freqs(NULL, x, 1, 3, 1, 4, f), MPT_OK);
  for (int p = 0; p < 3; p++) {
    ck_assert_float_eq_tol(x[4 * p + 0], cos(p / 2.0), 1e-7);
    ck_assert_float_eq_tol(x[4 * p + 2], sin(p / 2.0), 1e-7);
    ck_assert_float_eq_tol(x[4 * p + 1], cos(p / 16.0), 1e-7);
    ck_assert_float_eq_tol(x[4 * p + 3], sin(p / 16.0), 1e-7);
  }
  enum { B = 2, T = 5, H = 3, D = 8, N = B * T * H * D };
  float a[N], y[N], g[D / 2], z[N];
  const mpt_rope_scaling sc = {MPT_ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 64};
  ck_assert_int_eq(mpt_rope_inv_freq(D, 500000.0f, &sc, g), MPT_OK);
  fill(a, N, 11);
  memcpy(y, a, sizeof a);
  ck_assert_int_eq(mpt_op_rope_freqs(NULL, y, B, T, H, D, g), MPT_OK);
  ck_assert_int_eq(mpt_op_rope_freqs_backward(NULL, y, B, T, H, D, g), MPT_OK);
  for (int i = 0; i < N; i++) ck_assert_float_eq_tol(y[i], a[i], 1e-6);
  /* the unscaled table gives mpt_op_rope's rotation (its angle in double: float rounding) */
  ck_assert_int_eq(mpt_rope_inv_freq(D, 500000.0f, NULL, g), MPT_OK);
  memcpy(y, a, sizeof a);
  memcpy(z, a, sizeof a);
  ck_assert_int_eq(mpt_op_rope_freqs(NULL, y, B, T, H, D, g), MPT_OK);
  ck_assert_int_eq(mpt_op_rope(NULL, z, B, T, H, D, 500000.0f), MPT_OK);
  for (int i = 0; i < N; i++) ck_assert_float_eq_tol(y[i], z[i], 2e-6);
}
END_TEST

static double rms_loss(const float *x, const float *w, const float *r, int rows, int c) {
  float y[64], rstd[8];
  ck_assert_int_eq(mpt_op_rmsnorm(NULL, x, rows, c, w, 1e-5f, y, rstd), MPT_OK);
  double l = 0;
  for (int i = 0; i < rows * c; i++) l += (double)y[i] * r[i];
  return l;
}

static void near(double got, double want) {
  ck_assert_msg(fabs(got - want) <= 2e-3 + 2e-3 * fabs(want), "got %.7g want %.7g", got, want);
}

START_TEST(rmsnorm_gradients) {
  enum { R = 3, C = 7, N = R * C };
  float x[N], w[C], r[N], y[N], rstd[R], dx[N] = {0}, dw[C] = {0};
  fill(x, N, 1);
  fill(w, C, 2);
  fill(r, N, 3);
  ck_assert_int_eq(mpt_op_rmsnorm(NULL, x, R, C, w, 1e-5f, y, rstd), MPT_OK);
  ck_assert_int_eq(mpt_op_rmsnorm_backward(NULL, r, x, R, C, w, rstd, dx, dw), MPT_OK);
  const float h = 1e-2f;
  for (int i = 0; i < N; i++) {
    const float keep = x[i];
    x[i] = keep + h;
    const double lp = rms_loss(x, w, r, R, C);
    x[i] = keep - h;
    const double lm = rms_loss(x, w, r, R, C);
    x[i] = keep;
    near(dx[i], (lp - lm) / (2 * h));
  }
  for (int j = 0; j < C; j++) {
    const float keep = w[j];
    w[j] = keep + h;
    const double lp = rms_loss(x, w, r, R, C);
    w[j] = keep - h;
    const double lm = rms_loss(x, w, r, R, C);
    w[j] = keep;
    near(dw[j], (lp - lm) / (2 * h));
  }
}
END_TEST

START_TEST(swiglu_values_and_gradients) {
  enum { N = 9 };
  float g[N], u[N], r[N], y[N], dg[N] = {0}, du[N] = {0};
  fill(g, N, 4);
  fill(u, N, 5);
  fill(r, N, 6);
  g[0] = 0.0f;
  for (int i = 0; i < N; i++) g[i] *= 3.0f;
  ck_assert_int_eq(mpt_op_swiglu(NULL, y, g, u, N), MPT_OK);
  ck_assert_float_eq(y[0], 0.0);
  for (int i = 0; i < N; i++)
    ck_assert_float_eq_tol(y[i], g[i] / (1.0 + exp(-(double)g[i])) * u[i], 1e-6);
  ck_assert_int_eq(mpt_op_swiglu_backward(NULL, r, g, u, N, dg, du), MPT_OK);
  ck_assert_float_eq_tol(dg[0], 0.5 * r[0] * u[0], 1e-7);
  const float h = 1e-2f;
  for (int i = 0; i < N; i++) {
    float a[1], b[1], p = g[i] + h, m = g[i] - h;
    mpt_op_swiglu(NULL, a, &p, &u[i], 1);
    mpt_op_swiglu(NULL, b, &m, &u[i], 1);
    near(dg[i], r[i] * ((double)a[0] - b[0]) / (2 * h));
    near(du[i], r[i] * (double)(g[i] / (1.0f + expf(-g[i]))));
  }
}
END_TEST

START_TEST(bad_arguments) {
  float x[8] = {0}, w[4] = {1, 1, 1, 1}, y[8], rs[2];
  ck_assert_int_eq(mpt_op_rmsnorm(NULL, x, 2, 4, w, -1.0f, y, rs), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_rmsnorm(NULL, x, 2, 0, w, 1e-5f, y, rs), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_rmsnorm(NULL, NULL, 2, 4, w, 1e-5f, y, rs), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_rope(NULL, x, 1, 1, 1, 3, 10000.0f), MPT_EINVAL); /* odd d */
  ck_assert_int_eq(mpt_op_rope(NULL, x, 1, 1, 2, 4, 1.0f), MPT_EINVAL);     /* theta <= 1 */
  ck_assert_int_eq(mpt_op_rope(NULL, x, 1, 1, 2, 4, NAN), MPT_EINVAL);
  const float fr[2] = {1.0f, INFINITY};
  ck_assert_int_eq(mpt_op_rope_freqs(NULL, x, 1, 1, 2, 4, NULL), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_rope_freqs(NULL, x, 1, 1, 2, 4, fr), MPT_EINVAL); /* not finite */
  ck_assert_int_eq(mpt_op_rope_freqs_backward(NULL, x, 1, 1, 1, 3, fr), MPT_EINVAL);
  mpt_rope_scaling sc = {MPT_ROPE_LLAMA3, 0.5f, 1.0f, 4.0f, 8192}; /* factor < 1 */
  float f[2];
  ck_assert_int_eq(mpt_rope_scaling_check(&sc), MPT_EINVAL);
  ck_assert_int_eq(mpt_rope_inv_freq(4, 10000.0f, &sc, f), MPT_EINVAL);
  sc.factor = 8.0f;
  sc.original_max_position_embeddings = 0;
  ck_assert_int_eq(mpt_rope_scaling_check(&sc), MPT_EINVAL);
  sc.original_max_position_embeddings = 8192;
  sc.low_freq_factor = 0.0f;
  ck_assert_int_eq(mpt_rope_scaling_check(&sc), MPT_EINVAL);
  sc.low_freq_factor = 4.0f; /* high_freq_factor must be above it */
  ck_assert_int_eq(mpt_rope_scaling_check(&sc), MPT_EINVAL);
  sc.low_freq_factor = 1.0f;
  ck_assert_int_eq(mpt_rope_scaling_check(&sc), MPT_OK);
  sc.type = (mpt_rope_type)7;
  ck_assert_int_eq(mpt_rope_scaling_check(&sc), MPT_EINVAL);
  ck_assert_int_eq(mpt_rope_scaling_check(NULL), MPT_OK);
  ck_assert_int_eq(mpt_rope_inv_freq(3, 10000.0f, NULL, f), MPT_EINVAL);
  ck_assert_int_eq(mpt_rope_inv_freq(4, 10000.0f, NULL, NULL), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_swiglu(NULL, y, NULL, x, 8), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_swiglu(NULL, y, x, x, -1), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_swiglu(NULL, NULL, NULL, NULL, 0), MPT_OK); /* no work */
}
END_TEST

int main(void) {
  Suite *s = suite_create("llama_ops");
  TCase *tc = tcase_create("ops");
  tcase_add_test(tc, rmsnorm_closed_form);
  tcase_add_test(tc, rope_closed_form);
  tcase_add_test(tc, rope_backward_inverts);
  tcase_add_test(tc, rope_llama3_frequencies_closed_form);
  tcase_add_test(tc, rope_freqs_closed_form_and_backward);
  tcase_add_test(tc, rmsnorm_gradients);
  tcase_add_test(tc, swiglu_values_and_gradients);
  tcase_add_test(tc, bad_arguments);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
