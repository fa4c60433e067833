/* Tests of op profiling on the tape (include/mpitrain/nn.h mpt_tape_set_profiling,
 * src/nn/tape_profile.c). The oracle is a user op written through autograd.h whose forward
 * sleeps 20 ms and whose backward sleeps 30 ms, beside a cheap built-in op, and a grad-ready
 * hook that sleeps 5 ms a call:
 * - node counts per name are exact (two sleeping nodes and one "add" per pass, over 3 passes);
 * - the sleeping op's rows hold at least its sleeps (2 x 3 x 20 ms forward, 2 x 3 x 30 ms
 *   backward), the hooks' row at least 3 x 5 ms per pass, and all rows together at most the
 *   wall time of the passes (the intervals partition it): under load the figures only grow,
 *   and both bounds still hold;
 * - mpt_tape_clear_op_times empties the rows, profiling off drops them, a forward with
 *   gradients disabled times nothing, and names are cut to MPT_OP_NAME_MAX - 1 bytes;
 * - mpt_op_gemm_counting counts calls and 2 m n k FLOPs exactly while on, nothing while off,
 *   and starts from zero when turned on again. */
#include <check.h>
#include <string.h>
#include <time.h>

#include "mpitrain/autograd.h"
#include "mpitrain/core.h"
#include "mpitrain/nn.h"
#include "mpitrain/ops.h"
#include "check_util.h"


static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

static const char *op_name = "sleepy"; /* the user op's node name (a long one in one test) */

static mpt_status sleepy_backward(mpt_tape *tape, mpt_node *node) {
  mpt_var *x = mpt_node_input(node, 0);
  const float *dy = mpt_node_grad_output(node);
  float *dx = NULL;
  MPT_RETURN_IF(mpt_var_grad_acc(tape, x, &dx));
  for (int64_t i = 0; dx && i < mpt_var_value(x)->count; i++) dx[i] += dy[i];
  sleep_ms(30);
  return MPT_OK;
}

/* y = x, taking 20 ms */
static mpt_status sleepy(mpt_tape *tape, mpt_var *x, mpt_var **y) {
  const mpt_tensor *xv = mpt_var_value(x);
  MPT_RETURN_IF(mpt_tape_new_var(tape, xv->ndim, xv->shape, MPT_F32, y));
  memcpy(mpt_var_value(*y)->data, xv->data, (size_t)xv->count * sizeof(float));
  sleep_ms(20);
  if (mpt_tape_needs_grad(tape, &x, 1))
    MPT_RETURN_IF(mpt_tape_record(tape, op_name, sleepy_backward, &x, 1, *y, NULL));
  return MPT_OK;
}

/* loss = sum(sleepy(a) + sleepy(b)), a and b parameters [4]; the sum's node is "sum". */
static mpt_status forward(mpt_model *m, mpt_tape *tape, void *ctx, mpt_var *in, mpt_var **out) {
  (void)m;
  (void)ctx;
  (void)in;
  mpt_var *a, *b, *ya, *yb, *s;
  MPT_RETURN_IF(mpt_tape_param(tape, 0, &a));
  MPT_RETURN_IF(mpt_tape_param(tape, 1, &b));
  MPT_RETURN_IF(sleepy(tape, a, &ya));
  MPT_RETURN_IF(sleepy(tape, b, &yb));
  MPT_RETURN_IF(mpt_nn_add(tape, ya, yb, &s));
  return mpt_nn_sum(tape, s, out);
}

static void slow_hook(void *user, int param_index) {
  (void)param_index;
  ++*(int *)user;
  sleep_ms(5);
}

typedef struct fixture {
  mpt_model *m;
  mpt_tape *tape;
  float dummy[1];
  mpt_tensor in;
} fixture;

static void setup(fixture *f) {
  const int64_t shape[1] = {4}, one[1] = {1};
  int index;
  OK(mpt_model_init(&f->m, mpt_device_cpu()));
  OK(mpt_model_add_param(f->m, "a", 1, shape, MPT_INIT_ONES, 0, &index));
  OK(mpt_model_add_param(f->m, "b", 1, shape, MPT_INIT_ONES, 0, &index));
  mpt_model_set_forward(f->m, forward, NULL, NULL);
  OK(mpt_model_finalize(f->m));
  OK(mpt_tape_init(&f->tape, f->m, NULL));
  f->dummy[0] = 0;
  f->in = mpt_tensor_view(f->dummy, mpt_device_cpu(), MPT_F32, 1, one);
}

