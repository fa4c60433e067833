/* Tests of the model's wrapper hooks and gradient state (include/mpitrain/nn.h, src/nn/model.c,
 * tape.c and tape_backward.c), and of the public op API (include/mpitrain/autograd.h) used from
 * outside the library:
 * - the hooks run in order (before_forward, before_backward, grad_ready per parameter in the
 *   order gradients become final, after_backward with backward's status) and only for training
 *   forwards with gradients; a tape with model hooks off calls none; a hook's error is the
 *   call's error; one wrapper per model;
 * - the gradient state follows zero_grad -> forward -> backward -> step, and each call out of
 *   order is MPT_ESTATE naming what is missing;
 * - a user op (scale by a learned scalar, y = s * x) recorded through autograd.h gets the
 *   gradients its backward accumulates, checked against exact values, and its parameter's
 *   grad-ready hook fires once, after its backward;
 * - a view of a parameter carries its gradient and counts as a use; a backward after a step is
 *   refused; recording refuses stale or foreign vars; sizes that overflow are errors. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/autograd.h"
#include "mpitrain/nn.h"
#include "mpitrain/optim.h"
#include "check_util.h"


/* ---- a user op: y = s * x, s a scalar parameter [1] ---- */

static mpt_status scale_backward(mpt_tape *tape, mpt_node *node) {
  mpt_var *s = mpt_node_input(node, 0), *x = mpt_node_input(node, 1);
  const float *dy = mpt_node_grad_output(node);
  const float *sv = mpt_var_value(s)->data, *xv = mpt_var_value(x)->data;
  const int64_t n = mpt_var_value(x)->count;
  float *ds = NULL, *dx = NULL;
  MPT_RETURN_IF(mpt_var_grad_acc(tape, s, &ds));
  MPT_RETURN_IF(mpt_var_grad_acc(tape, x, &dx));
  for (int64_t i = 0; i < n; i++) {
    if (ds) ds[0] += dy[i] * xv[i]; /* accumulate, never overwrite */
    if (dx) dx[i] += dy[i] * sv[0];
  }
  return MPT_OK;
}

static mpt_status user_scale(mpt_tape *tape, mpt_var *s, mpt_var *x, mpt_var **y) {
  const mpt_tensor *xv = mpt_var_value(x);
  if (mpt_var_value(s)->count != 1) return MPT_FAIL(MPT_ESHAPE, "scale: s must hold one value");
  MPT_RETURN_IF(mpt_tape_new_var(tape, xv->ndim, xv->shape, MPT_F32, y));
  float *out = (float *)mpt_var_value(*y)->data;
  const float *in = xv->data, sv = *(const float *)mpt_var_value(s)->data;
  for (int64_t i = 0; i < xv->count; i++) out[i] = sv * in[i];
  mpt_var *inputs[2] = {s, x};
  if (mpt_tape_needs_grad(tape, inputs, 2))
    MPT_RETURN_IF(mpt_tape_record(tape, "scale", scale_backward, inputs, 2, *y, NULL));
  return MPT_OK;
}

/* The model: y = s * x (s initialised to 1, then set to 3), forward via the user op. */
static mpt_status scale_forward(mpt_model *m, mpt_tape *tape, void *ctx, mpt_var *x,
                                mpt_var **y) {
  (void)m;
  (void)ctx;
  mpt_var *s = NULL;
  MPT_RETURN_IF(mpt_tape_param(tape, 0, &s));
  return user_scale(tape, s, x, y);
}

static mpt_model *scale_model(void) {
  mpt_model *m = NULL;
  const int64_t shape[1] = {1};
  int index = -1;
  OK(mpt_model_init(&m, mpt_device_cpu()));
  OK(mpt_model_add_param(m, "s", 1, shape, MPT_INIT_ONES, 0, &index));
  mpt_model_set_forward(m, scale_forward, NULL, NULL);
  OK(mpt_model_finalize(m));
  OK(mpt_model_init_params(m, 1));
  mpt_model_params(m)[0] = 3.0f;
  return m;
}

/* ---- a recording wrapper ---- */

typedef struct recorder {
  char log[256];
  mpt_status fail_before_forward, fail_after_backward;
  mpt_status seen_status;
} recorder;

static void note(recorder *r, const char *what) {
  strncat(r->log, what, sizeof r->log - strlen(r->log) - 1);
}
static mpt_status rec_before_forward(void *u, mpt_tape *t) {
  (void)t;
  note(u, "F");
  return ((recorder *)u)->fail_before_forward;
}
static mpt_status rec_before_backward(void *u, mpt_tape *t) {
  (void)t;
  note(u, "B");
  return MPT_OK;
}
static void rec_grad_ready(void *u, int p) { note(u, p == 0 ? "g0" : "g?"); }
static mpt_status rec_after_backward(void *u, mpt_tape *t, mpt_status st) {
  (void)t;
  recorder *r = u;
  note(r, "A");
  r->seen_status = st;
  return r->fail_after_backward != MPT_OK ? mpt_error_set(r->fail_after_backward, "recorder")
                                          : st;
}

