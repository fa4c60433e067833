/* Tests for the nn tape (src/nn/tape.c, tape_backward.c): parameter use counts and the
 * grad-ready hook (the DDP contract: each parameter's hook fires once, after its last use in
 * backward, with its whole gradient), backward's scale and accumulation, its refusals,
 * recording with gradients off, and the arena's and scratch's steady state. Everything runs on
 * the CPU with the NULL stream (tests/tape_util.h). The model registry is tested in
 * tests/test_tape_model.c, the ops' values and gradients in tests/test_tape_ops.c. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain.h"
#include "mpitrain/autograd.h"
#include "nn/tape.h"
#include "tape_util.h"

static void set_param(mpt_model *m, int index, float value) {
  float *p = param_data(m, index);
  for (int64_t i = 0; i < mpt_model_param_info(m, index)->count; i++) p[i] = value;
}

/* ---- hooks -------------------------------------------------------------------------------- */

#define HOOK_MAX 32

typedef struct hook_log {
  mpt_model *model;
  int n;
  int order[HOOK_MAX];        /* parameter indices in the order the hook saw them */
  double grad_sum[HOOK_MAX];  /* sum of that parameter's gradient when the hook fired */
} hook_log;

static void log_hook(void *user, int index) {
  hook_log *h = user;
  ck_assert_int_lt(h->n, HOOK_MAX);
  const float *g = grad_data(h->model, index);
  double s = 0;
  for (int64_t i = 0; i < mpt_model_param_info(h->model, index)->count; i++) s += g[i];
  h->order[h->n] = index;
  h->grad_sum[h->n] = s;
  h->n++;
}

static int hook_count(const hook_log *h, int index) {
  int n = 0;
  for (int i = 0; i < h->n; i++) n += h->order[i] == index;
  return n;
}

/* ---- the tape: use counts, hooks, backward ------------------------------------------------ */

/* A model with two linear layers A and B (2 -> 2, with bias) and a batch x [3, 2] of small
 * integers, so sums of products are exact in float. */
typedef struct ab_fixture {
  mpt_model *m;
  mpt_tape *t;
  mpt_linear a, b;
  float x[6];
  mpt_tensor xt;
  hook_log log;
} ab_fixture;

static void ab_setup(ab_fixture *f) {
  memset(f, 0, sizeof *f);
  f->m = new_model();
  OK(mpt_linear_add(f->m, "A", 2, 2, 1, &f->a));
  OK(mpt_linear_add(f->m, "B", 2, 2, 1, &f->b));
  OK(mpt_model_finalize(f->m));
  OK(mpt_model_init_params(f->m, 5));
  const float x[6] = {1, 2, 3, -1, 0, 4};
  memcpy(f->x, x, sizeof x);
  const int64_t shape[2] = {3, 2};
  f->xt = mpt_tensor_view(f->x, mpt_device_cpu(), MPT_F32, 2, shape);
  OK(mpt_tape_init(&f->t, f->m, NULL));
  f->log.model = f->m;
  mpt_tape_set_grad_hook(f->t, log_hook, &f->log);
  mpt_tape_reset(f->t, 0);
}

static void ab_teardown(ab_fixture *f) {
  mpt_tape_free(f->t);
  mpt_model_free(f->m);
}

/* For loss = sum(linear(x)): dW[o][i] = sum_n x[n][i] = {4, 5}, db[o] = N = 3. */
static void check_sum_linear_grads(mpt_model *m, const mpt_linear *l, float k) {
  const float *gw = grad_data(m, l->weight), *gb = grad_data(m, l->bias);
  for (int o = 0; o < 2; o++) {
    ck_assert_float_eq(gw[o * 2 + 0], k * 4.0f);
    ck_assert_float_eq(gw[o * 2 + 1], k * 5.0f);
    ck_assert_float_eq(gb[o], k * 3.0f);
  }
}

