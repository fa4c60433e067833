/* Tests of the Llama model and its ops (include/mpitrain/llama.h; src/nn/llama.c,
 * src/nn/llama_ops.c). The PyTorch oracle of the whole model is tests/test_llama_torch.sh.
 *
 * Oracles:
 * - Config: each invalid field (n_heads not a multiple of n_kv_heads, more key/value heads than
 *   heads, dim not a multiple of n_heads, an odd head size, theta <= 1, a negative eps, a zero
 *   size, tied not 0/1) is MPT_EINVAL with a message naming it; the presets' parameter counts
 *   worked out by hand (llama-tiny 131,392; llama-mini 9,638,784).
 * - Layout: Hugging Face's names and shapes in the documented order, contiguous in the flat
 *   buffer; a tied model has no lm_head; the ZeRO-3 units are the embedding, each layer, then
 *   the final norm with the head.
 * - Initialisation: norm weights exactly 1; every other tensor's sample mean and standard
 *   deviation against N(0, 0.02) within 5 standard errors; one seed gives the same bits.
 * - RoPE (mpt_nn_rope): with a head size of 2, position t rotates (1, 0) to (cos t, sin t)
 *   (within 1e-6: float cos and sin of the double angle), and the gradient of sum(y * r) is r
 *   rotated by -t.
 * - Grouped-query attention, closed forms (rope_theta 0): with all keys 0 every score is 0, so
 *   the attention is uniform over the positions up to t (1 and 1/2, 1/2: exact in float), and
 *   each query head's output is the mean of ITS key/value head's values (head h reads head
 *   h / (H / KV)): exact; the gradient of sum(y) with respect to v sums the H / KV query heads
 *   that share it (3 and 1 per element here: exact), and with respect to q is exactly 0 (the
 *   keys are 0). With one key at score ln 3 the weights are 1/4 and 3/4 (within 1e-5: the float
 *   rounding of sqrt(2) ln 3 and of exp).
 * - Grouped-query attention against multi-head attention on keys and values repeated by hand:
 *   the same output bits, and key/value gradients equal to the sums over the copies (1e-6
 *   relative: the copies' rotations back are summed after, not before, rounding).
 * - RoPE inside the attention (rope_theta > 0) against mpt_nn_rope on q and k then the
 *   attention with rope_theta 0: the same bits, forward and every gradient.
 * - linear_swiglu with its weights adjacent in memory (one product) and apart (two): the same
 *   results within 1e-6 relative, and silu(x Wg^T) (x Wu^T) as computed in double (1e-5).
 * - mpt_nn_llama_attention (projections, RoPE and attention in one node; one product when the
 *   weights are adjacent) against linear_nd three times then mpt_nn_gqa_attention: 1e-6
 *   relative, forward and every gradient, with the weights adjacent and apart, unscaled and
 *   with llama3 RoPE scaling.
 * - llama3-scaled RoPE inside the attention against q and k rotated beforehand by
 *   mpt_op_rope_freqs: the same bits, forward and (rotated back) every gradient.
 * - The model: --recompute (each layer a checkpoint) gives the loss and every gradient bit for
 *   bit; a sequence longer than max_seq_len is MPT_ESHAPE, a token outside the vocabulary
 *   MPT_EINVAL naming it, a CUDA device MPT_ENOTSUP. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_util.h"
#include "mpitrain/autograd.h"
#include "mpitrain/llama.h"
#include "mpitrain/transformer.h"

static mpt_llama_config tiny(void) {
  mpt_llama_config c;
  ck_assert_int_eq(mpt_llama_config_preset("llama-tiny", &c), MPT_OK);
  return c;
}

/* ---- config ---- */

START_TEST(test_config_check) {
  static const struct {
    const char *field;
    int value;
    const char *want; /* in the message */
  } cases[] = {
      {"n_kv_heads", 3, "not a multiple of n_kv_heads = 3"},
      {"n_kv_heads", 8, "not a multiple of n_kv_heads = 8"},
      {"n_heads", 6, "dim = 64 is not a multiple of n_heads = 6"},
      {"n_heads", 0, "n_heads = 0 must be >= 1"},
      {"dim", 60, "dim / n_heads = 60 / 4 = 15 is odd"},
      {"vocab_size", 0, "vocab_size = 0"},
      {"ffn_dim", -1, "ffn_dim = -1"},
      {"max_seq_len", 0, "max_seq_len = 0"},
      {"n_layers", 0, "n_layers = 0"},
      {"tied_embeddings", 2, "tied_embeddings = 2"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    mpt_llama_config c = tiny();
    if (strcmp(cases[i].field, "n_kv_heads") == 0) c.n_kv_heads = cases[i].value;
    if (strcmp(cases[i].field, "n_heads") == 0) c.n_heads = cases[i].value;
    if (strcmp(cases[i].field, "dim") == 0) c.dim = cases[i].value;
    if (strcmp(cases[i].field, "vocab_size") == 0) c.vocab_size = cases[i].value;
    if (strcmp(cases[i].field, "ffn_dim") == 0) c.ffn_dim = cases[i].value;
    if (strcmp(cases[i].field, "max_seq_len") == 0) c.max_seq_len = cases[i].value;
    if (strcmp(cases[i].field, "n_layers") == 0) c.n_layers = cases[i].value;
    if (strcmp(cases[i].field, "tied_embeddings") == 0) c.tied_embeddings = cases[i].value;
    ck_assert_int_eq(mpt_llama_config_check(&c), MPT_EINVAL);
    ck_assert_msg(strstr(mpt_last_error(), cases[i].want), "%s = %d: message '%s'",
                  cases[i].field, cases[i].value, mpt_last_error());
    mpt_model *m = NULL;
    ck_assert_int_eq(mpt_model_init_llama(&m, mpt_device_cpu(), &c, 1), MPT_EINVAL);
    ck_assert_ptr_null(m);
    ck_assert_int_eq(mpt_llama_param_count(&c), 0);
  }
  mpt_llama_config c = tiny();
  c.rope_theta = 1.0f;
  ck_assert_int_eq(mpt_llama_config_check(&c), MPT_EINVAL);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "rope_theta = 1 must be finite and > 1"));
  c = tiny();
  c.norm_eps = -1e-6f;
  ck_assert_int_eq(mpt_llama_config_check(&c), MPT_EINVAL);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "norm_eps"));
  c = tiny();
  c.n_kv_heads = 4; /* multi-head: allowed */
  OK(mpt_llama_config_check(&c));
  c.n_kv_heads = 1; /* multi-query: allowed */
  OK(mpt_llama_config_check(&c));
  ck_assert_int_eq(mpt_llama_config_check(NULL), MPT_EINVAL);
}
END_TEST

