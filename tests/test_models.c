/* Tests of the built-in models (src/nn/models.c): parameter layout against PyTorch's
 * (names, shapes, counts computed by hand), config validation, gradients of whole tiny models
 * against central finite differences, determinism of seeded training, that a CNN with
 * BatchNorm learns a tiny batch, and that evaluation mode makes each sample's output
 * independent of the rest of the batch. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/nn.h"
#include "mpitrain/ops.h"
#include "check_util.h"


/* A fixed batch on the host: x [n, ...] uniform in (-1, 1), labels i % classes. */
typedef struct batch {
  mpt_tensor x, labels;
  float *xd;
  int32_t *ld;
} batch;

static batch batch_make(int ndim, const int64_t *shape, int64_t classes, uint64_t seed) {
  batch b;
  mpt_rng rng;
  int64_t count = 1;
  for (int d = 0; d < ndim; d++) count *= shape[d];
  b.xd = malloc((size_t)count * sizeof *b.xd);
  b.ld = malloc((size_t)shape[0] * sizeof *b.ld);
  ck_assert(b.xd && b.ld);
  mpt_rng_seed(&rng, seed);
  mpt_rng_fill_uniform(&rng, b.xd, count, -1.0f, 1.0f);
  for (int64_t i = 0; i < shape[0]; i++) b.ld[i] = (int32_t)(i % classes);
  b.x = mpt_tensor_view(b.xd, mpt_device_cpu(), MPT_F32, ndim, shape);
  b.labels = mpt_tensor_view(b.ld, mpt_device_cpu(), MPT_I32, 1, shape);
  return b;
}

static void batch_free(batch *b) {
  free(b->xd);
  free(b->ld);
}

/* Runs the model on x with grad disabled; returns the output (valid until the next reset). */
static const mpt_tensor *forward_eval(mpt_model *m, mpt_tape *tape, const mpt_tensor *x,
                                      uint64_t seed) {
  mpt_var *xv = NULL, *y = NULL;
  mpt_tape_reset(tape, seed);
  mpt_tape_set_grad_enabled(tape, 0);
  OK(mpt_tape_input(tape, x, &xv));
  OK(mpt_model_forward(m, tape, xv, &y));
  mpt_tape_set_grad_enabled(tape, 1);
  return mpt_var_value(y);
}

static double objective(mpt_model *m, mpt_tape *tape, const mpt_tensor *x, const float *r) {
  const mpt_tensor *y = forward_eval(m, tape, x, 5);
  const float *yv = y->data;
  double sum = 0;
  for (int64_t i = 0; i < y->count; i++) sum += (double)yv[i] * r[i];
  return sum;
}

static void backprop(mpt_model *m, mpt_tape *tape, const mpt_tensor *x, float *r) {
  mpt_var *xv = NULL, *y = NULL, *rv = NULL, *yr = NULL, *loss = NULL;
  OK(mpt_model_zero_grad(m, NULL));
  mpt_tape_reset(tape, 5);
  OK(mpt_tape_input(tape, x, &xv));
  OK(mpt_model_forward(m, tape, xv, &y));
  const mpt_tensor *yt = mpt_var_value(y);
  mpt_tensor rt = mpt_tensor_view(r, mpt_device_cpu(), MPT_F32, yt->ndim, yt->shape);
  OK(mpt_tape_input(tape, &rt, &rv));
  OK(mpt_nn_mul(tape, y, rv, &yr));
  OK(mpt_nn_sum(tape, yr, &loss));
  OK(mpt_tape_backward(tape, loss, 1.0f));
  /* every parameter of the built-in models takes part in the forward */
  for (int p = 0; p < mpt_model_num_params(m); p++)
    ck_assert_msg(mpt_tape_param_uses(tape, p) >= 1, "%s unused",
                  mpt_model_param_info(m, p)->name);
}

static int agree(double numeric, double analytic) {
  return fabs(numeric - analytic) <= 1e-2 * fmax(fabs(numeric), fabs(analytic)) + 1e-3;
}