START_TEST(test_unused_parameter_has_no_uses_and_no_hook) {
  ab_fixture f;
  ab_setup(&f);
  mpt_var *x = NULL, *y = NULL, *loss = NULL;
  OK(mpt_tape_input(f.t, &f.xt, &x));
  OK(mpt_linear_forward(f.t, &f.a, x, &y));
  OK(mpt_nn_sum(f.t, y, &loss));
  ck_assert_int_eq(mpt_tape_param_uses(f.t, f.a.weight), 1);
  ck_assert_int_eq(mpt_tape_param_uses(f.t, f.a.bias), 1);
  ck_assert_int_eq(mpt_tape_param_uses(f.t, f.b.weight), 0);
  ck_assert_int_eq(mpt_tape_param_uses(f.t, f.b.bias), 0);
  OK(mpt_tape_backward(f.t, loss, 1.0f));
  ck_assert_int_eq(f.log.n, 2);
  ck_assert_int_eq(hook_count(&f.log, f.a.weight), 1);
  ck_assert_int_eq(hook_count(&f.log, f.a.bias), 1);
  ck_assert_int_eq(hook_count(&f.log, f.b.weight), 0);
  ck_assert_int_eq(hook_count(&f.log, f.b.bias), 0);
  check_sum_linear_grads(f.m, &f.a, 1);
  for (int i = 0; i < 4; i++) ck_assert_float_eq(grad_data(f.m, f.b.weight)[i], 0.0f);
  /* The batch needs no gradient: the input var never got one. */
  ck_assert_ptr_null(mpt_var_grad(x)->data);
  ab_teardown(&f);
}
END_TEST

START_TEST(test_node_outside_the_loss_releases_its_parameters_with_zero_gradient) {
  /* B's output is computed but not part of the loss: nothing flows into it, yet B was used, so
   * its gradient (zero) is final when backward passes its node and the hook must fire. */
  ab_fixture f;
  ab_setup(&f);
  mpt_var *x = NULL, *ya = NULL, *yb = NULL, *loss = NULL;
  OK(mpt_tape_input(f.t, &f.xt, &x));
  OK(mpt_linear_forward(f.t, &f.b, x, &yb));
  OK(mpt_linear_forward(f.t, &f.a, x, &ya));
  OK(mpt_nn_sum(f.t, ya, &loss));
  ck_assert_int_eq(mpt_tape_param_uses(f.t, f.b.weight), 1);
  OK(mpt_tape_backward(f.t, loss, 1.0f));
  ck_assert_int_eq(f.log.n, 4);
  const int want[4] = {f.a.weight, f.a.bias, f.b.weight, f.b.bias};
  for (int i = 0; i < 4; i++) ck_assert_int_eq(f.log.order[i], want[i]);
  ck_assert_ptr_null(mpt_var_grad(yb)->data);
  check_sum_linear_grads(f.m, &f.a, 1);
  for (int i = 0; i < 4; i++) ck_assert_float_eq(grad_data(f.m, f.b.weight)[i], 0.0f);
  ab_teardown(&f);
}
END_TEST

START_TEST(test_two_branches_fire_each_hook_once_in_reverse_order) {
  ab_fixture f;
  ab_setup(&f);
  mpt_var *x = NULL, *ya = NULL, *yb = NULL, *y = NULL, *loss = NULL;
  OK(mpt_tape_input(f.t, &f.xt, &x));
  OK(mpt_linear_forward(f.t, &f.a, x, &ya));
  OK(mpt_linear_forward(f.t, &f.b, x, &yb));
  OK(mpt_nn_add(f.t, ya, yb, &y));
  OK(mpt_nn_sum(f.t, y, &loss));
  OK(mpt_tape_backward(f.t, loss, 1.0f));
  /* Reverse of the forward: B's node is undone first, then A's. */
  ck_assert_int_eq(f.log.n, 4);
  const int want[4] = {f.b.weight, f.b.bias, f.a.weight, f.a.bias};
  for (int i = 0; i < 4; i++) ck_assert_int_eq(f.log.order[i], want[i]);
  check_sum_linear_grads(f.m, &f.a, 1);
  check_sum_linear_grads(f.m, &f.b, 1);
  /* Each gradient was already complete when its hook fired. */
  ck_assert(f.log.grad_sum[0] == 18.0 && f.log.grad_sum[1] == 6.0);
  ck_assert(f.log.grad_sum[2] == 18.0 && f.log.grad_sum[3] == 6.0);
  ab_teardown(&f);
}
END_TEST