START_TEST(test_presets) {
  mpt_llama_config c;
  OK(mpt_llama_config_preset("llama-tiny", &c));
  /* 256 x 64 embedding and head, 64 final norm; per layer 2 x 64 norms, q and o 64 x 64,
   * k and v 32 x 64, gate, up and down 192 x 64 */
  const int64_t tiny_layer = 2 * 64 + 2 * 64 * 64 + 2 * 32 * 64 + 3 * 192 * 64;
  ck_assert_int_eq(mpt_llama_param_count(&c), 2 * 256 * 64 + 64 + 2 * tiny_layer);
  ck_assert_int_eq(mpt_llama_param_count(&c), 131392);
  ck_assert_int_eq(mpt_llama_num_tensors(&c), 21);
  OK(mpt_llama_config_preset("llama-mini", &c));
  const int64_t mini_layer = 2 * 384 + 2 * 384 * 384 + 2 * 128 * 384 + 3 * 1024 * 384;
  ck_assert_int_eq(mpt_llama_param_count(&c), 2 * 256 * 384 + 384 + 6 * mini_layer);
  ck_assert_int_eq(mpt_llama_param_count(&c), 9638784);
  ck_assert_int_eq(c.n_heads / c.n_kv_heads, 3);
  ck_assert_int_eq(mpt_llama_config_preset("llama-huge", &c), MPT_EINVAL);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "llama-tiny or llama-mini"));
}
END_TEST

/* ---- layout and initialisation ---- */

START_TEST(test_layout_names_units) {
  for (int tied = 0; tied < 2; tied++) {
    mpt_llama_config c = tiny();
    c.tied_embeddings = tied;
    mpt_model *m = NULL;
    OK(mpt_model_init_llama(&m, mpt_device_cpu(), &c, 5));
    ck_assert_int_eq(mpt_model_num_params(m), tied ? 20 : 21);
    ck_assert_int_eq(mpt_model_param_count(m), mpt_llama_param_count(&c));
    static const char *const want[] = {
        "model.embed_tokens.weight 256 64",
        "model.layers.0.input_layernorm.weight 64",
        "model.layers.0.self_attn.q_proj.weight 64 64",
        "model.layers.0.self_attn.k_proj.weight 32 64",
        "model.layers.0.self_attn.v_proj.weight 32 64",
        "model.layers.0.self_attn.o_proj.weight 64 64",
        "model.layers.0.post_attention_layernorm.weight 64",
        "model.layers.0.mlp.gate_proj.weight 192 64",
        "model.layers.0.mlp.up_proj.weight 192 64",
        "model.layers.0.mlp.down_proj.weight 64 192",
        "model.layers.1.input_layernorm.weight 64",
        "model.layers.1.self_attn.q_proj.weight 64 64",
        "model.layers.1.self_attn.k_proj.weight 32 64",
        "model.layers.1.self_attn.v_proj.weight 32 64",
        "model.layers.1.self_attn.o_proj.weight 64 64",
        "model.layers.1.post_attention_layernorm.weight 64",
        "model.layers.1.mlp.gate_proj.weight 192 64",
        "model.layers.1.mlp.up_proj.weight 192 64",
        "model.layers.1.mlp.down_proj.weight 64 192",
        "model.norm.weight 64",
        "lm_head.weight 256 64"};
    int64_t offset = 0;
    for (int i = 0; i < mpt_model_num_params(m); i++) {
      const mpt_param_info *pi = mpt_model_param_info(m, i);
      char got[128];
      int w = snprintf(got, sizeof got, "%s", pi->name);
      for (int d = 0; d < pi->ndim; d++)
        w += snprintf(got + w, sizeof got - (size_t)w, " %lld", (long long)pi->shape[d]);
      ck_assert_str_eq(got, want[i]);
      ck_assert_int_eq(pi->offset, offset);
      offset += pi->count;
    }
    const int *first = NULL;
    ck_assert_int_eq(mpt_model_units(m, &first), 4);
    ck_assert_int_eq(first[0], 0);
    ck_assert_int_eq(first[1], 1);
    ck_assert_int_eq(first[2], 10);
    ck_assert_int_eq(first[3], 19);
    OK(mpt_llama_check_model(m, &c));
    mpt_llama_config other = c;
    other.n_kv_heads = 4;
    ck_assert_int_eq(mpt_llama_check_model(m, &other), MPT_ESHAPE);
    ck_assert_ptr_nonnull(strstr(mpt_last_error(), "k_proj"));
    mpt_model_free(m);
  }
}
END_TEST