/* Whether the finite differences of L at parameter element *v with step eps agree with the
 * analytic gradient `a`: the central difference does, or (a kink within eps) the one-sided
 * differences disagree with each other and the one on the smooth side matches. */
static int fd_agrees(mpt_model *m, mpt_tape *tape, const mpt_tensor *x, const float *r,
                     double l0, float *v, float eps, double a, int *central_ok, double *numeric) {
  const float saved = *v;
  *v = saved + eps;
  const double lp = objective(m, tape, x, r);
  *v = saved - eps;
  const double lm = objective(m, tape, x, r);
  *v = saved;
  /* the steps actually taken, after rounding saved +- eps to float */
  const double hp = (double)(float)(saved + eps) - saved;
  const double hm = saved - (double)(float)(saved - eps);
  const double central = (lp - lm) / (hp + hm), fwd = (lp - l0) / hp, bwd = (l0 - lm) / hm;
  *numeric = central;
  *central_ok = agree(central, a);
  return *central_ok || (!agree(fwd, bwd) && (agree(fwd, a) || agree(bwd, a)));
}

/* Central differences of L = sum(y * r) with respect to every element of every parameter,
 * against the backward. Tolerance: see tests/test_layers.c; a wrong backward term changes a
 * gradient by O(1) relative, at every step size.
 * ReLU and max pooling make L piecewise smooth, and a conv1 weight moves hundreds of ReLU
 * inputs at once (with BatchNorm, whole channels), so some points lie within eps = 1e-3 of a
 * kink, where the central difference averages two slopes. There the check retries with the
 * steps 3e-4, 1e-4 and 3e-5 (a kink that close is rarer; the rounding noise of L, ~1e-7, is
 * still ~1e-3 of the difference at the smallest step), and also accepts the one-sided difference
 * on the smooth side when the two one-sided differences disagree. At most a third of the
 * points may need that, so a wrong gradient cannot hide behind kinks. */
static void gradcheck_model(mpt_model *m, const mpt_tensor *x) {
  static const float steps[4] = {1e-3f, 3e-4f, 1e-4f, 3e-5f};
  mpt_tape *tape = NULL;
  OK(mpt_tape_init(&tape, m, NULL));
  const mpt_tensor *y = forward_eval(m, tape, x, 5);
  const int64_t ny = y->count;
  float *r = malloc((size_t)ny * sizeof *r);
  mpt_rng rng;
  mpt_rng_seed(&rng, 1234);
  mpt_rng_fill_uniform(&rng, r, ny, -1.0f, 1.0f);
  backprop(m, tape, x, r);
  const float *grads = mpt_model_grads(m);
  float *params = mpt_model_params(m);
  const double l0 = objective(m, tape, x, r);
  const int64_t count = mpt_model_param_count(m);
  int64_t kinks = 0;
  for (int p = 0; p < mpt_model_num_params(m); p++) {
    const mpt_param_info *info = mpt_model_param_info(m, p);
    for (int64_t j = 0; j < info->count; j++) {
      const double a = grads[info->offset + j];
      double numeric = 0;
      int ok = 0, central_ok = 0, s = 0;
      for (; s < 4; s++) {
        ok = fd_agrees(m, tape, x, r, l0, params + info->offset + j, steps[s], a, &central_ok,
                       &numeric);
        if (ok) break;
      }
      ck_assert_msg(ok, "d/d%s[%lld]: analytic %.6g, numeric %.6g", info->name, (long long)j, a,
                    numeric);
      if (s > 0 || !central_ok) kinks++;
    }
  }
  ck_assert_msg(kinks * 3 <= count, "%lld of %lld points at kinks", (long long)kinks,
                (long long)count);
  free(r);
  mpt_tape_free(tape);
}

/* Plain SGD (param -= lr * grad) with cross-entropy on a fixed batch; loss[i] receives the
 * loss of step i when loss is not NULL. The tape is reset with seed = step (dropout masks). */
