/* Tests of the DDP engine's communication hook (ddp.h mpt_ddp_register_comm_hook), run under
 * mpirun with 2 and 3 ranks (tests/test_ddp_hook_np2.mpi, _np3.mpi).
 *
 * Oracles: the built-in reducers rebuilt as hooks give the same bits as the built-in ones:
 * - an all-reduce average hook against config.allreduce NATIVE; a sum hook that divides by W
 *   in a host function on the comm stream against NATIVE too (the comm's average is the sum
 *   divided by W in float32);
 * - a bfloat16 hook (round on the comm worker, bfloat16 sum, widen and divide) against
 *   config.grad_comm bf16;
 * and the hook sees every bucket once per pass, in index order, with the engine's slices. A
 * failing hook fails the backward with its error. Refusals: ZeRO, bf16 config, NULL engine.
 *
 * MPI rules as tests/test_ddp.c: no forking, soft checks agreed across ranks per test. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/comm.h"
#include "mpitrain/ddp.h"
#include "mpitrain/nn.h"

static mpt_comm *g_comm;
static int g_rank, g_world;

#define MPI_CHECK_COMM g_comm
#include "mpi_check.h"

enum { PER_RANK = 8, CLASSES = 10, FEATURES = 784, MAX_BUCKETS = 64 };

static mpt_model *mlp_make(uint64_t seed) {
  mpt_mlp_config c = mpt_mlp_config_default();
  c.input_size = FEATURES;
  c.num_hidden = 2;
  c.hidden[0] = 64;
  c.hidden[1] = 37;
  c.num_classes = CLASSES;
  mpt_model *m = NULL;
  OK(mpt_model_init_mlp(&m, mpt_device_cpu(), &c, seed));
  return m;
}

static mpt_ddp *wrap(mpt_model *m, mpt_ddp_grad_comm mode, int zero) {
  mpt_ddp_config dc = mpt_ddp_config_default();
  dc.bucket_cap_mb = dc.first_bucket_cap_mb = 0.01; /* several buckets */
  dc.timeout_ms = 30000;
  dc.grad_comm = mode;
  dc.zero = zero;
  mpt_ddp *d = NULL;
  OK(mpt_ddp_init(&d, m, g_comm, NULL, &dc));
  return d;
}

/* One backward of mean cross-entropy on this rank's batch (seeded by rank). */
static mpt_status backward(mpt_model *m, mpt_tape *tape) {
  float *x = malloc(sizeof(float) * PER_RANK * FEATURES);
  int32_t y[PER_RANK];
  ck_assert(x);
  mpt_rng rng;
  mpt_rng_seed(&rng, 41 + (uint64_t)g_rank);
  mpt_rng_fill_uniform(&rng, x, PER_RANK * FEATURES, -1.0f, 1.0f);
  for (int i = 0; i < PER_RANK; i++) y[i] = (int32_t)mpt_rng_below(&rng, CLASSES);
  int64_t xs[2] = {PER_RANK, FEATURES}, ys[1] = {PER_RANK};
  mpt_tensor xt = mpt_tensor_view(x, mpt_device_cpu(), MPT_F32, 2, xs);
  mpt_tensor yt = mpt_tensor_view(y, mpt_device_cpu(), MPT_I32, 1, ys);
  mpt_var *xv = NULL, *out = NULL, *loss = NULL;
  OK(mpt_model_zero_grad(m, NULL));
  mpt_tape_reset(tape, 1);
  OK(mpt_tape_input(tape, &xt, &xv));
  OK(mpt_model_forward(m, tape, xv, &out));
  OK(mpt_nn_cross_entropy(tape, out, &yt, &loss));
  mpt_status st = mpt_tape_backward(tape, loss, 1.0f);
  free(x);
  return st;
}

/* The hooks' state: what they saw, and what the bf16 hook needs on the comm worker. */
typedef struct hook_state {
  int calls, order_ok, nbuckets;
  int64_t offsets[MAX_BUCKETS], counts[MAX_BUCKETS];
  int world;
  uint16_t *wire;                       /* bf16: the conversion buffer, one slot per element */
  mpt_ddp_comm_bucket seen[MAX_BUCKETS]; /* what the host functions read */
  int fail;                             /* return MPT_ECOMM */
} hook_state;

static void record(hook_state *s, const mpt_ddp_comm_bucket *b) {
  if (s->nbuckets < 1 || b->index != s->calls % s->nbuckets) s->order_ok = 0;
  if (b->index >= 0 && b->index < MAX_BUCKETS) {
    s->offsets[b->index] = b->offset;
    s->counts[b->index] = b->count;
    s->seen[b->index] = *b;
  }
  s->calls++;
}

