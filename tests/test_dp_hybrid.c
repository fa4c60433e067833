/* Hybrid data parallelism (include/mpitrain/dp.h): DataParallel over cpu:2 inside each rank,
 * the ranks' reduced gradients then averaged by the DDP engine (mpt_ddp_allreduce_grads).
 * Run under mpirun as tests/test_dp_hybrid_np2.mpi (2 ranks), never bare.
 *
 * Oracle: one process on the combined batch. Every rank draws the same W * B samples per
 * step, takes rows [rank * B, (rank + 1) * B) for its DP step, and also trains a plain model
 * (same seed, no DP, no DDP) on all W * B rows; after 10 SGD-with-momentum steps both hold
 * the same parameters (relative 1e-5), and the DP models are bit-identical across ranks. Per-
 * rank batches of 5 (chunks of 3 and 2) and 1 (fewer rows than devices), MLP and CNN. A sum
 * instead of an average, or an average taken twice, is off by far more than the tolerance.
 *
 * MPI rules: Check runs without forking; every rank runs the same tests in the same order;
 * value checks are soft and the ranks agree on the outcome at the end of each test, so a
 * failing check on one rank never leaves the others waiting in a collective. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/comm.h"
#include "mpitrain/ddp.h"
#include "mpitrain/dp.h"
#include "mpitrain/nn.h"
#include "mpitrain/optim.h"

static mpt_comm *g_comm;
static int g_rank, g_world;

#define MPI_CHECK_COMM g_comm
#include "mpi_check.h"

enum { CLASSES = 5, STEPS = 10 };
#define TOL 1e-5

static mpt_model *model_make(int cnn, uint64_t seed) {
  mpt_model *m = NULL;
  if (cnn) {
    mpt_cnn_config c = mpt_cnn_config_default();
    c.height = c.width = 12;
    c.conv1_channels = 4;
    c.conv2_channels = 6;
    c.kernel = 3;
    c.hidden = 16;
    c.num_classes = CLASSES;
    OK(mpt_model_init_cnn(&m, mpt_device_cpu(), &c, seed));
  } else {
    mpt_mlp_config c = mpt_mlp_config_default();
    c.input_size = 144;
    c.num_hidden = 1;
    c.hidden[0] = 16;
    c.num_classes = CLASSES;
    OK(mpt_model_init_mlp(&m, mpt_device_cpu(), &c, seed));
  }
  return m;
}

static mpt_optimizer *sgd_make(const mpt_model *m) {
  mpt_optimizer_config c = mpt_optimizer_config_default();
  c.lr = 0.05f;
  c.momentum = 0.9f;
  mpt_optimizer *opt = NULL;
  OK(mpt_optimizer_init(&opt, &c, mpt_device_cpu(), mpt_model_param_count(m)));
  return opt;
}

/* _i: cnn = _i % 2; per-rank batch 5 (_i < 2) or 1. */
START_TEST(test_hybrid_matches_one_process_on_combined_batch) {
  const int cnn = _i % 2;
  const int64_t per = _i < 2 ? 5 : 1, total = per * g_world, features = 144;
  g_bad = 0;
  mpt_model *m = model_make(cnn, 7), *ref = model_make(cnn, 7);
  mpt_device devices[2];
  int n = 0;
  OK(mpt_dp_parse_devices("cpu:2", devices, 2, &n));
  mpt_dp *dp = NULL;
  mpt_ddp *ddp = NULL;
  mpt_tape *tape = NULL;
  OK(mpt_dp_init(&dp, m, devices, n, NULL, NULL));
  OK(mpt_ddp_init(&ddp, m, g_comm, NULL, NULL));
  OK(mpt_tape_init(&tape, ref, NULL));
  mpt_optimizer *om = sgd_make(m), *oref = sgd_make(ref);
  float *x = malloc((size_t)(total * features) * sizeof *x);
  int32_t *y = malloc((size_t)total * sizeof *y);
  ck_assert(x && y);
  for (int step = 0; step < STEPS; step++) {
    mpt_rng rng;
    mpt_rng_seed(&rng, 500u + (uint64_t)step);
    mpt_rng_fill_uniform(&rng, x, total * features, -1.0f, 1.0f);
    for (int64_t i = 0; i < total; i++) y[i] = (int32_t)mpt_rng_below(&rng, CLASSES);
    /* this rank's share, DP over its two devices, then DDP across ranks */
    int64_t xs[4] = {per, 1, 12, 12}, ys[1] = {per};
    mpt_tensor xt = mpt_tensor_view(x + g_rank * per * features, mpt_device_cpu(), MPT_F32, 4, xs);
    mpt_tensor yt = mpt_tensor_view(y + g_rank * per, mpt_device_cpu(), MPT_I32, 1, ys);
    OK(mpt_model_zero_grad(m, NULL));
    OK(mpt_dp_step(dp, &xt, &yt, 1.0f, (uint64_t)step, NULL, NULL));
    OK(mpt_ddp_allreduce_grads(ddp));
    OK(mpt_optimizer_step_model(om, m, NULL, 0.05f)); /* refused without the all-reduce */
    /* the oracle: one process, all rows */
    int64_t xa[4] = {total, 1, 12, 12}, ya[1] = {total};
    mpt_tensor xall = mpt_tensor_view(x, mpt_device_cpu(), MPT_F32, 4, xa);
    mpt_tensor yall = mpt_tensor_view(y, mpt_device_cpu(), MPT_I32, 1, ya);
    mpt_var *in = NULL, *out = NULL, *loss = NULL;
    OK(mpt_model_zero_grad(ref, NULL));
    mpt_tape_reset(tape, 0);
    OK(mpt_tape_input(tape, &xall, &in));
    OK(mpt_model_forward(ref, tape, in, &out));
    OK(mpt_nn_cross_entropy(tape, out, &yall, &loss));
    OK(mpt_tape_backward(tape, loss, 1.0f));
    if (step == 0) {
      double r = rel_diff(mpt_model_grads(m), mpt_model_grads(ref), mpt_model_param_count(m));
      EXPECT(r <= TOL, "gradients after step 1 differ by %.3g (cnn %d, %lld per rank)", r, cnn,
             (long long)per);
    }
    OK(mpt_optimizer_step(oref, NULL, mpt_model_params(ref), mpt_model_grads(ref), 0.05f));
  }
  int64_t np = mpt_model_param_count(m);
  double r = rel_diff(mpt_model_params(m), mpt_model_params(ref), np);
  EXPECT(r <= TOL, "parameters after %d steps differ by %.3g (cnn %d, %lld per rank)", STEPS, r,
         cnn, (long long)per);
  mpt_model *init = model_make(cnn, 7);
  EXPECT(rel_diff(mpt_model_params(m), mpt_model_params(init), np) > 1e-2,
         "the parameters did not move");
  EXPECT(same_on_all_ranks(mpt_model_params(m), np), "replicas differ across ranks");
  EXPECT(mpt_ddp_get_stats(ddp).steps == STEPS, "DDP counted %lld passes",
         (long long)mpt_ddp_get_stats(ddp).steps);
  mpt_model_free(init);
  free(x);
  free(y);
  mpt_optimizer_free(om);
  mpt_optimizer_free(oref);
  mpt_tape_free(tape);
  mpt_ddp_free(ddp);
  mpt_dp_free(dp);
  mpt_model_free(m);
  mpt_model_free(ref);
  expect_agree();
}
END_TEST

static Suite *make_suite(void) {
  Suite *s = suite_create("dp_hybrid");
  TCase *tc = tcase_create("hybrid");
  tcase_add_loop_test(tc, test_hybrid_matches_one_process_on_combined_batch, 0, 4);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  return mpi_check_main("test_dp_hybrid", 30000, &g_comm, &g_world, make_suite);
}
