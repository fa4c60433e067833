/* Tests of the training ops of src/core/ops.c on the CPU (src/core/cpu/norm_cpu.c and
 * optim_cpu.c): batch normalisation against a double-precision reference (its backward against
 * central finite differences of that reference, an oracle independent of the formula the kernel
 * uses), and the SGD and AdamW steps against values worked by hand and a double reference over
 * three steps. Each bound is stated where it is used: a few float ulps of the quantities
 * involved, far below the O(1) error of a wrong formula or index. */
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

/* ---- batch normalisation ---- */

typedef struct bn_shape {
  int64_t n, c, inner;
} bn_shape;

/* inner 11 and 5: blocks of 8 plus a remainder, and remainder only; inner 1: BatchNorm1d. */
static const bn_shape bn_shapes[] = {{4, 3, 5}, {6, 4, 1}, {3, 2, 4}, {2, 3, 11}};
#define BN_MAX 66 /* elements in the largest shape */

/* Double forward: per channel mean and biased var, y = gamma (x - mean) / sqrt(var + eps) +
 * beta. mean and var may be NULL. */
static void bn_ref(bn_shape s, const double *x, const double *gamma, const double *beta,
                   double eps, double *y, double *mean, double *var) {
  const double N = (double)(s.n * s.inner);
  for (int64_t ch = 0; ch < s.c; ch++) {
    double mu = 0, v = 0;
    for (int64_t r = 0; r < s.n; r++)
      for (int64_t i = 0; i < s.inner; i++) mu += x[(r * s.c + ch) * s.inner + i];
    mu /= N;
    for (int64_t r = 0; r < s.n; r++)
      for (int64_t i = 0; i < s.inner; i++) {
        const double d = x[(r * s.c + ch) * s.inner + i] - mu;
        v += d * d;
      }
    v /= N;
    for (int64_t r = 0; r < s.n; r++)
      for (int64_t i = 0; i < s.inner; i++) {
        const int64_t at = (r * s.c + ch) * s.inner + i;
        y[at] = gamma[ch] * (x[at] - mu) / sqrt(v + eps) + beta[ch];
      }
    if (mean) mean[ch] = mu;
    if (var) var[ch] = v;
  }
}

/* Inputs with a different offset per channel (up to 5), so that subtracting the mean matters. */
static void bn_inputs(bn_shape s, uint64_t seed, float *x, float *gamma, float *beta) {
  rand_fill(x, s.n * s.c * s.inner, seed, -1, 1);
  for (int64_t q = 0; q < s.n * s.c * s.inner; q++) x[q] += (float)(2 * ((q / s.inner) % s.c) - 1);
  rand_fill(gamma, s.c, seed + 1, 0.5f, 1.5f);
  rand_fill(beta, s.c, seed + 2, -1, 1);
}

