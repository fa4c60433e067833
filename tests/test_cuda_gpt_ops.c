/* Tests of the CUDA transformer ops (src/core/cuda/kernels_gpt.cu, ops_cuda_gpt.c) beyond the op
 * table (tests/test_backend_ops.c compares each op of include/mpitrain/ops_gpt.h with the CPU):
 * what the embedding does with a bad token, the cross-entropy's gradient at logits of 1e4
 * (its rows must still sum to 0), and the transformer layers of transformer.h end to end: a
 * 2-block mini GPT on a CUDA model against the same model on the CPU (loss and every gradient). Exits 77 (automake's SKIP) with "SKIP: no CUDA device" when no GPU is present.
 * Check runs without forking: a CUDA context does not survive fork(). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/autograd.h"
#include "mpitrain/ops.h"
#include "mpitrain/ops_gpt.h"
#include "mpitrain/transformer.h"
#include "check_util.h"

#define TIMEOUT_MS 60000.0

enum { B = 3, T = 7, C = 40, V = 50, VP = 64 };

static const mpt_device GPU = {MPT_DEVICE_CUDA, 0};
static mpt_stream *S;

static void setup(void) { OK(mpt_stream_init(&S, GPU, MPT_STREAM_INLINE)); }
static void teardown(void) {
  mpt_stream_free(S);
  S = NULL;
}

static float *hrand(int64_t n, uint64_t seed, float lo, float hi) {
  float *x = calloc((size_t)n, sizeof *x);
  ck_assert_ptr_nonnull(x);
  mpt_rng r;
  mpt_rng_seed(&r, seed);
  mpt_rng_fill_uniform(&r, x, n, lo, hi);
  return x;
}
static void *up(const void *h, size_t nbytes) {
  void *d = NULL;
  OK(mpt_device_alloc(GPU, nbytes, &d));
  OK(mpt_op_memcpy(S, GPU, d, mpt_device_cpu(), h, nbytes));
  return d;
}
static float *upf(const float *h, int64_t n) { return up(h, (size_t)n * sizeof *h); }
static void down(void *h, const void *d, size_t nbytes) {
  OK(mpt_op_memcpy(S, mpt_device_cpu(), h, GPU, d, nbytes));
  OK(mpt_stream_synchronize(S, TIMEOUT_MS));
}
static void dfree(void *d) { mpt_device_free(GPU, d); }

/* Downloads n floats from d and requires |got - want| <= atol + rtol |want| (NaN meets NaN). */
static void expect_dev(const char *what, const float *d, const float *want, int64_t n,
                       double rtol, double atol) {
  float *got = malloc((size_t)n * sizeof *got);
  ck_assert_ptr_nonnull(got);
  down(got, d, (size_t)n * sizeof *got);
  for (int64_t i = 0; i < n; i++) {
    if (isnan(want[i]) && isnan(got[i])) continue;
    const double e = fabs((double)got[i] - want[i]);
    if (!(e <= atol + rtol * fabs((double)want[i])))
      ck_abort_msg("%s[%lld]: cuda %.9g, cpu %.9g (bound %.3g + %.3g |cpu|)", what,
                   (long long)i, (double)got[i], (double)want[i], atol, rtol);
  }
  free(got);
}

static int32_t *ids(int64_t n, int64_t limit, uint64_t seed) {
  int32_t *t = malloc((size_t)n * sizeof *t);
  ck_assert_ptr_nonnull(t);
  mpt_rng r;
  mpt_rng_seed(&r, seed);
  for (int64_t i = 0; i < n; i++) t[i] = (int32_t)mpt_rng_below(&r, (uint64_t)limit);
  t[1] = t[0]; /* a repeated id: its rows add up */
  return t;
}

/* The CUDA embedding does not synchronise to check tokens: a token out of range makes its row
 * NaN (the CPU refuses it), the other rows stay as the table compares them. */
