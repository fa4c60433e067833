/* DataParallel on CUDA devices (src/dp/dp.c) against one CPU process: the same model (same
 * seed) trained on the whole batch on the CPU is the oracle. DP over the visible GPUs (one, or
 * the first two: then replica copies go between GPUs, through peer access when the devices
 * allow it), with and without gathered outputs (without, nothing but the completion wait orders
 * the reduction and the optimizer after replica 0's backward: without that wait they race),
 * must give the same loss and gradients after one step and the same parameters after STEPS SGD
 * steps with momentum. Exits 77 (SKIP) without a GPU.
 *
 * Tolerance: relative 1e-4 per tensor (float32 summation order on the GPU; a missing wait or a
 * missing replica is off by 1e-2 and more). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/dp.h"
#include "mpitrain/nn.h"
#include "mpitrain/ops.h"
#include "mpitrain/optim.h"
#include "check_util.h"


#define TOL 1e-4
enum { CLASSES = 5, STEPS = 5, BATCH = 24, SIDE = 12 };

static mpt_model *cnn_make(mpt_device dev) {
  mpt_cnn_config c = mpt_cnn_config_default();
  c.height = c.width = SIDE;
  c.conv1_channels = 4;
  c.conv2_channels = 6;
  c.kernel = 3;
  c.hidden = 16;
  c.num_classes = CLASSES;
  mpt_model *m = NULL;
  OK(mpt_model_init_cnn(&m, dev, &c, 11));
  return m;
}

/* n floats of device memory to a new host array. */
static float *to_host(mpt_stream *s, mpt_device dev, const float *src, int64_t n) {
  float *h = malloc((size_t)n * sizeof *h);
  ck_assert_ptr_nonnull(h);
  OK(mpt_op_memcpy(s, mpt_device_cpu(), h, dev, src, (size_t)n * sizeof *h));
  OK(mpt_stream_synchronize(s, 60000));
  return h;
}

static mpt_optimizer *sgd_make(mpt_device dev, int64_t count) {
  mpt_optimizer_config c = mpt_optimizer_config_default();
  c.lr = 0.05f;
  c.momentum = 0.9f;
  mpt_optimizer *opt = NULL;
  OK(mpt_optimizer_init(&opt, &c, dev, count));
  return opt;
}

/* _i: 0 = outputs gathered, 1 = not gathered. */
START_TEST(test_dp_on_cuda_matches_one_cpu_process) {
  const int gather = _i == 0;
  const int ndev = mpt_device_count(MPT_DEVICE_CUDA) >= 2 ? 2 : 1;
  mpt_device devs[2] = {{MPT_DEVICE_CUDA, 0}, {MPT_DEVICE_CUDA, 1}};
  mpt_stream *s = NULL;
  OK(mpt_stream_init(&s, devs[0], MPT_STREAM_INLINE));
  mpt_model *ref = cnn_make(mpt_device_cpu()), *m = cnn_make(devs[0]);
  const int64_t np = mpt_model_param_count(m);
  mpt_tape *tape = NULL;
  OK(mpt_tape_init(&tape, ref, NULL));
  mpt_dp_config cfg = mpt_dp_config_default();
  cfg.gather_outputs = gather;
  cfg.timeout_ms = 60000;
  mpt_dp *dp = NULL;
  OK(mpt_dp_init(&dp, m, devs, ndev, s, &cfg));
  mpt_optimizer *oref = sgd_make(mpt_device_cpu(), np), *om = sgd_make(devs[0], np);

  float *x = malloc(sizeof(float) * BATCH * SIDE * SIDE);
  int32_t *y = malloc(sizeof(int32_t) * BATCH);
  ck_assert(x && y);
  mpt_rng rng;
  for (int step = 0; step < STEPS; step++) {
    mpt_rng_seed(&rng, 100 + (uint64_t)step);
    mpt_rng_fill_uniform(&rng, x, BATCH * SIDE * SIDE, -1.0f, 1.0f);
    for (int i = 0; i < BATCH; i++) y[i] = (int32_t)mpt_rng_below(&rng, CLASSES);
    const int64_t xs[4] = {BATCH, 1, SIDE, SIDE}, ys[1] = {BATCH};
    mpt_tensor xt = mpt_tensor_view(x, mpt_device_cpu(), MPT_F32, 4, xs);
    mpt_tensor yt = mpt_tensor_view(y, mpt_device_cpu(), MPT_I32, 1, ys);
    /* the oracle: one CPU process on the whole batch */
    OK(mpt_model_zero_grad(ref, NULL));
    mpt_var *in = NULL, *out = NULL, *loss = NULL;
    mpt_tape_reset(tape, 0);
    OK(mpt_tape_input(tape, &xt, &in));
    OK(mpt_model_forward(ref, tape, in, &out));
    OK(mpt_nn_cross_entropy(tape, out, &yt, &loss));
    float want = 0;
    OK(mpt_var_item(tape, loss, &want));
    OK(mpt_tape_backward(tape, loss, 1.0f));
    /* DP on the GPUs */
    OK(mpt_model_zero_grad(m, s));
    float got = -1;
    int64_t correct = -1;
    OK(mpt_dp_step(dp, &xt, &yt, 1.0f, (uint64_t)step, &got, &correct));
    ck_assert_msg(fabs(got - want) <= TOL * fabs(want), "loss %.9g, CPU %.9g", (double)got,
                  (double)want);
    if (step == 0) {
      float *g = to_host(s, devs[0], mpt_model_grads(m), np);
      const double r = rel_diff(g, mpt_model_grads(ref), np);
      ck_assert_msg(r <= TOL, "gradients differ by %.3g (gather %d, %d GPUs)", r, gather, ndev);
      free(g);
    }
    OK(mpt_optimizer_step(oref, NULL, mpt_model_params(ref), mpt_model_grads(ref), 0.05f));
    OK(mpt_optimizer_step(om, s, mpt_model_params(m), mpt_model_grads(m), 0.05f));
  }
  float *p = to_host(s, devs[0], mpt_model_params(m), np);
  const double r = rel_diff(p, mpt_model_params(ref), np);
  ck_assert_msg(r <= TOL, "parameters after %d steps differ by %.3g (gather %d, %d GPUs)", STEPS,
                r, gather, ndev);
  free(p);
  free(x);
  free(y);
  mpt_optimizer_free(oref);
  mpt_optimizer_free(om);
  mpt_dp_free(dp);
  mpt_tape_free(tape);
  mpt_model_free(ref);
  mpt_model_free(m);
  mpt_stream_free(s);
}
END_TEST

int main(void) {
  if (mpt_device_count(MPT_DEVICE_CUDA) == 0) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  Suite *su = suite_create("dp_cuda");
  TCase *tc = tcase_create("dp_cuda");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_dp_on_cuda_matches_one_cpu_process, 0, 2);
  suite_add_tcase(su, tc);
  SRunner *sr = srunner_create(su);
  srunner_set_fork_status(sr, CK_NOFORK); /* a CUDA context does not survive fork() */
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