START_TEST(test_parameter_used_twice_fires_after_last_use_with_summed_gradient) {
  /* loss = sum(x1*p + x2*q + x3*p): nodes m1(p) m2(q) add m3(p) add sum. Backward meets m3
   * (p: 1 use left), then m2 (q final), then m1 (p final): hooks q, p, once each, and p's
   * gradient at its hook is already x1 + x3. */
  mpt_model *m = new_model();
  int pi = add_param(m, "p", 1, 4, 0), qi = add_param(m, "q", 1, 4, 0);
  OK(mpt_model_finalize(m));
  set_param(m, pi, 1);
  set_param(m, qi, 2);
  float x1[4] = {1, 2, 3, 4}, x2[4] = {10, 20, 30, 40}, x3[4] = {100, 200, 300, 400};
  const int64_t s[1] = {4};
  mpt_tensor t1 = mpt_tensor_view(x1, mpt_device_cpu(), MPT_F32, 1, s);
  mpt_tensor t2 = mpt_tensor_view(x2, mpt_device_cpu(), MPT_F32, 1, s);
  mpt_tensor t3 = mpt_tensor_view(x3, mpt_device_cpu(), MPT_F32, 1, s);
  mpt_tape *t = NULL;
  hook_log log = {.model = m};
  OK(mpt_tape_init(&t, m, NULL));
  mpt_tape_set_grad_hook(t, log_hook, &log);
  mpt_tape_reset(t, 0);
  mpt_var *v1, *v2, *v3, *p, *q, *a, *b, *c, *s1, *s2, *loss;
  OK(mpt_tape_input(t, &t1, &v1));
  OK(mpt_tape_input(t, &t2, &v2));
  OK(mpt_tape_input(t, &t3, &v3));
  OK(mpt_tape_param(t, pi, &p));
  OK(mpt_tape_param(t, qi, &q));
  OK(mpt_nn_mul(t, v1, p, &a));
  OK(mpt_nn_mul(t, v2, q, &b));
  OK(mpt_nn_add(t, a, b, &s1));
  OK(mpt_nn_mul(t, v3, p, &c));
  OK(mpt_nn_add(t, s1, c, &s2));
  OK(mpt_nn_sum(t, s2, &loss));
  ck_assert_int_eq(mpt_tape_param_uses(t, pi), 2);
  ck_assert_int_eq(mpt_tape_param_uses(t, qi), 1);
  float lv;
  OK(mpt_var_item(t, loss, &lv));
  ck_assert_float_eq(lv, (1.0f + 2 + 3 + 4 + 100 + 200 + 300 + 400) * 1 + 100.0f * 2);
  OK(mpt_tape_backward(t, loss, 1.0f));
  ck_assert_int_eq(log.n, 2);
  ck_assert_int_eq(log.order[0], qi);
  ck_assert_int_eq(log.order[1], pi);
  ck_assert(log.grad_sum[0] == 100.0);        /* q: x2 */
  ck_assert(log.grad_sum[1] == 10.0 + 1000.0); /* p: x1 + x3, complete at its hook */
  for (int i = 0; i < 4; i++) {
    ck_assert_float_eq(grad_data(m, pi)[i], x1[i] + x3[i]);
    ck_assert_float_eq(grad_data(m, qi)[i], x2[i]);
  }
  /* A parameter taken twice by ONE node (p * p) counts two uses and still fires once. */
  memset(&log, 0, sizeof log);
  log.model = m;
  OK(mpt_model_zero_grad(m, NULL));
  mpt_tape_reset(t, 0);
  ck_assert_int_eq(mpt_tape_param_uses(t, pi), 0);
  OK(mpt_tape_param(t, pi, &p));
  OK(mpt_nn_mul(t, p, p, &a));
  OK(mpt_nn_sum(t, a, &loss));
  ck_assert_int_eq(mpt_tape_param_uses(t, pi), 2);
  OK(mpt_tape_backward(t, loss, 1.0f));
  ck_assert_int_eq(log.n, 1);
  ck_assert_int_eq(log.order[0], pi);
  for (int i = 0; i < 4; i++) ck_assert_float_eq(grad_data(m, pi)[i], 2.0f);
  mpt_tape_free(t);
  mpt_model_free(m);
}
END_TEST