START_TEST(test_init) {
  mpt_llama_config c = tiny();
  mpt_model *a = NULL, *b = NULL, *d = NULL;
  OK(mpt_model_init_llama(&a, mpt_device_cpu(), &c, 11));
  OK(mpt_model_init_llama(&b, mpt_device_cpu(), &c, 11));
  OK(mpt_model_init_llama(&d, mpt_device_cpu(), &c, 12));
  const int64_t n = mpt_model_param_count(a);
  ck_assert(memcmp(mpt_model_params(a), mpt_model_params(b), (size_t)n * sizeof(float)) == 0);
  ck_assert(memcmp(mpt_model_params(a), mpt_model_params(d), (size_t)n * sizeof(float)) != 0);
  for (int i = 0; i < mpt_model_num_params(a); i++) {
    const mpt_param_info *pi = mpt_model_param_info(a, i);
    const float *w = mpt_model_params(a) + pi->offset;
    if (pi->ndim == 1) {
      for (int64_t j = 0; j < pi->count; j++) ck_assert_float_eq(w[j], 1.0f);
      continue;
    }
    double s = 0, s2 = 0;
    for (int64_t j = 0; j < pi->count; j++) {
      s += w[j];
      s2 += (double)w[j] * w[j];
    }
    const double k = (double)pi->count, mean = s / k, sd = sqrt(s2 / k - mean * mean);
    /* standard errors: of the mean 0.02 / sqrt(k), of the sd 0.02 / sqrt(2 k) */
    ck_assert_msg(fabs(mean) < 5 * 0.02 / sqrt(k), "%s: mean %g", pi->name, mean);
    ck_assert_msg(fabs(sd - 0.02) < 5 * 0.02 / sqrt(2 * k), "%s: sd %g", pi->name, sd);
  }
  mpt_model_free(a);
  mpt_model_free(b);
  mpt_model_free(d);
}
END_TEST

/* ---- ops, on parameters of a fixture model ---- */

typedef struct fixture {
  mpt_model *model;
  mpt_tape *tape;
} fixture;

/* A model whose parameters are the given tensors (ndims[i] of shapes[i]; NULL ndims: 3 each),
 * filled from `values`. */
static void fixture_make_nd(fixture *f, int n, const int *ndims, const int64_t (*shapes)[3],
                            float *const *values) {
  OK(mpt_model_init(&f->model, mpt_device_cpu()));
  for (int i = 0; i < n; i++) {
    char name[16];
    int index = -1;
    snprintf(name, sizeof name, "p%d", i);
    OK(mpt_model_add_param(f->model, name, ndims ? ndims[i] : 3, shapes[i], MPT_INIT_ZEROS, 1,
                           &index));
  }
  OK(mpt_model_finalize(f->model));
  for (int i = 0; i < n; i++) {
    const mpt_param_info *pi = mpt_model_param_info(f->model, i);
    memcpy(mpt_model_params(f->model) + pi->offset, values[i], (size_t)pi->count * sizeof(float));
  }
  OK(mpt_tape_init(&f->tape, f->model, NULL));
  mpt_tape_reset(f->tape, 1);
  OK(mpt_model_zero_grad(f->model, NULL));
}

static void fixture_make(fixture *f, int n, const int64_t (*shapes)[3], float *const *values) {
  fixture_make_nd(f, n, NULL, shapes, values);
}

static void fixture_free(fixture *f) {
  mpt_tape_free(f->tape);
  mpt_model_free(f->model);
}

static const float *grad_of(fixture *f, int i) {
  return mpt_model_grads(f->model) + mpt_model_param_info(f->model, i)->offset;
}

/* loss = sum(y * r) (r: a constant input of y's shape), backward. */
static void backward_weighted(fixture *f, mpt_var *y, const float *r) {
  const mpt_tensor *yt = mpt_var_value(y);
  mpt_tensor rt = mpt_tensor_view((void *)r, mpt_device_cpu(), MPT_F32, yt->ndim, yt->shape);
  mpt_var *rv = NULL, *prod = NULL, *loss = NULL;
  OK(mpt_tape_input(f->tape, &rt, &rv));
  OK(mpt_nn_mul(f->tape, y, rv, &prod));
  OK(mpt_nn_sum(f->tape, prod, &loss));
  OK(mpt_tape_backward(f->tape, loss, 1.0f));
}

START_TEST(test_rope_closed_form) {
  enum { T = 3 };
  const int64_t shape[1][3] = {{1, T, 2}};
  float x[T * 2] = {1, 0, 1, 0, 1, 0}, r[T * 2] = {1, 0, 1, 0, 0, 1};
  float *vals[1] = {x};
  fixture f;
  fixture_make(&f, 1, shape, vals);
  mpt_var *p = NULL, *y = NULL;
  OK(mpt_tape_param(f.tape, 0, &p));
  OK(mpt_nn_rope(f.tape, p, 1, 10000.0f, &y));
  const float *yv = mpt_var_value(y)->data;
  for (int t = 0; t < T; t++) {
    ck_assert_float_eq_tol(yv[2 * t], cos((double)t), 1e-6);
    ck_assert_float_eq_tol(yv[2 * t + 1], sin((double)t), 1e-6);
  }
  backward_weighted(&f, y, r);
  const float *g = grad_of(&f, 0);
  /* d/dx of sum(R(t) x . r) = R(-t) r */
  for (int t = 0; t < T; t++) {
    const double c = cos((double)t), s = sin((double)t), r1 = r[2 * t], r2 = r[2 * t + 1];
    ck_assert_float_eq_tol(g[2 * t], c * r1 + s * r2, 1e-6);
    ck_assert_float_eq_tol(g[2 * t + 1], c * r2 - s * r1, 1e-6);
  }
  mpt_var *bad = NULL;
  ck_assert_int_eq(mpt_nn_rope(f.tape, p, 1, 1.0f, &bad), MPT_EINVAL);
  ck_assert_int_eq(mpt_nn_rope(f.tape, p, 2, 10000.0f, &bad), MPT_ESHAPE); /* head size 1 */
  fixture_free(&f);
}
END_TEST