START_TEST(test_embedding_bad_token_gives_nan_row) {
  int32_t *tok = ids(B * T, V, 1);
  float *wte = hrand(VP * C, 2, -1, 1), *wpe = hrand(T * C, 3, -1, 1);
  float *y = hrand(B * T * C, 0, 0, 0);
  tok[4] = V;
  ck_assert_int_eq(mpt_op_embedding_gpt(NULL, tok, B, T, C, V, wte, wpe, y), MPT_EINVAL);
  int32_t *d_tok = up(tok, B * T * sizeof *tok);
  float *d_wte = upf(wte, VP * C), *d_wpe = upf(wpe, T * C), *d_y = upf(y, B * T * C);
  OK(mpt_op_embedding_gpt(S, d_tok, B, T, C, V, d_wte, d_wpe, d_y));
  down(y, d_y, B * T * C * sizeof *y);
  ck_assert(isnan(y[4 * C]) && isnan(y[5 * C - 1]) && !isnan(y[5 * C]));
  dfree(d_tok), dfree(d_wte), dfree(d_wpe), dfree(d_y);
  free(tok), free(wte), free(wpe), free(y);
}
END_TEST

/* Logits of magnitude 1e4 (rows on a large offset, s + [-3, 3], and rows over [-s, s]): the GPU
 * recomputes the probabilities from the row maximum and 1 / sum as the CPU does, so dlogits
 * agree within 1e-6 g (g = dloss / n; a few float roundings of a probability <= 1, as in
 * tests/test_gpt_core.c) and each GPU row sums to 0 within 2e-6 g. A logsumexp kept as a float
 * would be off by up to 1e4 2^-24 = 6e-4 in every probability. */
START_TEST(test_xent_vocab_gradient_matches_cpu_at_large_logits) {
  const int64_t n = B * T;
  const float s = 1e4f, dloss = 1.0f, g = dloss / (float)n;
  int32_t *tg = ids(n, V, 25);
  float *logits = hrand(n * VP, 26, -1, 1), *st = hrand(2 * n, 0, 0, 0), loss = 0;
  for (int64_t i = 0; i < n * VP; i++)
    logits[i] = (i / VP) % 2 ? s + 3.0f * logits[i] : s * logits[i];
  float *dl = hrand(n * VP, 0, 0, 0), *got = hrand(n * VP, 0, 0, 0);
  int32_t *d_tg = up(tg, n * sizeof *tg);
  float *d_logits = upf(logits, n * VP), *d_st = upf(st, 2 * n), *d_loss = upf(&loss, 1);
  float *d_dloss = upf(&dloss, 1), *d_dl = upf(dl, n * VP);
  OK(mpt_op_xent_vocab(NULL, logits, tg, n, VP, V, st, &loss));
  OK(mpt_op_xent_vocab(S, d_logits, d_tg, n, VP, V, d_st, d_loss));
  expect_dev("loss", d_loss, &loss, 1, 1e-6, 0);
  OK(mpt_op_xent_vocab_backward(NULL, logits, tg, n, VP, V, st, &dloss, dl));
  OK(mpt_op_xent_vocab_backward(S, d_logits, d_tg, n, VP, V, d_st, d_dloss, d_dl));
  expect_dev("dlogits", d_dl, dl, n * VP, 0, 1e-6 * g);
  down(got, d_dl, (size_t)(n * VP) * sizeof *got);
  for (int64_t r = 0; r < n; r++) {
    double sum = 0;
    for (int64_t j = 0; j < V; j++) sum += got[r * VP + j];
    ck_assert_msg(fabs(sum) <= 2e-6 * g, "row %lld of dlogits sums to %.3g g", (long long)r,
                  sum / g);
  }
  dfree(d_tg), dfree(d_logits), dfree(d_st), dfree(d_loss), dfree(d_dloss), dfree(d_dl);
  free(tg), free(logits), free(st), free(dl), free(got);
}
END_TEST

/* ---- the layers end to end: a 2-block mini GPT, CUDA model against CPU model ---- */

