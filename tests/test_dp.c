/* Tests of DataParallel (src/dp/dp.c, src/dp/devices.c) over CPU devices.
 *
 * The oracle is one device: a plain model (same seed) trained with its own tape on the whole
 * batch. DP over K = 1..4 devices, for every batch size 1..2K+1 (fewer rows than devices, not
 * divisible, divisible), for the MLP and the CNN, must give the same loss, accuracy and
 * gradients after one step and the same parameters after 10 SGD-with-momentum steps (relative
 * 1e-5 per tensor). Also: the gathered outputs equal the one-device outputs row by row on the
 * output device; the loss is the mean over the whole batch (B = 3 over 2 devices against a
 * naive double-precision loop, and not the mean of the two chunks' means); BatchNorm running
 * statistics come from replica 0 (the first chunk) and the other replicas restart from them;
 * gradient accumulation with a loss scale; a failing replica names its device; device lists.
 *
 * Tolerance: DP and one device differ only in float32 summation order (GEMMs over chunks, then
 * a weighted sum of K chunk gradients), a few ulps; a real fault (a mean of means, a missing or
 * doubled replica, rows out of order, stale parameters) is off by 1e-2 and more. */
#include "config.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "mpitrain/dp.h"
#include "mpitrain/nn.h"
#include "mpitrain/optim.h"
#include "check_util.h"


#define TOL 1e-5
enum { CLASSES = 5, STEPS = 10 };

/* MLP 64-16-5 on [N, 1, 8, 8], or CNN on 1x12x12: conv 1->4 k3, conv 4->6 k3, fc 54->16, fc
 * 16->5, with or without BatchNorm. No dropout. */
static mpt_model *model_make(int cnn, int batchnorm, uint64_t seed) {
  mpt_model *m = NULL;
  if (cnn) {
    mpt_cnn_config c = mpt_cnn_config_default();
    c.height = c.width = 12;
    c.conv1_channels = 4;
    c.conv2_channels = 6;
    c.kernel = 3;
    c.hidden = 16;
    c.num_classes = CLASSES;
    c.batchnorm = batchnorm;
    OK(mpt_model_init_cnn(&m, mpt_device_cpu(), &c, seed));
  } else {
    mpt_mlp_config c = mpt_mlp_config_default();
    c.input_size = 64;
    c.num_hidden = 1;
    c.hidden[0] = 16;
    c.num_classes = CLASSES;
    OK(mpt_model_init_mlp(&m, mpt_device_cpu(), &c, seed));
  }
  return m;
}

typedef struct batch {
  float *x;
  int32_t *y;
  int64_t n, side;
  mpt_tensor xt, yt; /* [n, 1, side, side], [n] */
} batch;

static batch batch_make(int cnn, int64_t n, uint64_t seed) {
  batch b = {.n = n, .side = cnn ? 12 : 8};
  int64_t features = b.side * b.side;
  b.x = malloc((size_t)(n * features) * sizeof *b.x);
  b.y = malloc((size_t)n * sizeof *b.y);
  ck_assert(b.x && b.y);
  mpt_rng rng;
  mpt_rng_seed(&rng, seed);
  mpt_rng_fill_uniform(&rng, b.x, n * features, -1.0f, 1.0f);
  for (int64_t i = 0; i < n; i++) b.y[i] = (int32_t)mpt_rng_below(&rng, CLASSES);
  int64_t xs[4] = {n, 1, b.side, b.side}, ys[1] = {n};
  b.xt = mpt_tensor_view(b.x, mpt_device_cpu(), MPT_F32, 4, xs);
  b.yt = mpt_tensor_view(b.y, mpt_device_cpu(), MPT_I32, 1, ys);
  return b;
}

static void batch_free(batch *b) {
  free(b->x);
  free(b->y);
}

/* Rows [first, first + n) of b as tensors (views). */
static void batch_rows(const batch *b, int64_t first, int64_t n, mpt_tensor *xt, mpt_tensor *yt) {
  int64_t xs[4] = {n, 1, b->side, b->side}, ys[1] = {n};
  *xt = mpt_tensor_view(b->x + first * b->side * b->side, mpt_device_cpu(), MPT_F32, 4, xs);
  *yt = mpt_tensor_view(b->y + first, mpt_device_cpu(), MPT_I32, 1, ys);
}

