/* Tests of causal multi-head attention (include/mpitrain/transformer.h; src/nn/attention.c)
 * through the tape; the other transformer ops are tested in tests/test_gpt_ops.c, whose
 * fixture and gradient check (tests/gpt_ops_util.h) these tests share.
 *
 * Oracles:
 * - Gradients: central finite differences in double of L = sum_i y_i r_i (r fixed, random)
 *   against the tape's backward, for every element of the packed qkv input, with 1, 2 and 4
 *   heads.
 * - Exact small cases: attention at T = 1 is the v projection, and with equal keys it is the
 *   running mean of v (the causal mask).
 * - Attention at T = 150 (several blocks of any blocking) against naive loops in double, forward
 *   and backward.
 * - Bad shapes are refused. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/autograd.h"
#include "mpitrain/transformer.h"
#include "gpt_ops_util.h"

/* ------------------------------------------------------------------------------------------ */
/* Attention                                                                                  */

static mpt_status attn_build(fx *f, mpt_var **y) {
  return mpt_nn_causal_attention(f->tape, pv(f, f->p[0]), f->n_head, y);
}

START_TEST(test_attention_gradients_match_finite_differences) {
  /* _i: heads 1, 2, 4 */
  fx f;
  fx_begin(&f);
  f.n_head = 1 << _i;
  add_param(&f, "qkv", 3, NB, NT, 3 * NC, 1);
  fx_finish(&f, 16);
  float *x = pdata(&f, f.p[0]);
  for (int i = 0; i < NB * NT * 3 * NC; i++) x[i] *= 2.0f; /* peaked softmaxes too */
  use_weighted_sum(&f, attn_build);
  gradcheck_all(&f, attn_build, "attention");
  fx_free(&f);
}
END_TEST

START_TEST(test_attention_of_one_position_is_the_v_projection) {
  fx f;
  fx_begin(&f);
  add_param(&f, "qkv", 3, 3, 1, 3 * NC, 1);
  fx_finish(&f, 17);
  mpt_var *y = NULL;
  mpt_tape_reset(f.tape, 0);
  OK(attn_build(&f, &y));
  const float *x = pdata(&f, f.p[0]), *yv = mpt_var_value(y)->data;
  for (int b = 0; b < 3; b++)
    for (int c = 0; c < NC; c++) ck_assert_float_eq(yv[b * NC + c], x[b * 3 * NC + 2 * NC + c]);
  fx_free(&f);
}
END_TEST

START_TEST(test_attention_with_equal_keys_is_the_causal_running_mean_of_v) {
  fx f;
  fx_begin(&f);
  add_param(&f, "qkv", 3, NB, NT, 3 * NC, 1);
  fx_finish(&f, 18);
  float *x = pdata(&f, f.p[0]);
  for (int r = 0; r < NB * NT; r++) /* every position's key equals position 0's of batch 0 */
    for (int c = 0; c < NC; c++) x[r * 3 * NC + NC + c] = x[NC + c];
  mpt_var *y = NULL;
  mpt_tape_reset(f.tape, 0);
  OK(attn_build(&f, &y));
  const float *yv = mpt_var_value(y)->data;
  for (int b = 0; b < NB; b++)
    for (int t = 0; t < NT; t++)
      for (int c = 0; c < NC; c++) {
        double mean = 0;
        for (int t2 = 0; t2 <= t; t2++) mean += x[(b * NT + t2) * 3 * NC + 2 * NC + c];
        mean /= t + 1;
        ck_assert_double_eq_tol(yv[(b * NT + t) * NC + c], mean, 1e-6);
      }
  fx_free(&f);
}
END_TEST

/* Naive loops in double, straight from the definition (transformer.h), for qkv [1, t, 3c] with
 * nh heads: y [t, c] and, for the upstream gradient g [t, c], dqkv [t, 3c]. */
