/* Tests of the fused causal attention (ops_gpt.h mpt_op_causal_attention and its backward;
 * src/core/cpu/attn_cpu.c), which mpt_nn_causal_attention uses on a float32 CPU tape.
 *
 * Oracle: the reference layer (src/nn/attention.c, mpt__causal_attention_reference), which
 * materialises [B, H, T, T] and is itself checked against naive loops in double and finite
 * differences (tests/test_gpt_ops_attention.c, which now runs the fused path). The fused op
 * does the reference's GEMMs and float operations in the reference's order (attn_cpu.c), so the
 * tolerance is zero: y and every element of dqkv are compared bit for bit, at 1, 2 and 3
 * threads (the op splits its (b, h) pairs over an OpenMP team of that size), on shapes that cover T = 1, T below, at and across the 64-row block (63, 64, 65,
 * 150), H = 1, H = 3 with an odd head size, and a qkv used twice (the second backward adds into
 * the gradient: beta 1). A wrong mask, scale, block bound, statistics row or beta breaks
 * equality at once; a fused kernel that merely rounds differently would also fail here, which
 * is the point: its contract is the reference's bits.
 * Independently of the reference: central finite differences of L = sum(y * r) in double
 * against the fused backward at T = 70 (across a block boundary), and the op's argument checks
 * and a case small enough to know by hand. */
#include <cblas.h>
#include <check.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/autograd.h"
#include "mpitrain/ops.h"
#include "mpitrain/ops_gpt.h"
#include "mpitrain/transformer.h"
#include "nn/gpt_ops.h"
#include "check_util.h"


typedef struct shape {
  int64_t b, t, c;
  int nh;
} shape;

static const shape shapes[] = {
    {2, 5, 8, 2},   {3, 1, 8, 2},    {1, 63, 16, 1}, {2, 64, 16, 2},
    {1, 65, 24, 3}, {2, 150, 32, 2}, {1, 200, 12, 1},
};
enum { NSHAPES = sizeof shapes / sizeof shapes[0] };