START_TEST(test_batchnorm_train_matches_double_reference) {
  const float eps = 1e-5f, momentum = 0.1f;
  for (size_t t = 0; t < sizeof bn_shapes / sizeof bn_shapes[0]; t++) {
    const bn_shape s = bn_shapes[t];
    const int64_t count = s.n * s.c * s.inner, N = s.n * s.inner;
    float x[BN_MAX], y[BN_MAX], gamma[4], beta[4], sm[4], si[4], rm[4], rv[4], rm0[4], rv0[4];
    double xd[BN_MAX], yd[BN_MAX], gd[4], bd[4], mean[4], var[4];
    bn_inputs(s, 10 + t, x, gamma, beta);
    rand_fill(rm0, s.c, 20 + t, -1, 1);
    rand_fill(rv0, s.c, 30 + t, 0.5f, 1.5f);
    memcpy(rm, rm0, sizeof rm);
    memcpy(rv, rv0, sizeof rv);
    OK(mpt_op_batchnorm_train(NULL, x, s.n, s.c, s.inner, gamma, beta, eps, momentum, rm, rv, y,
                              sm, si));
    for (int64_t q = 0; q < count; q++) xd[q] = x[q];
    for (int64_t ch = 0; ch < s.c; ch++) gd[ch] = gamma[ch], bd[ch] = beta[ch];
    bn_ref(s, xd, gd, bd, eps, yd, mean, var);
    /* y: the float rounding of the mean (|mean| <= 5, half an ulp 2.4e-7) times gamma *
     * invstd (< 4), plus three roundings of |y| < 4: at most ~1.5e-6 (5e-7 measured). */
    for (int64_t q = 0; q < count; q++)
      CLOSE(y[q], yd[q], 3e-6, "shape %zu y[%lld]", t, (long long)q);
    for (int64_t ch = 0; ch < s.c; ch++) {
      const double invstd = 1.0 / sqrt(var[ch] + eps);
      /* Statistics are computed in double and rounded once: within an ulp. */
      CLOSE(sm[ch], mean[ch], FLT_EPSILON * fabs(mean[ch]), "save_mean %lld", (long long)ch);
      CLOSE(si[ch], invstd, FLT_EPSILON * invstd, "save_invstd %lld", (long long)ch);
      const double want_rm = (1 - (double)momentum) * rm0[ch] + (double)momentum * mean[ch];
      const double want_rv = (1 - (double)momentum) * rv0[ch] +
                             (double)momentum * var[ch] * (double)N / (double)(N - 1);
      CLOSE(rm[ch], want_rm, 2 * FLT_EPSILON * fabs(want_rm), "running_mean %lld", (long long)ch);
      CLOSE(rv[ch], want_rv, 2 * FLT_EPSILON * fabs(want_rv), "running_var %lld", (long long)ch);
    }
    float y2[BN_MAX]; /* running statistics are optional and do not change the output */
    OK(mpt_op_batchnorm_train(NULL, x, s.n, s.c, s.inner, gamma, beta, eps, momentum, NULL,
                              NULL, y2, sm, si));
    ck_assert(memcmp(y, y2, (size_t)count * sizeof *y) == 0);
  }
}
END_TEST

START_TEST(test_batchnorm_eval_uses_running_statistics) {
  const bn_shape s = {4, 3, 5};
  const int64_t count = s.n * s.c * s.inner;
  const float eps = 1e-3f;
  float x[BN_MAX], y[BN_MAX], gamma[3], beta[3], rm[3], rv[3];
  bn_inputs(s, 40, x, gamma, beta);
  rand_fill(rm, 3, 41, -2, 2);
  rand_fill(rv, 3, 42, 0.25f, 2);
  OK(mpt_op_batchnorm_eval(NULL, x, s.n, s.c, s.inner, gamma, beta, eps, rm, rv, y));
  for (int64_t q = 0; q < count; q++) {
    const int64_t ch = (q / s.inner) % s.c;
    const double want = gamma[ch] * ((double)x[q] - rm[ch]) / sqrt((double)rv[ch] + eps) + beta[ch];
    /* x - rm, the scale and y each rounded once (|y| < 8): about 1e-6 at worst. */
    CLOSE(y[q], want, 3e-6, "y[%lld]", (long long)q);
  }
}
END_TEST

/* sum_q w_q y_q(x, gamma, beta), the objective whose gradient is backward's output. */
static double bn_objective(bn_shape s, const double *x, const double *gamma, const double *beta,
                           double eps, const double *w) {
  double y[BN_MAX], total = 0;
  bn_ref(s, x, gamma, beta, eps, y, NULL, NULL);
  for (int64_t q = 0; q < s.n * s.c * s.inner; q++) total += w[q] * y[q];
  return total;
}

/* Central difference of the objective in one coordinate v (restored afterwards). h = 1e-5:
 * truncation O(h^2) ~ 1e-10, cancellation ~ 1e-16 * |objective| / h ~ 1e-10. */
static double bn_fd(bn_shape s, double *x, double *gamma, double *beta, double eps,
                    const double *w, double *v) {
  const double h = 1e-5, keep = *v;
  *v = keep + h;
  const double up = bn_objective(s, x, gamma, beta, eps, w);
  *v = keep - h;
  const double down = bn_objective(s, x, gamma, beta, eps, w);
  *v = keep;
  return (up - down) / (2 * h);
}

