/* Tests for src/optim (include/mpitrain/optim.h): SGD (plain, momentum, Nesterov, weight decay,
 * dampening) and AdamW against values worked by hand (the arithmetic is in the comments; the
 * same numbers were cross-checked once against torch.optim 1.13 in float64), the checkpoint
 * state path, the learning-rate schedules at chosen steps, and argument validation.
 *
 * All optimizer runs use the same 3 parameters and gradients:
 *   p0 = [1, -2, 1.5]
 *   g1 = [0.5, -1, 2]   g2 = [1, 0.25, -0.5]   g3 = [0.5, -0.5, 1]
 * chosen so that no expected value comes from a cancellation near zero (so a relative tolerance
 * of 1e-6 is meaningful for float32 arithmetic). */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain.h"

#define N 3
static const float P0[N] = {1.0f, -2.0f, 1.5f};
static const float G[3][N] = {{0.5f, -1.0f, 2.0f}, {1.0f, 0.25f, -0.5f}, {0.5f, -0.5f, 1.0f}};

/* |got - want| <= 1e-6 |want| (exact when want == 0). */
static void check_rel(double got, double want, const char *what, int i) {
  double tol = 1e-6 * fabs(want);
  ck_assert_msg(fabs(got - want) <= tol, "%s[%d] = %.9g, want %.9g (rel err %.3g)", what, i, got,
                want, want != 0 ? fabs(got - want) / fabs(want) : fabs(got));
}

static void check_vec(const float *got, const double *want, int n, const char *what) {
  for (int i = 0; i < n; ++i) check_rel(got[i], want[i], what, i);
}

/* Runs `nsteps` steps from P0 with gradients G[0..nsteps-1] and learning rates lrs[], on the
 * CPU with the NULL stream. Returns the optimizer (caller frees) and the final params in p. */
static mpt_optimizer *run_steps(const mpt_optimizer_config *cfg, int nsteps, const float *lrs,
                                float *p) {
  mpt_optimizer *opt = NULL;
  mpt_status st = mpt_optimizer_init(&opt, cfg, mpt_device_cpu(), N);
  ck_assert_msg(st == MPT_OK, "init: %s", mpt_last_error());
  memcpy(p, P0, sizeof P0);
  for (int s = 0; s < nsteps; ++s) {
    st = mpt_optimizer_step(opt, NULL, p, G[s], lrs[s]);
    ck_assert_msg(st == MPT_OK, "step %d: %s (%s)", s + 1, mpt_status_name(st), mpt_last_error());
  }
  ck_assert_int_eq(mpt_optimizer_step_count(opt), nsteps);
  return opt;
}

static mpt_optimizer_config sgd_config(float momentum, float dampening, int nesterov, float wd) {
  mpt_optimizer_config c = mpt_optimizer_config_default();
  c.kind = MPT_OPTIM_SGD;
  c.lr = 0.1f;
  c.momentum = momentum;
  c.dampening = dampening;
  c.nesterov = nesterov;
  c.weight_decay = wd;
  return c;
}

/* ---- SGD ---------------------------------------------------------------------------------- */

START_TEST(test_sgd_plain_uses_the_lr_of_each_step) {
  /* p -= lr * g, lr 0.1 then 0.2:
   *   step 1: [1 - 0.05, -2 + 0.1, 1.5 - 0.2]      = [0.95, -1.9, 1.3]
   *   step 2: [0.95 - 0.2, -1.9 - 0.05, 1.3 + 0.1] = [0.75, -1.95, 1.4] */
  mpt_optimizer_config c = sgd_config(0, 0, 0, 0);
  float p[N], lrs[] = {0.1f, 0.2f};
  mpt_optimizer *opt = run_steps(&c, 2, lrs, p);
  const double want[N] = {0.75, -1.95, 1.4};
  check_vec(p, want, N, "param");
  mpt_optimizer_state s;
  ck_assert_int_eq(mpt_optimizer_get_state(opt, &s), MPT_OK);
  ck_assert_int_eq(s.nbuffers, 0); /* plain SGD keeps no state */
  mpt_optimizer_free(opt);
}
END_TEST

