/* Tests of the nn layers with state or geometry: conv2d, maxpool2d, batchnorm, dropout
 * (src/nn/conv.c, pool.c, batchnorm.c, dropout.c).
 *
 * Oracles:
 * - Gradients: central finite differences of L = sum_i y_i * r_i (r fixed, random, so every
 *   output element weighs differently) computed on the host in double, against the tape's
 *   backward. Inputs are registered as model parameters so that their gradients land in the
 *   model's flat gradient buffer next to those of the weights.
 * - Forward: naive loops (conv2d on small integers, so that every sum is exact in float and the
 *   comparison is bit-exact whatever the summation order), closed formulas computed in double
 *   (batchnorm), exact mask properties (dropout). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/nn.h"
#include "mpitrain/ops.h"
#include "check_util.h"


/* ------------------------------------------------------------------------------------------ */
/* Fixture: a model whose parameters are the op's inputs, and a tape                          */

typedef struct fx {
  mpt_model *model;
  mpt_tape *tape;
  int x, w, b;    /* parameter indices (-1: absent) */
  int rm, rv;     /* buffer indices (batchnorm) */
  int64_t stride, pad, kernel;
  float p, momentum, eps;
} fx;

typedef mpt_status (*build_fn)(fx *f, mpt_var **y);

static int add_param(mpt_model *m, const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2,
                     int64_t d3) {
  const int64_t shape[4] = {d0, d1, d2, d3};
  int index = -1;
  /* fan_in 1: U(-1, 1) */
  OK(mpt_model_add_param(m, name, ndim, shape, MPT_INIT_FAN_IN, 1, &index));
  return index;
}

static void fx_begin(fx *f) {
  memset(f, 0, sizeof *f);
  f->x = f->w = f->b = f->rm = f->rv = -1;
  f->momentum = 0.1f;
  f->eps = 1e-5f;
  OK(mpt_model_init(&f->model, mpt_device_cpu()));
}

static void fx_finish(fx *f, uint64_t seed) {
  OK(mpt_model_finalize(f->model));
  OK(mpt_model_init_params(f->model, seed));
  OK(mpt_tape_init(&f->tape, f->model, NULL));
}

static void fx_free(fx *f) {
  mpt_tape_free(f->tape);
  mpt_model_free(f->model);
}

static float *param_data(fx *f, int index) { return mpt_model_param(f->model, index).data; }
static float *grad_data(fx *f, int index) { return mpt_model_grad(f->model, index).data; }

static mpt_var *param_var(fx *f, int index) {
  mpt_var *v = NULL;
  if (index < 0) return NULL;
  OK(mpt_tape_param(f->tape, index, &v));
  return v;
}

/* Runs the op once with grad disabled and returns its output var. */
static const mpt_tensor *run_forward(fx *f, build_fn build) {
  mpt_var *y = NULL;
  mpt_tape_reset(f->tape, 7);
  mpt_tape_set_grad_enabled(f->tape, 0);
  OK(build(f, &y));
  mpt_tape_set_grad_enabled(f->tape, 1);
  return mpt_var_value(y);
}

static double objective(fx *f, build_fn build, const float *r) {
  const mpt_tensor *y = run_forward(f, build);
  const float *yv = y->data;
  double sum = 0;
  for (int64_t i = 0; i < y->count; i++) sum += (double)yv[i] * r[i];
  return sum;
}

/* Zeroes the gradients and backpropagates L = sum(y * r) through the tape. */
static void backprop(fx *f, build_fn build, float *r) {
  mpt_var *y = NULL, *rv = NULL, *yr = NULL, *loss = NULL;
  OK(mpt_model_zero_grad(f->model, NULL));
  mpt_tape_reset(f->tape, 7);
  OK(build(f, &y));
  const mpt_tensor *yt = mpt_var_value(y);
  mpt_tensor rt = mpt_tensor_view(r, mpt_device_cpu(), MPT_F32, yt->ndim, yt->shape);
  OK(mpt_tape_input(f->tape, &rt, &rv));
  OK(mpt_nn_mul(f->tape, y, rv, &yr));
  OK(mpt_nn_sum(f->tape, yr, &loss));
  OK(mpt_tape_backward(f->tape, loss, 1.0f));
}