START_TEST(test_gqa_uniform_closed_form) {
  /* B 1, T 2, H 4, KV 2, hd 2; keys 0; kv head 0's values (1, 2) then (3, 4), head 1's (10, 20)
   * then (30, 40) */
  enum { T = 2, H = 4, KV = 2, HD = 2 };
  const int64_t shapes[3][3] = {{1, T, H * HD}, {1, T, KV * HD}, {1, T, KV * HD}};
  float q[T * H * HD], k[T * KV * HD] = {0}, v[T * KV * HD] = {1, 2, 10, 20, 3, 4, 30, 40};
  for (int i = 0; i < T * H * HD; i++) q[i] = 0.25f * (float)(i % 7) - 0.5f;
  float *vals[3] = {q, k, v};
  fixture f;
  fixture_make(&f, 3, shapes, vals);
  mpt_var *p[3], *y = NULL;
  for (int i = 0; i < 3; i++) OK(mpt_tape_param(f.tape, i, &p[i]));
  OK(mpt_nn_gqa_attention(f.tape, p[0], p[1], p[2], H, KV, 0.0f, &y));
  const float *yv = mpt_var_value(y)->data;
  const float want[T][H][HD] = {{{1, 2}, {1, 2}, {10, 20}, {10, 20}},
                                {{2, 3}, {2, 3}, {20, 30}, {20, 30}}};
  for (int t = 0; t < T; t++)
    for (int h = 0; h < H; h++)
      for (int i = 0; i < HD; i++)
        ck_assert_msg(yv[(t * H + h) * HD + i] == want[t][h][i], "y[%d, head %d, %d] = %g", t,
                      h, i, (double)yv[(t * H + h) * HD + i]);
  float r[T * H * HD];
  for (int i = 0; i < T * H * HD; i++) r[i] = 1.0f;
  backward_weighted(&f, y, r);
  const float *dq = grad_of(&f, 0), *dv = grad_of(&f, 2);
  /* dv[t2] = sum over the 2 query heads sharing it of sum_t att[t, t2]: (1 + 1/2) x 2 = 3 at
   * t2 = 0, 1/2 x 2 = 1 at t2 = 1 */
  for (int t2 = 0; t2 < T; t2++)
    for (int i = 0; i < KV * HD; i++) ck_assert_float_eq(dv[t2 * KV * HD + i], t2 ? 1.0f : 3.0f);
  for (int i = 0; i < T * H * HD; i++) ck_assert_float_eq(dq[i], 0.0f);
  mpt_var *bad = NULL;
  ck_assert_int_eq(mpt_nn_gqa_attention(f.tape, p[0], p[1], p[2], H, 3, 0.0f, &bad),
                   MPT_EINVAL);
  ck_assert_int_eq(mpt_nn_gqa_attention(f.tape, p[0], p[1], p[2], H, 1, 0.0f, &bad),
                   MPT_ESHAPE); /* k has 2 heads' channels, not 1 */
  fixture_free(&f);
}
END_TEST

START_TEST(test_gqa_weights_closed_form) {
  /* B 1, T 2, H 2, KV 1, hd 2: k(0) = 0, k(1) = (sqrt(2) ln 3, 0); at t = 1, head 0's
   * q = (1, 0) scores ln 3 against t2 = 1 and 0 against t2 = 0 (weights 1/4, 3/4), head 1's
   * q = (0, 1) scores 0 against both (1/2, 1/2); v(0) = (4, 8), v(1) = (8, 16) */
  enum { T = 2, H = 2, KV = 1, HD = 2 };
  const int64_t shapes[3][3] = {{1, T, H * HD}, {1, T, KV * HD}, {1, T, KV * HD}};
  float q[T * H * HD] = {0, 0, 0, 0, 1, 0, 0, 1};
  float k[T * KV * HD] = {0, 0, (float)(sqrt(2.0) * log(3.0)), 0};
  float v[T * KV * HD] = {4, 8, 8, 16};
  float *vals[3] = {q, k, v};
  fixture f;
  fixture_make(&f, 3, shapes, vals);
  mpt_var *p[3], *y = NULL;
  for (int i = 0; i < 3; i++) OK(mpt_tape_param(f.tape, i, &p[i]));
  OK(mpt_nn_gqa_attention(f.tape, p[0], p[1], p[2], H, KV, 0.0f, &y));
  const float *yv = mpt_var_value(y)->data;
  const double want[H * HD] = {0.25 * 4 + 0.75 * 8, 0.25 * 8 + 0.75 * 16, 6, 12};
  for (int i = 0; i < H * HD; i++) ck_assert_float_eq_tol(yv[H * HD + i], want[i], 1e-5);
  for (int h = 0; h < H; h++) { /* t = 0 sees itself only */
    ck_assert_float_eq(yv[h * HD], 4.0f);
    ck_assert_float_eq(yv[h * HD + 1], 8.0f);
  }
  fixture_free(&f);
}
END_TEST

static void fill(float *x, int n, uint32_t seed) {
  for (int i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = (float)(seed >> 8) * (2.0f / 16777216.0f) - 1.0f;
  }
}

