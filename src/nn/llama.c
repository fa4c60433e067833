/* The Llama language model of include/mpitrain/llama.h, built from the ops of llama_ops.c and
 * transformer.h through the public API only (as gpt.c builds the GPT).
 *
 * Parameters: index 0 the token embedding, then 9 per layer in the order the forward uses them
 * (input_layernorm, q, k, v, o, post_attention_layernorm, gate, up, down: LLAMA_K_*), then the
 * final norm and, untied, the head. Backward finalises the last layer's gradients first, so
 * DDP's buckets (reverse registration order) become ready one after the other. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/autograd.h"
#include "mpitrain/llama.h"
#include "mpitrain/transformer.h"
#include "nn/lm_common.h"

enum {
  LLAMA_K_LN1,
  LLAMA_K_Q,
  LLAMA_K_K,
  LLAMA_K_V,
  LLAMA_K_O,
  LLAMA_K_LN2,
  LLAMA_K_GATE,
  LLAMA_K_UP,
  LLAMA_K_DOWN,
  LLAMA_PER_LAYER
};

#define LLAMA_INIT_STD 0.02 /* transformers' initializer_range */

static const char *const layer_names[LLAMA_PER_LAYER] = {
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};

typedef struct llama_block {
  const mpt_llama_config *cfg;
  int layer;
} llama_block;

typedef struct llama_ctx {
  mpt_llama_config cfg;
  llama_block *blocks; /* [n_layers]: each block's checkpoint argument (recompute) */
} llama_ctx;

static void llama_ctx_free(void *p) {
  llama_ctx *ctx = p;
  if (ctx) free(ctx->blocks);
  free(ctx);
}

static int layer_index(int layer, int k) { return 1 + LLAMA_PER_LAYER * layer + k; }
static int norm_index(const mpt_llama_config *c) { return 1 + LLAMA_PER_LAYER * c->n_layers; }
/* The head: its own tensor, or the embedding's when tied. */
static int head_index(const mpt_llama_config *c) {
  return c->tied_embeddings ? 0 : norm_index(c) + 1;
}

mpt_status mpt_llama_config_check(const mpt_llama_config *c) {
  if (!c) return MPT_FAIL(MPT_EINVAL, "llama config: NULL config");
  static const char pre[] = "llama config";
  const struct {
    const char *name;
    int value;
  } sizes[] = {{"vocab_size", c->vocab_size}, {"dim", c->dim}, {"n_layers", c->n_layers},
               {"n_heads", c->n_heads}, {"n_kv_heads", c->n_kv_heads},
               {"ffn_dim", c->ffn_dim}, {"max_seq_len", c->max_seq_len}};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
    if (sizes[i].value < 1)
      return MPT_FAIL(MPT_EINVAL, "%s: %s = %d must be >= 1", pre, sizes[i].name, sizes[i].value);
  if (c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads != 0)
    return MPT_FAIL(MPT_EINVAL, "%s: n_heads = %d is not a multiple of n_kv_heads = %d (each "
                    "key/value head serves n_heads / n_kv_heads query heads)", pre, c->n_heads,
                    c->n_kv_heads);
  if (c->dim % c->n_heads != 0)
    return MPT_FAIL(MPT_EINVAL, "%s: dim = %d is not a multiple of n_heads = %d", pre, c->dim,
                    c->n_heads);
  const int hd = c->dim / c->n_heads;
  if (hd % 2 != 0)
    return MPT_FAIL(MPT_EINVAL, "%s: the head size dim / n_heads = %d / %d = %d is odd (RoPE "
                    "rotates pairs of channels)", pre, c->dim, c->n_heads, hd);
  if (!isfinite(c->rope_theta) || !(c->rope_theta > 1.0f))
    return MPT_FAIL(MPT_EINVAL, "%s: rope_theta = %g must be finite and > 1", pre,
                    (double)c->rope_theta);
  if (!isfinite(c->norm_eps) || !(c->norm_eps >= 0.0f))
    return MPT_FAIL(MPT_EINVAL, "%s: norm_eps = %g must be finite and >= 0", pre,
                    (double)c->norm_eps);
  if (c->tied_embeddings != 0 && c->tied_embeddings != 1)
    return MPT_FAIL(MPT_EINVAL, "%s: tied_embeddings = %d must be 0 or 1", pre,
                    c->tied_embeddings);
  MPT_RETURN_IF(mpt_rope_scaling_check(&c->rope_scaling));
  /* every tensor's extents, and the activations' rows times columns, stay within what the
   * core ops take (2^31 per extent); the whole model within int64 */
  const int64_t lim = INT32_MAX;
  if ((int64_t)c->vocab_size * c->dim > lim || (int64_t)c->ffn_dim * c->dim > lim ||
      (int64_t)c->dim * 3 > lim)
    return MPT_FAIL(MPT_EINVAL, "%s: a tensor of vocab_size x dim = %d x %d or ffn_dim x dim = "
                    "%d x %d holds 2^31 elements or more", pre, c->vocab_size, c->dim,
                    c->ffn_dim, c->dim);
  return MPT_OK;
}