/* One-device forward (+ backward with `scale` when scale != 0) of rows [first, first + n). */
static float ref_pass(mpt_model *m, mpt_tape *tape, const batch *b, int64_t first, int64_t n,
                      float scale, mpt_var **logits) {
  mpt_tensor xt, yt;
  batch_rows(b, first, n, &xt, &yt);
  mpt_var *in = NULL, *out = NULL, *loss = NULL;
  mpt_tape_reset(tape, 0);
  OK(mpt_tape_input(tape, &xt, &in));
  OK(mpt_model_forward(m, tape, in, &out));
  OK(mpt_nn_cross_entropy(tape, out, &yt, &loss));
  float l = 0;
  OK(mpt_var_item(tape, loss, &l));
  if (scale != 0.0f) OK(mpt_tape_backward(tape, loss, scale));
  if (logits) *logits = out;
  return l;
}

/* Every parameter tensor of `got` within TOL of `want` (flat buffers `ga`, `wa`). */
static void expect_params_close(mpt_model *want, const float *ga, const float *wa,
                                const char *what, int k, int64_t batch) {
  for (int p = 0; p < mpt_model_num_params(want); p++) {
    const mpt_param_info *info = mpt_model_param_info(want, p);
    double r = rel_diff(ga + info->offset, wa + info->offset, info->count);
    ck_assert_msg(r <= TOL, "%s of %s differ by %.3g (relative) with %d devices, batch %lld",
                  what, info->name, r, k, (long long)batch);
  }
}

static mpt_optimizer *sgd_make(const mpt_model *m) {
  mpt_optimizer_config c = mpt_optimizer_config_default();
  c.lr = 0.05f;
  c.momentum = 0.9f;
  mpt_optimizer *opt = NULL;
  OK(mpt_optimizer_init(&opt, &c, mpt_device_cpu(), mpt_model_param_count(m)));
  return opt;
}

static void cpu_devices(mpt_device *devices, int k) {
  for (int i = 0; i < k; i++) devices[i] = (mpt_device){MPT_DEVICE_CPU, i};
}

/* ------------------------------------------------------------------------------------------ */

START_TEST(test_split_is_even_and_never_empty) {
  int64_t c[8];
  ck_assert_int_eq(mpt_dp_split(5, 4, c), 4);
  ck_assert(c[0] == 2 && c[1] == 1 && c[2] == 1 && c[3] == 1);
  ck_assert_int_eq(mpt_dp_split(8, 3, c), 3);
  ck_assert(c[0] == 3 && c[1] == 3 && c[2] == 2);
  ck_assert_int_eq(mpt_dp_split(3, 4, c), 3);
  ck_assert(c[0] == 1 && c[1] == 1 && c[2] == 1);
  ck_assert_int_eq(mpt_dp_split(8, 4, c), 4);
  ck_assert(c[0] == 2 && c[1] == 2 && c[2] == 2 && c[3] == 2);
  ck_assert_int_eq(mpt_dp_split(0, 4, c), 0);
  ck_assert_int_eq(mpt_dp_split(4, 0, c), 0);
}
END_TEST

/* _i: K = 1 + i / 2 devices, mlp (i even) or cnn (i odd); every batch size 1 .. 2K+1. */
START_TEST(test_dp_matches_one_device_for_every_batch_size) {
  const int k = 1 + _i / 2, cnn = _i % 2;
  mpt_device devices[4];
  cpu_devices(devices, k);
  for (int64_t bsz = 1; bsz <= 2 * k + 1; bsz++) {
    mpt_model *ref = model_make(cnn, 0, 7), *m = model_make(cnn, 0, 7);
    mpt_tape *tape = NULL;
    mpt_dp *dp = NULL;
    OK(mpt_tape_init(&tape, ref, NULL));
    OK(mpt_dp_init(&dp, m, devices, k, NULL, NULL));
    mpt_optimizer *oref = sgd_make(ref), *om = sgd_make(m);
    int64_t np = mpt_model_param_count(m);
    for (int step = 0; step < STEPS; step++) {
      batch b = batch_make(cnn, bsz, 1000u * (uint64_t)bsz + (uint64_t)step);
      OK(mpt_model_zero_grad(ref, NULL));
      float want = ref_pass(ref, tape, &b, 0, bsz, 1.0f, NULL);
      OK(mpt_model_zero_grad(m, NULL));
      float got = -1;
      int64_t correct = -1;
      OK(mpt_dp_step(dp, &b.xt, &b.yt, 1.0f, (uint64_t)step, &got, &correct));
      ck_assert_msg(fabs(got - want) <= TOL * fabs(want), "loss %.9g, one device %.9g (K %d, "
                    "B %lld)", (double)got, (double)want, k, (long long)bsz);
      ck_assert(correct >= 0 && correct <= bsz);
      if (step == 0)
        expect_params_close(ref, mpt_model_grads(m), mpt_model_grads(ref), "gradients", k, bsz);
      OK(mpt_optimizer_step(oref, NULL, mpt_model_params(ref), mpt_model_grads(ref), 0.05f));
      OK(mpt_optimizer_step(om, NULL, mpt_model_params(m), mpt_model_grads(m), 0.05f));
      batch_free(&b);
    }
    expect_params_close(ref, mpt_model_params(m), mpt_model_params(ref), "parameters", k, bsz);
    /* and the parameters did move (so the comparison above says something) */
    mpt_model *init = model_make(cnn, 0, 7);
    ck_assert(rel_diff(mpt_model_params(m), mpt_model_params(init), np) > 1e-2);
    mpt_model_free(init);
    mpt_dp_stats s = mpt_dp_get_stats(dp);
    ck_assert_int_eq(s.steps, STEPS);
    ck_assert_int_eq(s.replicas, bsz < k ? (int)bsz : k);
    ck_assert(s.first_extra_ms == s.broadcast_ms + s.gather_ms + s.reduce_ms);
    for (int d = 0; d < k; d++) ck_assert(d < s.replicas ? s.replica_ms[d] >= 0 : s.replica_ms[d] == 0);
    mpt_optimizer_free(oref);
    mpt_optimizer_free(om);
    mpt_dp_free(dp);
    mpt_tape_free(tape);
    mpt_model_free(ref);
    mpt_model_free(m);
  }
}
END_TEST