START_TEST(test_gqa_equals_repeated_mha) {
  /* B 2, T 5, H 6, KV 2 (3 query heads per key/value head), hd 4, RoPE theta 10000 */
  enum { B = 2, T = 5, H = 6, KV = 2, HD = 4, REP = H / KV };
  enum { NQ = B * T * H * HD, NK = B * T * KV * HD };
  static float q[NQ], k[NK], v[NK], kr[NQ], vr[NQ], r[NQ];
  fill(q, NQ, 1);
  fill(k, NK, 2);
  fill(v, NK, 3);
  fill(r, NQ, 4);
  for (int row = 0; row < B * T; row++) /* head h of kr, vr: head h / REP of k, v */
    for (int h = 0; h < H; h++)
      for (int i = 0; i < HD; i++) {
        kr[(row * H + h) * HD + i] = k[(row * KV + h / REP) * HD + i];
        vr[(row * H + h) * HD + i] = v[(row * KV + h / REP) * HD + i];
      }
  const int64_t sq[3] = {B, T, H * HD}, sk[3] = {B, T, KV * HD};
  const int64_t gshapes[3][3] = {{sq[0], sq[1], sq[2]}, {sk[0], sk[1], sk[2]},
                                 {sk[0], sk[1], sk[2]}};
  const int64_t mshapes[3][3] = {{sq[0], sq[1], sq[2]}, {sq[0], sq[1], sq[2]},
                                 {sq[0], sq[1], sq[2]}};
  float *gvals[3] = {q, k, v}, *mvals[3] = {q, kr, vr};
  fixture g, m;
  fixture_make(&g, 3, gshapes, gvals);
  fixture_make(&m, 3, mshapes, mvals);
  mpt_var *gp[3], *mp[3], *gy = NULL, *my = NULL;
  for (int i = 0; i < 3; i++) {
    OK(mpt_tape_param(g.tape, i, &gp[i]));
    OK(mpt_tape_param(m.tape, i, &mp[i]));
  }
  OK(mpt_nn_gqa_attention(g.tape, gp[0], gp[1], gp[2], H, KV, 10000.0f, &gy));
  OK(mpt_nn_gqa_attention(m.tape, mp[0], mp[1], mp[2], H, H, 10000.0f, &my));
  ck_assert(memcmp(mpt_var_value(gy)->data, mpt_var_value(my)->data, sizeof q) == 0);
  backward_weighted(&g, gy, r);
  backward_weighted(&m, my, r);
  ck_assert(memcmp(grad_of(&g, 0), grad_of(&m, 0), sizeof q) == 0);
  double err = 0, scale = 0;
  for (int part = 1; part < 3; part++) {
    const float *gg = grad_of(&g, part), *mg = grad_of(&m, part);
    for (int row = 0; row < B * T; row++)
      for (int j = 0; j < KV; j++)
        for (int i = 0; i < HD; i++) {
          double sum = 0;
          for (int c = 0; c < REP; c++) sum += mg[(row * H + j * REP + c) * HD + i];
          const double got = gg[(row * KV + j) * HD + i];
          if (fabs(got - sum) > err) err = fabs(got - sum);
          if (fabs(sum) > scale) scale = fabs(sum);
        }
  }
  ck_assert_msg(err <= 1e-6 * scale, "key/value gradients %g apart (largest %g)", err, scale);
  fixture_free(&g);
  fixture_free(&m);
}
END_TEST

START_TEST(test_gqa_rope_fused_equals_rope_op) {
  enum { B = 2, T = 6, H = 4, KV = 2, HD = 6 };
  enum { NQ = B * T * H * HD, NK = B * T * KV * HD };
  static float q[NQ], k[NK], v[NK], r[NQ];
  fill(q, NQ, 5);
  fill(k, NK, 6);
  fill(v, NK, 7);
  fill(r, NQ, 8);
  const int64_t shapes[3][3] = {{B, T, H * HD}, {B, T, KV * HD}, {B, T, KV * HD}};
  float *vals[3] = {q, k, v};
  fixture a, b;
  fixture_make(&a, 3, shapes, vals);
  fixture_make(&b, 3, shapes, vals);
  mpt_var *pa[3], *pb[3], *ya = NULL, *yb = NULL, *qr = NULL, *kr = NULL;
  for (int i = 0; i < 3; i++) {
    OK(mpt_tape_param(a.tape, i, &pa[i]));
    OK(mpt_tape_param(b.tape, i, &pb[i]));
  }
  OK(mpt_nn_gqa_attention(a.tape, pa[0], pa[1], pa[2], H, KV, 500000.0f, &ya));
  OK(mpt_nn_rope(b.tape, pb[0], H, 500000.0f, &qr));
  OK(mpt_nn_rope(b.tape, pb[1], KV, 500000.0f, &kr));
  OK(mpt_nn_gqa_attention(b.tape, qr, kr, pb[2], H, KV, 0.0f, &yb));
  ck_assert(memcmp(mpt_var_value(ya)->data, mpt_var_value(yb)->data, sizeof q) == 0);
  backward_weighted(&a, ya, r);
  backward_weighted(&b, yb, r);
  ck_assert(memcmp(mpt_model_grads(a.model), mpt_model_grads(b.model),
                   (size_t)mpt_model_param_count(a.model) * sizeof(float)) == 0);
  fixture_free(&a);
  fixture_free(&b);
}
END_TEST

/* linear_swiglu with its two weights adjacent in memory (one product over both, as in the
 * model) and apart (two products): the same output and gradients (1e-6 relative: the products'
 * blocking may differ); and silu(g) u at a few points against the formula in double. */