static float *random_weights(int64_t count, uint64_t seed) {
  mpt_rng rng;
  float *r = malloc((size_t)count * sizeof *r);
  ck_assert_ptr_nonnull(r);
  mpt_rng_seed(&rng, seed);
  mpt_rng_fill_uniform(&rng, r, count, -1.0f, 1.0f);
  return r;
}

/* Tolerance of the gradient checks. The central difference with eps = 1e-3 has a truncation
 * error O(eps^2 * f''') ~ 1e-6 and a rounding error ~ (float rounding of L ~ 1e-7 * |L|) / eps ~
 * 1e-4 here; the gradients are O(0.1..1). A wrong backward term (a dropped mean term in
 * batchnorm, a kernel not flipped, an off-by-one in col2im, a gradient sent to the wrong max)
 * changes the affected entries by O(1) relative, 100x this tolerance, so it cannot pass. */
#define FD_EPS 1e-3f
#define FD_RTOL 1e-2
#define FD_ATOL 1e-3

/* Checks d L / d (every element of parameter `index`) by central differences. */
static void gradcheck_param(fx *f, build_fn build, int index, const char *what) {
  const mpt_tensor *y = run_forward(f, build);
  float *r = random_weights(y->count, 99);
  backprop(f, build, r);
  const int64_t count = mpt_model_param_info(f->model, index)->count;
  float *analytic = malloc((size_t)count * sizeof *analytic);
  ck_assert_ptr_nonnull(analytic);
  memcpy(analytic, grad_data(f, index), (size_t)count * sizeof *analytic);
  float *p = param_data(f, index);
  for (int64_t j = 0; j < count; j++) {
    const float saved = p[j];
    p[j] = saved + FD_EPS;
    const double lp = objective(f, build, r);
    p[j] = saved - FD_EPS;
    const double lm = objective(f, build, r);
    p[j] = saved;
    const double numeric = (lp - lm) / (2.0 * (double)FD_EPS);
    const double err = fabs(numeric - analytic[j]);
    const double tol = FD_RTOL * fmax(fabs(numeric), fabs(analytic[j])) + FD_ATOL;
    ck_assert_msg(err <= tol, "%s: d/d%s[%lld]: analytic %.6g, numeric %.6g (err %.3g > %.3g)",
                  what, mpt_model_param_info(f->model, index)->name, (long long)j,
                  analytic[j], numeric, err, tol);
  }
  free(analytic);
  free(r);
}

static void gradcheck_all(fx *f, build_fn build, const char *what) {
  const int idx[3] = {f->x, f->w, f->b};
  for (int i = 0; i < 3; i++)
    if (idx[i] >= 0) gradcheck_param(f, build, idx[i], what);
}

/* ------------------------------------------------------------------------------------------ */
/* conv2d                                                                                     */

static mpt_status conv_build(fx *f, mpt_var **y) {
  return mpt_nn_conv2d(f->tape, param_var(f, f->x), param_var(f, f->w), param_var(f, f->b),
                       f->stride, f->pad, y);
}

static void conv_setup(fx *f, int64_t n, int64_t c, int64_t h, int64_t w, int64_t o, int64_t kh,
                       int64_t kw, int64_t stride, int64_t pad, int bias, uint64_t seed) {
  fx_begin(f);
  f->x = add_param(f->model, "x", 4, n, c, h, w);
  f->w = add_param(f->model, "w", 4, o, c, kh, kw);
  if (bias) f->b = add_param(f->model, "b", 1, o, 0, 0, 0);
  f->stride = stride;
  f->pad = pad;
  fx_finish(f, seed);
}

/* Loop tests over the two ways conv2d computes: _i = 0 im2col + GEMM, 1 the library (oneDNN).
 * Returns 0 (the iteration has nothing to run) when the build has no library convolution, after
 * checking that asking for it is refused. */
static int use_conv_algo(int i) {
  const mpt_conv_algo algo = i == 0 ? MPT_CONV_ALGO_IM2COL : MPT_CONV_ALGO_LIBRARY;
  OK(mpt_nn_set_conv_algo(algo));
  ck_assert_int_eq(mpt_nn_conv_algo(), algo);
  if (algo == MPT_CONV_ALGO_LIBRARY && !mpt_op_conv2d_available(NULL)) {
    fx f;
    mpt_var *y = NULL;
    conv_setup(&f, 1, 1, 3, 3, 1, 3, 3, 1, 0, 0, 1);
    mpt_tape_reset(f.tape, 1);
    ck_assert_int_eq(mpt_nn_conv2d(f.tape, param_var(&f, f.x), param_var(&f, f.w), NULL, 1, 0,
                                   &y), MPT_ENOTSUP);
    fx_free(&f);
    return 0;
  }
  return 1;
}