/* Correct answers: DP's count equals a count over the one-device logits. */
START_TEST(test_dp_counts_correct_answers_over_the_whole_batch) {
  mpt_device devices[3];
  cpu_devices(devices, 3);
  mpt_model *ref = model_make(0, 0, 3), *m = model_make(0, 0, 3);
  mpt_tape *tape = NULL;
  mpt_dp *dp = NULL;
  OK(mpt_tape_init(&tape, ref, NULL));
  OK(mpt_dp_init(&dp, m, devices, 3, NULL, NULL));
  batch b = batch_make(0, 40, 99);
  mpt_var *logits = NULL;
  ref_pass(ref, tape, &b, 0, b.n, 0.0f, &logits);
  const float *l = mpt_var_value(logits)->data;
  int64_t want = 0;
  for (int64_t i = 0; i < b.n; i++) {
    int best = 0;
    for (int c = 1; c < CLASSES; c++)
      if (l[i * CLASSES + c] > l[i * CLASSES + best]) best = c;
    want += best == b.y[i];
  }
  int64_t got = -1;
  OK(mpt_dp_step(dp, &b.xt, &b.yt, 1.0f, 0, NULL, &got));
  ck_assert_int_eq(got, want);
  ck_assert(want > 0); /* a count of 0 would not tell chunks apart */
  batch_free(&b);
  mpt_dp_free(dp);
  mpt_tape_free(tape);
  mpt_model_free(ref);
  mpt_model_free(m);
}
END_TEST

START_TEST(test_outputs_are_gathered_in_order_on_the_output_device) {
  mpt_device devices[3];
  cpu_devices(devices, 3);
  for (int out = 0; out < 3; out += 2) {
    mpt_model *ref = model_make(1, 0, 5), *m = model_make(1, 0, 5);
    mpt_tape *tape = NULL;
    mpt_dp *dp = NULL;
    mpt_dp_config cfg = mpt_dp_config_default();
    cfg.output_device = out;
    OK(mpt_tape_init(&tape, ref, NULL));
    OK(mpt_dp_init(&dp, m, devices, 3, NULL, &cfg));
    ck_assert_ptr_null(mpt_dp_output(dp));
    batch b = batch_make(1, 7, 11); /* chunks of 3, 2, 2 */
    mpt_var *logits = NULL;
    ref_pass(ref, tape, &b, 0, b.n, 0.0f, &logits);
    const float *want = mpt_var_value(logits)->data;
    OK(mpt_dp_step(dp, &b.xt, &b.yt, 1.0f, 0, NULL, NULL));
    const mpt_tensor *o = mpt_dp_output(dp);
    ck_assert_ptr_nonnull(o);
    ck_assert(o->device.type == MPT_DEVICE_CPU && o->device.index == out);
    ck_assert(o->ndim == 2 && o->shape[0] == 7 && o->shape[1] == CLASSES);
    const float *got = o->data;
    for (int i = 0; i < 7; i++) {
      double r = rel_diff(got + i * CLASSES, want + i * CLASSES, CLASSES);
      ck_assert_msg(r <= TOL, "row %d of the gathered outputs differs by %.3g", i, r);
      for (int j = 0; j < i; j++) /* rows are distinct, so an order mix-up would show */
        ck_assert(rel_diff(want + j * CLASSES, want + i * CLASSES, CLASSES) > 1e-3);
    }
    batch_free(&b);
    mpt_dp_free(dp);
    mpt_tape_free(tape);
    mpt_model_free(ref);
    mpt_model_free(m);
  }
}
END_TEST