static void train_steps(mpt_model *m, const batch *b, int steps, float lr, float *losses) {
  mpt_tape *tape = NULL;
  OK(mpt_tape_init(&tape, m, NULL));
  for (int step = 0; step < steps; step++) {
    mpt_var *xv = NULL, *y = NULL, *loss = NULL;
    OK(mpt_model_zero_grad(m, NULL));
    mpt_tape_reset(tape, (uint64_t)step);
    OK(mpt_tape_input(tape, &b->x, &xv));
    OK(mpt_model_forward(m, tape, xv, &y));
    OK(mpt_nn_cross_entropy(tape, y, &b->labels, &loss));
    OK(mpt_tape_backward(tape, loss, 1.0f));
    if (losses) OK(mpt_var_item(tape, loss, &losses[step]));
    OK(mpt_op_axpy(NULL, mpt_model_param_count(m), -lr, mpt_model_grads(m),
                   mpt_model_params(m)));
  }
  mpt_tape_free(tape);
}

static mpt_cnn_config tiny_cnn(int batchnorm, float dropout) {
  mpt_cnn_config c = mpt_cnn_config_default();
  c.height = c.width = 8;
  c.conv1_channels = 2;
  c.conv2_channels = 3;
  c.kernel = 3;
  c.hidden = 5;
  c.num_classes = 4;
  c.batchnorm = batchnorm;
  c.dropout = dropout;
  return c;
}

static void expect_param(mpt_model *m, int index, const char *name, int ndim, int64_t d0,
                         int64_t d1, int64_t d2, int64_t d3, int64_t offset) {
  const mpt_param_info *info = mpt_model_param_info(m, index);
  const int64_t want[4] = {d0, d1, d2, d3};
  int64_t count = 1;
  ck_assert_ptr_nonnull(info);
  ck_assert_str_eq(info->name, name);
  ck_assert_int_eq(info->ndim, ndim);
  for (int d = 0; d < ndim; d++) {
    ck_assert_int_eq(info->shape[d], want[d]);
    count *= want[d];
  }
  ck_assert_int_eq(info->count, count);
  ck_assert_int_eq(info->offset, offset);
}

/* ------------------------------------------------------------------------------------------ */

START_TEST(test_mlp_default_has_pytorch_parameter_layout) {
  mpt_mlp_config c = mpt_mlp_config_default();
  ck_assert_int_eq(c.input_size, 784);
  ck_assert_int_eq(c.num_hidden, 2);
  ck_assert_int_eq(c.hidden[0], 512);
  ck_assert_int_eq(c.hidden[1], 512);
  ck_assert_int_eq(c.num_classes, 10);
  ck_assert_float_eq(c.dropout, 0.0f);
  mpt_model *m = NULL;
  OK(mpt_model_init_mlp(&m, mpt_device_cpu(), &c, 1));
  ck_assert_int_eq(mpt_model_num_params(m), 6);
  ck_assert_int_eq(mpt_model_num_buffers(m), 0);
  ck_assert_int_eq(mpt_model_param_count(m), 784 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10);
  ck_assert_int_eq(mpt_model_param_count(m), 669706);
  expect_param(m, 0, "fc1.weight", 2, 512, 784, 0, 0, 0);
  expect_param(m, 1, "fc1.bias", 1, 512, 0, 0, 0, 401408);
  expect_param(m, 2, "fc2.weight", 2, 512, 512, 0, 0, 401920);
  expect_param(m, 3, "fc2.bias", 1, 512, 0, 0, 0, 664064);
  expect_param(m, 4, "fc3.weight", 2, 10, 512, 0, 0, 664576);
  expect_param(m, 5, "fc3.bias", 1, 10, 0, 0, 0, 669696);
  /* PyTorch's Linear init: all of fc1 within 1/sqrt(784) */
  const float *p = mpt_model_params(m), bound = 1.0f / sqrtf(784.0f);
  for (int64_t i = 0; i < 401920; i++) ck_assert(fabsf(p[i]) <= bound);
  mpt_model_free(m);
}
END_TEST