static void teardown(fixture *f) {
  mpt_tape_free(f->tape);
  mpt_model_free(f->m);
}

/* One training pass: zero_grad, forward, backward. */
static void pass(fixture *f, int grad) {
  mpt_var *x, *loss;
  OK(mpt_model_zero_grad(f->m, NULL));
  mpt_tape_reset(f->tape, 0);
  mpt_tape_set_grad_enabled(f->tape, grad);
  OK(mpt_tape_input(f->tape, &f->in, &x));
  OK(mpt_model_forward(f->m, f->tape, x, &loss));
  if (grad) OK(mpt_tape_backward(f->tape, loss, 1.0f));
  mpt_tape_set_grad_enabled(f->tape, 1);
}

static const mpt_op_time *find(const mpt_op_time *rows, int n, const char *name) {
  for (int i = 0; i < n; i++)
    if (strcmp(rows[i].name, name) == 0) return &rows[i];
  return NULL;
}

START_TEST(test_counts_and_times_bound_the_sleeps) {
  fixture f;
  setup(&f);
  int hook_calls = 0;
  mpt_tape_set_grad_hook(f.tape, slow_hook, &hook_calls);
  ck_assert_int_eq(mpt_tape_op_times(f.tape, NULL, 0), 0); /* off: no rows */
  OK(mpt_tape_set_profiling(f.tape, 1));
  const double t0 = mpt_time_ms();
  for (int p = 0; p < 3; p++) pass(&f, 1);
  const double wall = mpt_time_ms() - t0;
  mpt_op_time rows[MPT_TAPE_PROFILE_MAX_OPS];
  const int n = mpt_tape_op_times(f.tape, rows, MPT_TAPE_PROFILE_MAX_OPS);
  ck_assert_int_eq(n, 4); /* sleepy, add, sum, grad-ready hooks */
  const mpt_op_time *s = find(rows, n, "sleepy"), *a = find(rows, n, "add"),
                    *h = find(rows, n, "grad-ready hooks"), *sum = find(rows, n, "sum");
  ck_assert_ptr_nonnull(s);
  ck_assert_ptr_nonnull(a);
  ck_assert_ptr_nonnull(h);
  ck_assert_ptr_nonnull(sum);
  ck_assert_int_eq(s->nodes, 6);
  ck_assert_int_eq(s->backward_nodes, 6);
  ck_assert_int_eq(a->nodes, 3);
  ck_assert_int_eq(a->backward_nodes, 3);
  ck_assert_int_eq(sum->nodes, 3);
  ck_assert_int_eq(hook_calls, 6);
  ck_assert_int_eq(h->nodes, 0);
  ck_assert_int_ge(h->backward_nodes, 2); /* per pass a and b are final after their nodes */
  ck_assert_msg(s->forward_ms >= 6 * 20.0, "sleepy forward %.1f ms", s->forward_ms);
  ck_assert_msg(s->backward_ms >= 6 * 30.0, "sleepy backward %.1f ms", s->backward_ms);
  ck_assert_msg(h->backward_ms >= 6 * 5.0, "hooks %.1f ms", h->backward_ms);
  double all = 0;
  for (int i = 0; i < n; i++) {
    ck_assert(rows[i].forward_ms >= 0 && rows[i].backward_ms >= 0);
    all += rows[i].forward_ms + rows[i].backward_ms;
  }
  ck_assert_msg(all <= wall, "rows %.1f ms > the passes' wall time %.1f ms", all, wall);
  /* the cheap op is not charged the sleeps: what is left of the wall time is all it can have */
  ck_assert_msg(a->forward_ms + a->backward_ms <= wall - 6 * 50.0 - 6 * 5.0,
                "add %.1f ms of %.1f", a->forward_ms + a->backward_ms, wall);
  teardown(&f);
}
END_TEST

