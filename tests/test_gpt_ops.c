/* Tests of the transformer ops (include/mpitrain/transformer.h; src/nn/gpt_ops.c, attention.c):
 * token + position embedding, LayerNorm, GELU, Linear over the last dimension, causal
 * multi-head attention, the fused cross-entropy over a padded vocabulary, the tied output head,
 * and a 2-block mini GPT made of them.
 *
 * Oracles:
 * - Gradients: central finite differences in double of L = sum_i y_i r_i (r fixed, random) or,
 *   for losses and the mini GPT, of the loss itself, against the tape's backward, for every
 *   element of every input (each input is registered as a model parameter, so its gradient
 *   lands in the model's flat gradient buffer). Shapes: B = 2, T = 5, C = 8, H = 2, V = 11,
 *   Vp = 16.
 * - Exact small cases: embedding rows added bit for bit; LayerNorm of a constant row is its
 *   bias and of a +-1 row is x / sqrt(1 + eps); GELU at points computed in double by Python;
 *   attention at T = 1 is the v projection, and with equal keys it is the running mean of v
 *   (the causal mask); uniform logits give log(V) whatever the padding columns hold.
 * - Attention at T = 150 (several blocks of any blocking) against naive loops in double, forward
 *   and backward.
 * - Tied weights: one parameter used by the embedding and the output head gets the sum of the
 *   gradients of two untied copies, and its grad-ready hook fires once, after both uses. */
#include <check.h>
#include <math.h>
#include <stdio.h>
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

static int add_param(fx *f, const char *name, int ndim, int64_t d0, int64_t d1, int64_t d2,
                     int64_t fan_in) {
  const int64_t shape[3] = {d0, d1, d2};
  int index = -1;
  OK(mpt_model_add_param(f->model, name, ndim, shape, MPT_INIT_FAN_IN, fan_in, &index));
  f->p[f->np++] = index;
  return index;
}