START_TEST(test_swiglu_adjacent_or_apart) {
  enum { R = 6, C = 5, F = 7 };
  static float x[R * C], wg[F * C], wu[F * C], r[R * F];
  fill(x, R * C, 11);
  fill(wg, F * C, 12);
  fill(wu, F * C, 13);
  fill(r, R * F, 14);
  const int nd[3] = {2, 2, 2};
  const int64_t adj_shapes[3][3] = {{R, C}, {F, C}, {F, C}};
  float *adj_vals[3] = {x, wg, wu}, *apart_vals[3] = {x, wu, wg};
  fixture a, b;
  fixture_make_nd(&a, 3, nd, adj_shapes, adj_vals);
  fixture_make_nd(&b, 3, nd, adj_shapes, apart_vals); /* up registered before gate */
  mpt_var *pa[3], *pb[3], *ya = NULL, *yb = NULL;
  for (int i = 0; i < 3; i++) {
    OK(mpt_tape_param(a.tape, i, &pa[i]));
    OK(mpt_tape_param(b.tape, i, &pb[i]));
  }
  OK(mpt_nn_linear_swiglu(a.tape, pa[0], pa[1], pa[2], &ya));
  OK(mpt_nn_linear_swiglu(b.tape, pb[0], pb[2], pb[1], &yb));
  const float *va = mpt_var_value(ya)->data, *vb = mpt_var_value(yb)->data;
  for (int i = 0; i < R * F; i++) {
    const int row = i / F, col = i % F;
    double g = 0, u = 0;
    for (int j = 0; j < C; j++) {
      g += (double)x[row * C + j] * wg[col * C + j];
      u += (double)x[row * C + j] * wu[col * C + j];
    }
    const double want = g / (1 + exp(-g)) * u;
    ck_assert_msg(fabs(va[i] - want) <= 1e-5 * (1 + fabs(want)), "y[%d] %g, want %g", i,
                  (double)va[i], want);
    ck_assert_msg(fabs(va[i] - vb[i]) <= 1e-6 * (1 + fabs(want)), "y[%d] %g apart %g", i,
                  (double)va[i], (double)vb[i]);
  }
  backward_weighted(&a, ya, r);
  backward_weighted(&b, yb, r);
  const int map[3] = {0, 2, 1}; /* a's parameter i is b's map[i] */
  for (int i = 0; i < 3; i++) {
    const float *ga = grad_of(&a, i), *gb = grad_of(&b, map[i]);
    const int n = (int)mpt_model_param_info(a.model, i)->count;
    double scale = 0, err = 0;
    for (int j = 0; j < n; j++) {
      if (fabs(ga[j]) > scale) scale = fabs(ga[j]);
      if (fabs(ga[j] - gb[j]) > err) err = fabs(ga[j] - gb[j]);
    }
    ck_assert_msg(scale > 0 && err <= 1e-6 * scale, "gradient %d: %g apart (largest %g)", i, err,
                  scale);
  }
  fixture_free(&a);
  fixture_free(&b);
}
END_TEST

/* mpt_nn_llama_attention against linear_nd three times then mpt_nn_gqa_attention, with the
 * weights adjacent in memory (one product) and apart (three): the same output and gradients
 * within 1e-6 relative (the products' summation order). */
static void llama_attention_case(int apart, const mpt_rope_scaling *sc) {
  enum { B = 2, T = 5, C = 12, H = 6, KV = 2, HD = 2 };
  static float x[B * T * C], wq[H * HD * C], wk[KV * HD * C], wv[KV * HD * C], r[B * T * H * HD];
  fill(x, B * T * C, 21);
  fill(wq, H * HD * C, 22);
  fill(wk, KV * HD * C, 23);
  fill(wv, KV * HD * C, 24);
  fill(r, B * T * H * HD, 25);
  /* apart: v registered before q and k, so k is not followed by v */
  const int nd[4] = {3, 2, 2, 2};
  const int64_t shapes[4][3] = {{B, T, C}, {H * HD, C}, {KV * HD, C}, {KV * HD, C}};
  const int64_t ashapes[4][3] = {{B, T, C}, {KV * HD, C}, {H * HD, C}, {KV * HD, C}};
  float *vals[4] = {x, wq, wk, wv}, *avals[4] = {x, wv, wq, wk};
  const int idx[4] = {0, 1, 2, 3}, aidx[4] = {0, 2, 3, 1}; /* x, q, k, v -> parameter */
  const int *at = apart ? aidx : idx;
  fixture a, b;
  fixture_make_nd(&a, 4, nd, apart ? ashapes : shapes, apart ? avals : vals);
  fixture_make_nd(&b, 4, nd, shapes, vals);
  mpt_var *pa[4], *pb[4], *ya = NULL, *yb = NULL, *q = NULL, *k = NULL, *v = NULL;
  for (int i = 0; i < 4; i++) {
    OK(mpt_tape_param(a.tape, at[i], &pa[i]));
    OK(mpt_tape_param(b.tape, i, &pb[i]));
  }
  OK(mpt_nn_llama_attention_scaled(a.tape, pa[0], pa[1], pa[2], pa[3], H, KV, 10000.0f, sc,
                                   &ya));
  OK(mpt_nn_linear_nd(b.tape, pb[0], pb[1], NULL, &q));
  OK(mpt_nn_linear_nd(b.tape, pb[0], pb[2], NULL, &k));
  OK(mpt_nn_linear_nd(b.tape, pb[0], pb[3], NULL, &v));
  OK(mpt_nn_gqa_attention_scaled(b.tape, q, k, v, H, KV, 10000.0f, sc, &yb));
  const float *va = mpt_var_value(ya)->data, *vb = mpt_var_value(yb)->data;
  double err = 0, scale = 0;
  for (int i = 0; i < B * T * H * HD; i++) {
    if (fabs(vb[i]) > scale) scale = fabs(vb[i]);
    if (fabs(va[i] - vb[i]) > err) err = fabs(va[i] - vb[i]);
  }
  ck_assert_msg(scale > 0 && err <= 1e-6 * scale, "apart %d: y %g apart (largest %g)", apart,
                err, scale);
  backward_weighted(&a, ya, r);
  backward_weighted(&b, yb, r);
  for (int i = 0; i < 4; i++) {
    const float *ga = grad_of(&a, at[i]), *gb = grad_of(&b, i);
    const int n = (int)mpt_model_param_info(b.model, i)->count;
    err = scale = 0;
    for (int j = 0; j < n; j++) {
      if (fabs(gb[j]) > scale) scale = fabs(gb[j]);
      if (fabs(ga[j] - gb[j]) > err) err = fabs(ga[j] - gb[j]);
    }
    ck_assert_msg(scale > 0 && err <= 1e-6 * scale, "apart %d: gradient %d %g apart (largest "
                  "%g)", apart, i, err, scale);
  }
  fixture_free(&a);
  fixture_free(&b);
}