mpt_status mpt_llama_config_preset(const char *name, mpt_llama_config *config) {
  if (!name || !config) return MPT_FAIL(MPT_EINVAL, "llama preset: NULL name or config");
  memset(config, 0, sizeof *config);
  const mpt_llama_config base = {.vocab_size = 256, .rope_theta = 10000.0f, .norm_eps = 1e-5f,
                                 .tied_embeddings = 0};
  *config = base;
  if (strcmp(name, "llama-tiny") == 0) {
    config->dim = 64;
    config->n_layers = 2;
    config->n_heads = 4;
    config->n_kv_heads = 2;
    config->ffn_dim = 192;
    config->max_seq_len = 64;
  } else if (strcmp(name, "llama-mini") == 0) {
    config->dim = 384;
    config->n_layers = 6;
    config->n_heads = 6;
    config->n_kv_heads = 2;
    config->ffn_dim = 1024;
    config->max_seq_len = 256;
  } else {
    memset(config, 0, sizeof *config);
    return MPT_FAIL(MPT_EINVAL, "llama preset: unknown name '%s' (llama-tiny or llama-mini)",
                    name);
  }
  return MPT_OK;
}

/* The shape of tensor `k` (LLAMA_K_*) of a layer: ndim and extents. */
static int layer_shape(const mpt_llama_config *c, int k, int64_t *shape) {
  const int64_t hd = c->dim / c->n_heads, C = c->dim;
  switch (k) {
    case LLAMA_K_LN1: case LLAMA_K_LN2: shape[0] = C; return 1;
    case LLAMA_K_Q: shape[0] = c->n_heads * hd; shape[1] = C; return 2;
    case LLAMA_K_K: case LLAMA_K_V: shape[0] = c->n_kv_heads * hd; shape[1] = C; return 2;
    case LLAMA_K_O: shape[0] = C; shape[1] = c->n_heads * hd; return 2;
    case LLAMA_K_GATE: case LLAMA_K_UP: shape[0] = c->ffn_dim; shape[1] = C; return 2;
    default: shape[0] = C; shape[1] = c->ffn_dim; return 2; /* down */
  }
}

/* Name, shape and whether it is a norm weight, of parameter `index` of a model of c. */
static int tensor_desc(const mpt_llama_config *c, int index, char *name, size_t size,
                       int64_t *shape, int *is_norm) {
  *is_norm = 0;
  if (index == 0) {
    snprintf(name, size, "model.embed_tokens.weight");
    shape[0] = c->vocab_size;
    shape[1] = c->dim;
    return 2;
  }
  if (index == norm_index(c)) {
    snprintf(name, size, "model.norm.weight");
    shape[0] = c->dim;
    *is_norm = 1;
    return 1;
  }
  if (index == norm_index(c) + 1) {
    snprintf(name, size, "lm_head.weight");
    shape[0] = c->vocab_size;
    shape[1] = c->dim;
    return 2;
  }
  const int l = (index - 1) / LLAMA_PER_LAYER, k = (index - 1) % LLAMA_PER_LAYER;
  snprintf(name, size, "model.layers.%d.%s", l, layer_names[k]);
  *is_norm = k == LLAMA_K_LN1 || k == LLAMA_K_LN2;
  return layer_shape(c, k, shape);
}

int mpt_llama_num_tensors(const mpt_llama_config *c) {
  if (!c || mpt_llama_config_check(c) != MPT_OK) return 0;
  return 2 + LLAMA_PER_LAYER * c->n_layers + (c->tied_embeddings ? 0 : 1);
}

int64_t mpt_llama_param_count(const mpt_llama_config *c) {
  const int n = mpt_llama_num_tensors(c);
  int64_t total = 0;
  for (int i = 0; i < n; i++) {
    char name[96];
    int64_t shape[2];
    int is_norm;
    const int nd = tensor_desc(c, i, name, sizeof name, shape, &is_norm);
    total += nd == 1 ? shape[0] : shape[0] * shape[1];
  }
  return total;
}