enum { NB = 2, NT = 9, NC = 48, NH = 4, NV = 37, NVP = 64, L = 2, PER = 12 };

typedef struct gpt {
  mpt_model *m;
  mpt_tape *tape;
  mpt_stream *s; /* NULL on the CPU */
  mpt_tensor tok, tgt;
} gpt;

static mpt_var *P(gpt *g, int i) {
  mpt_var *v = NULL;
  OK(mpt_tape_param(g->tape, i, &v));
  return v;
}

static mpt_status gpt_loss(gpt *g, mpt_var **loss) {
  mpt_tape *t = g->tape;
  mpt_var *x = NULL, *h = NULL, *a = NULL;
  MPT_RETURN_IF(mpt_nn_embedding_gpt(t, &g->tok, NV, P(g, 0), P(g, 1), &x));
  for (int l = 0; l < L; l++) {
    const int q = 2 + PER * l;
    MPT_RETURN_IF(mpt_nn_layernorm(t, x, P(g, q), P(g, q + 1), 1e-5f, &h));
    MPT_RETURN_IF(mpt_nn_linear_nd(t, h, P(g, q + 2), P(g, q + 3), &h));
    MPT_RETURN_IF(mpt_nn_causal_attention(t, h, NH, &a));
    MPT_RETURN_IF(mpt_nn_linear_nd(t, a, P(g, q + 4), P(g, q + 5), &a));
    MPT_RETURN_IF(mpt_nn_add(t, x, a, &x));
    MPT_RETURN_IF(mpt_nn_layernorm(t, x, P(g, q + 6), P(g, q + 7), 1e-5f, &h));
    MPT_RETURN_IF(mpt_nn_linear_nd(t, h, P(g, q + 8), P(g, q + 9), &h));
    MPT_RETURN_IF(mpt_nn_gelu(t, h, &h));
    MPT_RETURN_IF(mpt_nn_linear_nd(t, h, P(g, q + 10), P(g, q + 11), &h));
    MPT_RETURN_IF(mpt_nn_add(t, x, h, &x));
  }
  const int z = 2 + PER * L;
  MPT_RETURN_IF(mpt_nn_layernorm(t, x, P(g, z), P(g, z + 1), 1e-5f, &x));
  MPT_RETURN_IF(mpt_nn_linear_nd(t, x, P(g, 0), NULL, &x));
  return mpt_nn_cross_entropy_vocab(t, x, &g->tgt, NV, loss);
}

static void gpt_init(gpt *g, mpt_device dev, const int32_t *tok, const int32_t *tgt) {
  static const int64_t dims[PER][3] = {
      {NC, 0, 1}, {NC, 0, 1}, {3 * NC, NC, NC}, {3 * NC, 0, 1}, {NC, NC, NC}, {NC, 0, 1},
      {NC, 0, 1}, {NC, 0, 1}, {4 * NC, NC, NC}, {4 * NC, 0, 1}, {NC, 4 * NC, 4 * NC}, {NC, 0, 1}};
  memset(g, 0, sizeof *g);
  OK(mpt_model_init(&g->m, dev));
  char name[32];
  int idx;
  const int64_t wte[2] = {NVP, NC}, wpe[2] = {NT, NC};
  OK(mpt_model_add_param(g->m, "wte", 2, wte, MPT_INIT_FAN_IN, 1, &idx));
  OK(mpt_model_add_param(g->m, "wpe", 2, wpe, MPT_INIT_FAN_IN, 1, &idx));
  for (int i = 0; i < PER * L + 2; i++) {
    const int64_t *d = i < PER * L ? dims[i % PER] : dims[0];
    const int64_t shape[2] = {d[0], d[1]};
    snprintf(name, sizeof name, "p%d", i);
    OK(mpt_model_add_param(g->m, name, d[1] ? 2 : 1, shape, MPT_INIT_FAN_IN, d[2], &idx));
  }
  OK(mpt_model_finalize(g->m));
  OK(mpt_model_init_params(g->m, 42)); /* drawn on the host: the same values on both devices */
  if (dev.type == MPT_DEVICE_CUDA) OK(mpt_stream_init(&g->s, dev, MPT_STREAM_INLINE));
  OK(mpt_tape_init(&g->tape, g->m, g->s));
  const int64_t shape[2] = {NB, NT};
  void *dt = (void *)tok, *dg = (void *)tgt;
  if (g->s) {
    OK(mpt_device_alloc(dev, NB * NT * sizeof *tok, &dt));
    OK(mpt_device_alloc(dev, NB * NT * sizeof *tgt, &dg));
    OK(mpt_op_memcpy(g->s, dev, dt, mpt_device_cpu(), tok, NB * NT * sizeof *tok));
    OK(mpt_op_memcpy(g->s, dev, dg, mpt_device_cpu(), tgt, NB * NT * sizeof *tgt));
  }
  g->tok = mpt_tensor_view(dt, dev, MPT_I32, 2, shape);
  g->tgt = mpt_tensor_view(dg, dev, MPT_I32, 2, shape);
}