START_TEST(test_gather_can_be_turned_off) {
  mpt_device devices[2];
  cpu_devices(devices, 2);
  mpt_model *m = model_make(0, 0, 5);
  mpt_dp *dp = NULL;
  mpt_dp_config cfg = mpt_dp_config_default();
  cfg.gather_outputs = 0;
  OK(mpt_dp_init(&dp, m, devices, 2, NULL, &cfg));
  batch b = batch_make(0, 4, 1);
  OK(mpt_dp_step(dp, &b.xt, &b.yt, 1.0f, 0, NULL, NULL));
  ck_assert_ptr_null(mpt_dp_output(dp));
  ck_assert(mpt_dp_get_stats(dp).gather_ms == 0);
  batch_free(&b);
  mpt_dp_free(dp);
  mpt_model_free(m);
}
END_TEST

/* B = 3 over 2 devices: chunks of 2 and 1. The loss is sum over rows / 3, not the mean of the
 * two chunks' means. */
START_TEST(test_loss_is_the_mean_over_the_whole_batch) {
  mpt_device devices[2];
  cpu_devices(devices, 2);
  mpt_model *ref = model_make(0, 0, 21), *m = model_make(0, 0, 21);
  mpt_tape *tape = NULL;
  mpt_dp *dp = NULL;
  OK(mpt_tape_init(&tape, ref, NULL));
  OK(mpt_dp_init(&dp, m, devices, 2, NULL, NULL));
  batch b = batch_make(0, 3, 4);
  mpt_var *logits = NULL;
  ref_pass(ref, tape, &b, 0, 3, 0.0f, &logits);
  const float *l = mpt_var_value(logits)->data;
  double row[3];
  for (int i = 0; i < 3; i++) { /* naive: log-sum-exp minus the label's logit, in double */
    double mx = l[i * CLASSES], s = 0;
    for (int c = 1; c < CLASSES; c++) mx = fmax(mx, l[i * CLASSES + c]);
    for (int c = 0; c < CLASSES; c++) s += exp(l[i * CLASSES + c] - mx);
    row[i] = mx + log(s) - l[i * CLASSES + b.y[i]];
  }
  double mean = (row[0] + row[1] + row[2]) / 3, mean_of_means = ((row[0] + row[1]) / 2 + row[2]) / 2;
  ck_assert_msg(fabs(mean - mean_of_means) > 1e-3 * mean, "test data cannot tell the two apart");
  float got = 0;
  OK(mpt_dp_step(dp, &b.xt, &b.yt, 1.0f, 0, &got, NULL));
  ck_assert_msg(fabs(got - mean) <= TOL * mean, "DP loss %.9g, mean over the batch %.9g "
                "(mean of chunk means %.9g)", (double)got, mean, mean_of_means);
  batch_free(&b);
  mpt_dp_free(dp);
  mpt_tape_free(tape);
  mpt_model_free(ref);
  mpt_model_free(m);
}
END_TEST

/* Two micro-batches of 3 with scale 1/2 accumulate to one device's step on the 6 rows. */
START_TEST(test_gradients_accumulate_with_the_loss_scale) {
  mpt_device devices[2];
  cpu_devices(devices, 2);
  mpt_model *ref = model_make(1, 0, 8), *m = model_make(1, 0, 8);
  mpt_tape *tape = NULL;
  mpt_dp *dp = NULL;
  OK(mpt_tape_init(&tape, ref, NULL));
  OK(mpt_dp_init(&dp, m, devices, 2, NULL, NULL));
  batch b = batch_make(1, 6, 12);
  ref_pass(ref, tape, &b, 0, 6, 1.0f, NULL);
  for (int half = 0; half < 2; half++) {
    mpt_tensor xt, yt;
    batch_rows(&b, 3 * half, 3, &xt, &yt);
    OK(mpt_dp_step(dp, &xt, &yt, 0.5f, 0, NULL, NULL));
  }
  expect_params_close(ref, mpt_model_grads(m), mpt_model_grads(ref), "gradients", 2, 6);
  batch_free(&b);
  mpt_dp_free(dp);
  mpt_tape_free(tape);
  mpt_model_free(ref);
  mpt_model_free(m);
}
END_TEST

