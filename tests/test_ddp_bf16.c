/* Tests of bf16 gradient communication in the DDP engine (mpt_ddp_config.grad_comm, ddp.h), run
 * under mpirun with 2 and 3 ranks (tests/test_ddp_bf16_np2.mpi, _np3.mpi).
 *
 * - Bound: the same MLP (784-64-64-10, several buckets) wrapped twice, fp32 and bf16, one
 *   backward on each rank's own batch: every averaged gradient element of the bf16 run is within
 *   the bound stated in ddp.h of the fp32 run's, c(W) (1/W) sum_r |g_r| (with float32 slack
 *   for the reference), where the |g_r| come from a plain model's local backward all-reduced;
 *   most elements differ (the test would test nothing otherwise); replicas agree bit for bit.
 * - Exact: gradients that are small integers on every rank (exact in bfloat16, and so are their
 *   partial sums) synchronised by mpt_ddp_allreduce_grads: bf16 equals fp32 bit for bit.
 * - Parsing and refusal: "fp32" / "bf16", anything else MPT_EINVAL.
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

enum { PER_RANK = 8, CLASSES = 10, FEATURES = 784 };

static mpt_model *mlp_make(uint64_t seed) {
  mpt_mlp_config c = mpt_mlp_config_default();
  c.input_size = FEATURES;
  c.num_hidden = 2;
  c.hidden[0] = 64;
  c.hidden[1] = 64;
  c.num_classes = CLASSES;
  mpt_model *m = NULL;
  OK(mpt_model_init_mlp(&m, mpt_device_cpu(), &c, seed));
  return m;
}

static mpt_ddp *wrap(mpt_model *m, mpt_ddp_grad_comm mode) {
  mpt_ddp_config dc = mpt_ddp_config_default();
  dc.bucket_cap_mb = dc.first_bucket_cap_mb = 0.01; /* several buckets */
  dc.timeout_ms = 30000;
  dc.grad_comm = mode;
  mpt_ddp *d = NULL;
  OK(mpt_ddp_init(&d, m, g_comm, NULL, &dc));
  return d;
}

/* One backward of mean cross-entropy on this rank's batch (seeded by rank). */
static void backward(mpt_model *m, mpt_tape *tape, const float *x, const int32_t *y) {
  int64_t xs[2] = {PER_RANK, FEATURES}, ys[1] = {PER_RANK};
  mpt_tensor xt = mpt_tensor_view((void *)x, mpt_device_cpu(), MPT_F32, 2, xs);
  mpt_tensor yt = mpt_tensor_view((void *)y, mpt_device_cpu(), MPT_I32, 1, ys);
  mpt_var *xv = NULL, *out = NULL, *loss = NULL;
  OK(mpt_model_zero_grad(m, NULL));
  mpt_tape_reset(tape, 1);
  OK(mpt_tape_input(tape, &xt, &xv));
  OK(mpt_model_forward(m, tape, xv, &out));
  OK(mpt_nn_cross_entropy(tape, out, &yt, &loss));
  OK(mpt_tape_backward(tape, loss, 1.0f));
}

START_TEST(test_bf16_gradients_are_within_the_stated_bound_of_fp32) {
  expect_begin();
  mpt_model *plain = mlp_make(7), *m32 = mlp_make(7), *m16 = mlp_make(7);
  mpt_tape *tp = NULL, *t32 = NULL, *t16 = NULL;
  OK(mpt_tape_init(&tp, plain, NULL));
  OK(mpt_tape_init(&t32, m32, NULL));
  OK(mpt_tape_init(&t16, m16, NULL));
  mpt_ddp *d32 = wrap(m32, MPT_DDP_GRAD_FP32), *d16 = wrap(m16, MPT_DDP_GRAD_BF16);
  EXPECT(mpt_ddp_num_buckets(d16) > 1, "want several buckets, got %d", mpt_ddp_num_buckets(d16));
  const int64_t n = mpt_model_param_count(m32);
  float *x = malloc(sizeof(float) * PER_RANK * FEATURES), *absg = malloc(sizeof(float) * n);
  int32_t y[PER_RANK];
  ck_assert(x && absg);
  mpt_rng rng;
  mpt_rng_seed(&rng, 99 + (uint64_t)g_rank);
  mpt_rng_fill_uniform(&rng, x, PER_RANK * FEATURES, -1.0f, 1.0f);
  for (int i = 0; i < PER_RANK; i++) y[i] = (int32_t)mpt_rng_below(&rng, CLASSES);

  backward(plain, tp, x, y); /* this rank's own gradient g_r */
  const float *gl = mpt_model_grads(plain);
  for (int64_t i = 0; i < n; i++) absg[i] = fabsf(gl[i]);
  OK(mpt_comm_allreduce_sync(g_comm, absg, absg, n, MPT_F32, MPT_REDUCE_SUM)); /* sum |g_r| */
  backward(m32, t32, x, y);
  backward(m16, t16, x, y);

  const float *g32 = mpt_model_grads(m32), *g16 = mpt_model_grads(m16);
  /* ddp.h: c(W) = u (2 + u) + (1 + u)^2 gamma_e(W - 1), one bfloat16 rounding of the input and
   * one of the float32 sum (a rounding per hop would allow gamma(W) = W u / (1 - W u)) */
  const double u = 0x1p-8, e = 0x1p-24, ge = (g_world - 1) * e / (1 - (g_world - 1) * e);
  const double gamma = u * (2 + u) + (1 + u) * (1 + u) * ge;
  const double f32_slack = (g_world + 1) * 0x1p-24; /* the fp32 reference's own rounding */
  int64_t differ = 0, over = 0;
  double worst = 0;
  for (int64_t i = 0; i < n; i++) {
    const double scale = (double)absg[i] / g_world;
    const double err = fabs((double)g16[i] - (double)g32[i]);
    const double bound = (gamma + f32_slack) * scale + 0x1p-24 * fabs((double)g16[i]);
    differ += g16[i] != g32[i];
    if (err > bound && over++ == 0)
      EXPECT(0, "element %lld: bf16 %.9g, fp32 %.9g, error %.3g over the bound %.3g",
             (long long)i, g16[i], g32[i], err, bound);
    if (scale > 0 && err / scale > worst) worst = err / scale;
  }
  EXPECT(differ > n / 4, "only %lld of %lld elements differ from fp32: bf16 not applied?",
         (long long)differ, (long long)n);
  EXPECT(same_on_all_ranks(g16, n), "the bf16 gradients differ across ranks");
  if (g_rank == 0)
    printf("ddp bf16 at %d ranks: %lld of %lld gradients differ from fp32; worst |error| / "
           "((1/W) sum|g_r|) = %.3g, bound c(W) = %.3g\n",
           g_world, (long long)differ, (long long)n, worst, gamma);
  mpt_ddp_free(d32);
  mpt_ddp_free(d16);
  mpt_tape_free(tp);
  mpt_tape_free(t32);
  mpt_tape_free(t16);
  mpt_model_free(plain);
  mpt_model_free(m32);
  mpt_model_free(m16);
  free(x);
  free(absg);
  expect_agree();
}
END_TEST