START_TEST(test_conv2d_gradients_match_finite_differences) {
  if (!use_conv_algo(_i)) return;
  /* n, c, h, w, o, kh, kw, stride, pad: stride 1/2, pad 0/1, non-square inputs and kernels */
  const int64_t cases[][9] = {{2, 2, 5, 7, 3, 3, 3, 1, 0}, {2, 2, 6, 5, 3, 3, 3, 2, 1},
                              {1, 3, 4, 6, 2, 2, 3, 1, 1}, {2, 1, 7, 6, 2, 3, 2, 2, 0},
                              {2, 2, 6, 5, 2, 5, 5, 1, 2}};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    const int64_t *k = cases[i];
    char what[64];
    fx f;
    snprintf(what, sizeof what, "conv2d case %zu", i);
    conv_setup(&f, k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7], k[8], 1, 100 + i);
    gradcheck_all(&f, conv_build, what);
    fx_free(&f);
  }
}
END_TEST

START_TEST(test_conv2d_forward_matches_naive_loops) {
  if (!use_conv_algo(_i)) return;
  const int64_t cases[][9] = {{2, 3, 5, 7, 4, 3, 3, 1, 0}, {2, 2, 6, 5, 3, 3, 3, 2, 1},
                              {3, 2, 4, 6, 2, 2, 3, 1, 2}};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const int64_t *k = cases[ci];
    const int64_t n = k[0], c = k[1], h = k[2], w = k[3], o = k[4], kh = k[5], kw = k[6];
    const int64_t stride = k[7], pad = k[8];
    fx f;
    conv_setup(&f, n, c, h, w, o, kh, kw, stride, pad, 1, 5);
    /* small integers: every product and sum below is exact in float */
    mpt_rng rng;
    mpt_rng_seed(&rng, 11 + ci);
    float *all = mpt_model_params(f.model);
    for (int64_t i = 0; i < mpt_model_param_count(f.model); i++)
      all[i] = (float)mpt_rng_below(&rng, 7) - 3.0f;
    const float *xv = param_data(&f, f.x), *wv = param_data(&f, f.w), *bv = param_data(&f, f.b);
    const mpt_tensor *y = run_forward(&f, conv_build);
    const int64_t oh = (h + 2 * pad - kh) / stride + 1, ow = (w + 2 * pad - kw) / stride + 1;
    ck_assert_int_eq(y->ndim, 4);
    ck_assert_int_eq(y->shape[0], n);
    ck_assert_int_eq(y->shape[1], o);
    ck_assert_int_eq(y->shape[2], oh);
    ck_assert_int_eq(y->shape[3], ow);
    const float *yv = y->data;
    for (int64_t in = 0; in < n; in++)
      for (int64_t oc = 0; oc < o; oc++)
        for (int64_t oy = 0; oy < oh; oy++)
          for (int64_t ox = 0; ox < ow; ox++) {
            double acc = bv[oc];
            for (int64_t ic = 0; ic < c; ic++)
              for (int64_t i = 0; i < kh; i++)
                for (int64_t j = 0; j < kw; j++) {
                  int64_t yy = oy * stride - pad + i, xx = ox * stride - pad + j;
                  if (yy < 0 || yy >= h || xx < 0 || xx >= w) continue;
                  acc += (double)xv[((in * c + ic) * h + yy) * w + xx] *
                         wv[((oc * c + ic) * kh + i) * kw + j];
                }
            const float got = yv[((in * o + oc) * oh + oy) * ow + ox];
            ck_assert_msg(got == (float)acc, "case %zu y[%lld,%lld,%lld,%lld] = %g, want %g", ci,
                          (long long)in, (long long)oc, (long long)oy, (long long)ox, got, acc);
          }
    fx_free(&f);
  }
}
END_TEST