START_TEST(test_sgd_momentum_matches_hand_values) {
  /* momentum 0.9, lr 0.1. buf = g1 on the first step, then buf = 0.9 buf + g:
   *   step 1: buf = [0.5, -1, 2];                 p = [0.95, -1.9, 1.3]
   *   step 2: buf = [0.45+1, -0.9+0.25, 1.8-0.5] = [1.45, -0.65, 1.3]
   *           p = [0.95-0.145, -1.9+0.065, 1.3-0.13] = [0.805, -1.835, 1.17]
   *   step 3: buf = [1.305+0.5, -0.585-0.5, 1.17+1] = [1.805, -1.085, 2.17]
   *           p = [0.805-0.1805, -1.835+0.1085, 1.17-0.217] = [0.6245, -1.7265, 0.953] */
  mpt_optimizer_config c = sgd_config(0.9f, 0, 0, 0);
  float p[N], lrs[] = {0.1f, 0.1f, 0.1f};
  mpt_optimizer *opt = run_steps(&c, 3, lrs, p);
  const double want[N] = {0.6245, -1.7265, 0.953};
  const double want_buf[N] = {1.805, -1.085, 2.17};
  check_vec(p, want, N, "param");
  mpt_optimizer_state s;
  ck_assert_int_eq(mpt_optimizer_get_state(opt, &s), MPT_OK);
  ck_assert_int_eq(s.nbuffers, 1);
  ck_assert_str_eq(s.names[0], "momentum_buffer");
  ck_assert_int_eq(s.count, N);
  ck_assert_int_eq(s.step_count, 3);
  check_vec(s.buffers[0], want_buf, N, "momentum_buffer");
  mpt_optimizer_free(opt);
}
END_TEST

START_TEST(test_sgd_nesterov_matches_hand_values) {
  /* nesterov, momentum 0.9, lr 0.1: buf as plain momentum, step direction g + 0.9 buf:
   *   step 1: buf = g1; d = 1.9 g1 = [0.95, -1.9, 3.8]; p = [0.905, -1.81, 1.12]
   *   step 2: buf = [1.45, -0.65, 1.3]; d = g2 + 0.9 buf = [1+1.305, 0.25-0.585, -0.5+1.17]
   *           = [2.305, -0.335, 0.67]; p = [0.905-0.2305, -1.81+0.0335, 1.12-0.067]
   *           = [0.6745, -1.7765, 1.053] */
  mpt_optimizer_config c = sgd_config(0.9f, 0, 1, 0);
  float p[N], lrs[] = {0.1f, 0.1f};
  mpt_optimizer *opt = run_steps(&c, 2, lrs, p);
  const double want[N] = {0.6745, -1.7765, 1.053};
  const double want_buf[N] = {1.45, -0.65, 1.3};
  check_vec(p, want, N, "param");
  mpt_optimizer_state s;
  ck_assert_int_eq(mpt_optimizer_get_state(opt, &s), MPT_OK);
  check_vec(s.buffers[0], want_buf, N, "momentum_buffer");
  mpt_optimizer_free(opt);
}
END_TEST

START_TEST(test_sgd_weight_decay_adds_l2_gradient) {
  /* weight_decay 0.1, lr 0.1, no momentum: g' = g + 0.1 p:
   *   step 1: g' = [0.5+0.1, -1-0.2, 2+0.15] = [0.6, -1.2, 2.15]; p = [0.94, -1.88, 1.285]
   *   step 2: g' = [1+0.094, 0.25-0.188, -0.5+0.1285] = [1.094, 0.062, -0.3715]
   *           p = [0.94-0.1094, -1.88-0.0062, 1.285+0.03715] = [0.8306, -1.8862, 1.32215] */
  mpt_optimizer_config c = sgd_config(0, 0, 0, 0.1f);
  float p[N], lrs[] = {0.1f, 0.1f};
  mpt_optimizer *opt = run_steps(&c, 2, lrs, p);
  const double want[N] = {0.8306, -1.8862, 1.32215};
  check_vec(p, want, N, "param");
  mpt_optimizer_free(opt);
}
END_TEST

START_TEST(test_sgd_dampening_spares_the_first_step) {
  /* momentum 0.9, dampening 0.5, lr 0.1. As in PyTorch the first step copies g into the buffer
   * undamped; later steps take buf = 0.9 buf + 0.5 g:
   *   step 1: buf = [0.5, -1, 2]; p = [0.95, -1.9, 1.3]
   *   step 2: buf = [0.45+0.5, -0.9+0.125, 1.8-0.25] = [0.95, -0.775, 1.55]
   *           p = [0.95-0.095, -1.9+0.0775, 1.3-0.155] = [0.855, -1.8225, 1.145]
   *   step 3: buf = [0.855+0.25, -0.6975-0.25, 1.395+0.5] = [1.105, -0.9475, 1.895]
   *           p = [0.855-0.1105, -1.8225+0.09475, 1.145-0.1895] = [0.7445, -1.72775, 0.9555] */
  mpt_optimizer_config c = sgd_config(0.9f, 0.5f, 0, 0);
  float p[N], lrs[] = {0.1f, 0.1f, 0.1f};
  mpt_optimizer *opt = run_steps(&c, 3, lrs, p);
  const double want[N] = {0.7445, -1.72775, 0.9555};
  const double want_buf[N] = {1.105, -0.9475, 1.895};
  check_vec(p, want, N, "param");
  mpt_optimizer_state s;
  ck_assert_int_eq(mpt_optimizer_get_state(opt, &s), MPT_OK);
  check_vec(s.buffers[0], want_buf, N, "momentum_buffer");
  mpt_optimizer_free(opt);
}
END_TEST