START_TEST(test_batchnorm_backward_matches_finite_differences) {
  const float eps = 1e-5f;
  for (size_t t = 0; t < sizeof bn_shapes / sizeof bn_shapes[0]; t++) {
    const bn_shape s = bn_shapes[t];
    const int64_t count = s.n * s.c * s.inner;
    float x[BN_MAX], y[BN_MAX], dy[BN_MAX], dx[BN_MAX], gamma[4], beta[4], sm[4], si[4];
    float dgamma[4], dbeta[4], dgamma2[4];
    double xd[BN_MAX], w[BN_MAX], gd[4], bd[4];
    bn_inputs(s, 50 + t, x, gamma, beta);
    rand_fill(dy, count, 60 + t, -1, 1);
    OK(mpt_op_batchnorm_train(NULL, x, s.n, s.c, s.inner, gamma, beta, eps, 0.1f, NULL, NULL, y,
                              sm, si));
    for (int64_t q = 0; q < count; q++) dx[q] = 0.25f; /* gradients accumulate */
    for (int64_t ch = 0; ch < s.c; ch++) dgamma[ch] = dbeta[ch] = dgamma2[ch] = 0.25f;
    OK(mpt_op_batchnorm_backward(NULL, dy, x, s.n, s.c, s.inner, gamma, sm, si, dx, dgamma,
                                 dbeta));
    OK(mpt_op_batchnorm_backward(NULL, dy, x, s.n, s.c, s.inner, gamma, sm, si, NULL, dgamma2,
                                 NULL)); /* outputs are independent */
    for (int64_t q = 0; q < count; q++) xd[q] = x[q], w[q] = dy[q];
    for (int64_t ch = 0; ch < s.c; ch++) gd[ch] = gamma[ch], bd[ch] = beta[ch];
    /* The kernel works from the float-rounded mean and invstd (relative 6e-8, absolute 2.4e-7
     * for the mean) and rounds sums of up to 20 terms below 2: within ~1e-6 of the exact
     * gradient (8e-7 measured). 3e-6 covers that and the finite difference's ~1e-9. */
    for (int64_t q = 0; q < count; q++)
      CLOSE(dx[q] - 0.25, bn_fd(s, xd, gd, bd, eps, w, &xd[q]), 3e-6, "shape %zu dx[%lld]", t,
            (long long)q);
    for (int64_t ch = 0; ch < s.c; ch++) {
      const double want_g = bn_fd(s, xd, gd, bd, eps, w, &gd[ch]);
      CLOSE(dgamma[ch] - 0.25, want_g, 3e-6, "shape %zu dgamma[%lld]", t, (long long)ch);
      CLOSE(dbeta[ch] - 0.25, bn_fd(s, xd, gd, bd, eps, w, &bd[ch]), 3e-6, "dbeta[%lld]",
            (long long)ch);
      ck_assert_float_eq(dgamma2[ch], dgamma[ch]);
    }
  }
}
END_TEST

/* ---- SGD ---- */

/* p = 1, constant g = 0.5, lr = 0.1, momentum 0.9, three steps, worked by hand:
 *   buf 0.5, 0.95, 1.355; p 0.95, 0.855, 0.7195.
 * Nesterov (d = g + 0.9 buf): d 0.95, 1.355, 1.7195; p 0.905, 0.7695, 0.59755.
 * Weight decay 0.5 without momentum and g = 0: p *= 1 - 0.1 * 0.5 each step: 0.857375.
 * Bound 1e-6: a handful of float roundings of values below 2 (ulp 1.2e-7 near 1). */
START_TEST(test_sgd_three_steps_match_hand_values) {
  struct {
    float momentum, weight_decay, grad;
    int nesterov;
    double want;
  } cases[] = {{0.9f, 0, 0.5f, 0, 0.7195}, {0.9f, 0, 0.5f, 1, 0.59755}, {0, 0.5f, 0, 0, 0.857375},
               {0, 0, 0.5f, 0, 0.85}};
  for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
    float p[3] = {1, 1, 1}, g[3], buf[3] = {99, 99, 99}; /* a stale buffer: step 1 overwrites */
    for (int i = 0; i < 3; i++) g[i] = cases[t].grad;
    for (int step = 1; step <= 3; step++)
      OK(mpt_op_sgd_step(NULL, p, g, buf, 3, 0.1f, cases[t].momentum, 0, cases[t].weight_decay,
                         cases[t].nesterov, step == 1));
    for (int i = 0; i < 3; i++) CLOSE(p[i], cases[t].want, 1e-6, "case %zu", t);
  }
}
END_TEST