START_TEST(test_conv2d_rejects_bad_shapes) {
  fx f;
  mpt_var *y = NULL;
  fx_begin(&f);
  f.x = add_param(f.model, "x", 4, 1, 2, 5, 5);
  f.w = add_param(f.model, "w", 4, 3, 4, 3, 3); /* 4 input channels, x has 2 */
  f.b = add_param(f.model, "b", 1, 2, 0, 0, 0); /* 2 biases, weight has 3 outputs */
  fx_finish(&f, 1);
  mpt_tape_reset(f.tape, 0);
  ck_assert_int_eq(mpt_nn_conv2d(f.tape, param_var(&f, f.x), param_var(&f, f.w), NULL, 1, 0, &y),
                   MPT_ESHAPE);
  ck_assert_int_eq(mpt_nn_conv2d(f.tape, param_var(&f, f.w), param_var(&f, f.w),
                                 param_var(&f, f.b), 1, 0, &y),
                   MPT_ESHAPE);
  /* matching channels (w [3, 4, 3, 3] as both input and weight) but stride 0 */
  ck_assert_int_eq(mpt_nn_conv2d(f.tape, param_var(&f, f.w), param_var(&f, f.w), NULL, 0, 0, &y),
                   MPT_EINVAL);
  fx_free(&f);
}
END_TEST

START_TEST(test_conv2d_layer_registers_fan_in_parameters) {
  mpt_model *m = NULL;
  mpt_conv2d layer;
  OK(mpt_model_init(&m, mpt_device_cpu()));
  OK(mpt_conv2d_add(m, "conv", 3, 4, 5, 1, 2, 1, &layer));
  OK(mpt_model_finalize(m));
  OK(mpt_model_init_params(m, 3));
  ck_assert_int_eq(mpt_model_num_params(m), 2);
  const mpt_param_info *wi = mpt_model_param_info(m, layer.weight);
  const mpt_param_info *bi = mpt_model_param_info(m, layer.bias);
  ck_assert_str_eq(wi->name, "conv.weight");
  ck_assert_str_eq(bi->name, "conv.bias");
  ck_assert_int_eq(wi->ndim, 4);
  ck_assert_int_eq(wi->shape[0], 4);
  ck_assert_int_eq(wi->shape[1], 3);
  ck_assert_int_eq(wi->shape[2], 5);
  ck_assert_int_eq(wi->shape[3], 5);
  ck_assert_int_eq(bi->ndim, 1);
  ck_assert_int_eq(bi->shape[0], 4);
  /* bound 1/sqrt(3*5*5) for both, and the draws come near it */
  const float bound = 1.0f / sqrtf(75.0f);
  const float *p = mpt_model_params(m);
  float maxabs = 0;
  for (int64_t i = 0; i < mpt_model_param_count(m); i++) {
    ck_assert(fabsf(p[i]) <= bound);
    maxabs = fmaxf(maxabs, fabsf(p[i]));
  }
  ck_assert(maxabs > 0.9f * bound);
  mpt_model_free(m);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* maxpool2d                                                                                  */

static mpt_status pool_build(fx *f, mpt_var **y) {
  return mpt_nn_maxpool2d(f->tape, param_var(f, f->x), f->kernel, f->stride, y);
}

/* x [n, c, h, w] filled with distinct values 0.05 apart in random order (no ties, and a 1e-3
 * perturbation never changes which element is the maximum). */
static void pool_setup(fx *f, int64_t n, int64_t c, int64_t h, int64_t w, int64_t kernel,
                       int64_t stride, uint64_t seed) {
  fx_begin(f);
  f->x = add_param(f->model, "x", 4, n, c, h, w);
  f->kernel = kernel;
  f->stride = stride;
  fx_finish(f, seed);
  float *x = param_data(f, f->x);
  const int64_t count = n * c * h * w;
  mpt_rng rng;
  mpt_rng_seed(&rng, seed);
  for (int64_t i = 0; i < count; i++) x[i] = 0.05f * (float)i - 2.0f;
  for (int64_t i = count - 1; i > 0; i--) { /* Fisher-Yates */
    int64_t j = (int64_t)mpt_rng_below(&rng, (uint64_t)i + 1);
    float t = x[i];
    x[i] = x[j];
    x[j] = t;
  }
}

START_TEST(test_maxpool2d_forward_matches_naive_loops) {
  const int64_t cases[][6] = {{2, 3, 6, 8, 2, 2}, {1, 2, 7, 5, 3, 2}, {2, 1, 5, 6, 2, 1}};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const int64_t *k = cases[ci];
    const int64_t n = k[0], c = k[1], h = k[2], w = k[3], kernel = k[4], stride = k[5];
    fx f;
    pool_setup(&f, n, c, h, w, kernel, stride, 20 + ci);
    const float *x = param_data(&f, f.x);
    const mpt_tensor *y = run_forward(&f, pool_build);
    const int64_t oh = (h - kernel) / stride + 1, ow = (w - kernel) / stride + 1;
    ck_assert_int_eq(y->shape[2], oh);
    ck_assert_int_eq(y->shape[3], ow);
    const float *yv = y->data;
    for (int64_t pl = 0; pl < n * c; pl++)
      for (int64_t oy = 0; oy < oh; oy++)
        for (int64_t ox = 0; ox < ow; ox++) {
          float best = -INFINITY;
          for (int64_t i = 0; i < kernel; i++)
            for (int64_t j = 0; j < kernel; j++)
              best = fmaxf(best, x[(pl * h + oy * stride + i) * w + ox * stride + j]);
          ck_assert_float_eq(yv[(pl * oh + oy) * ow + ox], best);
        }
    fx_free(&f);
  }
}
END_TEST