/* BatchNorm: K = 2, B = 5 (chunks of 3 and 2), two steps. The model's running statistics are
 * those of a one-device model that saw only the first chunk of each batch; replica 1 restarts
 * from them at each step (broadcast), so after step 2 it holds chunk 0 of batch 1 then chunk 1
 * of batch 2. */
START_TEST(test_batchnorm_buffers_come_from_replica_zero) {
  mpt_device devices[2];
  cpu_devices(devices, 2);
  mpt_model *m = model_make(1, 1, 31), *first = model_make(1, 1, 31);
  mpt_model *second = model_make(1, 1, 31), *whole = model_make(1, 1, 31);
  mpt_tape *t_first = NULL, *t_second = NULL, *t_whole = NULL;
  OK(mpt_tape_init(&t_first, first, NULL));
  OK(mpt_tape_init(&t_second, second, NULL));
  OK(mpt_tape_init(&t_whole, whole, NULL));
  mpt_dp *dp = NULL;
  OK(mpt_dp_init(&dp, m, devices, 2, NULL, NULL));
  int64_t nb = mpt_model_buffer_count(m);
  ck_assert(nb > 0);
  batch b1 = batch_make(1, 5, 41), b2 = batch_make(1, 5, 42);
  OK(mpt_dp_step(dp, &b1.xt, &b1.yt, 1.0f, 0, NULL, NULL));
  ref_pass(first, t_first, &b1, 0, 3, 0.0f, NULL);
  ref_pass(second, t_second, &b1, 0, 3, 0.0f, NULL);
  ref_pass(whole, t_whole, &b1, 0, 5, 0.0f, NULL);
  ck_assert(rel_diff(mpt_model_buffers(m), mpt_model_buffers(first), nb) <= TOL);
  ck_assert(rel_diff(mpt_model_buffers(m), mpt_model_buffers(whole), nb) > 1e-3);
  OK(mpt_dp_step(dp, &b2.xt, &b2.yt, 1.0f, 1, NULL, NULL));
  ref_pass(first, t_first, &b2, 0, 3, 0.0f, NULL);
  ref_pass(second, t_second, &b2, 3, 2, 0.0f, NULL);
  ck_assert(rel_diff(mpt_model_buffers(m), mpt_model_buffers(first), nb) <= TOL);
  mpt_model *r1 = mpt_dp_replica(dp, 1);
  ck_assert_ptr_eq(mpt_dp_replica(dp, 0), m);
  ck_assert(rel_diff(mpt_model_buffers(r1), mpt_model_buffers(second), nb) <= TOL);
  ck_assert(rel_diff(mpt_model_buffers(r1), mpt_model_buffers(m), nb) > 1e-3);
  batch_free(&b1);
  batch_free(&b2);
  mpt_dp_free(dp);
  mpt_tape_free(t_first);
  mpt_tape_free(t_second);
  mpt_tape_free(t_whole);
  mpt_model_free(m);
  mpt_model_free(first);
  mpt_model_free(second);
  mpt_model_free(whole);
}
END_TEST

/* Forward only, evaluation mode: the one-device loss, and no gradient is written. */
START_TEST(test_forward_evaluates_without_gradients) {
  mpt_device devices[3];
  cpu_devices(devices, 3);
  mpt_model *ref = model_make(1, 1, 13), *m = model_make(1, 1, 13);
  mpt_model_set_training(ref, 0);
  mpt_model_set_training(m, 0);
  mpt_tape *tape = NULL;
  mpt_dp *dp = NULL;
  OK(mpt_tape_init(&tape, ref, NULL));
  OK(mpt_dp_init(&dp, m, devices, 3, NULL, NULL));
  batch b = batch_make(1, 8, 17);
  float want = ref_pass(ref, tape, &b, 0, 8, 0.0f, NULL), got = 0;
  OK(mpt_dp_forward(dp, &b.xt, &b.yt, &got, NULL));
  ck_assert(fabs(got - want) <= TOL * fabs(want));
  const float *g = mpt_model_grads(m);
  for (int64_t i = 0; i < mpt_model_param_count(m); i++) ck_assert(g[i] == 0.0f);
  ck_assert_int_eq(mpt_dp_get_stats(dp).steps, 0);
  batch_free(&b);
  mpt_dp_free(dp);
  mpt_tape_free(tape);
  mpt_model_free(ref);
  mpt_model_free(m);
}
END_TEST