/* Deterministic values in [-a, a). */
static void fill_uniform(float *x, int64_t n, float a, uint32_t seed) {
  for (int64_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = a * ((float)(seed >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}

typedef struct result {
  float *y, *g; /* y [B, T, C]; dqkv [B, T, 3C] */
} result;

typedef mpt_status (*attn_fn)(mpt_tape *, mpt_var *, int, mpt_var **);

/* L = sum(y1 * r) (+ sum(y2 * r2) with `twice`: qkv feeds two attentions, so the second
 * backward accumulates), backpropagated; qkv x4 so that some softmax rows are peaked. */
static result run_layer(const shape *s, attn_fn fn, int twice) {
  const int64_t n = s->b * s->t * 3 * s->c, ny = s->b * s->t * s->c;
  const int64_t qshape[3] = {s->b, s->t, 3 * s->c}, yshape[3] = {s->b, s->t, s->c};
  mpt_model *model = NULL;
  mpt_tape *tape = NULL;
  int index = -1;
  OK(mpt_model_init(&model, mpt_device_cpu()));
  OK(mpt_model_add_param(model, "qkv", 3, qshape, MPT_INIT_ZEROS, 1, &index));
  OK(mpt_model_finalize(model));
  fill_uniform(mpt_model_param(model, index).data, n, 4.0f, 7 + (uint32_t)s->t);
  OK(mpt_tape_init(&tape, model, NULL));
  float *r = malloc(2 * (size_t)ny * sizeof *r);
  ck_assert_ptr_nonnull(r);
  fill_uniform(r, 2 * ny, 1.0f, 99);
  mpt_tensor rt = mpt_tensor_view(r, mpt_device_cpu(), MPT_F32, 3, yshape);
  mpt_tensor rt2 = mpt_tensor_view(r + ny, mpt_device_cpu(), MPT_F32, 3, yshape);
  mpt_var *qkv = NULL, *y = NULL, *y2 = NULL, *rv = NULL, *loss = NULL, *loss2 = NULL;
  OK(mpt_model_zero_grad(model, NULL));
  mpt_tape_reset(tape, 1);
  OK(mpt_tape_param(tape, index, &qkv));
  OK(fn(tape, qkv, s->nh, &y));
  result out = {.y = malloc((size_t)ny * sizeof(float)), .g = malloc((size_t)n * sizeof(float))};
  ck_assert(out.y && out.g);
  memcpy(out.y, mpt_var_value(y)->data, (size_t)ny * sizeof(float));
  OK(mpt_tape_input(tape, &rt, &rv));
  OK(mpt_nn_mul(tape, y, rv, &y));
  OK(mpt_nn_sum(tape, y, &loss));
  if (twice) {
    OK(fn(tape, qkv, s->nh, &y2));
    OK(mpt_tape_input(tape, &rt2, &rv));
    OK(mpt_nn_mul(tape, y2, rv, &y2));
    OK(mpt_nn_sum(tape, y2, &loss2));
    OK(mpt_nn_add(tape, loss, loss2, &loss));
  }
  OK(mpt_tape_backward(tape, loss, 1.0f));
  memcpy(out.g, mpt_model_grad(model, index).data, (size_t)n * sizeof(float));
  mpt_tape_free(tape);
  mpt_model_free(model);
  free(r);
  return out;
}

static void check_same(const shape *s, int twice, int threads) {
  const int64_t n = s->b * s->t * 3 * s->c, ny = s->b * s->t * s->c;
  OK(mpt_cpu_set_threads(threads));
  result ref = run_layer(s, mpt__causal_attention_reference, twice);
  const int blas_threads = openblas_get_num_threads();
  result fused = run_layer(s, mpt_nn_causal_attention, twice);
  /* the op runs OpenBLAS on one thread while its team runs, and gives the rank's count back */
  ck_assert_int_eq(openblas_get_num_threads(), blas_threads);
  for (int64_t i = 0; i < ny; i++)
    ck_assert_msg(memcmp(&ref.y[i], &fused.y[i], sizeof(float)) == 0,
                  "B %lld T %lld C %lld H %d, %d thread(s): y[%lld] fused %.9g, reference %.9g",
                  (long long)s->b, (long long)s->t, (long long)s->c, s->nh, threads,
                  (long long)i, fused.y[i], ref.y[i]);
  for (int64_t i = 0; i < n; i++)
    ck_assert_msg(memcmp(&ref.g[i], &fused.g[i], sizeof(float)) == 0,
                  "B %lld T %lld C %lld H %d, %d thread(s)%s: dqkv[%lld] fused %.9g, "
                  "reference %.9g", (long long)s->b, (long long)s->t, (long long)s->c, s->nh,
                  threads, twice ? ", qkv used twice" : "", (long long)i, fused.g[i],
                  ref.g[i]);
  free(ref.y);
  free(ref.g);
  free(fused.y);
  free(fused.g);
  OK(mpt_cpu_set_threads(1));
}

START_TEST(test_fused_attention_gives_the_reference_bits) {
  /* _i: the shape */
  ck_assert(mpt_op_causal_attention_available(NULL));
  for (int threads = 1; threads <= 3; threads++) check_same(&shapes[_i], 0, threads);
}
END_TEST

START_TEST(test_fused_attention_accumulates_into_a_gradient_used_twice) {
  check_same(&shapes[0], 1, 1);
  check_same(&shapes[5], 1, 2);
}
END_TEST

/* L = sum_i y_i r_i in double, y the fused op's output. */
static double objective(const float *qkv, const float *r, int64_t b, int64_t t, int64_t c,
                        int64_t nh, float *y, float *st) {
  OK(mpt_op_causal_attention(NULL, qkv, b, t, c, nh, y, st));
  double sum = 0;
  for (int64_t i = 0; i < b * t * c; i++) sum += (double)y[i] * r[i];
  return sum;
}

/* The tolerance of the gradient checks of tests/gpt_ops_util.h (eps 1e-2; rounding ~1e-5,
 * truncation ~1e-5; a wrong term moves an entry by 5-100 %). */
START_TEST(test_fused_attention_gradients_match_finite_differences) {
  enum { B = 1, T = 70, C = 8, H = 2, N = B * T * 3 * C, NY = B * T * C };
  static float x[N], r[NY], y[NY], st[B * H * T * 2], g[N];
  fill_uniform(x, N, 2.0f, 5);
  fill_uniform(r, NY, 1.0f, 6);
  OK(mpt_op_causal_attention(NULL, x, B, T, C, H, y, st));
  OK(mpt_op_causal_attention_backward(NULL, x, st, r, B, T, C, H, 0.0f, g));
  const double eps = 1e-2;
  for (int i = 0; i < N; i += 3) {
    const float saved = x[i];
    x[i] = (float)(saved + eps);
    const double up = (double)x[i] - saved, lp = objective(x, r, B, T, C, H, y, st);
    x[i] = (float)(saved - eps);
    const double down = (double)saved - x[i], lm = objective(x, r, B, T, C, H, y, st);
    x[i] = saved;
    const double numeric = (lp - lm) / (up + down), err = fabs(numeric - g[i]);
    const double tol = 2e-3 * fmax(fabs(numeric), fabs(g[i])) + 1e-4;
    ck_assert_msg(err <= tol, "d/dqkv[%d]: fused %.6g, numeric %.6g (err %.3g > %.3g)", i,
                  g[i], numeric, err, tol);
  }
}
END_TEST

START_TEST(test_fused_attention_op_rejects_bad_arguments) {
  float x[3 * 8 * 2], y[8 * 2], st[2 * 2 * 2], g[3 * 8 * 2];
  memset(x, 0, sizeof x);
  memset(y, 0, sizeof y);
  /* nh not dividing c, nh 0, negative extents, NULL outputs, beta not 0 or 1 */
  ck_assert_int_eq(mpt_op_causal_attention(NULL, x, 1, 2, 8, 3, y, st), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_causal_attention(NULL, x, 1, 2, 8, 0, y, st), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_causal_attention(NULL, x, -1, 2, 8, 2, y, st), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_causal_attention(NULL, x, 1, 2, 8, 2, NULL, st), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_causal_attention(NULL, x, 1, 2, 8, 2, y, NULL), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_causal_attention_backward(NULL, x, st, y, 1, 2, 8, 2, 0.5f, g),
                   MPT_EINVAL);
  ck_assert_int_eq(mpt_op_causal_attention_backward(NULL, x, NULL, y, 1, 2, 8, 2, 0.0f, g),
                   MPT_EINVAL);
  /* no work: nothing touched */
  OK(mpt_op_causal_attention(NULL, NULL, 0, 2, 8, 2, NULL, NULL));
  OK(mpt_op_causal_attention_backward(NULL, NULL, NULL, NULL, 1, 0, 8, 2, 1.0f, NULL));
  /* and a valid call works: T 2, one head of 8, equal keys: y = the running mean of v */
  for (int t = 0; t < 2; t++)
    for (int i = 0; i < 8; i++) x[t * 24 + 16 + i] = (float)(t + 1) * (float)(i + 1);
  OK(mpt_op_causal_attention(NULL, x, 1, 2, 8, 1, y, st));
  for (int i = 0; i < 8; i++) {
    ck_assert_float_eq(y[i], (float)(i + 1));
    ck_assert_float_eq_tol(y[8 + i], 1.5f * (float)(i + 1), 1e-6f);
  }
}
END_TEST

static Suite *attention_fused_suite(void) {
  Suite *s = suite_create("attention_fused");
  TCase *tc = tcase_create("attention_fused");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_fused_attention_gives_the_reference_bits, 0, NSHAPES);
  tcase_add_test(tc, test_fused_attention_accumulates_into_a_gradient_used_twice);
  tcase_add_test(tc, test_fused_attention_gradients_match_finite_differences);
  tcase_add_test(tc, test_fused_attention_op_rejects_bad_arguments);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(attention_fused_suite());
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