START_TEST(test_maxpool2d_gradients_match_finite_differences) {
  const int64_t cases[][6] = {{2, 2, 6, 4, 2, 2}, {1, 2, 7, 5, 3, 2}, {1, 1, 5, 6, 2, 1}};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
    const int64_t *k = cases[ci];
    fx f;
    char what[32];
    snprintf(what, sizeof what, "maxpool case %zu", ci);
    pool_setup(&f, k[0], k[1], k[2], k[3], k[4], k[5], 30 + ci);
    gradcheck_all(&f, pool_build, what);
    fx_free(&f);
  }
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* batchnorm                                                                                  */

static mpt_status bn_build(fx *f, mpt_var **y) {
  return mpt_nn_batchnorm(f->tape, param_var(f, f->x), param_var(f, f->w), param_var(f, f->b),
                          f->rm, f->rv, f->momentum, f->eps, y);
}

/* x [n, c] (h = 0) or [n, c, h, w]; weight and bias random in (-1, 1); buffers 0 / 1. */
static void bn_setup(fx *f, int64_t n, int64_t c, int64_t h, int64_t w, uint64_t seed) {
  fx_begin(f);
  f->x = h ? add_param(f->model, "x", 4, n, c, h, w) : add_param(f->model, "x", 2, n, c, 0, 0);
  f->w = add_param(f->model, "weight", 1, c, 0, 0, 0);
  f->b = add_param(f->model, "bias", 1, c, 0, 0, 0);
  OK(mpt_model_add_buffer(f->model, "running_mean", 1, &c, MPT_INIT_ZEROS, &f->rm));
  OK(mpt_model_add_buffer(f->model, "running_var", 1, &c, MPT_INIT_ONES, &f->rv));
  fx_finish(f, seed);
}

START_TEST(test_batchnorm_training_gradients_match_finite_differences_2d) {
  fx f;
  bn_setup(&f, 6, 3, 0, 0, 40);
  gradcheck_all(&f, bn_build, "batchnorm [6, 3]");
  fx_free(&f);
}
END_TEST

START_TEST(test_batchnorm_training_gradients_match_finite_differences_4d) {
  fx f;
  bn_setup(&f, 2, 3, 3, 2, 41);
  gradcheck_all(&f, bn_build, "batchnorm [2, 3, 3, 2]");
  fx_free(&f);
}
END_TEST

START_TEST(test_batchnorm_eval_gradients_match_finite_differences) {
  fx f;
  bn_setup(&f, 3, 2, 2, 3, 42);
  float *rm = mpt_model_buffer(f.model, f.rm).data, *rv = mpt_model_buffer(f.model, f.rv).data;
  rm[0] = 0.3f, rm[1] = -0.2f, rv[0] = 0.5f, rv[1] = 2.0f;
  mpt_model_set_training(f.model, 0);
  gradcheck_all(&f, bn_build, "batchnorm eval");
  fx_free(&f);
}
END_TEST