/* A label out of range in replica 1's chunk: the error names cpu:1; the next step works. */
START_TEST(test_a_failing_replica_names_its_device) {
  mpt_device devices[2];
  cpu_devices(devices, 2);
  mpt_model *m = model_make(0, 0, 2);
  mpt_dp *dp = NULL;
  OK(mpt_dp_init(&dp, m, devices, 2, NULL, NULL));
  batch b = batch_make(0, 4, 3);
  b.y[3] = CLASSES + 4;
  mpt_status st = mpt_dp_step(dp, &b.xt, &b.yt, 1.0f, 0, NULL, NULL);
  ck_assert_int_ne(st, MPT_OK);
  ck_assert_msg(strncmp(mpt_last_error(), "cpu:1: ", 7) == 0, "detail: %s", mpt_last_error());
  b.y[3] = 0;
  OK(mpt_dp_step(dp, &b.xt, &b.yt, 1.0f, 0, NULL, NULL));
  batch_free(&b);
  mpt_dp_free(dp);
  mpt_model_free(m);
}
END_TEST

/* Current virtual size of this process (VmSize), in bytes; 0 if unknown. */
static unsigned long long vm_size_bytes(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  unsigned long long kib = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmSize: %llu kB", &kib) == 1) break;
  if (f) fclose(f);
  return kib * 1024;
}

/* A replica whose first GEMM cannot get OpenBLAS's per-thread buffer (an address-space limit
 * 64 MiB above what the process maps, below the buffer's 128 MiB) fails the step at once with
 * MPT_ENOMEM naming OpenBLAS, instead of spinning in OpenBLAS's allocation loop until the
 * step's deadline (20 s here; Check's 4 s timeout ends the test first on the old code). The
 * GEMMs are 32 x 512 x 784, above OpenBLAS's small-matrix path; _i 0 sends them to OpenBLAS
 * (mpt_cpu_set_gemm, --gemm openblas). Runs in Check's child process (the limit is restored
 * anyway). _i 1 sends them to oneDNN's sgemm (src/core/cpu/sgemm_dnnl.c; builds with oneDNN),
 * which needs no such buffer: the step then succeeds under the same limit (the OpenBLAS guard is
 * tested on its own in tests/test_sgemm_dnnl.c) once oneDNN's process-wide JIT GEMM kernels
 * exist: oneDNN generates them at its first sgemm and does not survive running out of address
 * space while it does (a segfault inside its jit_init), so that case takes one step before the
 * limit. */
START_TEST(test_replica_without_blas_memory_fails_the_step_at_once) {
  const int onednn = _i == 1;
  if (onednn) {
#ifndef MPT_HAVE_ONEDNN
    ck_assert_int_eq(mpt_cpu_set_gemm(MPT_CPU_GEMM_ONEDNN), MPT_ENOTSUP);
    return;
#endif
  }
  OK(mpt_cpu_set_gemm(onednn ? MPT_CPU_GEMM_ONEDNN : MPT_CPU_GEMM_OPENBLAS));
  mpt_device devices[2];
  cpu_devices(devices, 2);
  mpt_mlp_config c = mpt_mlp_config_default();
  c.input_size = 784;
  c.num_hidden = 1;
  c.hidden[0] = 512;
  c.num_classes = CLASSES;
  mpt_model *m = NULL;
  OK(mpt_model_init_mlp(&m, mpt_device_cpu(), &c, 5));
  mpt_dp_config pc = mpt_dp_config_default();
  pc.timeout_ms = 20000;
  mpt_dp *dp = NULL;
  OK(mpt_dp_init(&dp, m, devices, 2, NULL, &pc));
  const int64_t n = 64, xs[4] = {n, 1, 28, 28}, ys[1] = {n};
  float *x = calloc((size_t)(n * 784), sizeof *x);
  int32_t *y = calloc((size_t)n, sizeof *y);
  ck_assert(x && y);
  mpt_tensor xt = mpt_tensor_view(x, mpt_device_cpu(), MPT_F32, 4, xs);
  mpt_tensor yt = mpt_tensor_view(y, mpt_device_cpu(), MPT_I32, 1, ys);
  if (onednn) OK(mpt_dp_step(dp, &xt, &yt, 1.0f, 0, NULL, NULL));
  struct rlimit old, tight;
  ck_assert_int_eq(getrlimit(RLIMIT_AS, &old), 0);
  unsigned long long vm = vm_size_bytes();
  ck_assert(vm > 0);
  tight = old;
  tight.rlim_cur = (rlim_t)(vm + (64ull << 20));
  ck_assert_int_eq(setrlimit(RLIMIT_AS, &tight), 0);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  mpt_status st = mpt_dp_step(dp, &xt, &yt, 1.0f, 0, NULL, NULL);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  setrlimit(RLIMIT_AS, &old);
  double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
  if (onednn) {
    ck_assert_msg(st == MPT_OK, "status %s: %s", mpt_status_name(st), mpt_last_error());
  } else {
    ck_assert_msg(st == MPT_ENOMEM, "status %s: %s", mpt_status_name(st), mpt_last_error());
    ck_assert_msg(strstr(mpt_last_error(), "OpenBLAS") != NULL, "detail: %s", mpt_last_error());
  }
  ck_assert_msg(s < 2.0, "the step took %.1f s to fail", s);
  OK(mpt_cpu_set_gemm(MPT_CPU_GEMM_AUTO));
  free(x);
  free(y);
  mpt_dp_free(dp);
  mpt_model_free(m);
}
END_TEST