static mpt_status hook_avg(void *state, const mpt_ddp_comm_bucket *b) {
  hook_state *s = state;
  record(s, b);
  if (s->fail) return mpt_error_set(MPT_ECOMM, "the test's hook refuses bucket %d", b->index);
  return mpt_comm_allreduce(b->comm, b->stream, b->grads, b->grads, b->count, MPT_F32,
                            MPT_REDUCE_AVG);
}

typedef struct divide_arg {
  hook_state *s;
  int index;
} divide_arg;
static divide_arg g_args[MAX_BUCKETS];

static mpt_status divide_by_world(void *arg) {
  divide_arg *a = arg;
  const mpt_ddp_comm_bucket *b = &a->s->seen[a->index];
  for (int64_t i = 0; i < b->count; i++) b->grads[i] /= (float)a->s->world;
  return MPT_OK;
}

static mpt_status hook_sum_then_divide(void *state, const mpt_ddp_comm_bucket *b) {
  hook_state *s = state;
  record(s, b);
  MPT_RETURN_IF(mpt_comm_allreduce(b->comm, b->stream, b->grads, b->grads, b->count, MPT_F32,
                                   MPT_REDUCE_SUM));
  g_args[b->index] = (divide_arg){s, b->index};
  return mpt_stream_launch_host(b->stream, divide_by_world, &g_args[b->index]);
}

static mpt_status to_bf16(void *arg) {
  divide_arg *a = arg;
  const mpt_ddp_comm_bucket *b = &a->s->seen[a->index];
  mpt_bf16_round_array(b->grads, a->s->wire + b->offset, b->count);
  return MPT_OK;
}

static mpt_status from_bf16(void *arg) {
  divide_arg *a = arg;
  const mpt_ddp_comm_bucket *b = &a->s->seen[a->index];
  for (int64_t i = 0; i < b->count; i++)
    b->grads[i] = mpt_bf16_to_f32(a->s->wire[b->offset + i]) / (float)a->s->world;
  return MPT_OK;
}

static mpt_status hook_bf16(void *state, const mpt_ddp_comm_bucket *b) {
  hook_state *s = state;
  record(s, b);
  g_args[b->index] = (divide_arg){s, b->index};
  MPT_RETURN_IF(mpt_stream_launch_host(b->stream, to_bf16, &g_args[b->index]));
  MPT_RETURN_IF(mpt_comm_allreduce(b->comm, b->stream, s->wire + b->offset, s->wire + b->offset,
                                   b->count, MPT_BF16, MPT_REDUCE_SUM));
  return mpt_stream_launch_host(b->stream, from_bf16, &g_args[b->index]);
}

/* Gradients of one backward with the built-in reducer (mode) and with `hook`: the same bits;
 * the hook saw every bucket once, in order, with the engine's slices. */
static void compare(mpt_ddp_grad_comm builtin, mpt_ddp_comm_hook hook, const char *what) {
  mpt_model *ma = mlp_make(5), *mb = mlp_make(5);
  mpt_tape *ta = NULL, *tb = NULL;
  OK(mpt_tape_init(&ta, ma, NULL));
  OK(mpt_tape_init(&tb, mb, NULL));
  mpt_ddp *da = wrap(ma, builtin, 0), *db = wrap(mb, MPT_DDP_GRAD_FP32, 0);
  const int64_t n = mpt_model_param_count(ma);
  hook_state s = {.order_ok = 1, .world = g_world};
  s.wire = malloc(sizeof(uint16_t) * (size_t)n);
  ck_assert(s.wire);
  OK(mpt_ddp_register_comm_hook(db, hook, &s));
  const int nb = mpt_ddp_num_buckets(db);
  ck_assert_int_le(nb, MAX_BUCKETS);
  s.nbuckets = nb;
  EXPECT(nb > 1, "want several buckets, got %d", nb);
  for (int pass = 0; pass < 2; pass++) {
    OK(backward(ma, ta));
    OK(backward(mb, tb));
    OK(mpt_model_consume_grads(ma));
    OK(mpt_model_consume_grads(mb));
  }
  EXPECT(memcmp(mpt_model_grads(ma), mpt_model_grads(mb), sizeof(float) * (size_t)n) == 0,
         "%s at %d ranks: the hook's gradients differ from the built-in reducer's", what,
         g_world);
  EXPECT(s.calls == 2 * nb && s.order_ok, "%s: %d hook calls for 2 passes of %d buckets "
         "(in order: %d)", what, s.calls, nb, s.order_ok);
  for (int b = 0; b < nb; b++)
    EXPECT(s.offsets[b] == mpt_ddp_bucket(db, b)->offset &&
               s.counts[b] == mpt_ddp_bucket(db, b)->count,
           "%s: bucket %d seen as {%lld, %lld}", what, b, (long long)s.offsets[b],
           (long long)s.counts[b]);
  if (g_rank == 0) printf("hook %s at %d ranks: %d buckets, same bits\n", what, g_world, nb);
  /* NULL restores the built-in reducer: no more calls */
  OK(mpt_ddp_register_comm_hook(db, NULL, NULL));
  OK(backward(mb, tb));
  OK(mpt_model_consume_grads(mb));
  EXPECT(s.calls == 2 * nb, "the hook was called after it was removed");
  mpt_ddp_free(da);
  mpt_ddp_free(db);
  mpt_tape_free(ta);
  mpt_tape_free(tb);
  mpt_model_free(ma);
  mpt_model_free(mb);
  free(s.wire);
}