START_TEST(test_batchnorm_eval_uses_running_statistics) {
  fx f;
  const int64_t n = 3, c = 2, inner = 4;
  bn_setup(&f, n, c, 2, 2, 43);
  float *rm = mpt_model_buffer(f.model, f.rm).data, *rv = mpt_model_buffer(f.model, f.rv).data;
  rm[0] = 0.25f, rm[1] = -1.5f, rv[0] = 0.5f, rv[1] = 3.0f;
  f.eps = 1e-3f;
  mpt_model_set_training(f.model, 0);
  const float *x = param_data(&f, f.x), *g = param_data(&f, f.w), *b = param_data(&f, f.b);
  const mpt_tensor *y = run_forward(&f, bn_build);
  const float *yv = y->data;
  for (int64_t i = 0; i < n; i++)
    for (int64_t ch = 0; ch < c; ch++)
      for (int64_t k = 0; k < inner; k++) {
        const int64_t at = (i * c + ch) * inner + k;
        const double want =
            g[ch] * (x[at] - (double)rm[ch]) / sqrt((double)rv[ch] + (double)f.eps) + b[ch];
        ck_assert_double_eq_tol(yv[at], want, 1e-6 * (1 + fabs(want)));
      }
  /* eval leaves the running statistics alone */
  ck_assert_float_eq(rm[1], -1.5f);
  ck_assert_float_eq(rv[1], 3.0f);
  fx_free(&f);
}
END_TEST

/* Per-channel batch mean and unbiased variance of x [n, c, inner], in double. */
static void batch_stats(const float *x, int64_t n, int64_t c, int64_t inner, double *mean,
                        double *var_unbiased) {
  for (int64_t ch = 0; ch < c; ch++) {
    double s = 0, ss = 0;
    for (int64_t i = 0; i < n; i++)
      for (int64_t k = 0; k < inner; k++) s += x[(i * c + ch) * inner + k];
    const double m = s / (double)(n * inner);
    for (int64_t i = 0; i < n; i++)
      for (int64_t k = 0; k < inner; k++) {
        double d = x[(i * c + ch) * inner + k] - m;
        ss += d * d;
      }
    mean[ch] = m;
    var_unbiased[ch] = ss / (double)(n * inner - 1);
  }
}

START_TEST(test_batchnorm_running_stats_after_one_step_with_momentum_one) {
  const int64_t shapes[][4] = {{5, 3, 0, 0}, {2, 3, 2, 3}};
  for (int s = 0; s < 2; s++) {
    const int64_t *k = shapes[s];
    const int64_t n = k[0], c = k[1], inner = k[2] ? k[2] * k[3] : 1;
    fx f;
    double mean[3], var[3];
    bn_setup(&f, n, c, k[2], k[3], 50 + s);
    float *x = param_data(&f, f.x);
    for (int64_t i = 0; i < n * c * inner; i++) x[i] = 3.0f * x[i] + 1.0f; /* mean ~1, var ~3 */
    batch_stats(x, n, c, inner, mean, var);
    f.momentum = 1.0f;
    run_forward(&f, bn_build);
    const float *rm = mpt_model_buffer(f.model, f.rm).data;
    const float *rv = mpt_model_buffer(f.model, f.rv).data;
    for (int64_t ch = 0; ch < c; ch++) {
      ck_assert_double_eq_tol(rm[ch], mean[ch], 1e-5 * (1 + fabs(mean[ch])));
      ck_assert_double_eq_tol(rv[ch], var[ch], 1e-5 * (1 + var[ch]));
    }
    /* and with momentum 0.1 from these values: r = 0.9 r + 0.1 batch */
    double old_m[3], old_v[3];
    for (int64_t ch = 0; ch < c; ch++) old_m[ch] = rm[ch], old_v[ch] = rv[ch];
    for (int64_t i = 0; i < n * c * inner; i++) x[i] = 0.5f * x[i] - 2.0f;
    batch_stats(x, n, c, inner, mean, var);
    f.momentum = 0.1f;
    run_forward(&f, bn_build);
    for (int64_t ch = 0; ch < c; ch++) {
      const double wm = 0.9 * old_m[ch] + 0.1 * mean[ch], wv = 0.9 * old_v[ch] + 0.1 * var[ch];
      ck_assert_double_eq_tol(rm[ch], wm, 1e-5 * (1 + fabs(wm)));
      ck_assert_double_eq_tol(rv[ch], wv, 1e-5 * (1 + wv));
    }
    fx_free(&f);
  }
}
END_TEST