START_TEST(test_sgd_restored_state_continues_the_run) {
  /* A checkpoint round trip: copy the momentum buffer and step count of a 2-step run into a
   * fresh optimizer, take step 3 there: the result is the 3-step run's (momentum test above). */
  mpt_optimizer_config c = sgd_config(0.9f, 0, 0, 0);
  float p[N], lrs[] = {0.1f, 0.1f};
  mpt_optimizer *a = run_steps(&c, 2, lrs, p); /* p = [0.805, -1.835, 1.17] */
  mpt_optimizer *b = NULL;
  ck_assert_int_eq(mpt_optimizer_init(&b, &c, mpt_device_cpu(), N), MPT_OK);
  mpt_optimizer_state sa, sb;
  ck_assert_int_eq(mpt_optimizer_get_state(a, &sa), MPT_OK);
  ck_assert_int_eq(mpt_optimizer_get_state(b, &sb), MPT_OK);
  ck_assert_int_eq(sb.step_count, 0);
  memcpy(sb.buffers[0], sa.buffers[0], N * sizeof(float));
  ck_assert_int_eq(mpt_optimizer_set_step_count(b, sa.step_count), MPT_OK);
  ck_assert_int_eq(mpt_optimizer_step(b, NULL, p, G[2], 0.1f), MPT_OK);
  const double want[N] = {0.6245, -1.7265, 0.953};
  check_vec(p, want, N, "param");
  ck_assert_int_eq(mpt_optimizer_step_count(b), 3);
  mpt_optimizer_free(a);
  mpt_optimizer_free(b);
}
END_TEST

START_TEST(test_sgd_on_a_worker_stream_matches_inline) {
  /* The momentum run of 3 steps, enqueued on a CPU worker stream, then synchronized. */
  mpt_optimizer_config c = sgd_config(0.9f, 0, 0, 0);
  mpt_optimizer *opt = NULL;
  mpt_stream *stream = NULL;
  float p[N];
  memcpy(p, P0, sizeof P0);
  ck_assert_int_eq(mpt_optimizer_init(&opt, &c, mpt_device_cpu(), N), MPT_OK);
  ck_assert_int_eq(mpt_stream_init(&stream, mpt_device_cpu(), MPT_STREAM_WORKER), MPT_OK);
  for (int s = 0; s < 3; ++s) {
    mpt_status st = mpt_optimizer_step(opt, stream, p, G[s], 0.1f);
    ck_assert_msg(st == MPT_OK, "step %d: %s", s + 1, mpt_last_error());
  }
  ck_assert_int_eq(mpt_stream_synchronize(stream, 10000.0), MPT_OK);
  const double want[N] = {0.6245, -1.7265, 0.953};
  check_vec(p, want, N, "param");
  mpt_stream_free(stream);
  mpt_optimizer_free(opt);
}
END_TEST

/* ---- AdamW -------------------------------------------------------------------------------- */