START_TEST(test_cnn_default_has_pytorch_parameter_layout) {
  mpt_cnn_config c = mpt_cnn_config_default();
  ck_assert_int_eq(c.in_channels, 1);
  ck_assert_int_eq(c.height, 28);
  ck_assert_int_eq(c.width, 28);
  ck_assert_int_eq(c.conv1_channels, 16);
  ck_assert_int_eq(c.conv2_channels, 32);
  ck_assert_int_eq(c.kernel, 5);
  ck_assert_int_eq(c.hidden, 128);
  ck_assert_int_eq(c.num_classes, 10);
  ck_assert_int_eq(c.batchnorm, 0);
  mpt_model *m = NULL;
  OK(mpt_model_init_cnn(&m, mpt_device_cpu(), &c, 1));
  ck_assert_int_eq(mpt_model_num_params(m), 8);
  ck_assert_int_eq(mpt_model_num_buffers(m), 0);
  /* 28 -> conv 28 -> pool 14 -> conv 14 -> pool 7: fc1 sees 32 * 7 * 7 = 1568 features */
  expect_param(m, 0, "conv1.weight", 4, 16, 1, 5, 5, 0);
  expect_param(m, 1, "conv1.bias", 1, 16, 0, 0, 0, 400);
  expect_param(m, 2, "conv2.weight", 4, 32, 16, 5, 5, 416);
  expect_param(m, 3, "conv2.bias", 1, 32, 0, 0, 0, 13216);
  expect_param(m, 4, "fc1.weight", 2, 128, 1568, 0, 0, 13248);
  expect_param(m, 5, "fc1.bias", 1, 128, 0, 0, 0, 213952);
  expect_param(m, 6, "fc2.weight", 2, 10, 128, 0, 0, 214080);
  expect_param(m, 7, "fc2.bias", 1, 10, 0, 0, 0, 215360);
  ck_assert_int_eq(mpt_model_param_count(m), 215370);
  mpt_model_free(m);

  c.batchnorm = 1;
  OK(mpt_model_init_cnn(&m, mpt_device_cpu(), &c, 1));
  ck_assert_int_eq(mpt_model_num_params(m), 12);
  ck_assert_int_eq(mpt_model_param_count(m), 215370 + 2 * 16 + 2 * 32);
  ck_assert_str_eq(mpt_model_param_info(m, 2)->name, "bn1.weight");
  ck_assert_str_eq(mpt_model_param_info(m, 3)->name, "bn1.bias");
  ck_assert_str_eq(mpt_model_param_info(m, 4)->name, "conv2.weight");
  ck_assert_str_eq(mpt_model_param_info(m, 6)->name, "bn2.weight");
  ck_assert_str_eq(mpt_model_param_info(m, 8)->name, "fc1.weight");
  ck_assert_int_eq(mpt_model_num_buffers(m), 4);
  ck_assert_int_eq(mpt_model_buffer_count(m), 2 * 16 + 2 * 32);
  ck_assert_str_eq(mpt_model_buffer_info(m, 0)->name, "bn1.running_mean");
  ck_assert_str_eq(mpt_model_buffer_info(m, 1)->name, "bn1.running_var");
  ck_assert_str_eq(mpt_model_buffer_info(m, 2)->name, "bn2.running_mean");
  ck_assert_str_eq(mpt_model_buffer_info(m, 3)->name, "bn2.running_var");
  ck_assert_int_eq(mpt_model_buffer_info(m, 3)->shape[0], 32);
  mpt_model_free(m);
}
END_TEST