START_TEST(test_llama_attention_equals_unfused) {
  /* unscaled, and llama3-scaled (an original context of 1: the one frequency divided by 4) */
  const mpt_rope_scaling sc = {MPT_ROPE_LLAMA3, 4.0f, 1.0f, 4.0f, 1};
  llama_attention_case(0, NULL);
  llama_attention_case(1, NULL);
  llama_attention_case(0, &sc);
  llama_attention_case(1, &sc);
}
END_TEST

/* The llama3-scaled RoPE inside the attention against q and k rotated beforehand with
 * mpt_op_rope_freqs (the table of mpt_rope_inv_freq) and the attention without RoPE: the same
 * output bits, and the q and k gradients those of the rotated inputs rotated back
 * (mpt_op_rope_freqs_backward): the same bits. The scaled output differs from the unscaled
 * one; a bad scaling is MPT_EINVAL. */
START_TEST(test_gqa_scaled_rope_equals_rotated_inputs) {
  enum { B = 2, T = 6, H = 4, KV = 2, HD = 6 };
  enum { NQ = B * T * H * HD, NK = B * T * KV * HD };
  static float q[NQ], k[NK], v[NK], r[NQ], qr[NQ], kr[NK];
  fill(q, NQ, 15);
  fill(k, NK, 16);
  fill(v, NK, 17);
  fill(r, NQ, 18);
  /* theta 100, hd 6: frequencies 1, 0.215, 0.0464 (wavelengths 6.3, 29, 135) against the
   * bands 8 and 32: one kept, one smoothed, one divided by 8 */
  const mpt_rope_scaling sc = {MPT_ROPE_LLAMA3, 8.0f, 1.0f, 4.0f, 32};
  float f[HD / 2];
  OK(mpt_rope_inv_freq(HD, 100.0f, &sc, f));
  memcpy(qr, q, sizeof q);
  memcpy(kr, k, sizeof k);
  OK(mpt_op_rope_freqs(NULL, qr, B, T, H, HD, f));
  OK(mpt_op_rope_freqs(NULL, kr, B, T, KV, HD, f));
  const int64_t shapes[3][3] = {{B, T, H * HD}, {B, T, KV * HD}, {B, T, KV * HD}};
  float *vals[3] = {q, k, v}, *rvals[3] = {qr, kr, v};
  fixture a, b, c;
  fixture_make(&a, 3, shapes, vals);
  fixture_make(&b, 3, shapes, rvals);
  fixture_make(&c, 3, shapes, vals);
  mpt_var *pa[3], *pb[3], *pc[3], *ya = NULL, *yb = NULL, *yc = NULL, *bad = NULL;
  for (int i = 0; i < 3; i++) {
    OK(mpt_tape_param(a.tape, i, &pa[i]));
    OK(mpt_tape_param(b.tape, i, &pb[i]));
    OK(mpt_tape_param(c.tape, i, &pc[i]));
  }
  OK(mpt_nn_gqa_attention_scaled(a.tape, pa[0], pa[1], pa[2], H, KV, 100.0f, &sc, &ya));
  OK(mpt_nn_gqa_attention(b.tape, pb[0], pb[1], pb[2], H, KV, 0.0f, &yb));
  OK(mpt_nn_gqa_attention(c.tape, pc[0], pc[1], pc[2], H, KV, 100.0f, &yc));
  ck_assert(memcmp(mpt_var_value(ya)->data, mpt_var_value(yb)->data, sizeof q) == 0);
  ck_assert(memcmp(mpt_var_value(ya)->data, mpt_var_value(yc)->data, sizeof q) != 0);
  backward_weighted(&a, ya, r);
  backward_weighted(&b, yb, r);
  float gq[NQ], gk[NK];
  memcpy(gq, grad_of(&b, 0), sizeof gq);
  memcpy(gk, grad_of(&b, 1), sizeof gk);
  OK(mpt_op_rope_freqs_backward(NULL, gq, B, T, H, HD, f));
  OK(mpt_op_rope_freqs_backward(NULL, gk, B, T, KV, HD, f));
  ck_assert(memcmp(grad_of(&a, 0), gq, sizeof gq) == 0);
  ck_assert(memcmp(grad_of(&a, 1), gk, sizeof gk) == 0);
  ck_assert(memcmp(grad_of(&a, 2), grad_of(&b, 2), sizeof v) == 0);
  const mpt_rope_scaling wrong = {MPT_ROPE_LLAMA3, 8.0f, 4.0f, 1.0f, 32}; /* high < low */
  ck_assert_int_eq(mpt_nn_gqa_attention_scaled(c.tape, pc[0], pc[1], pc[2], H, KV, 100.0f,
                                               &wrong, &bad), MPT_EINVAL);
  fixture_free(&a);
  fixture_free(&b);
  fixture_free(&c);
}
END_TEST