static float gpt_step(gpt *g) {
  mpt_var *loss = NULL;
  float value = 0;
  OK(mpt_model_zero_grad(g->m, g->s));
  mpt_tape_reset(g->tape, 1);
  OK(gpt_loss(g, &loss));
  OK(mpt_tape_backward(g->tape, loss, 1.0f));
  OK(mpt_var_item(g->tape, loss, &value));
  return value;
}

static void gpt_free(gpt *g) {
  if (g->s) {
    mpt_device_free(g->tok.device, g->tok.data);
    mpt_device_free(g->tgt.device, g->tgt.data);
  }
  mpt_tape_free(g->tape);
  mpt_stream_free(g->s);
  mpt_model_free(g->m);
}

START_TEST(test_mini_gpt_on_cuda_matches_cpu) {
  int32_t *tok = ids(NB * NT, NV, 18), *tgt = ids(NB * NT, NV, 19);
  gpt cpu, gpu;
  gpt_init(&cpu, mpt_device_cpu(), tok, tgt);
  gpt_init(&gpu, GPU, tok, tgt);
  const int64_t count = mpt_model_param_count(cpu.m);
  float *params = malloc((size_t)count * sizeof *params), *grads = NULL;
  ck_assert_ptr_nonnull(params);
  down(params, mpt_model_params(gpu.m), (size_t)count * sizeof *params);
  ck_assert_mem_eq(params, mpt_model_params(cpu.m), (size_t)count * sizeof *params);
  const float lc = gpt_step(&cpu), lg = gpt_step(&gpu);
  ck_assert_msg(fabsf(lc - lg) <= 1e-5f * fabsf(lc), "loss: cpu %.9g, cuda %.9g", lc, lg);
  grads = mpt_model_grads(cpu.m);
  /* gradients: O(1e-3..1e-1); cuBLAS runs plain FP32 (no TF32, ops_cuda.c), so each differs by float
   * rounding through ~20 layers: 1e-4 relative of the largest gradient bounds it */
  double gmax = 0;
  for (int64_t i = 0; i < count; i++) gmax = fmax(gmax, fabs(grads[i]));
  expect_dev("mini gpt grads", mpt_model_grads(gpu.m), grads, count, 1e-3, 1e-4 * gmax);
  gpt_free(&cpu);
  gpt_free(&gpu);
  free(params), free(tok), free(tgt);
}
END_TEST

int main(void) {
  if (mpt_device_count(MPT_DEVICE_CUDA) == 0) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  Suite *suite = suite_create("cuda_gpt_ops");
  TCase *tc = tcase_create("cuda_gpt");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_embedding_bad_token_gives_nan_row);
  tcase_add_test(tc, test_xent_vocab_gradient_matches_cpu_at_large_logits);
  tcase_add_test(tc, test_mini_gpt_on_cuda_matches_cpu);
  suite_add_tcase(suite, tc);
  SRunner *sr = srunner_create(suite);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