START_TEST(test_step_rejects_bad_inputs) {
  mpt_device devices[2];
  cpu_devices(devices, 2);
  mpt_model *m = model_make(0, 0, 2);
  mpt_dp *dp = NULL;
  OK(mpt_dp_init(&dp, m, devices, 2, NULL, NULL));
  batch b = batch_make(0, 4, 3);
  mpt_tensor x0 = b.xt, y3 = b.yt;
  x0.shape[0] = 0;
  ck_assert_int_eq(mpt_dp_step(dp, &x0, &b.yt, 1.0f, 0, NULL, NULL), MPT_EINVAL);
  y3.shape[0] = 3;
  ck_assert_int_eq(mpt_dp_step(dp, &b.xt, &y3, 1.0f, 0, NULL, NULL), MPT_ESHAPE);
  ck_assert_int_eq(mpt_dp_step(dp, NULL, &b.yt, 1.0f, 0, NULL, NULL), MPT_EINVAL);
  batch_free(&b);
  mpt_dp_free(dp);
  mpt_model_free(m);
}
END_TEST

START_TEST(test_init_rejects_bad_lists_and_config) {
  mpt_model *m = model_make(0, 0, 2);
  mpt_dp *dp = NULL;
  mpt_device twice[2] = {{MPT_DEVICE_CPU, 1}, {MPT_DEVICE_CPU, 1}};
  ck_assert_int_eq(mpt_dp_init(&dp, m, twice, 2, NULL, NULL), MPT_EINVAL);
  ck_assert(strstr(mpt_last_error(), "cpu:1 is named twice") != NULL);
  ck_assert_ptr_null(dp);
  mpt_device ok[2] = {{MPT_DEVICE_CPU, 0}, {MPT_DEVICE_CPU, 1}};
  ck_assert_int_eq(mpt_dp_init(&dp, m, ok, 0, NULL, NULL), MPT_EINVAL);
  mpt_dp_config cfg = mpt_dp_config_default();
  cfg.output_device = 2;
  ck_assert_int_eq(mpt_dp_init(&dp, m, ok, 2, NULL, &cfg), MPT_EINVAL);
  cfg = mpt_dp_config_default();
  cfg.timeout_ms = 0;
  ck_assert_int_eq(mpt_dp_init(&dp, m, ok, 2, NULL, &cfg), MPT_EINVAL);
  if (!mpt_device_available(MPT_DEVICE_CUDA)) {
    mpt_device cuda[1] = {{MPT_DEVICE_CUDA, 0}};
    ck_assert_int_eq(mpt_dp_init(&dp, m, cuda, 1, NULL, NULL), MPT_EINVAL);
  }
  ck_assert_ptr_null(dp);
  mpt_dp_free(NULL);
  mpt_model_free(m);
}
END_TEST

static int parse(const char *text, mpt_device *d, int max) {
  int n = -1;
  mpt_status st = mpt_dp_parse_devices(text, d, max, &n);
  if (st != MPT_OK) {
    ck_assert_int_eq(st, MPT_EINVAL);
    ck_assert_int_eq(n, 0);
    return -1;
  }
  return n;
}