START_TEST(test_adamw_with_weight_decay_matches_hand_values) {
  /* beta1 0.75, beta2 0.875 (exact in float, so 1 - beta^t is exact), eps 0.25 (large, so that
   * its place, outside the sqrt, matters), weight_decay 0.5, lr 0.125 then 0.25.
   * step 1 (t = 1): p *= 1 - 0.125*0.5 = 0.9375 -> [0.9375, -1.875, 1.40625]
   *   m = 0.25 g1 = [0.125, -0.25, 0.5];  v = 0.125 g1^2 = [0.03125, 0.125, 0.5]
   *   m_hat = m / 0.25 = g1; v_hat = v / 0.125 = [0.25, 1, 4]; sqrt + eps = [0.75, 1.25, 2.25]
   *   p -= 0.125 * [0.5/0.75, -1/1.25, 2/2.25] = 0.125 * [2/3, -0.8, 8/9]
   *   p = [0.9375 - 1/12, -1.875 + 0.1, 1.40625 - 1/9] = [41/48, -1.775, 373/288]
   * step 2 (t = 2): p *= 1 - 0.25*0.5 = 0.875
   *   m = 0.75 m + 0.25 g2 = [0.09375+0.25, -0.1875+0.0625, 0.375-0.125] = [0.34375, -0.125, 0.25]
   *   v = 0.875 v + 0.125 g2^2 = [0.02734375+0.125, 0.109375+0.0078125, 0.4375+0.03125]
   *     = [0.15234375, 0.1171875, 0.46875]
   *   1 - 0.75^2 = 0.4375: m_hat = [11/14, -2/7, 4/7]
   *   1 - 0.875^2 = 0.234375: v_hat = [0.65, 0.5, 2]
   *   p = 0.875 p - 0.25 m_hat / (sqrt(v_hat) + 0.25)
   *     = [0.747395833 - 0.185972452, -1.553125 + 0.074629632, 1.133246528 - 0.085840631]
   *     = [0.561423690, -1.478495321, 1.047405896] */
  mpt_optimizer_config c = mpt_optimizer_config_default();
  c.kind = MPT_OPTIM_ADAMW;
  c.lr = 0.125f;
  c.beta1 = 0.75f;
  c.beta2 = 0.875f;
  c.eps = 0.25f;
  c.weight_decay = 0.5f;
  float p[N], lrs[] = {0.125f, 0.25f};
  mpt_optimizer *opt = run_steps(&c, 2, lrs, p);
  const double want[N] = {
      0.875 * (41.0 / 48.0) - 0.25 * (11.0 / 14.0) / (sqrt(0.65) + 0.25),
      0.875 * -1.775 + 0.25 * (2.0 / 7.0) / (sqrt(0.5) + 0.25),
      0.875 * (373.0 / 288.0) - 0.25 * (4.0 / 7.0) / (sqrt(2.0) + 0.25),
  };
  /* the decimal values above, as a guard on the expressions themselves */
  ck_assert(fabs(want[0] - 0.561423690) < 1e-9 && fabs(want[1] + 1.478495321) < 1e-9 &&
            fabs(want[2] - 1.047405896) < 1e-9);
  check_vec(p, want, N, "param");
  mpt_optimizer_state s;
  ck_assert_int_eq(mpt_optimizer_get_state(opt, &s), MPT_OK);
  ck_assert_int_eq(s.nbuffers, 2);
  ck_assert_str_eq(s.names[0], "exp_avg");
  ck_assert_str_eq(s.names[1], "exp_avg_sq");
  const double want_m[N] = {0.34375, -0.125, 0.25};
  const double want_v[N] = {0.15234375, 0.1171875, 0.46875};
  check_vec(s.buffers[0], want_m, N, "exp_avg");
  check_vec(s.buffers[1], want_v, N, "exp_avg_sq");
  mpt_optimizer_free(opt);
}
END_TEST

START_TEST(test_adamw_state_starts_at_zero) {
  /* The state is allocated and zeroed at init, ready for a checkpoint load or step 1. */
  mpt_optimizer_config c = mpt_optimizer_config_default();
  c.kind = MPT_OPTIM_ADAMW;
  mpt_optimizer *opt = NULL;
  ck_assert_int_eq(mpt_optimizer_init(&opt, &c, mpt_device_cpu(), 1000), MPT_OK);
  mpt_optimizer_state s;
  ck_assert_int_eq(mpt_optimizer_get_state(opt, &s), MPT_OK);
  ck_assert_int_eq(s.nbuffers, 2);
  ck_assert_int_eq(s.step_count, 0);
  for (int b = 0; b < 2; ++b)
    for (int i = 0; i < 1000; ++i)
      ck_assert_msg(s.buffers[b][i] == 0.0f, "%s[%d] = %g", s.names[b], i, s.buffers[b][i]);
  ck_assert_ptr_ne(s.buffers[0], s.buffers[1]);
  mpt_optimizer_free(opt);
}
END_TEST

START_TEST(test_optimizer_with_no_parameters_counts_steps) {
  mpt_optimizer_config c = mpt_optimizer_config_default();
  c.kind = MPT_OPTIM_ADAMW;
  mpt_optimizer *opt = NULL;
  ck_assert_int_eq(mpt_optimizer_init(&opt, &c, mpt_device_cpu(), 0), MPT_OK);
  ck_assert_int_eq(mpt_optimizer_step(opt, NULL, NULL, NULL, 0.1f), MPT_OK);
  ck_assert_int_eq(mpt_optimizer_step_count(opt), 1);
  mpt_optimizer_free(opt);
  mpt_optimizer_free(NULL); /* no-op */
}
END_TEST