/* forward + sum over x = [1, 2, 4] on a fresh pass; returns the loss var */
static mpt_var *pass(mpt_model *m, mpt_tape *t, float *x, mpt_status *st) {
  const int64_t shape[1] = {3};
  mpt_tensor xt = mpt_tensor_view(x, mpt_device_cpu(), MPT_F32, 1, shape);
  mpt_var *xv = NULL, *y = NULL, *loss = NULL;
  mpt_tape_reset(t, 0);
  OK(mpt_tape_input(t, &xt, &xv));
  *st = mpt_model_forward(m, t, xv, &y);
  if (*st != MPT_OK) return NULL;
  OK(mpt_nn_sum(t, y, &loss));
  return loss;
}

START_TEST(test_user_op_gradients_are_exact_and_accumulate) {
  mpt_model *m = scale_model();
  mpt_tape *t = NULL;
  OK(mpt_tape_init(&t, m, NULL));
  float x[3] = {1, 2, 4};
  mpt_status st;
  OK(mpt_model_zero_grad(m, NULL));
  mpt_var *loss = pass(m, t, x, &st);
  OK(st);
  float value = 0;
  OK(mpt_var_item(t, loss, &value));
  ck_assert_float_eq(value, 21.0f); /* 3 * (1 + 2 + 4) */
  OK(mpt_tape_backward(t, loss, 1.0f));
  ck_assert_float_eq(mpt_model_grads(m)[0], 7.0f); /* d/ds sum(s x) = sum x */
  /* a second micro-batch accumulates: 7 + 0.5 * 7 */
  loss = pass(m, t, x, &st);
  OK(st);
  OK(mpt_tape_backward(t, loss, 0.5f));
  ck_assert_float_eq(mpt_model_grads(m)[0], 10.5f);
  mpt_tape_free(t);
  mpt_model_free(m);
}
END_TEST

START_TEST(test_hooks_run_in_order_and_only_for_training_forwards) {
  mpt_model *m = scale_model();
  mpt_tape *t = NULL;
  OK(mpt_tape_init(&t, m, NULL));
  recorder r = {.fail_before_forward = MPT_OK, .fail_after_backward = MPT_OK};
  const mpt_model_hooks h = {.user = &r,
                             .before_forward = rec_before_forward,
                             .before_backward = rec_before_backward,
                             .grad_ready = rec_grad_ready,
                             .after_backward = rec_after_backward};
  OK(mpt_model_set_hooks(m, &h));
  recorder other = r;
  mpt_model_hooks h2 = h;
  h2.user = &other;
  ck_assert_int_eq(mpt_model_set_hooks(m, &h2), MPT_ESTATE); /* one wrapper per model */
  float x[3] = {1, 2, 4};
  mpt_status st;
  mpt_var *loss = pass(m, t, x, &st);
  OK(st);
  OK(mpt_tape_backward(t, loss, 1.0f));
  ck_assert_str_eq(r.log, "FBg0A");
  /* evaluation forwards: no hook */
  mpt_tape_set_grad_enabled(t, 0);
  pass(m, t, x, &st);
  OK(st);
  mpt_tape_set_grad_enabled(t, 1);
  mpt_model_set_training(m, 0);
  pass(m, t, x, &st);
  OK(st);
  mpt_model_set_training(m, 1);
  ck_assert_str_eq(r.log, "FBg0A");
  /* a tape with model hooks off */
  mpt_tape_set_model_hooks(t, 0);
  OK(mpt_model_consume_grads(m));
  OK(mpt_model_zero_grad(m, NULL));
  loss = pass(m, t, x, &st);
  OK(st);
  OK(mpt_tape_backward(t, loss, 1.0f));
  ck_assert_str_eq(r.log, "FBg0A");
  ck_assert_int_eq(mpt_model_grads_state(m), MPT_GRADS_READY); /* state kept all the same */
  mpt_tape_set_model_hooks(t, 1);
  /* a hook's error is the call's */
  OK(mpt_model_consume_grads(m));
  OK(mpt_model_zero_grad(m, NULL));
  r.fail_before_forward = MPT_ECOMM;
  pass(m, t, x, &st);
  ck_assert_int_eq(st, MPT_ECOMM);
  r.fail_before_forward = MPT_OK;
  r.fail_after_backward = MPT_ETIMEOUT;
  loss = pass(m, t, x, &st);
  OK(st);
  ck_assert_int_eq(mpt_tape_backward(t, loss, 1.0f), MPT_ETIMEOUT);
  ck_assert_int_eq(r.seen_status, MPT_OK);
  ck_assert_int_eq(mpt_model_grads_state(m), MPT_GRADS_PENDING); /* a failed backward */
  OK(mpt_model_set_hooks(m, NULL));
  ck_assert_ptr_null(mpt_model_get_hooks(m));
  mpt_tape_free(t);
  mpt_model_free(m);
}
END_TEST