/* F06: p1 = [1,1,1,1], p2 = [2,2,2,2], loss = sum(x1*p1 + x2*p2), x1 = 1s, x2 = 10s. */
static void f06_run(int p2_first, hook_log *log) {
  mpt_model *m = new_model();
  int i1 = add_param(m, "p1", 1, 4, 0), i2 = add_param(m, "p2", 1, 4, 0);
  OK(mpt_model_finalize(m));
  set_param(m, i1, 1);
  set_param(m, i2, 2);
  float x1[4] = {1, 1, 1, 1}, x2[4] = {10, 10, 10, 10};
  const int64_t s[1] = {4};
  mpt_tensor t1 = mpt_tensor_view(x1, mpt_device_cpu(), MPT_F32, 1, s);
  mpt_tensor t2 = mpt_tensor_view(x2, mpt_device_cpu(), MPT_F32, 1, s);
  mpt_tape *t = NULL;
  memset(log, 0, sizeof *log);
  log->model = m;
  OK(mpt_tape_init(&t, m, NULL));
  mpt_tape_set_grad_hook(t, log_hook, log);
  mpt_tape_reset(t, 0);
  mpt_var *v1, *v2, *p1, *p2, *a = NULL, *b = NULL, *y, *loss;
  OK(mpt_tape_input(t, &t1, &v1));
  OK(mpt_tape_input(t, &t2, &v2));
  OK(mpt_tape_param(t, i1, &p1));
  OK(mpt_tape_param(t, i2, &p2));
  if (p2_first) OK(mpt_nn_mul(t, v2, p2, &b));
  OK(mpt_nn_mul(t, v1, p1, &a));
  if (!p2_first) OK(mpt_nn_mul(t, v2, p2, &b));
  OK(mpt_nn_add(t, a, b, &y));
  OK(mpt_nn_sum(t, y, &loss));
  float lv;
  OK(mpt_var_item(t, loss, &lv));
  ck_assert_float_eq(lv, 84.0f);
  OK(mpt_tape_backward(t, loss, 1.0f));
  for (int i = 0; i < 4; i++) {
    ck_assert_float_eq(grad_data(m, i1)[i], 1.0f);
    ck_assert_float_eq(grad_data(m, i2)[i], 10.0f);
  }
  mpt_tape_free(t);
  mpt_model_free(m);
}

START_TEST(test_f06_hook_order_follows_reverse_use) {
  hook_log log;
  f06_run(0, &log); /* p1's branch first: p2 is ready first */
  ck_assert_int_eq(log.n, 2);
  ck_assert_int_eq(log.order[0], 1);
  ck_assert_int_eq(log.order[1], 0);
  ck_assert(log.grad_sum[0] == 40.0 && log.grad_sum[1] == 4.0);
  f06_run(1, &log); /* the opposite order: same gradients, p1 ready first */
  ck_assert_int_eq(log.n, 2);
  ck_assert_int_eq(log.order[0], 0);
  ck_assert_int_eq(log.order[1], 1);
  ck_assert(log.grad_sum[0] == 4.0 && log.grad_sum[1] == 40.0);
}
END_TEST