START_TEST(test_bf16_gradients_equal_fp32_bit_for_bit_when_representable) {
  expect_begin();
  mpt_model *m32 = mlp_make(3), *m16 = mlp_make(3);
  mpt_ddp *d32 = wrap(m32, MPT_DDP_GRAD_FP32), *d16 = wrap(m16, MPT_DDP_GRAD_BF16);
  const int64_t n = mpt_model_param_count(m32);
  float *g32 = mpt_model_grads(m32), *g16 = mpt_model_grads(m16);
  for (int64_t i = 0; i < n; i++) /* |g| <= 4 * 13: partial sums <= 52 * W, exact in bf16 */
    g32[i] = g16[i] = (float)((g_rank + 1) * (int)(i % 13 + 1) * (i % 2 ? -1 : 1));
  OK(mpt_ddp_allreduce_grads(d32));
  OK(mpt_ddp_allreduce_grads(d16));
  EXPECT(memcmp(g32, g16, sizeof(float) * (size_t)n) == 0, "bf16 and fp32 gradients differ");
  float want = 0;
  for (int r = 0; r < g_world; r++) want += (float)(r + 1);
  want /= (float)g_world; /* element 0: sum_r (r + 1) * 1 / W */
  EXPECT(g16[0] == want, "element 0: %g, want %g", g16[0], want);
  mpt_ddp_free(d32);
  mpt_ddp_free(d16);
  mpt_model_free(m32);
  mpt_model_free(m16);
  expect_agree();
}
END_TEST

START_TEST(test_grad_comm_parses_and_rejects) {
  mpt_ddp_grad_comm mode = MPT_DDP_GRAD_FP32;
  ck_assert_int_eq(mpt_ddp_grad_comm_parse("bf16", &mode), MPT_OK);
  ck_assert_int_eq(mode, MPT_DDP_GRAD_BF16);
  ck_assert_int_eq(mpt_ddp_grad_comm_parse("fp32", &mode), MPT_OK);
  ck_assert_int_eq(mode, MPT_DDP_GRAD_FP32);
  ck_assert_int_eq(mpt_ddp_grad_comm_parse("fp16", &mode), MPT_EINVAL);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "fp32 or bf16"));
  ck_assert_str_eq(mpt_ddp_grad_comm_name(MPT_DDP_GRAD_BF16), "bf16");
  mpt_model *m = mlp_make(1);
  mpt_ddp_config dc = mpt_ddp_config_default();
  dc.grad_comm = (mpt_ddp_grad_comm)7;
  mpt_ddp *d = NULL;
  ck_assert_int_eq(mpt_ddp_init(&d, m, g_comm, NULL, &dc), MPT_EINVAL);
  ck_assert_ptr_null(d);
  mpt_model_free(m);
}
END_TEST

static Suite *make_suite(void) {
  Suite *s = suite_create("ddp bf16");
  TCase *tc = tcase_create("bf16");
  tcase_add_test(tc, test_grad_comm_parses_and_rejects);
  tcase_add_test(tc, test_bf16_gradients_are_within_the_stated_bound_of_fp32);
  tcase_add_test(tc, test_bf16_gradients_equal_fp32_bit_for_bit_when_representable);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  return mpi_check_main("test_ddp_bf16", 30000, &g_comm, &g_world, make_suite);
}