START_TEST(test_model_configs_are_validated) {
  mpt_model *m = (mpt_model *)&m; /* must be reset to NULL on failure */
  mpt_mlp_config mc = mpt_mlp_config_default();
  mc.hidden[1] = 0;
  ck_assert_int_eq(mpt_model_init_mlp(&m, mpt_device_cpu(), &mc, 1), MPT_EINVAL);
  ck_assert_ptr_null(m);
  ck_assert(strstr(mpt_last_error(), "hidden[1]") != NULL);
  mc = mpt_mlp_config_default();
  mc.num_hidden = MPT_MLP_MAX_HIDDEN + 1;
  ck_assert_int_eq(mpt_model_init_mlp(&m, mpt_device_cpu(), &mc, 1), MPT_EINVAL);
  mc = mpt_mlp_config_default();
  mc.dropout = 1.0f;
  ck_assert_int_eq(mpt_model_init_mlp(&m, mpt_device_cpu(), &mc, 1), MPT_EINVAL);
  mc = mpt_mlp_config_default();
  mc.num_classes = 0;
  ck_assert_int_eq(mpt_model_init_mlp(&m, mpt_device_cpu(), &mc, 1), MPT_EINVAL);

  mpt_cnn_config cc = mpt_cnn_config_default();
  cc.height = 30; /* 30 -> 15: the second pooling does not divide 15 */
  ck_assert_int_eq(mpt_model_init_cnn(&m, mpt_device_cpu(), &cc, 1), MPT_EINVAL);
  ck_assert(strstr(mpt_last_error(), "30x28") != NULL);
  cc = mpt_cnn_config_default();
  cc.conv2_channels = 0;
  ck_assert_int_eq(mpt_model_init_cnn(&m, mpt_device_cpu(), &cc, 1), MPT_EINVAL);
  ck_assert(strstr(mpt_last_error(), "conv2_channels") != NULL);
  cc = mpt_cnn_config_default();
  cc.dropout = -0.5f;
  ck_assert_int_eq(mpt_model_init_cnn(&m, mpt_device_cpu(), &cc, 1), MPT_EINVAL);
  cc = mpt_cnn_config_default();
  cc.batchnorm = 2;
  ck_assert_int_eq(mpt_model_init_cnn(&m, mpt_device_cpu(), &cc, 1), MPT_EINVAL);
  ck_assert_ptr_null(m);
}
END_TEST

START_TEST(test_mlp_flattens_image_inputs) {
  mpt_mlp_config c = mpt_mlp_config_default();
  c.input_size = 12;
  c.num_hidden = 1;
  c.hidden[0] = 6;
  c.num_classes = 3;
  mpt_model *m = NULL;
  mpt_tape *tape = NULL;
  OK(mpt_model_init_mlp(&m, mpt_device_cpu(), &c, 2));
  OK(mpt_tape_init(&tape, m, NULL));
  const int64_t img[4] = {4, 1, 3, 4}, flat[2] = {4, 12}, bad[2] = {4, 11};
  batch b = batch_make(4, img, 3, 3);
  float out_img[12];
  const mpt_tensor *y = forward_eval(m, tape, &b.x, 0);
  ck_assert_int_eq(y->ndim, 2);
  ck_assert_int_eq(y->shape[0], 4);
  ck_assert_int_eq(y->shape[1], 3);
  memcpy(out_img, y->data, sizeof out_img);
  mpt_tensor xf = mpt_tensor_view(b.xd, mpt_device_cpu(), MPT_F32, 2, flat);
  y = forward_eval(m, tape, &xf, 0);
  ck_assert(memcmp(out_img, y->data, sizeof out_img) == 0);
  mpt_tensor xb = mpt_tensor_view(b.xd, mpt_device_cpu(), MPT_F32, 2, bad);
  mpt_var *xv = NULL, *yv = NULL;
  mpt_tape_reset(tape, 0);
  OK(mpt_tape_input(tape, &xb, &xv));
  ck_assert_int_eq(mpt_model_forward(m, tape, xv, &yv), MPT_ESHAPE);
  batch_free(&b);
  mpt_tape_free(tape);
  mpt_model_free(m);
}
END_TEST

START_TEST(test_cnn_rejects_wrong_input_shape) {
  mpt_cnn_config c = tiny_cnn(0, 0.0f);
  mpt_model *m = NULL;
  mpt_tape *tape = NULL;
  OK(mpt_model_init_cnn(&m, mpt_device_cpu(), &c, 2));
  OK(mpt_tape_init(&tape, m, NULL));
  const int64_t shape[4] = {2, 1, 8, 6};
  batch b = batch_make(4, shape, 4, 3);
  mpt_var *xv = NULL, *yv = NULL;
  mpt_tape_reset(tape, 0);
  OK(mpt_tape_input(tape, &b.x, &xv));
  ck_assert_int_eq(mpt_model_forward(m, tape, xv, &yv), MPT_ESHAPE);
  ck_assert(strstr(mpt_last_error(), "[2, 1, 8, 6]") != NULL);
  batch_free(&b);
  mpt_tape_free(tape);
  mpt_model_free(m);
}
END_TEST