START_TEST(test_hook_average_equals_builtin_allreduce) {
  expect_begin();
  compare(MPT_DDP_GRAD_FP32, hook_avg, "all-reduce avg");
  compare(MPT_DDP_GRAD_FP32, hook_sum_then_divide, "sum, then / W on the comm stream");
  expect_agree();
}
END_TEST

START_TEST(test_hook_bf16_equals_builtin_bf16) {
  expect_begin();
  compare(MPT_DDP_GRAD_BF16, hook_bf16, "bf16 compression");
  expect_agree();
}
END_TEST

START_TEST(test_failing_hook_fails_the_backward) {
  expect_begin();
  mpt_model *m = mlp_make(2);
  mpt_tape *t = NULL;
  OK(mpt_tape_init(&t, m, NULL));
  mpt_ddp *d = wrap(m, MPT_DDP_GRAD_FP32, 0);
  hook_state s = {.order_ok = 1, .world = g_world, .fail = 1, .nbuckets = 1};
  OK(mpt_ddp_register_comm_hook(d, hook_avg, &s));
  mpt_status st = backward(m, t);
  EXPECT(st == MPT_ECOMM && strstr(mpt_last_error(), "communication hook failed on bucket 0") &&
             strstr(mpt_last_error(), "the test's hook refuses bucket 0"),
         "a failing hook: %s: %s", mpt_status_name(st), mpt_last_error());
  EXPECT(s.calls == 1, "the hook was called %d times after failing", s.calls);
  mpt_ddp_free(d);
  mpt_tape_free(t);
  mpt_model_free(m);
  expect_agree();
}
END_TEST

START_TEST(test_hook_refusals) {
  expect_begin();
  hook_state s = {.order_ok = 1};
  EXPECT(mpt_ddp_register_comm_hook(NULL, hook_avg, &s) == MPT_EINVAL, "NULL engine accepted");
  mpt_model *m = mlp_make(3);
  mpt_ddp *d = wrap(m, MPT_DDP_GRAD_FP32, 1);
  EXPECT(mpt_ddp_register_comm_hook(d, hook_avg, &s) == MPT_ENOTSUP &&
             strstr(mpt_last_error(), "ZeRO-1"),
         "a hook with ZeRO-1: %s", mpt_last_error());
  mpt_ddp_free(d);
  d = wrap(m, MPT_DDP_GRAD_BF16, 0);
  EXPECT(mpt_ddp_register_comm_hook(d, hook_avg, &s) == MPT_ENOTSUP,
         "a hook with bf16 gradients was accepted");
  EXPECT(mpt_ddp_register_comm_hook(d, NULL, NULL) == MPT_OK, "removing no hook failed");
  mpt_ddp_free(d);
  mpt_model_free(m);
  expect_agree();
}
END_TEST

static Suite *make_suite(void) {
  Suite *s = suite_create("ddp comm hook");
  TCase *tc = tcase_create("hook");
  tcase_add_test(tc, test_hook_average_equals_builtin_allreduce);
  tcase_add_test(tc, test_hook_bf16_equals_builtin_bf16);
  tcase_add_test(tc, test_failing_hook_fails_the_backward);
  tcase_add_test(tc, test_hook_refusals);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  return mpi_check_main("test_ddp_hook", 30000, &g_comm, &g_world, make_suite);
}