/* ---- validation --------------------------------------------------------------------------- */

/* init must fail with MPT_EINVAL, leave *opt NULL, and name `needle` in the error. */
static void expect_init_einval(const mpt_optimizer_config *c, const char *needle) {
  mpt_optimizer *opt = (mpt_optimizer *)(uintptr_t)1;
  mpt_error_clear();
  mpt_status st = mpt_optimizer_init(&opt, c, mpt_device_cpu(), N);
  ck_assert_msg(st == MPT_EINVAL, "got %s, want MPT_EINVAL (%s)", mpt_status_name(st), needle);
  ck_assert_ptr_null(opt);
  ck_assert_msg(strstr(mpt_last_error(), needle) != NULL, "error '%s' does not name '%s'",
                mpt_last_error(), needle);
  ck_assert_int_eq(mpt_optimizer_config_validate(c), MPT_EINVAL);
}

START_TEST(test_nesterov_requires_momentum_and_no_dampening) {
  mpt_optimizer_config c = sgd_config(0, 0, 1, 0);
  expect_init_einval(&c, "nesterov");
  c = sgd_config(0.9f, 0.5f, 1, 0);
  expect_init_einval(&c, "nesterov");
  c = sgd_config(0.9f, 0, 1, 0);
  ck_assert_int_eq(mpt_optimizer_config_validate(&c), MPT_OK);
}
END_TEST

START_TEST(test_bad_hyperparameters_are_rejected) {
  mpt_optimizer_config c;
  c = sgd_config(0, 0, 0, 0), c.lr = -0.1f;
  expect_init_einval(&c, "lr");
  c = sgd_config(0, 0, 0, 0), c.lr = NAN;
  expect_init_einval(&c, "lr");
  c = sgd_config(0, 0, 0, 0), c.lr = INFINITY;
  expect_init_einval(&c, "lr");
  c = sgd_config(-0.5f, 0, 0, 0);
  expect_init_einval(&c, "momentum");
  c = sgd_config(0.9f, 1.5f, 0, 0);
  expect_init_einval(&c, "dampening");
  c = sgd_config(0, 0, 0, -1e-4f);
  expect_init_einval(&c, "weight_decay");
  c = mpt_optimizer_config_default(), c.kind = (mpt_optim_kind)7;
  expect_init_einval(&c, "kind");

  mpt_optimizer_config a = mpt_optimizer_config_default();
  a.kind = MPT_OPTIM_ADAMW;
  c = a, c.beta1 = 1.0f;
  expect_init_einval(&c, "beta1");
  c = a, c.beta1 = -0.1f;
  expect_init_einval(&c, "beta1");
  c = a, c.beta2 = 1.0f;
  expect_init_einval(&c, "beta2");
  c = a, c.eps = 0.0f;
  expect_init_einval(&c, "eps");
  c = a, c.eps = -1e-8f;
  expect_init_einval(&c, "eps");
  c = a, c.weight_decay = NAN;
  expect_init_einval(&c, "weight_decay");
  c = a, c.beta1 = 0.0f; /* beta 0 is in range */
  ck_assert_int_eq(mpt_optimizer_config_validate(&c), MPT_OK);

  /* fields a kind does not use are not checked */
  c = sgd_config(0, 0, 0, 0), c.beta1 = 1.0f, c.eps = 0.0f;
  ck_assert_int_eq(mpt_optimizer_config_validate(&c), MPT_OK);

  mpt_optimizer *opt = NULL;
  c = sgd_config(0, 0, 0, 0);
  ck_assert_int_eq(mpt_optimizer_init(&opt, &c, mpt_device_cpu(), -1), MPT_EINVAL);
  ck_assert_ptr_null(opt);
  ck_assert_int_eq(mpt_optimizer_init(&opt, NULL, mpt_device_cpu(), 1), MPT_EINVAL);
  ck_assert_int_eq(mpt_optimizer_init(NULL, &c, mpt_device_cpu(), 1), MPT_EINVAL);
}
END_TEST