START_TEST(test_gradient_state_follows_the_step_and_names_what_is_missing) {
  mpt_model *m = scale_model();
  mpt_tape *t = NULL;
  mpt_optimizer *opt = NULL;
  mpt_optimizer_config c = mpt_optimizer_config_default();
  c.kind = MPT_OPTIM_SGD;
  c.momentum = 0;
  c.weight_decay = 0;
  OK(mpt_optimizer_init(&opt, &c, mpt_device_cpu(), 1));
  OK(mpt_tape_init(&t, m, NULL));
  float x[3] = {1, 2, 4};
  mpt_status st;
  ck_assert_int_eq(mpt_model_grads_state(m), MPT_GRADS_ZERO);
  ck_assert_int_eq(mpt_optimizer_step_model(opt, m, NULL, 0.1f), MPT_ESTATE); /* no backward */
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "no backward"));
  mpt_var *loss = pass(m, t, x, &st);
  OK(st);
  ck_assert_int_eq(mpt_model_grads_state(m), MPT_GRADS_PENDING);
  ck_assert_int_eq(mpt_optimizer_step_model(opt, m, NULL, 0.1f), MPT_ESTATE);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "has not finished"));
  ck_assert_float_eq(mpt_model_params(m)[0], 3.0f); /* refused steps change nothing */
  OK(mpt_tape_backward(t, loss, 1.0f));
  ck_assert_int_eq(mpt_model_grads_state(m), MPT_GRADS_READY);
  OK(mpt_optimizer_step_model(opt, m, NULL, 0.1f));
  ck_assert_float_eq(mpt_model_params(m)[0], 3.0f - 0.1f * 7.0f);
  ck_assert_int_eq(mpt_model_grads_state(m), MPT_GRADS_APPLIED);
  ck_assert_int_eq(mpt_optimizer_step_model(opt, m, NULL, 0.1f), MPT_ESTATE); /* twice */
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "already used"));
  pass(m, t, x, &st); /* forward without zero_grad after a step */
  ck_assert_int_eq(st, MPT_ESTATE);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "not zeroed"));
  OK(mpt_model_zero_grad(m, NULL));
  ck_assert_int_eq(mpt_model_grads_state(m), MPT_GRADS_ZERO);
  pass(m, t, x, &st);
  OK(st);
  mpt_optimizer_free(opt);
  mpt_tape_free(t);
  mpt_model_free(m);
}
END_TEST

/* A view of a parameter counts as a use: d/dw sum(view(w) * w) = 2w, and w's hook fires once,
 * after both uses (a view that dropped its gradient gave w, silently). */
START_TEST(test_view_of_a_parameter_carries_its_gradient_and_use) {
  mpt_model *m = NULL;
  const int64_t shape[2] = {2, 2}, flat[1] = {4};
  int index;
  OK(mpt_model_init(&m, mpt_device_cpu()));
  OK(mpt_model_add_param(m, "w", 2, shape, MPT_INIT_ONES, 0, &index));
  OK(mpt_model_finalize(m));
  OK(mpt_model_init_params(m, 1));
  float *w = mpt_model_params(m);
  for (int i = 0; i < 4; i++) w[i] = (float)(i + 1);
  mpt_tape *t = NULL;
  OK(mpt_tape_init(&t, m, NULL));
  recorder r = {.fail_before_forward = MPT_OK, .fail_after_backward = MPT_OK};
  mpt_tape_set_grad_hook(t, rec_grad_ready, &r);
  mpt_var *wv = NULL, *v = NULL, *w2 = NULL, *y = NULL, *loss = NULL;
  OK(mpt_tape_param(t, 0, &wv));
  OK(mpt_tape_view_var(t, wv, 1, flat, &v));
  ck_assert_int_eq(mpt_var_requires_grad(v), 1);
  OK(mpt_tape_view_var(t, wv, 1, flat, &w2));
  OK(mpt_nn_mul(t, v, w2, &y));
  OK(mpt_nn_sum(t, y, &loss));
  OK(mpt_tape_backward(t, loss, 1.0f));
  for (int i = 0; i < 4; i++) ck_assert_float_eq(mpt_model_grads(m)[i], 2.0f * (float)(i + 1));
  ck_assert_str_eq(r.log, "g0");
  mpt_tape_free(t);
  mpt_model_free(m);
}
END_TEST

/* A backward after an optimizer step without zero_grad (two tapes: forward on both, backward
 * on one, step, backward on the other) is refused: it would make applied gradients "ready". */