START_TEST(test_clear_off_and_no_grad) {
  fixture f;
  setup(&f);
  OK(mpt_tape_set_profiling(f.tape, 1));
  pass(&f, 1);
  ck_assert_int_eq(mpt_tape_op_times(f.tape, NULL, 0), 3); /* sleepy, add, sum; no hook */
  mpt_tape_clear_op_times(f.tape);
  ck_assert_int_eq(mpt_tape_op_times(f.tape, NULL, 0), 0);
  pass(&f, 0); /* gradients disabled: nothing recorded, nothing timed */
  ck_assert_int_eq(mpt_tape_op_times(f.tape, NULL, 0), 0);
  pass(&f, 1);
  mpt_op_time rows[2];
  ck_assert_int_eq(mpt_tape_op_times(f.tape, rows, 2), 3); /* the count, even past max_rows */
  ck_assert_str_eq(rows[0].name, "sleepy");                /* first-seen order */
  ck_assert_int_eq(rows[0].nodes, 2);
  OK(mpt_tape_set_profiling(f.tape, 0));
  ck_assert_int_eq(mpt_tape_op_times(f.tape, NULL, 0), 0);
  ck_assert_int_eq(mpt_tape_set_profiling(NULL, 1), MPT_EINVAL);
  teardown(&f);
}
END_TEST

START_TEST(test_long_names_are_cut) {
  fixture f;
  setup(&f);
  op_name = "an_op_name_far_longer_than_thirty_one_bytes";
  OK(mpt_tape_set_profiling(f.tape, 1));
  pass(&f, 1);
  mpt_op_time rows[4];
  ck_assert_int_eq(mpt_tape_op_times(f.tape, rows, 4), 3);
  ck_assert_uint_eq(strlen(rows[0].name), MPT_OP_NAME_MAX - 1);
  ck_assert_int_eq(strncmp(rows[0].name, op_name, MPT_OP_NAME_MAX - 1), 0);
  ck_assert_int_eq(rows[0].nodes, 2);
  op_name = "sleepy";
  teardown(&f);
}
END_TEST

START_TEST(test_gemm_counting) {
  float a[4 * 6], b[6 * 5], c[4 * 5];
  for (int i = 0; i < 24; i++) a[i] = (float)i;
  for (int i = 0; i < 30; i++) b[i] = 1.0f;
  int64_t calls = -1;
  double ms = -1, flop = -1;
  mpt_op_gemm_counting(1);
  for (int r = 0; r < 3; r++)
    OK(mpt_op_gemm(NULL, 0, 0, 4, 5, 6, 1.0f, a, 6, b, 5, 0.0f, c, 5));
  mpt_op_gemm_counted(&calls, &ms, &flop);
  ck_assert_int_eq(calls, 3);
  ck_assert(flop == 3 * 2.0 * 4 * 5 * 6);
  ck_assert(ms >= 0);
  ck_assert(c[0] == 15.0f); /* row 0 of a sums 0..5 */
  mpt_op_gemm_counting(0); /* off: not counted, totals kept */
  OK(mpt_op_gemm(NULL, 0, 0, 4, 5, 6, 1.0f, a, 6, b, 5, 0.0f, c, 5));
  mpt_op_gemm_counted(&calls, NULL, NULL);
  ck_assert_int_eq(calls, 3);
  mpt_op_gemm_counting(1); /* on again: from zero */
  mpt_op_gemm_counted(&calls, &ms, &flop);
  ck_assert_int_eq(calls, 0);
  ck_assert(ms == 0 && flop == 0);
  mpt_op_gemm_counting(0);
}
END_TEST

int main(void) {
  Suite *s = suite_create("tape_profile");
  TCase *tc = tcase_create("profile");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_counts_and_times_bound_the_sleeps);
  tcase_add_test(tc, test_clear_off_and_no_grad);
  tcase_add_test(tc, test_long_names_are_cut);
  tcase_add_test(tc, test_gemm_counting);
  suite_add_tcase(s, tc);
  SRunner *r = srunner_create(s);
  srunner_run_all(r, CK_NORMAL);
  const int failed = srunner_ntests_failed(r);
  srunner_free(r);
  return failed ? 1 : 0;
}
