/* Shared by the Check programs of the transformer ops (tests/test_gpt_ops.c,
 * tests/test_gpt_ops_attention.c): the shapes (B = 2, T = 5, C = 8, H = 2, V = 11, Vp = 16), a
 * fixture whose model parameters are the op's inputs (so every input's gradient lands in the
 * model's flat gradient buffer), and the finite-difference gradient check of the tape's backward
 * against L = sum(y * r) (r fixed, random) or against the loss the build returns. */
#ifndef MPT_TESTS_GPT_OPS_UTIL_H
#define MPT_TESTS_GPT_OPS_UTIL_H

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/autograd.h"
#include "mpitrain/transformer.h"
#include "check_util.h"

enum { NB = 2, NT = 5, NC = 8, NH = 2, NV = 11, NVP = 16, MAXT = 6 };

/* ------------------------------------------------------------------------------------------ */
/* Fixture: a model whose parameters are the op's inputs, a tape, tokens and targets          */

typedef struct fx {
  mpt_model *model;
  mpt_tape *tape;
  int p[40];      /* parameter indices, in registration order */
  int np;
  int n_head;     /* attention */
  int32_t tokens[NB * NT], targets[NB * NT];
  mpt_tensor tok, tgt;
  float *r;       /* the weights of L = sum(y * r); NULL when the build returns a loss */
  mpt_var *seen[64]; /* gpt_build's intermediate vars of the last pass */
  int nseen;
} fx;

typedef mpt_status (*build_fn)(fx *f, mpt_var **y);

static inline int add_param(fx *f, const char *name, int ndim, int64_t d0, int64_t d1,
                            int64_t d2, int64_t fan_in) {
  const int64_t shape[3] = {d0, d1, d2};
  int index = -1;
  OK(mpt_model_add_param(f->model, name, ndim, shape, MPT_INIT_FAN_IN, fan_in, &index));
  f->p[f->np++] = index;
  return index;
}

static inline void fx_begin(fx *f) {
  memset(f, 0, sizeof *f);
  f->n_head = NH;
  OK(mpt_model_init(&f->model, mpt_device_cpu()));
  const int64_t shape[2] = {NB, NT};
  for (int i = 0; i < NB * NT; i++) {
    f->tokens[i] = (int32_t)((i * 7 + 3) % NV); /* repeats: rows accumulate twice */
    f->targets[i] = (int32_t)((i * 5 + 1) % NV);
  }
  f->tokens[3] = NV - 1; /* the last real row */
  f->targets[4] = NV - 1;
  f->tok = mpt_tensor_view(f->tokens, mpt_device_cpu(), MPT_I32, 2, shape);
  f->tgt = mpt_tensor_view(f->targets, mpt_device_cpu(), MPT_I32, 2, shape);
}

static inline void fx_finish(fx *f, uint64_t seed) {
  OK(mpt_model_finalize(f->model));
  OK(mpt_model_init_params(f->model, seed));
  OK(mpt_tape_init(&f->tape, f->model, NULL));
}

static inline void fx_free(fx *f) {
  mpt_tape_free(f->tape);
  mpt_model_free(f->model);
  free(f->r);
}

static inline float *pdata(fx *f, int index) { return mpt_model_param(f->model, index).data; }
static inline float *gdata(fx *f, int index) { return mpt_model_grad(f->model, index).data; }

static inline mpt_var *pv(fx *f, int index) {
  mpt_var *v = NULL;
  OK(mpt_tape_param(f->tape, index, &v));
  return v;
}

static inline float *random_floats(int64_t count, uint64_t seed, float lo, float hi) {
  mpt_rng rng;
  float *r = malloc((size_t)count * sizeof *r);
  ck_assert_ptr_nonnull(r);
  mpt_rng_seed(&rng, seed);
  mpt_rng_fill_uniform(&rng, r, count, lo, hi);
  return r;
}