START_TEST(test_backward_scales_and_accumulates) {
  ab_fixture f;
  ab_setup(&f);
  for (int step = 0; step < 2; step++) { /* no zero_grad between: gradients add up */
    mpt_var *x = NULL, *y = NULL, *loss = NULL;
    mpt_tape_reset(f.t, 0);
    OK(mpt_tape_input(f.t, &f.xt, &x));
    OK(mpt_linear_forward(f.t, &f.a, x, &y));
    OK(mpt_nn_sum(f.t, y, &loss));
    OK(mpt_tape_backward(f.t, loss, 0.25f));
    check_sum_linear_grads(f.m, &f.a, 0.25f * (step + 1));
    ck_assert_float_eq(mpt_var_grad(loss)->data ? ((float *)mpt_var_grad(loss)->data)[0] : -1,
                       0.25f);
  }
  ck_assert_int_eq(f.log.n, 4); /* two per pass */
  ab_teardown(&f);
}
END_TEST

START_TEST(test_backward_rejects_bad_loss) {
  ab_fixture f, g;
  ab_setup(&f);
  ab_setup(&g);
  mpt_var *x = NULL, *y = NULL, *loss = NULL, *in_sum = NULL, *other = NULL, *gx = NULL;
  OK(mpt_tape_input(f.t, &f.xt, &x));
  OK(mpt_linear_forward(f.t, &f.a, x, &y));
  FAILS(mpt_tape_backward(f.t, y, 1.0f), MPT_ESTATE); /* [3, 2] is not a scalar */
  ck_assert_msg(strstr(mpt_last_error(), "[3, 2]"), "%s", mpt_last_error());
  OK(mpt_nn_sum(f.t, x, &in_sum)); /* depends on no parameter: nothing recorded */
  ck_assert_int_eq(mpt_var_requires_grad(in_sum), 0);
  FAILS(mpt_tape_backward(f.t, in_sum, 1.0f), MPT_ESTATE);
  OK(mpt_tape_input(g.t, &g.xt, &gx));
  OK(mpt_linear_forward(g.t, &g.a, gx, &other));
  OK(mpt_nn_sum(g.t, other, &other));
  FAILS(mpt_tape_backward(f.t, other, 1.0f), MPT_ESTATE); /* another tape's var */
  OK(mpt_nn_sum(f.t, y, &loss));
  OK(mpt_tape_backward(f.t, loss, 1.0f));
  FAILS(mpt_tape_backward(f.t, loss, 1.0f), MPT_ESTATE); /* twice in one pass */
  check_sum_linear_grads(f.m, &f.a, 1);                  /* ... and nothing was added */
  ck_assert_int_eq(f.log.n, 2);
  FAILS(mpt_var_item(f.t, y, &(float){0}), MPT_EINVAL); /* not a scalar */
  /* A parameter var from another tape is refused by the op. */
  mpt_var *gw = NULL, *z = NULL;
  OK(mpt_tape_param(g.t, g.a.weight, &gw));
  mpt_tape_reset(f.t, 0);
  OK(mpt_tape_input(f.t, &f.xt, &x));
  FAILS(mpt_nn_linear(f.t, x, gw, NULL, &z), MPT_EINVAL);
  ab_teardown(&f);
  ab_teardown(&g);
}
END_TEST

START_TEST(test_grad_disabled_records_nothing) {
  ab_fixture f;
  ab_setup(&f);
  float with_grad, without;
  for (int enabled = 1; enabled >= 0; enabled--) {
    mpt_var *x = NULL, *y = NULL, *r = NULL, *loss = NULL;
    mpt_tape_set_grad_enabled(f.t, enabled);
    mpt_tape_reset(f.t, 0);
    OK(mpt_tape_input(f.t, &f.xt, &x));
    OK(mpt_linear_forward(f.t, &f.a, x, &y));
    OK(mpt_nn_relu(f.t, y, &r));
    OK(mpt_linear_forward(f.t, &f.b, r, &y));
    OK(mpt_nn_mean(f.t, y, &loss));
    OK(mpt_var_item(f.t, loss, enabled ? &with_grad : &without));
    if (!enabled) {
      for (int i = 0; i < 4; i++) ck_assert_int_eq(mpt_tape_param_uses(f.t, i), 0);
      ck_assert_int_eq(mpt_var_requires_grad(loss), 0);
      ck_assert_int_eq(mpt_var_requires_grad(y), 0);
      FAILS(mpt_tape_backward(f.t, loss, 1.0f), MPT_ESTATE);
    }
  }
  ck_assert_msg(memcmp(&with_grad, &without, sizeof without) == 0,
                "evaluation computes the same value (%.9g vs %.9g)", without, with_grad);
  ck_assert_int_eq(f.log.n, 0);
  for (int64_t i = 0; i < mpt_model_param_count(f.m); i++)
    ck_assert_float_eq(mpt_model_grads(f.m)[i], 0.0f);
  ab_teardown(&f);
}
END_TEST

