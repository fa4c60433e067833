/* Tests of the transformer ops (include/mpitrain/transformer.h; src/nn/gpt_ops.c, attention.c):
 * token + position embedding, LayerNorm, GELU, Linear over the last dimension, the fused
 * cross-entropy over a padded vocabulary, the tied output head, and a 2-block mini GPT made of
 * them with causal multi-head attention (whose own tests are in tests/test_gpt_ops_attention.c;
 * the fixture and the gradient check are in tests/gpt_ops_util.h).
 *
 * Oracles:
 * - Gradients: central finite differences in double of L = sum_i y_i r_i (r fixed, random) or,
 *   for losses and the mini GPT, of the loss itself, against the tape's backward, for every
 *   element of every input (each input is registered as a model parameter, so its gradient
 *   lands in the model's flat gradient buffer). Shapes: B = 2, T = 5, C = 8, H = 2, V = 11,
 *   Vp = 16.
 * - Exact small cases: embedding rows added bit for bit; LayerNorm of a constant row is its
 *   bias and of a +-1 row is x / sqrt(1 + eps); GELU at points computed in double by Python;
 *   uniform logits give log(V) whatever the padding columns hold.
 * - Tied weights: one parameter used by the embedding and the output head gets the sum of the
 *   gradients of two untied copies, and its grad-ready hook fires once, after both uses. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/autograd.h"
#include "mpitrain/transformer.h"
#include "gpt_ops_util.h"

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
   * them and adding. Pass 2 runs in the arena pass 1 grew; then every gradient buffer of its
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

int main(void) { return run_suite(gpt_ops_suite()); }