/* The objective: L = sum(y * r) in double (forward only), or the loss the build returns. */
static inline double objective(fx *f, build_fn build) {
  mpt_var *y = NULL;
  mpt_tape_reset(f->tape, 7);
  mpt_tape_set_grad_enabled(f->tape, 0);
  OK(build(f, &y));
  mpt_tape_set_grad_enabled(f->tape, 1);
  const mpt_tensor *yt = mpt_var_value(y);
  const float *yv = yt->data;
  if (!f->r) return yv[0];
  double sum = 0;
  for (int64_t i = 0; i < yt->count; i++) sum += (double)yv[i] * f->r[i];
  return sum;
}

/* Zeroes the gradients and backpropagates the objective through the tape. */
static inline void backprop(fx *f, build_fn build) {
  mpt_var *y = NULL, *rv = NULL, *loss = NULL;
  OK(mpt_model_zero_grad(f->model, NULL));
  mpt_tape_reset(f->tape, 7);
  OK(build(f, &y));
  if (f->r) {
    const mpt_tensor *yt = mpt_var_value(y);
    mpt_tensor rt = mpt_tensor_view(f->r, mpt_device_cpu(), MPT_F32, yt->ndim, yt->shape);
    OK(mpt_tape_input(f->tape, &rt, &rv));
    OK(mpt_nn_mul(f->tape, y, rv, &y));
    OK(mpt_nn_sum(f->tape, y, &loss));
  } else {
    loss = y;
  }
  OK(mpt_tape_backward(f->tape, loss, 1.0f));
}

/* Tolerance of the gradient checks. The forward is float32: the rounding error of L is about
 * 1e-7 |L| (|L| ~ 1..10), which a central difference with eps = 1e-2 turns into ~1e-5; the
 * truncation error is O(eps^2 f''') ~ 1e-5. Measured: the largest error is 2e-5 (attention),
 * and every error is under 20 % of the tolerance below. Gradients are
 * O(1e-4..1); a wrong backward term (a dropped mean term in LayerNorm, a wrong tanh' in GELU,
 * the softmax Jacobian, the mask or a missing scale in attention, the padding in the
 * cross-entropy, a "=" for a "+=") changes affected entries by 5..100 % and fails. */
#define FD_EPS 1e-2
#define FD_RTOL 2e-3
#define FD_ATOL 1e-4

/* Checks dL/d(element j of parameter `index`) for j in [0, count) stepping `stride`. */
static inline void gradcheck(fx *f, build_fn build, int index, int64_t stride,
                             const char *what) {
  backprop(f, build);
  const int64_t count = mpt_model_param_info(f->model, index)->count;
  float *analytic = malloc((size_t)count * sizeof *analytic);
  ck_assert_ptr_nonnull(analytic);
  memcpy(analytic, gdata(f, index), (size_t)count * sizeof *analytic);
  float *p = pdata(f, index);
  for (int64_t j = 0; j < count; j += stride) {
    const float saved = p[j];
    p[j] = (float)(saved + FD_EPS);
    const double up = (double)p[j] - saved;
    const double lp = objective(f, build);
    p[j] = (float)(saved - FD_EPS);
    const double down = (double)saved - p[j];
    const double lm = objective(f, build);
    p[j] = saved;
    const double numeric = (lp - lm) / (up + down);
    const double err = fabs(numeric - analytic[j]);
    const double tol = FD_RTOL * fmax(fabs(numeric), fabs(analytic[j])) + FD_ATOL;
    ck_assert_msg(err <= tol, "%s: d/d%s[%lld]: analytic %.6g, numeric %.6g (err %.3g > %.3g)",
                  what, mpt_model_param_info(f->model, index)->name, (long long)j,
                  analytic[j], numeric, err, tol);
  }
  free(analytic);
}

static inline void gradcheck_all(fx *f, build_fn build, const char *what) {
  for (int i = 0; i < f->np; i++) gradcheck(f, build, f->p[i], 1, what);
}

/* Sets f->r to random weights shaped like the build's output. */
static inline void use_weighted_sum(fx *f, build_fn build) {
  mpt_var *y = NULL;
  mpt_tape_reset(f->tape, 7);
  OK(build(f, &y));
  f->r = random_floats(mpt_var_value(y)->count, 99, -1.0f, 1.0f);
}

#endif