START_TEST(test_step_rejects_bad_lr_and_leaves_params_alone) {
  mpt_optimizer_config c = sgd_config(0.9f, 0, 0, 0);
  mpt_optimizer *opt = NULL;
  float p[N];
  memcpy(p, P0, sizeof P0);
  ck_assert_int_eq(mpt_optimizer_init(&opt, &c, mpt_device_cpu(), N), MPT_OK);
  const float bad[] = {-0.1f, NAN, INFINITY};
  for (int i = 0; i < 3; ++i) {
    mpt_error_clear();
    ck_assert_int_eq(mpt_optimizer_step(opt, NULL, p, G[0], bad[i]), MPT_EINVAL);
    ck_assert_ptr_nonnull(strstr(mpt_last_error(), "lr"));
  }
  ck_assert_int_eq(mpt_optimizer_step(opt, NULL, NULL, G[0], 0.1f), MPT_EINVAL);
  ck_assert_int_eq(mpt_optimizer_step(opt, NULL, p, NULL, 0.1f), MPT_EINVAL);
  ck_assert_int_eq(mpt_optimizer_step(NULL, NULL, p, G[0], 0.1f), MPT_EINVAL);
  ck_assert_int_eq(mpt_optimizer_step_count(opt), 0);
  ck_assert(memcmp(p, P0, sizeof P0) == 0);
  ck_assert_int_eq(mpt_optimizer_set_step_count(opt, -1), MPT_EINVAL);
  /* lr 0 is allowed: with momentum it still fills the buffer but leaves p as it was */
  ck_assert_int_eq(mpt_optimizer_step(opt, NULL, p, G[0], 0.0f), MPT_OK);
  ck_assert(memcmp(p, P0, sizeof P0) == 0);
  mpt_optimizer_free(opt);
}
END_TEST

START_TEST(test_kind_names_parse_and_print) {
  mpt_optim_kind k = (mpt_optim_kind)-1;
  ck_assert_int_eq(mpt_optimizer_kind_parse("sgd", &k), MPT_OK);
  ck_assert_int_eq(k, MPT_OPTIM_SGD);
  ck_assert_int_eq(mpt_optimizer_kind_parse("adamw", &k), MPT_OK);
  ck_assert_int_eq(k, MPT_OPTIM_ADAMW);
  ck_assert_int_eq(mpt_optimizer_kind_parse("adam", &k), MPT_EINVAL);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "'adam'"));
  ck_assert_int_eq(mpt_optimizer_kind_parse("SGD", &k), MPT_EINVAL);
  ck_assert_int_eq(mpt_optimizer_kind_parse(NULL, &k), MPT_EINVAL);
  ck_assert_str_eq(mpt_optimizer_kind_name(MPT_OPTIM_ADAMW), "adamw");
  ck_assert_str_eq(mpt_optimizer_kind_name((mpt_optim_kind)9), "unknown");

  mpt_lr_kind l = (mpt_lr_kind)-1;
  ck_assert_int_eq(mpt_lr_kind_parse("constant", &l), MPT_OK);
  ck_assert_int_eq(l, MPT_LR_CONSTANT);
  ck_assert_int_eq(mpt_lr_kind_parse("step", &l), MPT_OK);
  ck_assert_int_eq(l, MPT_LR_STEP);
  ck_assert_int_eq(mpt_lr_kind_parse("cosine", &l), MPT_OK);
  ck_assert_int_eq(l, MPT_LR_COSINE);
  ck_assert_int_eq(mpt_lr_kind_parse("linear", &l), MPT_EINVAL);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "'linear'"));
  ck_assert_str_eq(mpt_lr_kind_name(MPT_LR_COSINE), "cosine");
}
END_TEST

/* ---- LR schedules ------------------------------------------------------------------------- */

static void check_lr(const mpt_lr_schedule *s, float base, int64_t step, double want) {
  char what[48];
  snprintf(what, sizeof what, "lr at step %lld", (long long)step);
  check_rel(mpt_lr_at(s, base, step), want, what, 0);
}

START_TEST(test_lr_constant_is_the_base_lr) {
  mpt_lr_schedule s = mpt_lr_schedule_default();
  ck_assert_int_eq(mpt_lr_schedule_validate(&s), MPT_OK);
  check_lr(&s, 0.1f, 0, 0.1f);
  check_lr(&s, 0.1f, 1, 0.1f);
  check_lr(&s, 0.1f, 1000000, 0.1f);
  check_lr(&s, 0.1f, -5, 0.1f);
  ck_assert(mpt_lr_at(NULL, 0.25f, 3) == 0.25f);
}
END_TEST