/* ---- the model ---- */

/* Loss and gradients of llama-tiny (seed 3) on B 2 x T 16 tokens, with or without recompute. */
static float model_pass(mpt_model *m, int recompute, const int32_t *tok, const int32_t *tgt) {
  const int64_t shape[2] = {2, 16};
  mpt_tensor tt = mpt_tensor_view((void *)tok, mpt_device_cpu(), MPT_I32, 2, shape);
  mpt_tensor gt = mpt_tensor_view((void *)tgt, mpt_device_cpu(), MPT_I32, 2, shape);
  mpt_tape *tape = NULL;
  OK(mpt_tape_init(&tape, m, NULL));
  mpt_tape_set_recompute(tape, recompute);
  mpt_tape_reset(tape, 1);
  OK(mpt_model_zero_grad(m, NULL));
  mpt_var *in = NULL, *logits = NULL, *loss = NULL;
  float value = 0;
  OK(mpt_tape_input(tape, &tt, &in));
  OK(mpt_model_forward(m, tape, in, &logits));
  OK(mpt_nn_cross_entropy_vocab(tape, logits, &gt, 256, &loss));
  OK(mpt_var_item(tape, loss, &value));
  OK(mpt_tape_backward(tape, loss, 1.0f));
  mpt_tape_free(tape);
  return value;
}

START_TEST(test_model_recompute_same_bits) {
  mpt_llama_config c = tiny();
  mpt_model *m = NULL;
  OK(mpt_model_init_llama(&m, mpt_device_cpu(), &c, 3));
  int32_t tok[32], tgt[32];
  for (int i = 0; i < 32; i++) {
    tok[i] = (i * 37 + 5) % 256;
    tgt[i] = (i * 11 + 3) % 256;
  }
  const int64_t n = mpt_model_param_count(m);
  float *g0 = malloc((size_t)n * sizeof *g0);
  ck_assert_ptr_nonnull(g0);
  const float l0 = model_pass(m, 0, tok, tgt);
  memcpy(g0, mpt_model_grads(m), (size_t)n * sizeof *g0);
  const float l1 = model_pass(m, 1, tok, tgt);
  ck_assert(l0 == l1);
  ck_assert(fabsf(l0 - logf(256.0f)) < 0.1f); /* the HF initialisation predicts ~uniformly */
  ck_assert(memcmp(g0, mpt_model_grads(m), (size_t)n * sizeof *g0) == 0);
  double norm = 0;
  for (int64_t i = 0; i < n; i++) norm += (double)g0[i] * g0[i];
  ck_assert(norm > 0);
  free(g0);
  mpt_model_free(m);
}
END_TEST

START_TEST(test_model_bad_input) {
  mpt_llama_config c = tiny();
  mpt_model *m = NULL;
  OK(mpt_model_init_llama(&m, mpt_device_cpu(), &c, 3));
  mpt_tape *tape = NULL;
  OK(mpt_tape_init(&tape, m, NULL));
  static int32_t tok[2 * 65];
  const int64_t too_long[2] = {2, 65}, shape[2] = {2, 8};
  mpt_tensor tt = mpt_tensor_view(tok, mpt_device_cpu(), MPT_I32, 2, too_long);
  mpt_var *in = NULL, *logits = NULL;
  mpt_tape_reset(tape, 1);
  OK(mpt_tape_input(tape, &tt, &in));
  ck_assert_int_eq(mpt_model_forward(m, tape, in, &logits), MPT_ESHAPE);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "1 <= T <= 64"));
  tok[5] = 256;
  tt = mpt_tensor_view(tok, mpt_device_cpu(), MPT_I32, 2, shape);
  mpt_tape_reset(tape, 1);
  OK(mpt_tape_input(tape, &tt, &in));
  ck_assert_int_eq(mpt_model_forward(m, tape, in, &logits), MPT_EINVAL);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "256"));
  mpt_tape_free(tape);
  mpt_model_free(m);
  mpt_model *g = NULL;
  const mpt_device gpu = {MPT_DEVICE_CUDA, 0};
  ck_assert_int_eq(mpt_model_init_llama(&g, gpu, &c, 3), MPT_ENOTSUP);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "CPU only"));
  ck_assert_ptr_null(g);
}
END_TEST

static Suite *llama_suite(void) {
  Suite *s = suite_create("llama");
  TCase *tc = tcase_create("llama");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_config_check);
  tcase_add_test(tc, test_presets);
  tcase_add_test(tc, test_layout_names_units);
  tcase_add_test(tc, test_init);
  tcase_add_test(tc, test_rope_closed_form);
  tcase_add_test(tc, test_gqa_uniform_closed_form);
  tcase_add_test(tc, test_gqa_weights_closed_form);
  tcase_add_test(tc, test_gqa_equals_repeated_mha);
  tcase_add_test(tc, test_gqa_rope_fused_equals_rope_op);
  tcase_add_test(tc, test_swiglu_adjacent_or_apart);
  tcase_add_test(tc, test_llama_attention_equals_unfused);
  tcase_add_test(tc, test_gqa_scaled_rope_equals_rotated_inputs);
  tcase_add_test(tc, test_model_recompute_same_bits);
  tcase_add_test(tc, test_model_bad_input);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(llama_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