START_TEST(test_arena_does_not_allocate_in_steady_state) {
  /* 64 x 128 activations (32 KiB each): one pass needs several arena chunks at first. */
  mpt_model *m = new_model();
  mpt_linear l1, l2;
  OK(mpt_linear_add(m, "fc1", 128, 128, 1, &l1));
  OK(mpt_linear_add(m, "fc2", 128, 128, 1, &l2));
  OK(mpt_model_finalize(m));
  OK(mpt_model_init_params(m, 3));
  float *x = malloc(64 * 128 * sizeof(float));
  ck_assert_ptr_nonnull(x);
  mpt_rng rng;
  mpt_rng_seed(&rng, 4);
  mpt_rng_fill_uniform(&rng, x, 64 * 128, -1, 1);
  const int64_t shape[2] = {64, 128};
  mpt_tensor xt = mpt_tensor_view(x, mpt_device_cpu(), MPT_F32, 2, shape);
  const int64_t np = mpt_model_param_count(m);
  float *first_grads = malloc((size_t)np * sizeof(float));
  ck_assert_ptr_nonnull(first_grads);
  mpt_tape *t = NULL;
  OK(mpt_tape_init(&t, m, NULL));
  size_t after[6], at_reset[6];
  float losses[6];
  for (int step = 0; step < 6; step++) {
    mpt_var *in = NULL, *h = NULL, *r = NULL, *y = NULL, *loss = NULL;
    mpt_tape_reset(t, (uint64_t)step);
    at_reset[step] = mpt__tape_arena_allocations(t);
    OK(mpt_model_zero_grad(m, NULL));
    OK(mpt_tape_input(t, &xt, &in));
    OK(mpt_linear_forward(t, &l1, in, &h));
    OK(mpt_nn_relu(t, h, &r));
    OK(mpt_linear_forward(t, &l2, r, &y));
    OK(mpt_nn_relu(t, y, &r));
    OK(mpt_nn_mean(t, r, &loss));
    OK(mpt_tape_backward(t, loss, 1.0f));
    OK(mpt_var_item(t, loss, &losses[step]));
    after[step] = mpt__tape_arena_allocations(t);
    if (step == 0) memcpy(first_grads, mpt_model_grads(m), (size_t)np * sizeof(float));
    else
      ck_assert_int_eq(memcmp(first_grads, mpt_model_grads(m), (size_t)np * sizeof(float)), 0);
    ck_assert_int_eq(memcmp(&losses[0], &losses[step], sizeof(float)), 0);
  }
  /* The first pass grew the arena chunk by chunk (and the host pools); on the CPU the reset
   * before the second keeps those chunks (their pages are mapped; a GPU's tape merges them into
   * one), so from then on nothing is allocated. */
  ck_assert_msg(after[0] >= 3, "first pass: %zu allocations (expected several chunks)", after[0]);
  for (int step = 2; step < 6; step++)
    ck_assert_msg(after[step] == after[1], "step %d: %zu allocations, step 1: %zu", step,
                  after[step], after[1]);
  for (int step = 1; step < 6; step++) /* the second pass and later: nothing inside a pass */
    ck_assert_msg(after[step] == at_reset[step], "step %d allocated %zu times", step,
                  after[step] - at_reset[step]);
  ck_assert_msg(after[1] == after[0], "step 1 allocated: %zu -> %zu (the CPU keeps the chunks)",
                after[0], after[1]);
  /* A smaller pass fits too; resetting after it allocates nothing. */
  mpt_var *in = NULL, *h = NULL;
  mpt_tape_reset(t, 0);
  OK(mpt_tape_input(t, &xt, &in));
  OK(mpt_linear_forward(t, &l1, in, &h));
  mpt_tape_reset(t, 0);
  ck_assert_int_eq(mpt__tape_arena_allocations(t), after[1]);
  /* Arena memory is 64-byte aligned. */
  void *p1 = NULL, *p2 = NULL;
  OK(mpt_tape_alloc(t, 3, &p1));
  OK(mpt_tape_alloc(t, 5, &p2));
  ck_assert_int_eq((uintptr_t)p1 % 64, 0);
  ck_assert_int_eq((uintptr_t)p2 % 64, 0);
  ck_assert_ptr_ne(p1, p2);
  mpt_tape_free(t);
  mpt_model_free(m);
  free(first_grads);
  free(x);
}
END_TEST