/* Double transcription of the documented recurrence. */
static void sgd_ref(double *p, const float *g, double *buf, int64_t n, double lr, double mom,
                    double damp, double wd, int nesterov, int first) {
  for (int64_t i = 0; i < n; i++) {
    double d = g[i] + wd * p[i];
    if (mom != 0) {
      buf[i] = first ? d : mom * buf[i] + (1 - damp) * d;
      d = nesterov ? d + mom * buf[i] : buf[i];
    }
    p[i] -= lr * d;
  }
}

START_TEST(test_sgd_matches_double_reference_across_blocks) {
  enum { N = 2500 }; /* two full 1024-element blocks of the kernel and a partial one */
  struct {
    float momentum, dampening, weight_decay;
    int nesterov;
  } cases[] = {{0, 0, 0.01f, 0}, {0.9f, 0.1f, 0.01f, 0}, {0.9f, 0, 0.1f, 1}, {0.5f, 0, 0, 0}};
  static float p[N], g[N], buf[N];
  static double pd[N], bufd[N];
  const float lr = 0.05f;
  for (size_t t = 0; t < sizeof cases / sizeof cases[0]; t++) {
    rand_fill(p, N, 70 + t, -1, 1);
    for (int i = 0; i < N; i++) pd[i] = p[i];
    for (int step = 1; step <= 3; step++) {
      rand_fill(g, N, 80 + 10 * t + step, -1, 1);
      OK(mpt_op_sgd_step(NULL, p, g, buf, N, lr, cases[t].momentum, cases[t].dampening,
                         cases[t].weight_decay, cases[t].nesterov, step == 1));
      sgd_ref(pd, g, bufd, N, lr, cases[t].momentum, cases[t].dampening, cases[t].weight_decay,
              cases[t].nesterov, step == 1);
    }
    /* |p| < 1.5 and buffers < 3: three steps of ~5 roundings each (1.5e-7 measured). */
    for (int i = 0; i < N; i++) {
      CLOSE(p[i], pd[i], 1e-6, "case %zu param %d", t, i);
      if (cases[t].momentum != 0) CLOSE(buf[i], bufd[i], 1e-6, "case %zu buf %d", t, i);
    }
  }
}
END_TEST

/* ---- AdamW ---- */

/* p = 1, constant g = 0.5, lr = 0.1, betas (0.9, 0.999), eps 1e-8, weight decay 0.01. With a
 * constant gradient the bias-corrected moments are exactly g and g^2, so each step is
 *   p = p * (1 - 0.1 * 0.01) - 0.1 * 0.5 / (0.5 + 1e-8):
 *   0.899000002, 0.798101004, 0.697302905 (to 9 digits).
 * Bound 1e-6: the float moments carry relative errors ~1e-7. */
START_TEST(test_adamw_three_steps_match_hand_values) {
  const double want[3] = {0.899000002, 0.798101004, 0.697302905};
  float p[5] = {1, 1, 1, 1, 1}, g[5] = {0.5f, 0.5f, 0.5f, 0.5f, 0.5f}, m[5] = {0}, v[5] = {0};
  for (int step = 1; step <= 3; step++) {
    OK(mpt_op_adamw_step(NULL, p, g, m, v, 5, 0.1f, 0.9f, 0.999f, 1e-8f, 0.01f, step));
    for (int i = 0; i < 5; i++) CLOSE(p[i], want[step - 1], 1e-6, "step %d", step);
  }
}
END_TEST

