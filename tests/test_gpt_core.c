/* Tests of the CPU transformer core ops (include/mpitrain/ops_gpt.h; src/core/ops_gpt.c and
 * src/core/cpu/gpt_cpu.c) called directly: the wrappers' argument checks and empty work, an
 * exact causal softmax, and GELU against its formula in double on a dense grid. Their
 * gradients are checked by finite differences through the tape in tests/test_gpt_ops.c, and
 * the CUDA kernels against these in tests/test_cuda_gpt_ops.c. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/ops_gpt.h"

#define OK(expr)                                                                              \
  do {                                                                                        \
    mpt_status st_ = (expr);                                                                  \
    ck_assert_msg(st_ == MPT_OK, "%s -> %s: %s", #expr, mpt_status_name(st_), mpt_last_error()); \
  } while (0)

START_TEST(test_core_ops_check_arguments_and_skip_empty_work) {
  float x[12] = {0}, w[4] = {1, 1, 1, 1}, b[4] = {0}, y[12], m[3], r[3];
  int32_t tg[3] = {0, 1, 2};
  ck_assert_int_eq(mpt_op_layernorm(NULL, x, 3, 0, w, b, 1e-5f, y, m, r), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_layernorm(NULL, x, 3, 4, w, b, -1.0f, y, m, r), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_layernorm(NULL, x, 3, 4, NULL, b, 1e-5f, y, m, r), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_xent_vocab(NULL, x, tg, 3, 4, 5, m, r), MPT_EINVAL); /* v > vp */
  ck_assert_int_eq(mpt_op_xent_vocab(NULL, x, tg, 0, 4, 4, m, r), MPT_EINVAL); /* no rows */
  ck_assert_int_eq(mpt_op_xent_vocab(NULL, x, tg, 3, 4, 2, m, r), MPT_EINVAL); /* tg[2] = 2 */
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "targets[2] = 2"));
  ck_assert_int_eq(mpt_op_embedding_gpt(NULL, tg, -1, 3, 4, 4, w, w, y), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_gelu(NULL, NULL, x, 3), MPT_EINVAL);
  OK(mpt_op_gelu(NULL, NULL, NULL, 0));
  OK(mpt_op_causal_softmax(NULL, NULL, 1, 0));
  OK(mpt_op_layernorm_backward(NULL, x, x, 3, 4, w, m, r, NULL, NULL, NULL)); /* nothing asked */
}
END_TEST

START_TEST(test_core_causal_softmax_of_equal_scores_is_uniform_over_the_past) {
  float s[2 * 9];
  for (int i = 0; i < 18; i++) s[i] = i < 9 ? 0.5f : -3.0f; /* two planes of equal scores */
  OK(mpt_op_causal_softmax(NULL, s, 2, 3));
  static const float want[9] = {1, 0, 0, 0.5f, 0.5f, 0, 1.0f / 3, 1.0f / 3, 1.0f / 3};
  for (int i = 0; i < 18; i++) ck_assert_float_eq_tol(s[i], want[i % 9], 1e-7f);
}
END_TEST

START_TEST(test_gelu_core_op_matches_double_precision_on_a_dense_grid) {
  /* the formula and its derivative in double at 4001 points of [-10, 10]: forward within
   * 4e-6 relative (a few float ulps) and the rounding of u below, backward within
   * 1e-6 relative + 1e-7 (float rounding of O(1) terms; gelu' crosses 0 near x = -0.75) */
  enum { N = 4001 };
  static float x[N], y[N], dx[N], dy[N];
  for (int i = 0; i < N; i++) {
    x[i] = -10.0f + (float)i * (20.0f / (N - 1));
    dy[i] = 1.0f;
    dx[i] = 0.0f;
  }
  OK(mpt_op_gelu(NULL, y, x, N));
  OK(mpt_op_gelu_backward(NULL, dx, dy, x, N));
  const double k = sqrt(2.0 / M_PI);
  for (int i = 0; i < N; i++) {
    const double v = x[i], u = k * (v + 0.044715 * v * v * v), th = tanh(u);
    /* 0.5 (1 + tanh u) = 1 / (1 + exp(-2u)) exactly; in the far tail 1 + tanh u cancels to 0
     * even in double, so the forward's reference takes the second form */
    const double want = v / (1.0 + exp(-2.0 * u));
    const double dwant = 0.5 * (1.0 + th) + 0.5 * v * (1.0 - th * th) * k * (1.0 + 3 * 0.044715 * v * v);
    /* plus the float rounding of u (relative 1.2e-7), which the tail's exp(2u) turns into a
     * relative error 2|u| times as large */
    ck_assert_msg(fabs(y[i] - want) <= (4e-6 + 2.5e-7 * fabs(u)) * fabs(want),
                  "gelu(%g) = %.9g, want %.9g", v, y[i], want);
    ck_assert_msg(fabs(dx[i] - dwant) <= 1e-6 * fabs(dwant) + 1e-7,
                  "gelu'(%g) = %.9g, want %.9g", v, dx[i], dwant);
  }
}
END_TEST

static Suite *gpt_core_suite(void) {
  Suite *s = suite_create("gpt_core");
  TCase *tc = tcase_create("gpt_core");
  tcase_add_test(tc, test_core_ops_check_arguments_and_skip_empty_work);
  tcase_add_test(tc, test_core_causal_softmax_of_equal_scores_is_uniform_over_the_past);
  tcase_add_test(tc, test_gelu_core_op_matches_double_precision_on_a_dense_grid);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(gpt_core_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