/* ---- runner ------------------------------------------------------------------------------- */

/* mpt_tape_scratch hands out the same block while requests fit, a new one when a request is
 * larger (then that one), and starts over after a reset; NULL arguments are refused. */
START_TEST(test_tape_scratch_is_reused_until_it_grows) {
  mpt_model *m = NULL;
  const int64_t shape[1] = {4};
  int p = 0;
  OK(mpt_model_init(&m, mpt_device_cpu()));
  OK(mpt_model_add_param(m, "w", 1, shape, MPT_INIT_ZEROS, 1, &p));
  OK(mpt_model_finalize(m));
  mpt_tape *t = NULL;
  OK(mpt_tape_init(&t, m, NULL));
  void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
  OK(mpt_tape_scratch(t, 1000, &a));
  OK(mpt_tape_scratch(t, 10, &b));
  ck_assert_ptr_eq(a, b);
  ck_assert_int_eq((uintptr_t)a % 64, 0);
  memset(a, 1, 1000);
  OK(mpt_tape_scratch(t, 5000, &c));
  ck_assert_ptr_ne(a, c);
  memset(c, 2, 5000);
  OK(mpt_tape_scratch(t, 4000, &d));
  ck_assert_ptr_eq(c, d);
  void *other = NULL;
  OK(mpt_tape_alloc(t, 64, &other)); /* the arena's own allocations do not overlap it */
  ck_assert((char *)other >= (char *)c + 5000 || (char *)other + 64 <= (char *)c);
  mpt_tape_reset(t, 0);
  OK(mpt_tape_scratch(t, 8, &a));
  OK(mpt_tape_alloc(t, 64, &b));
  ck_assert_ptr_ne(a, b);
  ck_assert_int_eq(mpt_tape_scratch(NULL, 8, &a), MPT_EINVAL);
  ck_assert_int_eq(mpt_tape_scratch(t, 8, NULL), MPT_EINVAL);
  mpt_tape_free(t);
  mpt_model_free(m);
}
END_TEST

static Suite *tape_suite(void) {
  Suite *s = suite_create("nn_tape");
  TCase *tape = tcase_create("tape");
  tcase_add_test(tape, test_unused_parameter_has_no_uses_and_no_hook);
  tcase_add_test(tape, test_node_outside_the_loss_releases_its_parameters_with_zero_gradient);
  tcase_add_test(tape, test_two_branches_fire_each_hook_once_in_reverse_order);
  tcase_add_test(tape, test_parameter_used_twice_fires_after_last_use_with_summed_gradient);
  tcase_add_test(tape, test_f06_hook_order_follows_reverse_use);
  tcase_add_test(tape, test_backward_scales_and_accumulates);
  tcase_add_test(tape, test_backward_rejects_bad_loss);
  tcase_add_test(tape, test_grad_disabled_records_nothing);
  tcase_add_test(tape, test_arena_does_not_allocate_in_steady_state);
  tcase_add_test(tape, test_tape_scratch_is_reused_until_it_grows);
  suite_add_tcase(s, tape);
  return s;
}

int main(void) { return run_suite(tape_suite()); }