START_TEST(test_backward_after_a_step_is_refused) {
  mpt_model *m = scale_model();
  mpt_tape *a = NULL, *b = NULL;
  mpt_optimizer *opt = NULL;
  mpt_optimizer_config c = mpt_optimizer_config_default();
  OK(mpt_optimizer_init(&opt, &c, mpt_device_cpu(), 1));
  OK(mpt_tape_init(&a, m, NULL));
  OK(mpt_tape_init(&b, m, NULL));
  float x[3] = {1, 2, 4};
  mpt_status st;
  mpt_var *la = pass(m, a, x, &st);
  OK(st);
  mpt_var *lb = pass(m, b, x, &st);
  OK(st);
  OK(mpt_tape_backward(b, lb, 1.0f));
  OK(mpt_optimizer_step_model(opt, m, NULL, 0.1f));
  ck_assert_int_eq(mpt_tape_backward(a, la, 1.0f), MPT_ESTATE);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "already applied"));
  ck_assert_int_eq(mpt_optimizer_step_model(opt, m, NULL, 0.1f), MPT_ESTATE);
  mpt_optimizer_free(opt);
  mpt_tape_free(a);
  mpt_tape_free(b);
  mpt_model_free(m);
}
END_TEST

static mpt_status noop_backward(mpt_tape *tape, mpt_node *node) {
  (void)tape;
  (void)node;
  return MPT_OK;
}

/* Recording is refused for a var kept from before mpt_tape_reset, and for an output that is
 * not a fresh var of the op (an input, a parameter, the output of another node); sizes that
 * overflow are errors, not tiny buffers. */
START_TEST(test_record_refuses_stale_and_foreign_vars_and_overflow) {
  mpt_model *m = scale_model();
  mpt_tape *t = NULL;
  OK(mpt_tape_init(&t, m, NULL));
  const int64_t shape[1] = {3};
  float x[3] = {1, 2, 3};
  mpt_tensor xt = mpt_tensor_view(x, mpt_device_cpu(), MPT_F32, 1, shape);
  mpt_var *s = NULL, *in = NULL, *old = NULL, *out = NULL;
  OK(mpt_tape_param(t, 0, &s));
  OK(mpt_tape_input(t, &xt, &in));
  OK(user_scale(t, s, in, &old));
  mpt_tape_reset(t, 0);
  OK(mpt_tape_param(t, 0, &s));
  OK(mpt_tape_new_var(t, 1, shape, MPT_F32, &out));
  mpt_var *inputs[2] = {s, old}; /* old: a var of the last pass */
  ck_assert_int_eq(mpt_tape_record(t, "t", noop_backward, inputs, 2, out, NULL), MPT_EINVAL);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "mpt_tape_reset"));
  OK(mpt_tape_input(t, &xt, &in));
  ck_assert_int_eq(mpt_tape_record(t, "t", noop_backward, &s, 1, in, NULL), MPT_EINVAL);
  ck_assert_int_eq(mpt_tape_record(t, "t", noop_backward, &in, 1, s, NULL), MPT_EINVAL);
  OK(mpt_tape_record(t, "t", noop_backward, &s, 1, out, NULL));
  ck_assert_int_eq(mpt_tape_record(t, "t", noop_backward, &s, 1, out, NULL), MPT_EINVAL);
  ck_assert_int_eq(mpt_tape_record(t, "t", noop_backward, &s, 1, NULL, NULL), MPT_EINVAL);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "NULL output"));
  const int64_t huge[1] = {((int64_t)1 << 62) + 16}, two[2] = {(int64_t)1 << 40, (int64_t)1 << 40};
  mpt_var *v = NULL;
  ck_assert_int_ne(mpt_tape_new_var(t, 1, huge, MPT_F32, &v), MPT_OK);
  ck_assert_ptr_null(v);
  mpt_tensor tt;
  ck_assert_int_eq(mpt_tensor_init(&tt, mpt_device_cpu(), MPT_F32, 1, huge), MPT_EINVAL);
  ck_assert_int_eq(mpt_tensor_init(&tt, mpt_device_cpu(), MPT_F32, 2, two), MPT_EINVAL);
  mpt_tape_free(t);
  mpt_model_free(m);
}
END_TEST

int main(void) {
  Suite *s = suite_create("hooks");
  TCase *tc = tcase_create("hooks");
  tcase_add_test(tc, test_user_op_gradients_are_exact_and_accumulate);
  tcase_add_test(tc, test_hooks_run_in_order_and_only_for_training_forwards);
  tcase_add_test(tc, test_gradient_state_follows_the_step_and_names_what_is_missing);
  tcase_add_test(tc, test_view_of_a_parameter_carries_its_gradient_and_use);
  tcase_add_test(tc, test_backward_after_a_step_is_refused);
  tcase_add_test(tc, test_record_refuses_stale_and_foreign_vars_and_overflow);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