static void fx_begin(fx *f) {
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

static void fx_finish(fx *f, uint64_t seed) {
  OK(mpt_model_finalize(f->model));
  OK(mpt_model_init_params(f->model, seed));
  OK(mpt_tape_init(&f->tape, f->model, NULL));
}

static void fx_free(fx *f) {
  mpt_tape_free(f->tape);
  mpt_model_free(f->model);
  free(f->r);
}

static float *pdata(fx *f, int index) { return mpt_model_param(f->model, index).data; }
static float *gdata(fx *f, int index) { return mpt_model_grad(f->model, index).data; }

static mpt_var *pv(fx *f, int index) {
  mpt_var *v = NULL;
  OK(mpt_tape_param(f->tape, index, &v));
  return v;
}

static float *random_floats(int64_t count, uint64_t seed, float lo, float hi) {
  mpt_rng rng;
  float *r = malloc((size_t)count * sizeof *r);
  ck_assert_ptr_nonnull(r);
  mpt_rng_seed(&rng, seed);
  mpt_rng_fill_uniform(&rng, r, count, lo, hi);
  return r;
}

/* The objective: L = sum(y * r) in double (forward only), or the loss the build returns. */
static double objective(fx *f, build_fn build) {
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
static void backprop(fx *f, build_fn build) {
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
static void gradcheck(fx *f, build_fn build, int index, int64_t stride, const char *what) {
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

static void gradcheck_all(fx *f, build_fn build, const char *what) {
  for (int i = 0; i < f->np; i++) gradcheck(f, build, f->p[i], 1, what);
}

/* Sets f->r to random weights shaped like the build's output. */
static void use_weighted_sum(fx *f, build_fn build) {
  mpt_var *y = NULL;
  mpt_tape_reset(f->tape, 7);
  OK(build(f, &y));
  f->r = random_floats(mpt_var_value(y)->count, 99, -1.0f, 1.0f);
}

/* ------------------------------------------------------------------------------------------ */
/* Embedding                                                                                  */

static mpt_status embed_build(fx *f, mpt_var **y) {
  return mpt_nn_embedding_gpt(f->tape, &f->tok, NV, pv(f, f->p[0]), pv(f, f->p[1]), y);
}

static void embed_fx(fx *f) {
  fx_begin(f);
  add_param(f, "wte", 2, NVP, NC, 0, 1);
  add_param(f, "wpe", 2, MAXT, NC, 0, 1);
  fx_finish(f, 11);
}

START_TEST(test_embedding_gradients_match_finite_differences) {
  fx f;
  embed_fx(&f);
  use_weighted_sum(&f, embed_build);
  gradcheck_all(&f, embed_build, "embedding");
  /* padding rows and the unused position are never looked up: exactly zero */
  for (int64_t i = NV * NC; i < NVP * NC; i++) ck_assert_float_eq(gdata(&f, f.p[0])[i], 0.0f);
  for (int64_t i = NT * NC; i < MAXT * NC; i++) ck_assert_float_eq(gdata(&f, f.p[1])[i], 0.0f);
  fx_free(&f);
}
END_TEST

START_TEST(test_embedding_forward_adds_the_rows_exactly) {
  fx f;
  embed_fx(&f);
  mpt_var *y = NULL;
  mpt_tape_reset(f.tape, 0);
  OK(embed_build(&f, &y));
  ck_assert_int_eq(mpt_var_value(y)->ndim, 3);
  ck_assert_int_eq(mpt_var_value(y)->shape[2], NC);
  const float *yv = mpt_var_value(y)->data, *wte = pdata(&f, f.p[0]), *wpe = pdata(&f, f.p[1]);
  for (int b = 0; b < NB; b++)
    for (int t = 0; t < NT; t++)
      for (int c = 0; c < NC; c++)
        ck_assert_float_eq(yv[(b * NT + t) * NC + c],
                           wte[f.tokens[b * NT + t] * NC + c] + wpe[t * NC + c]);
  fx_free(&f);
}
END_TEST

START_TEST(test_embedding_rejects_bad_tokens_and_shapes) {
  fx f;
  embed_fx(&f);
  mpt_var *y = NULL;
  mpt_tape_reset(f.tape, 0);
  f.tokens[6] = NV; /* a padding row: not a token */
  ck_assert_int_eq(embed_build(&f, &y), MPT_EINVAL);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "tokens[6] = 11"));
  f.tokens[6] = -1;
  ck_assert_int_eq(embed_build(&f, &y), MPT_EINVAL);
  f.tokens[6] = 0;
  ck_assert_int_eq(mpt_nn_embedding_gpt(f.tape, &f.tok, NVP + 1, pv(&f, f.p[0]),
                                        pv(&f, f.p[1]), &y), MPT_EINVAL);
  const int64_t long_shape[2] = {1, MAXT + 1}; /* T > maxT */
  int32_t zeros[MAXT + 1] = {0};
  mpt_tensor t = mpt_tensor_view(zeros, mpt_device_cpu(), MPT_I32, 2, long_shape);
  ck_assert_int_eq(mpt_nn_embedding_gpt(f.tape, &t, NV, pv(&f, f.p[0]), pv(&f, f.p[1]), &y),
                   MPT_ESHAPE);
  ck_assert_ptr_null(y);
  fx_free(&f);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* LayerNorm, GELU, Linear                                                                    */

static mpt_status ln_build(fx *f, mpt_var **y) {
  return mpt_nn_layernorm(f->tape, pv(f, f->p[0]), pv(f, f->p[1]), pv(f, f->p[2]), 1e-5f, y);
}

static void ln_fx(fx *f) {
  fx_begin(f);
  add_param(f, "x", 3, NB, NT, NC, 1);
  add_param(f, "weight", 1, NC, 0, 0, 1);
  add_param(f, "bias", 1, NC, 0, 0, 1);
  fx_finish(f, 12);
}

START_TEST(test_layernorm_gradients_match_finite_differences) {
  fx f;
  ln_fx(&f);
  use_weighted_sum(&f, ln_build);
  gradcheck_all(&f, ln_build, "layernorm");
  fx_free(&f);
}
END_TEST

START_TEST(test_layernorm_of_constant_and_alternating_rows) {
  fx f;
  ln_fx(&f);
  float *x = pdata(&f, f.p[0]), *w = pdata(&f, f.p[1]), *b = pdata(&f, f.p[2]);
  for (int c = 0; c < NC; c++) {
    x[c] = 0.75f;                         /* row 0: constant, mean exact, var 0 */
    x[NC + c] = c % 2 ? -1.0f : 1.0f;     /* row 1: mean 0, biased variance 1 */
  }
  mpt_var *y = NULL;
  mpt_tape_reset(f.tape, 0);
  OK(ln_build(&f, &y));
  const float *yv = mpt_var_value(y)->data;
  const double rs = 1.0 / sqrt(1.0 + 1e-5);
  for (int c = 0; c < NC; c++) {
    ck_assert_float_eq(yv[c], b[c]);
    ck_assert_double_eq_tol(yv[NC + c], (c % 2 ? -1.0 : 1.0) * rs * w[c] + b[c], 1e-6);
  }
  fx_free(&f);
}
END_TEST

static mpt_status gelu_build(fx *f, mpt_var **y) { return mpt_nn_gelu(f->tape, pv(f, f->p[0]), y); }

START_TEST(test_gelu_gradients_match_finite_differences) {
  fx f;
  fx_begin(&f);
  add_param(&f, "x", 3, NB, NT, NC, 1);
  fx_finish(&f, 13);
  float *x = pdata(&f, f.p[0]);
  for (int i = 0; i < NB * NT * NC; i++) x[i] *= 3.0f; /* U(-3, 3): the curved part */
  use_weighted_sum(&f, gelu_build);
  gradcheck_all(&f, gelu_build, "gelu");
  fx_free(&f);
}
END_TEST

START_TEST(test_gelu_matches_the_tanh_formula) {
  /* values of 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) computed in double by Python */
  static const double xs[6] = {0.0, 1.0, -1.0, 2.0, -0.5, 3.0};
  static const double want[6] = {0.0, 0.8411919906082768, -0.15880800939172324,
                                 1.954597694087775, -0.15428599017485606, 2.996362607918227};
  fx f;
  fx_begin(&f);
  add_param(&f, "x", 1, 6, 0, 0, 1);
  fx_finish(&f, 14);
  for (int i = 0; i < 6; i++) pdata(&f, f.p[0])[i] = (float)xs[i];
  mpt_var *y = NULL;
  mpt_tape_reset(f.tape, 0);
  OK(gelu_build(&f, &y));
  for (int i = 0; i < 6; i++)
    ck_assert_double_eq_tol(((float *)mpt_var_value(y)->data)[i], want[i], 2e-7 + 1e-6 * fabs(want[i]));
  fx_free(&f);
}
END_TEST

static mpt_status linear_build(fx *f, mpt_var **y) {
  return mpt_nn_linear_nd(f->tape, pv(f, f->p[0]), pv(f, f->p[1]),
                          f->np > 2 ? pv(f, f->p[2]) : NULL, y);
}

START_TEST(test_linear_nd_gradients_match_finite_differences) {
  /* _i = 0: with a bias; 1: without */
  fx f;
  fx_begin(&f);
  add_param(&f, "x", 3, NB, NT, NC, 1);
  add_param(&f, "weight", 2, 3 * NC / 2, NC, 0, 1);
  if (_i == 0) add_param(&f, "bias", 1, 3 * NC / 2, 0, 0, 1);
  fx_finish(&f, 15);
  use_weighted_sum(&f, linear_build);
  gradcheck_all(&f, linear_build, "linear_nd");
  /* the forward equals mpt_nn_linear on the [B*T, C] view, bit for bit */
  mpt_var *y = NULL, *x2 = NULL, *y2 = NULL;
  mpt_tape_reset(f.tape, 0);
  OK(linear_build(&f, &y));
  const int64_t shape2[2] = {NB * NT, NC};
  OK(mpt_tape_view_var(f.tape, pv(&f, f.p[0]), 2, shape2, &x2));
  OK(mpt_nn_linear(f.tape, x2, pv(&f, f.p[1]), f.np > 2 ? pv(&f, f.p[2]) : NULL, &y2));
  ck_assert_int_eq(mpt_var_value(y)->ndim, 3);
  ck_assert_int_eq(mpt_var_value(y)->shape[2], 3 * NC / 2);
  ck_assert_int_eq(mpt_var_value(y)->count, mpt_var_value(y2)->count);
  ck_assert_mem_eq(mpt_var_value(y)->data, mpt_var_value(y2)->data,
                   (size_t)mpt_var_value(y)->count * sizeof(float));
  fx_free(&f);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Attention                                                                                  */

static mpt_status attn_build(fx *f, mpt_var **y) {
  return mpt_nn_causal_attention(f->tape, pv(f, f->p[0]), f->n_head, y);
}

START_TEST(test_attention_gradients_match_finite_differences) {
  /* _i: heads 1, 2, 4 */
  fx f;
  fx_begin(&f);
  f.n_head = 1 << _i;
  add_param(&f, "qkv", 3, NB, NT, 3 * NC, 1);
  fx_finish(&f, 16);
  float *x = pdata(&f, f.p[0]);
  for (int i = 0; i < NB * NT * 3 * NC; i++) x[i] *= 2.0f; /* peaked softmaxes too */
  use_weighted_sum(&f, attn_build);
  gradcheck_all(&f, attn_build, "attention");
  fx_free(&f);
}
END_TEST

START_TEST(test_attention_of_one_position_is_the_v_projection) {
  fx f;
  fx_begin(&f);
  add_param(&f, "qkv", 3, 3, 1, 3 * NC, 1);
  fx_finish(&f, 17);
  mpt_var *y = NULL;
  mpt_tape_reset(f.tape, 0);
  OK(attn_build(&f, &y));
  const float *x = pdata(&f, f.p[0]), *yv = mpt_var_value(y)->data;
  for (int b = 0; b < 3; b++)
    for (int c = 0; c < NC; c++) ck_assert_float_eq(yv[b * NC + c], x[b * 3 * NC + 2 * NC + c]);
  fx_free(&f);
}
END_TEST

START_TEST(test_attention_with_equal_keys_is_the_causal_running_mean_of_v) {
  fx f;
  fx_begin(&f);
  add_param(&f, "qkv", 3, NB, NT, 3 * NC, 1);
  fx_finish(&f, 18);
  float *x = pdata(&f, f.p[0]);
  for (int r = 0; r < NB * NT; r++) /* every position's key equals position 0's of batch 0 */
    for (int c = 0; c < NC; c++) x[r * 3 * NC + NC + c] = x[NC + c];
  mpt_var *y = NULL;
  mpt_tape_reset(f.tape, 0);
  OK(attn_build(&f, &y));
  const float *yv = mpt_var_value(y)->data;
  for (int b = 0; b < NB; b++)
    for (int t = 0; t < NT; t++)
      for (int c = 0; c < NC; c++) {
        double mean = 0;
        for (int t2 = 0; t2 <= t; t2++) mean += x[(b * NT + t2) * 3 * NC + 2 * NC + c];
        mean /= t + 1;
        ck_assert_double_eq_tol(yv[(b * NT + t) * NC + c], mean, 1e-6);
      }
  fx_free(&f);
}
END_TEST

/* Naive loops in double, straight from the definition (transformer.h), for qkv [1, t, 3c] with
 * nh heads: y [t, c] and, for the upstream gradient g [t, c], dqkv [t, 3c]. */
static void attention_naive(const float *qkv, const float *g, int t, int c, int nh, double *y,
                            double *dqkv) {
  const int hs = c / nh, c3 = 3 * c;
  const double scale = 1.0 / sqrt((double)hs);
  double *a = calloc((size_t)t, sizeof *a), *da = calloc((size_t)t, sizeof *da);
  ck_assert(a && da);
  memset(dqkv, 0, sizeof(double) * (size_t)(t * c3));
  for (int h = 0; h < nh; h++)
    for (int i = 0; i < t; i++) {
      const float *q = qkv + i * c3 + h * hs;
      double mx = -INFINITY, sum = 0, dot = 0;
      for (int j = 0; j <= i; j++) {
        a[j] = 0;
        for (int e = 0; e < hs; e++) a[j] += (double)q[e] * qkv[j * c3 + c + h * hs + e];
        a[j] *= scale;
        mx = fmax(mx, a[j]);
      }
      for (int j = 0; j <= i; j++) sum += (a[j] = exp(a[j] - mx));
      for (int j = 0; j <= i; j++) a[j] /= sum;
      for (int e = 0; e < hs; e++) {
        double acc = 0;
        for (int j = 0; j <= i; j++) acc += a[j] * qkv[j * c3 + 2 * c + h * hs + e];
        y[i * c + h * hs + e] = acc;
      }
      for (int j = 0; j <= i; j++) { /* dA, then dv */
        da[j] = 0;
        for (int e = 0; e < hs; e++) {
          da[j] += (double)g[i * c + h * hs + e] * qkv[j * c3 + 2 * c + h * hs + e];
          dqkv[j * c3 + 2 * c + h * hs + e] += a[j] * g[i * c + h * hs + e];
        }
        dot += a[j] * da[j];
      }
      for (int j = 0; j <= i; j++) { /* dS, then dq and dk */
        const double ds = a[j] * (da[j] - dot) * scale;
        for (int e = 0; e < hs; e++) {
          dqkv[i * c3 + h * hs + e] += ds * qkv[j * c3 + c + h * hs + e];
          dqkv[j * c3 + c + h * hs + e] += ds * q[e];
        }
      }
    }
  free(a);
  free(da);
}

START_TEST(test_attention_matches_naive_loops_at_long_sequences) {
  /* T = 150 (several blocks of any row blocking), C = 16, H = 2 */
  enum { LT = 150, LC = 16, LH = 2 };
  fx f;
  fx_begin(&f);
  f.n_head = LH;
  add_param(&f, "qkv", 3, 1, LT, 3 * LC, 1);
  fx_finish(&f, 25);
  float *x = pdata(&f, f.p[0]);
  for (int i = 0; i < LT * 3 * LC; i++) x[i] *= 2.0f;
  use_weighted_sum(&f, attn_build); /* the upstream gradient is r */
  backprop(&f, attn_build);
  mpt_var *y = NULL;
  mpt_tape_reset(f.tape, 0);
  OK(attn_build(&f, &y));
  double *want = malloc(sizeof(double) * LT * LC), *dwant = malloc(sizeof(double) * LT * 3 * LC);
  ck_assert(want && dwant);
  attention_naive(x, f.r, LT, LC, LH, want, dwant);
  const float *yv = mpt_var_value(y)->data, *g = gdata(&f, f.p[0]);
  for (int i = 0; i < LT * LC; i++)
    ck_assert_msg(fabs(yv[i] - want[i]) <= 1e-5 * (1 + fabs(want[i])), "y[%d] = %.7g, want %.7g",
                  i, yv[i], want[i]);
  for (int i = 0; i < LT * 3 * LC; i++)
    ck_assert_msg(fabs(g[i] - dwant[i]) <= 1e-5 * (1 + fabs(dwant[i])),
                  "dqkv[%d] = %.7g, want %.7g", i, g[i], dwant[i]);
  free(want);
  free(dwant);
  fx_free(&f);
}
END_TEST

START_TEST(test_attention_rejects_bad_shapes) {
  fx f;
  fx_begin(&f);
  add_param(&f, "qkv", 3, NB, NT, 3 * NC, 1);
  add_param(&f, "x2", 2, NT, 3 * NC, 0, 1);
  fx_finish(&f, 19);
  mpt_var *y = NULL;
  mpt_tape_reset(f.tape, 0);
  ck_assert_int_eq(mpt_nn_causal_attention(f.tape, pv(&f, f.p[0]), 3, &y), MPT_ESHAPE);
  ck_assert_int_eq(mpt_nn_causal_attention(f.tape, pv(&f, f.p[0]), 0, &y), MPT_EINVAL);
  ck_assert_int_eq(mpt_nn_causal_attention(f.tape, pv(&f, f.p[1]), 1, &y), MPT_ESHAPE);
  ck_assert_ptr_null(y);
  fx_free(&f);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Cross-entropy over a padded vocabulary                                                     */

static mpt_status xent_build(fx *f, mpt_var **y) {
  return mpt_nn_cross_entropy_vocab(f->tape, pv(f, f->p[0]), &f->tgt, NV, y);
}

START_TEST(test_cross_entropy_vocab_gradients_match_finite_differences) {
  fx f;
  fx_begin(&f);
  add_param(&f, "logits", 3, NB, NT, NVP, 1);
  fx_finish(&f, 20);
  float *x = pdata(&f, f.p[0]);
  for (int i = 0; i < NB * NT * NVP; i++) x[i] *= 3.0f;
  gradcheck_all(&f, xent_build, "cross_entropy_vocab");
  const float *g = gdata(&f, f.p[0]);
  for (int r = 0; r < NB * NT; r++)
    for (int j = NV; j < NVP; j++) ck_assert_float_eq(g[r * NVP + j], 0.0f);
  /* the loss against a double reference */
  double want = 0;
  for (int r = 0; r < NB * NT; r++) {
    double s = 0;
    for (int j = 0; j < NV; j++) s += exp((double)x[r * NVP + j]);
    want += log(s) - x[r * NVP + f.targets[r]];
  }
  want /= NB * NT;
  ck_assert_double_eq_tol(objective(&f, xent_build), want, 1e-6 * fabs(want));
  fx_free(&f);
}
END_TEST

START_TEST(test_cross_entropy_vocab_of_uniform_logits_is_log_v) {
  fx f;
  fx_begin(&f);
  add_param(&f, "logits", 3, NB, NT, NVP, 1);
  fx_finish(&f, 21);
  float *x = pdata(&f, f.p[0]);
  for (int r = 0; r < NB * NT; r++)
    for (int j = 0; j < NVP; j++) x[r * NVP + j] = j < NV ? 0.25f : 1000.0f; /* padding: huge */
  ck_assert_double_eq_tol(objective(&f, xent_build), log((double)NV), 1e-6);
  backprop(&f, xent_build); /* dlogits = (1/V - [target]) / N, 0 on the padding */
  const float *g = gdata(&f, f.p[0]);
  for (int r = 0; r < NB * NT; r++)
    for (int j = 0; j < NVP; j++) {
      const double want = j >= NV ? 0.0 : (1.0 / NV - (j == f.targets[r])) / (NB * NT);
      ck_assert_double_eq_tol(g[r * NVP + j], want, 1e-7);
    }
  fx_free(&f);
}
END_TEST

START_TEST(test_cross_entropy_vocab_rejects_padding_targets_and_shapes) {
  fx f;
  fx_begin(&f);
  add_param(&f, "logits", 3, NB, NT, NVP, 1);
  fx_finish(&f, 22);
  mpt_var *y = NULL;
  mpt_tape_reset(f.tape, 0);
  f.targets[7] = NV;
  ck_assert_int_eq(xent_build(&f, &y), MPT_EINVAL);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "targets[7] = 11"));
  f.targets[7] = 0;
  ck_assert_int_eq(mpt_nn_cross_entropy_vocab(f.tape, pv(&f, f.p[0]), &f.tgt, NVP + 1, &y),
                   MPT_EINVAL);
  const int64_t wrong[2] = {NT, NB};
  mpt_tensor t = mpt_tensor_view(f.targets, mpt_device_cpu(), MPT_I32, 2, wrong);
  ck_assert_int_eq(mpt_nn_cross_entropy_vocab(f.tape, pv(&f, f.p[0]), &t, NV, &y), MPT_ESHAPE);
  ck_assert_ptr_null(y);
  fx_free(&f);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* The tied output head, and a 2-block mini GPT                                               */

/* Parameters of the tied model: wte, wpe, lnf.weight, lnf.bias; the untied one adds a second
 * token matrix for the head (head_wte >= 0). */
typedef struct tied {
  fx f;
  int wte, wpe, lnw, lnb, head_wte;
  int ready_calls[8];
  float ready_snapshot[NVP * NC]; /* wte's gradient when its grad-ready hook fired */
} tied;

static mpt_status tied_build(fx *f, mpt_var **loss) {
  tied *m = (tied *)f; /* f is the first member */
  mpt_var *x = NULL, *logits = NULL;
  mpt_var *wte = pv(f, m->wte), *head = m->head_wte >= 0 ? pv(f, m->head_wte) : wte;
  MPT_RETURN_IF(mpt_nn_embedding_gpt(f->tape, &f->tok, NV, wte, pv(f, m->wpe), &x));
  MPT_RETURN_IF(mpt_nn_layernorm(f->tape, x, pv(f, m->lnw), pv(f, m->lnb), 1e-5f, &x));
  MPT_RETURN_IF(mpt_nn_linear_nd(f->tape, x, head, NULL, &logits));
  return mpt_nn_cross_entropy_vocab(f->tape, logits, &f->tgt, NV, loss);
}

static void tied_ready(void *user, int index) {
  tied *m = user;
  m->ready_calls[index]++;
  if (index == m->wte) memcpy(m->ready_snapshot, gdata(&m->f, index), sizeof m->ready_snapshot);
}

static void tied_init(tied *m, int untied) {
  fx_begin(&m->f);
  m->wte = add_param(&m->f, "wte", 2, NVP, NC, 0, 1);
  m->wpe = add_param(&m->f, "wpe", 2, MAXT, NC, 0, 1);
  m->lnw = add_param(&m->f, "lnf.weight", 1, NC, 0, 0, 1);
  m->lnb = add_param(&m->f, "lnf.bias", 1, NC, 0, 0, 1);
  m->head_wte = untied ? add_param(&m->f, "head", 2, NVP, NC, 0, 1) : -1;
  fx_finish(&m->f, 23);
  if (untied) memcpy(pdata(&m->f, m->head_wte), pdata(&m->f, m->wte), sizeof(float) * NVP * NC);
  mpt_tape_set_grad_hook(m->f.tape, tied_ready, m);
}

START_TEST(test_tied_head_gets_both_gradients_and_one_ready_hook) {
  static tied a, b; /* a: tied; b: the same model with a copy of wte as the head */
  tied_init(&a, 0);
  tied_init(&b, 1);
  memcpy(mpt_model_params(b.f.model), mpt_model_params(a.f.model),
         sizeof(float) * (size_t)mpt_model_param_count(a.f.model));
  memcpy(pdata(&b.f, b.head_wte), pdata(&b.f, b.wte), sizeof(float) * NVP * NC);
  backprop(&a.f, tied_build);
  backprop(&b.f, tied_build);
  ck_assert_int_eq(mpt_tape_param_uses(a.f.tape, a.wte), 2);
  for (int i = 0; i < 4; i++) ck_assert_int_eq(a.ready_calls[i], 1);
  /* the hook saw the final gradient: both uses had been added when it fired */
  ck_assert_mem_eq(a.ready_snapshot, gdata(&a.f, a.wte), sizeof a.ready_snapshot);
  const float *g = gdata(&a.f, a.wte), *ge = gdata(&b.f, b.wte), *gh = gdata(&b.f, b.head_wte);
  double emb_norm = 0, head_norm = 0;
  for (int i = 0; i < NVP * NC; i++) {
    ck_assert_double_eq_tol(g[i], (double)ge[i] + gh[i], 1e-6 + 1e-5 * fabs(g[i]));
    emb_norm += fabs(ge[i]);
    head_norm += fabs(gh[i]);
  }
  ck_assert(emb_norm > 1e-3 && head_norm > 1e-3); /* both uses contribute */
  /* and the sum is the derivative of the tied loss */
  gradcheck(&a.f, tied_build, a.wte, 1, "tied wte");
  fx_free(&a.f);
  fx_free(&b.f);
}
END_TEST

enum { LAYERS = 2, PER_LAYER = 12 };

/* Parameters: wte, wpe, then per layer ln1.w, ln1.b, qkv.w [3C, C], qkv.b, proj.w [C, C],
 * proj.b, ln2.w, ln2.b, fc.w [4C, C], fc.b, fcproj.w [C, 4C], fcproj.b; then lnf.w, lnf.b. */
#define SEEN(v) (f->nseen < 64 ? (void)(f->seen[f->nseen++] = (v)) : (void)0)

static mpt_status gpt_build(fx *f, mpt_var **loss) {
  mpt_var *x = NULL, *h = NULL, *a = NULL;
  const int *p = f->p;
  mpt_tape *t = f->tape;
  f->nseen = 0;
  MPT_RETURN_IF(mpt_nn_embedding_gpt(t, &f->tok, NV, pv(f, p[0]), pv(f, p[1]), &x));
  SEEN(x);
  for (int l = 0; l < LAYERS; l++) {
    const int *q = p + 2 + PER_LAYER * l;
    MPT_RETURN_IF(mpt_nn_layernorm(t, x, pv(f, q[0]), pv(f, q[1]), 1e-5f, &h));
    SEEN(h);
    MPT_RETURN_IF(mpt_nn_linear_nd(t, h, pv(f, q[2]), pv(f, q[3]), &h));
    SEEN(h);
    MPT_RETURN_IF(mpt_nn_causal_attention(t, h, NH, &a));
    SEEN(a);
    MPT_RETURN_IF(mpt_nn_linear_nd(t, a, pv(f, q[4]), pv(f, q[5]), &a));
    SEEN(a);
    MPT_RETURN_IF(mpt_nn_add(t, x, a, &x));
    SEEN(x);
    MPT_RETURN_IF(mpt_nn_layernorm(t, x, pv(f, q[6]), pv(f, q[7]), 1e-5f, &h));
    SEEN(h);
    MPT_RETURN_IF(mpt_nn_linear_nd(t, h, pv(f, q[8]), pv(f, q[9]), &h));
    SEEN(h);
    MPT_RETURN_IF(mpt_nn_gelu(t, h, &h));
    SEEN(h);
    MPT_RETURN_IF(mpt_nn_linear_nd(t, h, pv(f, q[10]), pv(f, q[11]), &h));
    SEEN(h);
    MPT_RETURN_IF(mpt_nn_add(t, x, h, &x));
    SEEN(x);
  }
  const int *z = p + 2 + PER_LAYER * LAYERS;
  MPT_RETURN_IF(mpt_nn_layernorm(t, x, pv(f, z[0]), pv(f, z[1]), 1e-5f, &x));
  SEEN(x);
  MPT_RETURN_IF(mpt_nn_linear_nd(t, x, pv(f, p[0]), NULL, &x)); /* tied head */
  SEEN(x);
  return mpt_nn_cross_entropy_vocab(t, x, &f->tgt, NV, loss);
}

static void count_ready(void *user, int index) { ((int *)user)[index]++; }

/* The mini GPT's parameters (gpt_build), from `seed`. */
static void mini_gpt_params(fx *f, uint64_t seed) {
  add_param(f, "wte", 2, NVP, NC, 0, 1);
  add_param(f, "wpe", 2, MAXT, NC, 0, 1);
  static const char *names[PER_LAYER] = {"ln1.w", "ln1.b", "qkv.w", "qkv.b", "proj.w",
                                          "proj.b", "ln2.w", "ln2.b", "fc.w", "fc.b",
                                          "fcproj.w", "fcproj.b"};
  /* rows, columns (0: a vector), fan_in of each parameter of a block */
  static const int64_t dims[PER_LAYER][3] = {
      {NC, 0, 1},      {NC, 0, 1}, {3 * NC, NC, NC}, {3 * NC, 0, 1}, {NC, NC, NC}, {NC, 0, 1},
      {NC, 0, 1},      {NC, 0, 1}, {4 * NC, NC, NC}, {4 * NC, 0, 1}, {NC, 4 * NC, 4 * NC},
      {NC, 0, 1}};
  for (int l = 0; l < LAYERS; l++)
    for (int i = 0; i < PER_LAYER; i++) {
      char name[64];
      snprintf(name, sizeof name, "h%d.%s", l, names[i]);
      add_param(f, name, dims[i][1] ? 2 : 1, dims[i][0], dims[i][1], 0, dims[i][2]);
    }
  add_param(f, "lnf.w", 1, NC, 0, 0, 1);
  add_param(f, "lnf.b", 1, NC, 0, 0, 1);
  fx_finish(f, seed);
  /* layer 0: qkv weights 4x larger, so that its attention is far from uniform */
  for (int i = 0; i < 3 * NC * NC; i++) pdata(f, f->p[2 + 2])[i] *= 4.0f;
}

START_TEST(test_mini_gpt_gradients_match_finite_differences) {
  fx f;
  fx_begin(&f);
  mini_gpt_params(&f, 24);
  /* one backward: every parameter's grad-ready hook fires exactly once (wte used twice) */
  static int ready[64];
  memset(ready, 0, sizeof ready);
  mpt_tape_set_grad_hook(f.tape, count_ready, ready);
  backprop(&f, gpt_build);
  mpt_tape_set_grad_hook(f.tape, NULL, NULL);
  ck_assert_int_eq(mpt_tape_param_uses(f.tape, f.p[0]), 2);
  for (int i = 0; i < f.np; i++) ck_assert_int_eq(ready[f.p[i]], 1);
  /* every parameter, a few elements each (a stride that is prime to the row length) */
  for (int i = 0; i < f.np; i++) gradcheck(&f, gpt_build, f.p[i], 5, "mini gpt");
  fx_free(&f);
}
END_TEST

START_TEST(test_grad_beta_is_0_for_new_storage_then_1) {
  fx f;
  fx_begin(&f);
  add_param(&f, "x", 3, NB, NT, NC, 1);
  add_param(&f, "w", 2, NC, NC, 0, NC);
  fx_finish(&f, 31);
  mpt_tape_reset(f.tape, 7);
  mpt_var *x = pv(&f, f.p[0]), *y = NULL, *v = NULL;
  OK(mpt_nn_linear_nd(f.tape, x, pv(&f, f.p[1]), NULL, &y));
  const int64_t flat[1] = {NB * NT * NC};
  OK(mpt_tape_view_var(f.tape, y, 1, flat, &v));
  float *g = NULL, *g2 = NULL, beta = -1.0f;
  OK(mpt_var_grad_beta(f.tape, v, &g, &beta)); /* a view: its base's new storage */
  ck_assert(g != NULL && beta == 0.0f);
  OK(mpt_var_grad_beta(f.tape, y, &g2, &beta));
  ck_assert(g2 == g && beta == 1.0f);
  OK(mpt_var_grad_acc(f.tape, y, &g2));
  ck_assert(g2 == g);
  OK(mpt_var_grad_beta(f.tape, x, &g2, &beta)); /* a parameter: the flat gradient, kept */
  ck_assert(g2 == gdata(&f, f.p[0]) && beta == 1.0f);
  fx_free(&f);
}
END_TEST

START_TEST(test_mini_gpt_gradients_do_not_read_stale_arena_memory) {
  /* Backward writes (beta 0) the gradients it is first to produce instead of zero-filling
   * them and adding. Pass 2 runs in the consolidated arena; then every gradient buffer of its
   * intermediate vars is filled with NaN; pass 3 reuses the same memory: its gradients must
   * be pass 2's bit for bit (a product that skipped an element, or added to a buffer it
   * should have written, would read the NaN). */
  fx f;
  fx_begin(&f);
  mini_gpt_params(&f, 25);
  const int64_t count = mpt_model_param_count(f.model);
  float *want = malloc((size_t)count * sizeof *want);
  ck_assert_ptr_nonnull(want);
  for (int pass = 1; pass <= 3; pass++) {
    backprop(&f, gpt_build);
    const float *grad = mpt_model_grad(f.model, f.p[0]).data; /* the flat buffer's start */
    if (pass == 2) {
      memcpy(want, grad, (size_t)count * sizeof *want);
      int poisoned = 0;
      for (int i = 0; i < f.nseen; i++) {
        const mpt_tensor *gt = mpt_var_grad(f.seen[i]);
        if (!gt->data) continue;
        for (int64_t j = 0; j < gt->count; j++) ((float *)gt->data)[j] = NAN;
        poisoned++;
      }
      ck_assert_int_ge(poisoned, 10);
    } else if (pass == 3) {
      for (int64_t j = 0; j < count; j++)
        ck_assert_msg(memcmp(&grad[j], &want[j], sizeof(float)) == 0,
                      "gradient %lld: %.9g after the poisoned pass, %.9g before", (long long)j,
                      grad[j], want[j]);
    }
  }
  free(want);
  fx_free(&f);
}
END_TEST

static Suite *gpt_ops_suite(void) {
  Suite *s = suite_create("gpt_ops");
  TCase *tc = tcase_create("gpt_ops");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_embedding_gradients_match_finite_differences);
  tcase_add_test(tc, test_embedding_forward_adds_the_rows_exactly);
  tcase_add_test(tc, test_embedding_rejects_bad_tokens_and_shapes);
  tcase_add_test(tc, test_layernorm_gradients_match_finite_differences);
  tcase_add_test(tc, test_layernorm_of_constant_and_alternating_rows);
  tcase_add_test(tc, test_gelu_gradients_match_finite_differences);
  tcase_add_test(tc, test_gelu_matches_the_tanh_formula);
  tcase_add_loop_test(tc, test_linear_nd_gradients_match_finite_differences, 0, 2);
  tcase_add_loop_test(tc, test_attention_gradients_match_finite_differences, 0, 3);
  tcase_add_test(tc, test_attention_of_one_position_is_the_v_projection);
  tcase_add_test(tc, test_attention_with_equal_keys_is_the_causal_running_mean_of_v);
  tcase_add_test(tc, test_attention_matches_naive_loops_at_long_sequences);
  tcase_add_test(tc, test_attention_rejects_bad_shapes);
  tcase_add_test(tc, test_cross_entropy_vocab_gradients_match_finite_differences);
  tcase_add_test(tc, test_cross_entropy_vocab_of_uniform_logits_is_log_v);
  tcase_add_test(tc, test_cross_entropy_vocab_rejects_padding_targets_and_shapes);
  tcase_add_test(tc, test_tied_head_gets_both_gradients_and_one_ready_hook);
  tcase_add_test(tc, test_mini_gpt_gradients_match_finite_differences);
  tcase_add_test(tc, test_grad_beta_is_0_for_new_storage_then_1);
  tcase_add_test(tc, test_mini_gpt_gradients_do_not_read_stale_arena_memory);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(gpt_ops_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