static void attention_naive(const float *qkv, const float *g, int t, int c, int nh, double *y,
                            double *dqkv) {
  const int hs = c / nh, c3 = 3 * c;
  const double scale = 1.0 / sqrt((double)hs);
  double *a = calloc((size_t)t, sizeof *a), *da = calloc((size_t)t, sizeof *da);
  ck_assert(a && da);
  memset(dqkv, 0, sizeof(double) * (size_t)(t * c3));
  for (int h = 0; h < nh; h++)
    for (int i = 0; i < t; i++) {
      const float *q = qkv + i * c3 + h * hs;
      double mx = -INFINITY, sum = 0, dot = 0;
      for (int j = 0; j <= i; j++) {
        a[j] = 0;
        for (int e = 0; e < hs; e++) a[j] += (double)q[e] * qkv[j * c3 + c + h * hs + e];
        a[j] *= scale;
        mx = fmax(mx, a[j]);
      }
      for (int j = 0; j <= i; j++) sum += (a[j] = exp(a[j] - mx));
      for (int j = 0; j <= i; j++) a[j] /= sum;
      for (int e = 0; e < hs; e++) {
        double acc = 0;
        for (int j = 0; j <= i; j++) acc += a[j] * qkv[j * c3 + 2 * c + h * hs + e];
        y[i * c + h * hs + e] = acc;
      }
      for (int j = 0; j <= i; j++) { /* dA, then dv */
        da[j] = 0;
        for (int e = 0; e < hs; e++) {
          da[j] += (double)g[i * c + h * hs + e] * qkv[j * c3 + 2 * c + h * hs + e];
          dqkv[j * c3 + 2 * c + h * hs + e] += a[j] * g[i * c + h * hs + e];
        }
        dot += a[j] * da[j];
      }
      for (int j = 0; j <= i; j++) { /* dS, then dq and dk */
        const double ds = a[j] * (da[j] - dot) * scale;
        for (int e = 0; e < hs; e++) {
          dqkv[i * c3 + h * hs + e] += ds * qkv[j * c3 + c + h * hs + e];
          dqkv[j * c3 + c + h * hs + e] += ds * q[e];
        }
      }
    }
  free(a);
  free(da);
}

START_TEST(test_attention_matches_naive_loops_at_long_sequences) {
  /* T = 150 (several blocks of any row blocking), C = 16, H = 2 */
  enum { LT = 150, LC = 16, LH = 2 };
  fx f;
  fx_begin(&f);
  f.n_head = LH;
  add_param(&f, "qkv", 3, 1, LT, 3 * LC, 1);
  fx_finish(&f, 25);
  float *x = pdata(&f, f.p[0]);
  for (int i = 0; i < LT * 3 * LC; i++) x[i] *= 2.0f;
  use_weighted_sum(&f, attn_build); /* the upstream gradient is r */
  backprop(&f, attn_build);
  mpt_var *y = NULL;
  mpt_tape_reset(f.tape, 0);
  OK(attn_build(&f, &y));
  double *want = malloc(sizeof(double) * LT * LC), *dwant = malloc(sizeof(double) * LT * 3 * LC);
  ck_assert(want && dwant);
  attention_naive(x, f.r, LT, LC, LH, want, dwant);
  const float *yv = mpt_var_value(y)->data, *g = gdata(&f, f.p[0]);
  for (int i = 0; i < LT * LC; i++)
    ck_assert_msg(fabs(yv[i] - want[i]) <= 1e-5 * (1 + fabs(want[i])), "y[%d] = %.7g, want %.7g",
                  i, yv[i], want[i]);
  for (int i = 0; i < LT * 3 * LC; i++)
    ck_assert_msg(fabs(g[i] - dwant[i]) <= 1e-5 * (1 + fabs(dwant[i])),
                  "dqkv[%d] = %.7g, want %.7g", i, g[i], dwant[i]);
  free(want);
  free(dwant);
  fx_free(&f);
}
END_TEST

START_TEST(test_attention_rejects_bad_shapes) {
  fx f;
  fx_begin(&f);
  add_param(&f, "qkv", 3, NB, NT, 3 * NC, 1);
  add_param(&f, "x2", 2, NT, 3 * NC, 0, 1);
  fx_finish(&f, 19);
  mpt_var *y = NULL;
  mpt_tape_reset(f.tape, 0);
  ck_assert_int_eq(mpt_nn_causal_attention(f.tape, pv(&f, f.p[0]), 3, &y), MPT_ESHAPE);
  ck_assert_int_eq(mpt_nn_causal_attention(f.tape, pv(&f, f.p[0]), 0, &y), MPT_EINVAL);
  ck_assert_int_eq(mpt_nn_causal_attention(f.tape, pv(&f, f.p[1]), 1, &y), MPT_ESHAPE);
  ck_assert_ptr_null(y);
  fx_free(&f);
}
END_TEST

static Suite *gpt_ops_attention_suite(void) {
  Suite *s = suite_create("gpt_ops_attention");
  TCase *tc = tcase_create("attention");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_attention_gradients_match_finite_differences, 0, 3);
  tcase_add_test(tc, test_attention_of_one_position_is_the_v_projection);
  tcase_add_test(tc, test_attention_with_equal_keys_is_the_causal_running_mean_of_v);
  tcase_add_test(tc, test_attention_matches_naive_loops_at_long_sequences);
  tcase_add_test(tc, test_attention_rejects_bad_shapes);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return run_suite(gpt_ops_attention_suite()); }