START_TEST(test_batchnorm_training_output_is_normalised) {
  fx f;
  const int64_t n = 4, c = 2, inner = 6;
  double mean[2], var[2];
  bn_setup(&f, n, c, 2, 3, 60);
  float *g = param_data(&f, f.w), *b = param_data(&f, f.b);
  g[0] = 1, g[1] = 1, b[0] = 0, b[1] = 0;
  const mpt_tensor *y = run_forward(&f, bn_build);
  batch_stats(y->data, n, c, inner, mean, var);
  const double biased = (double)(n * inner - 1) / (double)(n * inner);
  for (int ch = 0; ch < 2; ch++) {
    ck_assert_double_eq_tol(mean[ch], 0.0, 1e-5);
    ck_assert_double_eq_tol(var[ch] * biased, 1.0, 1e-3); /* eps = 1e-5 shrinks it a little */
  }
  fx_free(&f);
}
END_TEST

START_TEST(test_batchnorm_layer_registers_parameters_and_buffers) {
  mpt_model *m = NULL;
  mpt_batchnorm bn;
  OK(mpt_model_init(&m, mpt_device_cpu()));
  OK(mpt_batchnorm_add(m, "bn1", 4, &bn));
  OK(mpt_model_finalize(m));
  OK(mpt_model_init_params(m, 9));
  ck_assert_int_eq(mpt_model_num_params(m), 2);
  ck_assert_int_eq(mpt_model_num_buffers(m), 2);
  ck_assert_str_eq(mpt_model_param_info(m, bn.weight)->name, "bn1.weight");
  ck_assert_str_eq(mpt_model_param_info(m, bn.bias)->name, "bn1.bias");
  ck_assert_str_eq(mpt_model_buffer_info(m, bn.running_mean)->name, "bn1.running_mean");
  ck_assert_str_eq(mpt_model_buffer_info(m, bn.running_var)->name, "bn1.running_var");
  ck_assert_float_eq(bn.momentum, 0.1f);
  ck_assert_float_eq(bn.eps, 1e-5f);
  ck_assert_int_eq(bn.channels, 4);
  for (int i = 0; i < 4; i++) {
    ck_assert_float_eq(((float *)mpt_model_param(m, bn.weight).data)[i], 1.0f);
    ck_assert_float_eq(((float *)mpt_model_param(m, bn.bias).data)[i], 0.0f);
    ck_assert_float_eq(((float *)mpt_model_buffer(m, bn.running_mean).data)[i], 0.0f);
    ck_assert_float_eq(((float *)mpt_model_buffer(m, bn.running_var).data)[i], 1.0f);
  }
  mpt_model_free(m);
}
END_TEST