START_TEST(test_mlp_gradients_match_finite_differences) {
  const float dropouts[2] = {0.0f, 0.3f};
  for (int i = 0; i < 2; i++) {
    mpt_mlp_config c = mpt_mlp_config_default();
    c.input_size = 6;
    c.hidden[0] = 5;
    c.hidden[1] = 4;
    c.num_classes = 3;
    c.dropout = dropouts[i];
    mpt_model *m = NULL;
    OK(mpt_model_init_mlp(&m, mpt_device_cpu(), &c, 10 + i));
    const int64_t shape[2] = {4, 6};
    batch b = batch_make(2, shape, 3, 20 + i);
    gradcheck_model(m, &b.x);
    batch_free(&b);
    mpt_model_free(m);
  }
}
END_TEST

START_TEST(test_cnn_gradients_match_finite_differences) {
  const int bns[3] = {0, 1, 1};
  const float dropouts[3] = {0.0f, 0.0f, 0.25f};
  for (int i = 0; i < 3; i++) {
    mpt_cnn_config c = tiny_cnn(bns[i], dropouts[i]);
    mpt_model *m = NULL;
    OK(mpt_model_init_cnn(&m, mpt_device_cpu(), &c, 30 + i));
    const int64_t shape[4] = {3, 1, 8, 8};
    batch b = batch_make(4, shape, 4, 40 + i);
    gradcheck_model(m, &b.x);
    batch_free(&b);
    mpt_model_free(m);
  }
}
END_TEST

/* Trains a copy from `seed` for 5 steps; returns its parameters and buffers (malloc'd). */
static float *trained_state(int cnn, uint64_t seed, int64_t *count) {
  mpt_model *m = NULL;
  batch b;
  if (cnn) {
    mpt_cnn_config c = tiny_cnn(1, 0.2f);
    const int64_t shape[4] = {4, 1, 8, 8};
    OK(mpt_model_init_cnn(&m, mpt_device_cpu(), &c, seed));
    b = batch_make(4, shape, 4, 50);
  } else {
    mpt_mlp_config c = mpt_mlp_config_default();
    c.input_size = 20;
    c.num_hidden = 1;
    c.hidden[0] = 16;
    c.num_classes = 5;
    c.dropout = 0.2f;
    const int64_t shape[2] = {8, 20};
    OK(mpt_model_init_mlp(&m, mpt_device_cpu(), &c, seed));
    b = batch_make(2, shape, 5, 51);
  }
  train_steps(m, &b, 5, 0.1f, NULL);
  const int64_t np = mpt_model_param_count(m), nb = mpt_model_buffer_count(m);
  float *state = malloc((size_t)(np + nb) * sizeof *state);
  memcpy(state, mpt_model_params(m), (size_t)np * sizeof *state);
  if (nb) memcpy(state + np, mpt_model_buffers(m), (size_t)nb * sizeof *state);
  *count = np + nb;
  batch_free(&b);
  mpt_model_free(m);
  return state;
}

START_TEST(test_same_seed_gives_bit_identical_training) {
  for (int cnn = 0; cnn < 2; cnn++) {
    int64_t na, nb, nc;
    float *a = trained_state(cnn, 77, &na), *b = trained_state(cnn, 77, &nb);
    float *c = trained_state(cnn, 78, &nc);
    ck_assert_int_eq(na, nb);
    ck_assert_int_eq(na, nc);
    ck_assert_msg(memcmp(a, b, (size_t)na * sizeof *a) == 0, "%s: same seed differs",
                  cnn ? "cnn" : "mlp");
    ck_assert_msg(memcmp(a, c, (size_t)na * sizeof *a) != 0, "%s: different seeds agree",
                  cnn ? "cnn" : "mlp");
    free(a);
    free(b);
    free(c);
  }
}
END_TEST