mpt_status mpt_llama_check_model(mpt_model *model, const mpt_llama_config *config) {
  if (!model || !config) return MPT_FAIL(MPT_EINVAL, "llama: NULL model or config");
  MPT_RETURN_IF(mpt_llama_config_check(config));
  const int n = mpt_llama_num_tensors(config);
  if (mpt_model_num_params(model) != n || !mpt_model_params(model))
    return MPT_FAIL(MPT_ESHAPE, "llama: the model (%d parameter tensors) is not a finalised "
                    "Llama of this config (%d tensors)", mpt_model_num_params(model), n);
  for (int i = 0; i < n; i++) {
    char name[96];
    int64_t shape[2];
    int is_norm;
    const int nd = tensor_desc(config, i, name, sizeof name, shape, &is_norm);
    const mpt_param_info *pi = mpt_model_param_info(model, i);
    int same = strcmp(pi->name, name) == 0 && pi->ndim == nd;
    for (int d = 0; same && d < nd; d++) same = pi->shape[d] == shape[d];
    if (!same) {
      char want[64], got[64];
      return MPT_FAIL(MPT_ESHAPE, "llama: parameter %d is %s %s, want %s %s", i, pi->name,
                      mpt_shape_str(pi->ndim, pi->shape, got, sizeof got), name,
                      mpt_shape_str(nd, shape, want, sizeof want));
    }
  }
  return MPT_OK;
}

/* One decoder layer on the residual stream x (recompute's checkpointed unit). */
static mpt_status llama_block_forward(mpt_tape *tape, void *user, mpt_var *x, mpt_var **y) {
  const llama_block *b = user;
  const mpt_llama_config *c = b->cfg;
  mpt_var *p[LLAMA_PER_LAYER];
  mpt_var *h = NULL, *a = NULL;
  /* each parameter taken right before the op that reads it (ZeRO-3 may give it back after) */
#define P(kind) (mpt_tape_param(tape, layer_index(b->layer, kind), &p[kind]))
  MPT_RETURN_IF(P(LLAMA_K_LN1));
  MPT_RETURN_IF(mpt_nn_rmsnorm(tape, x, p[LLAMA_K_LN1], c->norm_eps, &h));
  MPT_RETURN_IF(P(LLAMA_K_Q));
  MPT_RETURN_IF(P(LLAMA_K_K));
  MPT_RETURN_IF(P(LLAMA_K_V));
  /* q, k and v adjacent in the flat buffer: one product over the three */
  MPT_RETURN_IF(mpt_nn_llama_attention_scaled(tape, h, p[LLAMA_K_Q], p[LLAMA_K_K],
                                              p[LLAMA_K_V], c->n_heads, c->n_kv_heads,
                                              c->rope_theta, &c->rope_scaling, &a));
  MPT_RETURN_IF(P(LLAMA_K_O));
  MPT_RETURN_IF(mpt_nn_linear_nd(tape, a, p[LLAMA_K_O], NULL, &a));
  MPT_RETURN_IF(mpt_nn_add(tape, x, a, &x));
  MPT_RETURN_IF(P(LLAMA_K_LN2));
  MPT_RETURN_IF(mpt_nn_rmsnorm(tape, x, p[LLAMA_K_LN2], c->norm_eps, &h));
  MPT_RETURN_IF(P(LLAMA_K_GATE));
  MPT_RETURN_IF(P(LLAMA_K_UP));
  MPT_RETURN_IF(mpt_nn_linear_swiglu(tape, h, p[LLAMA_K_GATE], p[LLAMA_K_UP], &h));
  MPT_RETURN_IF(P(LLAMA_K_DOWN));
  MPT_RETURN_IF(mpt_nn_linear_nd(tape, h, p[LLAMA_K_DOWN], NULL, &h));
#undef P
  return mpt_nn_add(tape, x, h, y);
}

static mpt_status llama_forward(mpt_model *model, mpt_tape *tape, void *vctx, mpt_var *input,
                                mpt_var **output) {
  const llama_ctx *ctx = vctx;
  const mpt_llama_config *c = &ctx->cfg;
  const mpt_tensor *tok = mpt_var_value(input);
  (void)model;
  MPT_RETURN_IF(mpt__lm_check_tokens("llama", tok, c->max_seq_len));
  mpt_var *e = NULL, *x = NULL, *nw = NULL, *head = NULL;
  MPT_RETURN_IF(mpt_tape_param(tape, 0, &e));
  MPT_RETURN_IF(mpt_nn_embedding(tape, tok, c->vocab_size, e, &x));
  const int recompute = mpt_tape_recompute(tape);
  for (int l = 0; l < c->n_layers; l++) {
    if (recompute) /* each layer a checkpoint: only its input is kept */
      MPT_RETURN_IF(mpt_tape_checkpoint(tape, llama_block_forward, &ctx->blocks[l], x, &x));
    else
      MPT_RETURN_IF(llama_block_forward(tape, &ctx->blocks[l], x, &x));
  }
  MPT_RETURN_IF(mpt_tape_param(tape, norm_index(c), &nw));
  MPT_RETURN_IF(mpt_nn_rmsnorm(tape, x, nw, c->norm_eps, &x));
  /* the head taken where it is used (ZeRO-3 gathers it then; tied: the embedding's unit) */
  MPT_RETURN_IF(mpt_tape_param(tape, head_index(c), &head));
  return mpt_nn_linear_nd(tape, x, head, NULL, output);
}