START_TEST(test_lr_step_decays_at_the_boundaries) {
  /* base 0.8, step_size 3, gamma 0.5: steps 0-2 -> 0.8, 3-5 -> 0.4, 6-8 -> 0.2, 9 -> 0.1 */
  mpt_lr_schedule s = mpt_lr_schedule_default();
  s.kind = MPT_LR_STEP;
  s.step_size = 3;
  s.gamma = 0.5f;
  ck_assert_int_eq(mpt_lr_schedule_validate(&s), MPT_OK);
  check_lr(&s, 0.8f, 0, 0.8);
  check_lr(&s, 0.8f, 2, 0.8);
  check_lr(&s, 0.8f, 3, 0.4);
  check_lr(&s, 0.8f, 5, 0.4);
  check_lr(&s, 0.8f, 6, 0.2);
  check_lr(&s, 0.8f, 9, 0.1);
}
END_TEST

START_TEST(test_lr_cosine_start_half_end) {
  /* base 0.8, min_lr 0.1, total 8, no warm-up: lr = 0.1 + 0.7 (1 + cos(pi k / 8)) / 2
   *   k = 0: 0.8;  k = 2: 0.1 + 0.35 (1 + 0.70710678) = 0.697487373;  k = 4: 0.45;
   *   k = 6: 0.1 + 0.35 (1 - 0.70710678) = 0.202512627;  k = 8: 0.1;  k = 100: held at 0.1 */
  mpt_lr_schedule s = mpt_lr_schedule_default();
  s.kind = MPT_LR_COSINE;
  s.total_steps = 8;
  s.min_lr = 0.1f;
  ck_assert_int_eq(mpt_lr_schedule_validate(&s), MPT_OK);
  check_lr(&s, 0.8f, 0, 0.8);
  check_lr(&s, 0.8f, 2, 0.69748737341529);
  check_lr(&s, 0.8f, 4, 0.45);
  check_lr(&s, 0.8f, 6, 0.20251262658471);
  check_lr(&s, 0.8f, 8, 0.1);
  check_lr(&s, 0.8f, 100, 0.1);
}
END_TEST

START_TEST(test_lr_warmup_is_linear_from_start_factor) {
  /* base 0.8, W = 4, start factor 0.25: factor = 0.25 + 0.75 k / 4 for k < 4
   *   k = 0: 0.2;  k = 1: 0.35;  k = 2 (middle): 0.5;  k = 3: 0.65;  k = 4 (end): 0.8 */
  mpt_lr_schedule s = mpt_lr_schedule_default();
  s.warmup_steps = 4;
  s.warmup_start_factor = 0.25f;
  ck_assert_int_eq(mpt_lr_schedule_validate(&s), MPT_OK);
  check_lr(&s, 0.8f, 0, 0.2);
  check_lr(&s, 0.8f, 1, 0.35);
  check_lr(&s, 0.8f, 2, 0.5);
  check_lr(&s, 0.8f, 3, 0.65);
  check_lr(&s, 0.8f, 4, 0.8);
  check_lr(&s, 0.8f, 50, 0.8);
  s.warmup_start_factor = 0.0f; /* from zero: k = 0 -> 0, k = 1 -> 0.2 */
  ck_assert_int_eq(mpt_lr_schedule_validate(&s), MPT_OK);
  ck_assert(mpt_lr_at(&s, 0.8f, 0) == 0.0f);
  check_lr(&s, 0.8f, 1, 0.2);
}
END_TEST

START_TEST(test_lr_main_schedule_counts_from_end_of_warmup) {
  /* Like SequentialLR([LinearLR(0.25, 4 steps), main], milestones = [4]); base 0.8.
   * step, step_size 3, gamma 0.5: k = 4, 5, 6 -> 0.8 (t = 0..2); k = 7 -> 0.4 (t = 3);
   *   k = 10 -> 0.2 (t = 6).
   * cosine, total 12 (T = 8 after warm-up), min 0.1: k = 4 -> 0.8; k = 5 -> 0.1 + 0.35 (1 +
   *   cos(pi/8)) = 0.1 + 0.35 * 1.923879533 = 0.773357836; k = 8 -> 0.45; k = 12 -> 0.1;
   *   k = 13 -> 0.1 (held). k = 2 is still warm-up: 0.5. */
  mpt_lr_schedule s = mpt_lr_schedule_default();
  s.warmup_steps = 4;
  s.warmup_start_factor = 0.25f;
  s.kind = MPT_LR_STEP;
  s.step_size = 3;
  s.gamma = 0.5f;
  ck_assert_int_eq(mpt_lr_schedule_validate(&s), MPT_OK);
  check_lr(&s, 0.8f, 3, 0.65);
  check_lr(&s, 0.8f, 4, 0.8);
  check_lr(&s, 0.8f, 6, 0.8);
  check_lr(&s, 0.8f, 7, 0.4);
  check_lr(&s, 0.8f, 10, 0.2);

  s.kind = MPT_LR_COSINE;
  s.total_steps = 12;
  s.min_lr = 0.1f;
  ck_assert_int_eq(mpt_lr_schedule_validate(&s), MPT_OK);
  check_lr(&s, 0.8f, 2, 0.5);
  check_lr(&s, 0.8f, 4, 0.8);
  check_lr(&s, 0.8f, 5, 0.77335783637895);
  check_lr(&s, 0.8f, 8, 0.45);
  check_lr(&s, 0.8f, 12, 0.1);
  check_lr(&s, 0.8f, 13, 0.1);
}
END_TEST