START_TEST(test_device_lists_parse) {
  mpt_device d[MPT_DP_MAX_DEVICES];
  ck_assert_int_eq(parse("cpu:4", d, 8), 4);
  for (int i = 0; i < 4; i++) ck_assert(d[i].type == MPT_DEVICE_CPU && d[i].index == i);
  ck_assert_int_eq(parse("cpu", d, 8), 1);
  ck_assert(d[0].type == MPT_DEVICE_CPU && d[0].index == 0);
  ck_assert_int_eq(parse("cpu:0", d, 8), 1);
  ck_assert(d[0].index == 0);
  ck_assert_int_eq(parse("cpu:0,cpu:1", d, 8), 2);
  ck_assert(d[0].index == 0 && d[1].index == 1);
  ck_assert_int_eq(parse("cpu:3,1,cpu:5", d, 8), 3);
  ck_assert(d[0].index == 3 && d[1].index == 1 && d[2].index == 5);
  ck_assert(d[1].type == MPT_DEVICE_CPU);
  ck_assert_int_eq(parse("cpu:64", d, MPT_DP_MAX_DEVICES), 64);
}
END_TEST

START_TEST(test_device_lists_reject_duplicates_and_missing_devices) {
  mpt_device d[MPT_DP_MAX_DEVICES];
  const char *bad[] = {"", "cpu:0,cpu:0", "cpu:0,1,0", "cpu:2,cpu:2", "gpu:0", "cpu:",
                       "cpu:x", "cpu:1,", ",cpu:1", "cpu:0,,cpu:1", "3", "cpu:-1", "cpux",
                       "cpu:65", "cpu:0,cpu:64", "cpu:1 "};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    ck_assert_msg(parse(bad[i], d, MPT_DP_MAX_DEVICES) == -1, "'%s' was accepted", bad[i]);
  ck_assert_int_eq(parse("cpu:0,cpu:0", d, 8), -1);
  ck_assert_msg(strstr(mpt_last_error(), "cpu:0 is named twice") != NULL, "%s",
                mpt_last_error());
  ck_assert_int_eq(parse("cpu:3", d, 2), -1); /* more than max */
  ck_assert_int_eq(parse("cpu:0,1,2", d, 2), -1);
  if (!mpt_device_available(MPT_DEVICE_CUDA)) {
    const char *cuda[] = {"cuda", "cuda:0", "cuda:0,1", "cpu:0,cuda:0"};
    for (size_t i = 0; i < sizeof cuda / sizeof cuda[0]; i++) {
      ck_assert_msg(parse(cuda[i], d, 8) == -1, "'%s' was accepted without CUDA", cuda[i]);
      ck_assert_msg(strstr(mpt_last_error(), "does not exist") != NULL, "%s", mpt_last_error());
    }
  } else {
    ck_assert_int_eq(parse("cuda:0,cuda:0", d, 8), -1);
    ck_assert_int_eq(parse("cuda:4096", d, 8), -1);
    ck_assert_int_eq(parse("cpu:0,cuda:0", d, 8), -1);
  }
}
END_TEST

static Suite *dp_suite(void) {
  Suite *s = suite_create("dp");
  TCase *eq = tcase_create("equivalence");
  tcase_set_timeout(eq, 60);
  tcase_add_loop_test(eq, test_dp_matches_one_device_for_every_batch_size, 0, 8);
  tcase_add_test(eq, test_dp_counts_correct_answers_over_the_whole_batch);
  tcase_add_test(eq, test_loss_is_the_mean_over_the_whole_batch);
  tcase_add_test(eq, test_gradients_accumulate_with_the_loss_scale);
  tcase_add_test(eq, test_forward_evaluates_without_gradients);
  suite_add_tcase(s, eq);
  TCase *io = tcase_create("gather_and_buffers");
  tcase_add_test(io, test_outputs_are_gathered_in_order_on_the_output_device);
  tcase_add_test(io, test_gather_can_be_turned_off);
  tcase_add_test(io, test_batchnorm_buffers_come_from_replica_zero);
  suite_add_tcase(s, io);
  TCase *err = tcase_create("errors");
  tcase_add_test(err, test_split_is_even_and_never_empty);
  tcase_add_test(err, test_a_failing_replica_names_its_device);
  tcase_add_test(err, test_step_rejects_bad_inputs);
  tcase_add_loop_test(err, test_replica_without_blas_memory_fails_the_step_at_once, 0, 2);
  tcase_add_test(err, test_init_rejects_bad_lists_and_config);
  tcase_add_test(err, test_device_lists_parse);
  tcase_add_test(err, test_device_lists_reject_duplicates_and_missing_devices);
  suite_add_tcase(s, err);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(dp_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