mpt_status mpt_llama_init_weights(mpt_model *model, const mpt_llama_config *config,
                                  uint64_t seed) {
  MPT_RETURN_IF(mpt_llama_check_model(model, config));
  if (mpt_model_device(model).type != MPT_DEVICE_CPU)
    return MPT_FAIL(MPT_ENOTSUP, "llama init: the model is not on the CPU");
  /* norm weights 1, the rest 0 (as registered); bumps the model's generation */
  MPT_RETURN_IF(mpt_model_init_params(model, seed));
  mpt_rng rng;
  mpt_rng_seed(&rng, seed);
  double spare = 0;
  int has_spare = 0;
  const int n = mpt_llama_num_tensors(config);
  for (int i = 0; i < n; i++) {
    char name[96];
    int64_t shape[2];
    int is_norm;
    tensor_desc(config, i, name, sizeof name, shape, &is_norm);
    if (is_norm) continue;
    const mpt_param_info *pi = mpt_model_param_info(model, i);
    float *w = mpt_model_params(model) + pi->offset;
    for (int64_t j = 0; j < pi->count; j++)
      w[j] = (float)(LLAMA_INIT_STD * mpt__lm_normal_draw(&rng, &spare, &has_spare));
  }
  return MPT_OK;
}

mpt_status mpt_model_init_llama(mpt_model **model, mpt_device device,
                                const mpt_llama_config *config, uint64_t seed) {
  mpt_status st = MPT_OK;
  mpt_model *m = NULL;
  if (!model || !config) return MPT_FAIL(MPT_EINVAL, "llama: NULL model or config");
  *model = NULL;
  MPT_RETURN_IF(mpt_llama_config_check(config));
  if (device.type != MPT_DEVICE_CPU)
    return MPT_FAIL(MPT_ENOTSUP, "llama: the model runs on the CPU only (its RMSNorm, RoPE and "
                    "SwiGLU ops have no GPU kernels yet): use --device cpu");
  llama_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return MPT_FAIL(MPT_ENOMEM, "llama: forward context");
  ctx->cfg = *config;
  if (!(ctx->blocks = calloc((size_t)config->n_layers, sizeof *ctx->blocks))) {
    llama_ctx_free(ctx);
    return MPT_FAIL(MPT_ENOMEM, "llama: forward context");
  }
  for (int l = 0; l < config->n_layers; l++)
    ctx->blocks[l] = (llama_block){.cfg = &ctx->cfg, .layer = l};
  st = mpt_model_init(&m, device);
  if (st != MPT_OK) {
    llama_ctx_free(ctx);
    return st;
  }
  mpt_model_set_forward(m, llama_forward, ctx, llama_ctx_free);
  const int n = mpt_llama_num_tensors(config);
  for (int i = 0; i < n; i++) {
    char name[96];
    int64_t shape[2];
    int is_norm, index = -1;
    const int nd = tensor_desc(config, i, name, sizeof name, shape, &is_norm);
    MPT_CHECK(mpt_model_add_param(m, name, nd, shape, is_norm ? MPT_INIT_ONES : MPT_INIT_ZEROS,
                                  1, &index), fail);
    if (index != i) {
      st = MPT_FAIL(MPT_ESTATE, "llama: %s registered as parameter %d, expected %d", name,
                    index, i);
      goto fail;
    }
  }
  { /* ZeRO-3's units: the embedding, each layer, the final norm with the head */
    int *first = malloc(sizeof *first * (size_t)(config->n_layers + 2));
    if (!first) {
      st = MPT_FAIL(MPT_ENOMEM, "llama: units");
      goto fail;
    }
    first[0] = 0;
    for (int l = 0; l <= config->n_layers; l++) first[l + 1] = 1 + LLAMA_PER_LAYER * l;
    st = mpt_model_set_units(m, config->n_layers + 2, first);
    free(first);
    if (st != MPT_OK) goto fail;
  }
  MPT_CHECK(mpt_model_finalize(m), fail);
  MPT_CHECK(mpt_llama_init_weights(m, config, seed), fail);
  *model = m;
  return MPT_OK;
fail:
  mpt_model_free(m);
  return st;
}