START_TEST(test_batchnorm_rejects_bad_buffers_and_shapes) {
  fx f;
  mpt_var *y = NULL;
  bn_setup(&f, 4, 3, 0, 0, 61);
  mpt_tape_reset(f.tape, 0);
  ck_assert_int_eq(mpt_nn_batchnorm(f.tape, param_var(&f, f.x), NULL, NULL, 5, f.rv, 0.1f,
                                    1e-5f, &y),
                   MPT_EINVAL);
  /* weight [3] used as the input: [3] is neither [N, C] nor [N, C, H, W] */
  ck_assert_int_eq(mpt_nn_batchnorm(f.tape, param_var(&f, f.w), NULL, NULL, f.rm, f.rv, 0.1f,
                                    1e-5f, &y),
                   MPT_ESHAPE);
  fx_free(&f);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* dropout                                                                                    */

static mpt_status dropout_build(fx *f, mpt_var **y) {
  return mpt_nn_dropout(f->tape, param_var(f, f->x), f->p, y);
}

START_TEST(test_dropout_backward_is_dy_times_mask) {
  fx f;
  const int64_t count = 10000;
  fx_begin(&f);
  f.x = add_param(f.model, "x", 2, 100, 100, 0, 0);
  fx_finish(&f, 70);
  f.p = 0.3f;
  float *x = param_data(&f, f.x);
  for (int64_t i = 0; i < count; i++) x[i] = 1.0f; /* y = 1 * mask = the mask, exactly */
  const mpt_tensor *y = run_forward(&f, dropout_build);
  float *mask = malloc(count * sizeof *mask);
  memcpy(mask, y->data, count * sizeof *mask);
  int64_t zeros = 0;
  float kept = 0;
  for (int64_t i = 0; i < count && kept == 0; i++) kept = mask[i];
  ck_assert_double_eq_tol(kept, 1.0 / 0.7, 1e-6);
  for (int64_t i = 0; i < count; i++) {
    ck_assert(mask[i] == 0.0f || mask[i] == kept);
    zeros += mask[i] == 0.0f;
  }
  /* Binomial(10000, 0.3): standard deviation 0.0046, the bound is 6.5 of them */
  ck_assert_msg(fabs((double)zeros / count - 0.3) < 0.03, "fraction dropped %g",
                (double)zeros / count);
  /* same seed, same mask: the backward of sum(y * r) gives dx = r * mask exactly */
  float *r = random_weights(count, 71);
  backprop(&f, dropout_build, r);
  const float *dx = grad_data(&f, f.x);
  for (int64_t i = 0; i < count; i++)
    ck_assert_msg(dx[i] == r[i] * mask[i], "dx[%lld] = %g, want %g", (long long)i, dx[i],
                  r[i] * mask[i]);
  /* another pass seed draws another mask */
  mpt_var *y2 = NULL;
  mpt_tape_reset(f.tape, 8);
  OK(dropout_build(&f, &y2));
  ck_assert(memcmp(mpt_var_value(y2)->data, mask, count * sizeof *mask) != 0);
  free(r);
  free(mask);
  fx_free(&f);
}
END_TEST

START_TEST(test_dropout_is_identity_in_eval_or_with_p_zero) {
  fx f;
  mpt_var *x = NULL, *y = NULL;
  fx_begin(&f);
  f.x = add_param(f.model, "x", 2, 4, 5, 0, 0);
  fx_finish(&f, 72);
  mpt_tape_reset(f.tape, 0);
  x = param_var(&f, f.x);
  OK(mpt_nn_dropout(f.tape, x, 0.0f, &y));
  ck_assert(memcmp(mpt_var_value(y)->data, mpt_var_value(x)->data, 20 * sizeof(float)) == 0);
  mpt_model_set_training(f.model, 0);
  OK(mpt_nn_dropout(f.tape, x, 0.5f, &y));
  ck_assert(memcmp(mpt_var_value(y)->data, mpt_var_value(x)->data, 20 * sizeof(float)) == 0);
  /* gradient flows through unchanged */
  f.p = 0.5f;
  float *r = random_weights(20, 73);
  backprop(&f, dropout_build, r);
  ck_assert(memcmp(grad_data(&f, f.x), r, 20 * sizeof(float)) == 0);
  ck_assert_int_eq(mpt_nn_dropout(f.tape, x, 1.0f, &y), MPT_EINVAL);
  ck_assert_int_eq(mpt_nn_dropout(f.tape, x, -0.1f, &y), MPT_EINVAL);
  free(r);
  fx_free(&f);
}
END_TEST

START_TEST(test_dropout_gradients_match_finite_differences) {
  fx f;
  fx_begin(&f);
  f.x = add_param(f.model, "x", 2, 6, 7, 0, 0);
  fx_finish(&f, 74);
  f.p = 0.4f;
  gradcheck_all(&f, dropout_build, "dropout");
  fx_free(&f);
}
END_TEST

static Suite *layers_suite(void) {
  Suite *s = suite_create("layers");
  TCase *tc = tcase_create("layers");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_conv2d_gradients_match_finite_differences, 0, 2);
  tcase_add_loop_test(tc, test_conv2d_forward_matches_naive_loops, 0, 2);
  tcase_add_test(tc, test_conv2d_rejects_bad_shapes);
  tcase_add_test(tc, test_conv2d_layer_registers_fan_in_parameters);
  tcase_add_test(tc, test_maxpool2d_forward_matches_naive_loops);
  tcase_add_test(tc, test_maxpool2d_gradients_match_finite_differences);
  tcase_add_test(tc, test_batchnorm_training_gradients_match_finite_differences_2d);
  tcase_add_test(tc, test_batchnorm_training_gradients_match_finite_differences_4d);
  tcase_add_test(tc, test_batchnorm_eval_gradients_match_finite_differences);
  tcase_add_test(tc, test_batchnorm_eval_uses_running_statistics);
  tcase_add_test(tc, test_batchnorm_running_stats_after_one_step_with_momentum_one);
  tcase_add_test(tc, test_batchnorm_training_output_is_normalised);
  tcase_add_test(tc, test_batchnorm_layer_registers_parameters_and_buffers);
  tcase_add_test(tc, test_batchnorm_rejects_bad_buffers_and_shapes);
  tcase_add_test(tc, test_dropout_backward_is_dy_times_mask);
  tcase_add_test(tc, test_dropout_is_identity_in_eval_or_with_p_zero);
  tcase_add_test(tc, test_dropout_gradients_match_finite_differences);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(layers_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