START_TEST(test_lr_bad_schedules_are_rejected) {
  const mpt_lr_schedule d = mpt_lr_schedule_default();
  mpt_lr_schedule s;
  s = d, s.kind = MPT_LR_STEP, s.step_size = 0;
  ck_assert_int_eq(mpt_lr_schedule_validate(&s), MPT_EINVAL);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "step_size"));
  ck_assert(mpt_lr_at(&s, 0.5f, 7) == 0.5f); /* no division by zero: no decay */
  s = d, s.kind = MPT_LR_STEP, s.gamma = 0.0f;
  ck_assert_int_eq(mpt_lr_schedule_validate(&s), MPT_EINVAL);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "gamma"));
  s = d, s.kind = MPT_LR_COSINE, s.total_steps = 4, s.warmup_steps = 4;
  ck_assert_int_eq(mpt_lr_schedule_validate(&s), MPT_EINVAL);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "total_steps"));
  ck_assert(isfinite(mpt_lr_at(&s, 0.5f, 4)));
  s = d, s.kind = MPT_LR_COSINE, s.total_steps = 10, s.min_lr = -0.1f;
  ck_assert_int_eq(mpt_lr_schedule_validate(&s), MPT_EINVAL);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "min_lr"));
  s = d, s.warmup_steps = -1;
  ck_assert_int_eq(mpt_lr_schedule_validate(&s), MPT_EINVAL);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "warmup_steps"));
  s = d, s.warmup_steps = 5, s.warmup_start_factor = 1.5f;
  ck_assert_int_eq(mpt_lr_schedule_validate(&s), MPT_EINVAL);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "warmup_start_factor"));
  s = d, s.kind = (mpt_lr_kind)5;
  ck_assert_int_eq(mpt_lr_schedule_validate(&s), MPT_EINVAL);
  ck_assert_int_eq(mpt_lr_schedule_validate(NULL), MPT_EINVAL);
}
END_TEST

static Suite *optim_suite(void) {
  Suite *s = suite_create("optim");
  TCase *sgd = tcase_create("sgd");
  tcase_add_test(sgd, test_sgd_plain_uses_the_lr_of_each_step);
  tcase_add_test(sgd, test_sgd_momentum_matches_hand_values);
  tcase_add_test(sgd, test_sgd_nesterov_matches_hand_values);
  tcase_add_test(sgd, test_sgd_weight_decay_adds_l2_gradient);
  tcase_add_test(sgd, test_sgd_dampening_spares_the_first_step);
  tcase_add_test(sgd, test_sgd_restored_state_continues_the_run);
  tcase_add_test(sgd, test_sgd_on_a_worker_stream_matches_inline);
  suite_add_tcase(s, sgd);
  TCase *adamw = tcase_create("adamw");
  tcase_add_test(adamw, test_adamw_with_weight_decay_matches_hand_values);
  tcase_add_test(adamw, test_adamw_state_starts_at_zero);
  tcase_add_test(adamw, test_optimizer_with_no_parameters_counts_steps);
  suite_add_tcase(s, adamw);
  TCase *valid = tcase_create("validation");
  tcase_add_test(valid, test_nesterov_requires_momentum_and_no_dampening);
  tcase_add_test(valid, test_bad_hyperparameters_are_rejected);
  tcase_add_test(valid, test_step_rejects_bad_lr_and_leaves_params_alone);
  tcase_add_test(valid, test_kind_names_parse_and_print);
  suite_add_tcase(s, valid);
  TCase *lr = tcase_create("schedule");
  tcase_add_test(lr, test_lr_constant_is_the_base_lr);
  tcase_add_test(lr, test_lr_step_decays_at_the_boundaries);
  tcase_add_test(lr, test_lr_cosine_start_half_end);
  tcase_add_test(lr, test_lr_warmup_is_linear_from_start_factor);
  tcase_add_test(lr, test_lr_main_schedule_counts_from_end_of_warmup);
  tcase_add_test(lr, test_lr_bad_schedules_are_rejected);
  suite_add_tcase(s, lr);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(optim_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