START_TEST(test_adamw_matches_double_reference) {
  enum { N = 1000 };
  static float p[N], g[N], m[N], v[N];
  static double pd[N], md[N], vd[N];
  const double lr = 0.01f, b1 = 0.8f, b2 = 0.99f, eps = 1e-6f, wd = 0.1f;
  rand_fill(p, N, 90, -1, 1);
  for (int i = 0; i < N; i++) pd[i] = p[i], md[i] = vd[i] = m[i] = v[i] = 0;
  for (int step = 1; step <= 3; step++) {
    rand_fill(g, N, 91 + step, -1, 1);
    OK(mpt_op_adamw_step(NULL, p, g, m, v, N, (float)lr, (float)b1, (float)b2, (float)eps,
                         (float)wd, step));
    for (int i = 0; i < N; i++) { /* the documented formula, in double */
      pd[i] *= 1 - lr * wd;
      md[i] = b1 * md[i] + (1 - b1) * g[i];
      vd[i] = b2 * vd[i] + (1 - b2) * g[i] * g[i];
      const double mhat = md[i] / (1 - pow(b1, step)), vhat = vd[i] / (1 - pow(b2, step));
      pd[i] -= lr * mhat / (sqrt(vhat) + eps);
    }
  }
  /* The update is lr * O(1) = 0.01 per step with relative error ~1e-6 at worst (moments that
   * nearly cancel); params below 1.1: 1e-6 absolute is a few ulps. */
  for (int i = 0; i < N; i++) {
    CLOSE(p[i], pd[i], 1e-6, "param %d", i);
    CLOSE(m[i], md[i], 1e-6, "m %d", i);
    CLOSE(v[i], vd[i], 1e-6, "v %d", i);
  }
}
END_TEST

/* The step in float with the scalar loop's order of operations (optim_cpu.c; PyTorch 1.13's
 * single-tensor AdamW): the vectorised loop must give the same bits, tail included. */
START_TEST(test_adamw_is_bit_identical_to_the_scalar_formula) {
  enum { N = 1037 }; /* 64 blocks of 16 and a tail of 13 */
  static float p[N], g[N], m[N], v[N], pr[N], mr[N], vr[N];
  const float lr = 6e-4f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f;
  rand_fill(p, N, 70, -1, 1);
  for (int i = 0; i < N; i++) pr[i] = p[i], m[i] = v[i] = mr[i] = vr[i] = 0;
  for (int step = 1; step <= 3; step++) {
    rand_fill(g, N, 71 + step, -2, 2);
    g[5] = 0.0f; /* a zero gradient: v stays 0 on step 1, denom = eps */
    OK(mpt_op_adamw_step(NULL, p, g, m, v, N, lr, b1, b2, eps, wd, step));
    const float decay = (float)(1.0 - (double)lr * wd);
    const double bc1 = 1.0 - pow(b1, (double)step), bc2 = 1.0 - pow(b2, (double)step);
    const float step_size = (float)(lr / bc1), bc2_sqrt = (float)sqrt(bc2);
    for (int i = 0; i < N; i++) {
      volatile float t = pr[i] * decay; /* volatile: each operation rounded as written */
      mr[i] = b1 * mr[i] + (1.0f - b1) * g[i];
      vr[i] = b2 * vr[i] + (1.0f - b2) * g[i] * g[i];
      const float denom = sqrtf(vr[i]) / bc2_sqrt + eps;
      pr[i] = t - step_size * (mr[i] / denom);
    }
    for (int i = 0; i < N; i++)
      ck_assert_msg(memcmp(&p[i], &pr[i], 4) == 0 && memcmp(&m[i], &mr[i], 4) == 0 &&
                    memcmp(&v[i], &vr[i], 4) == 0, "step %d element %d: p %.9g / %.9g, "
                    "m %.9g / %.9g, v %.9g / %.9g", step, i, p[i], pr[i], m[i], mr[i], v[i],
                    vr[i]);
  }
}
END_TEST

int main(void) {
  Suite *suite = suite_create("ops_train");
  TCase *tc = tcase_create("cpu");
  tcase_add_test(tc, test_batchnorm_train_matches_double_reference);
  tcase_add_test(tc, test_batchnorm_eval_uses_running_statistics);
  tcase_add_test(tc, test_batchnorm_backward_matches_finite_differences);
  tcase_add_test(tc, test_sgd_three_steps_match_hand_values);
  tcase_add_test(tc, test_sgd_matches_double_reference_across_blocks);
  tcase_add_test(tc, test_adamw_three_steps_match_hand_values);
  tcase_add_test(tc, test_adamw_matches_double_reference);
  tcase_add_test(tc, test_adamw_is_bit_identical_to_the_scalar_formula);
  suite_add_tcase(suite, tc);
  SRunner *sr = srunner_create(suite);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