START_TEST(test_cnn_with_batchnorm_loss_decreases) {
  mpt_cnn_config c = tiny_cnn(1, 0.0f);
  mpt_model *m = NULL;
  OK(mpt_model_init_cnn(&m, mpt_device_cpu(), &c, 60));
  const int64_t shape[4] = {8, 1, 8, 8};
  batch b = batch_make(4, shape, 4, 61);
  float losses[20];
  train_steps(m, &b, 20, 0.2f, losses);
  /* 4 balanced classes: the untrained loss is near ln 4 = 1.386; 20 steps take it to ~0.45 */
  ck_assert_msg(losses[0] > 1.0f && losses[0] < 2.0f, "initial loss %g", losses[0]);
  ck_assert_msg(losses[19] < 0.7f * losses[0] && losses[19] < losses[10] &&
                    losses[10] < losses[0],
                "loss %g -> %g -> %g", losses[0], losses[10], losses[19]);
  /* training moved the running statistics away from 0 / 1 */
  const float *buf = mpt_model_buffers(m);
  ck_assert(buf[0] != 0.0f && buf[c.conv1_channels] != 1.0f);
  batch_free(&b);
  mpt_model_free(m);
}
END_TEST

START_TEST(test_eval_output_does_not_depend_on_other_samples) {
  mpt_cnn_config c = tiny_cnn(1, 0.3f);
  mpt_model *m = NULL;
  mpt_tape *tape = NULL;
  OK(mpt_model_init_cnn(&m, mpt_device_cpu(), &c, 70));
  const int64_t shape[4] = {4, 1, 8, 8};
  batch a = batch_make(4, shape, 4, 71), other = batch_make(4, shape, 4, 72);
  train_steps(m, &a, 3, 0.1f, NULL); /* non-trivial running statistics */
  /* batch b: sample 0 of a, then three different samples */
  memcpy(other.xd, a.xd, 64 * sizeof(float));
  float ya[4], yb[4];
  OK(mpt_tape_init(&tape, m, NULL));
  mpt_model_set_training(m, 0);
  ck_assert_int_eq(mpt_model_training(m), 0);
  memcpy(ya, forward_eval(m, tape, &a.x, 1)->data, sizeof ya);
  memcpy(yb, forward_eval(m, tape, &other.x, 2)->data, sizeof yb);
  for (int k = 0; k < 4; k++) ck_assert_double_eq_tol(ya[k], yb[k], 1e-6 * (1 + fabs(ya[k])));
  /* the oracle can fail: in training mode the batch statistics make sample 0 depend on the
   * others (same dropout seed for both passes) */
  mpt_model_set_training(m, 1);
  memcpy(ya, forward_eval(m, tape, &a.x, 1)->data, sizeof ya);
  memcpy(yb, forward_eval(m, tape, &other.x, 1)->data, sizeof yb);
  double diff = 0;
  for (int k = 0; k < 4; k++) diff = fmax(diff, fabs(ya[k] - yb[k]));
  ck_assert_msg(diff > 1e-3, "training-mode outputs differ by only %g", diff);
  batch_free(&a);
  batch_free(&other);
  mpt_tape_free(tape);
  mpt_model_free(m);
}
END_TEST

static Suite *models_suite(void) {
  Suite *s = suite_create("models");
  TCase *tc = tcase_create("models");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_mlp_default_has_pytorch_parameter_layout);
  tcase_add_test(tc, test_cnn_default_has_pytorch_parameter_layout);
  tcase_add_test(tc, test_model_configs_are_validated);
  tcase_add_test(tc, test_mlp_flattens_image_inputs);
  tcase_add_test(tc, test_cnn_rejects_wrong_input_shape);
  tcase_add_test(tc, test_mlp_gradients_match_finite_differences);
  tcase_add_test(tc, test_cnn_gradients_match_finite_differences);
  tcase_add_test(tc, test_same_seed_gives_bit_identical_training);
  tcase_add_test(tc, test_cnn_with_batchnorm_loss_decreases);
  tcase_add_test(tc, test_eval_output_does_not_depend_on_other_samples);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(models_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
