/* The GPT-2 language model of include/mpitrain/transformer.h, built from the transformer ops
 * through the public API only (as the models of models.c).
 *
 * Parameters are registered layer-major, as PyTorch's GPT modules register theirs: wte, wpe,
 * then for each layer l its 12 tensors h{l}.ln1w, ln1b, qkvw, qkvb, attprojw, attprojb, ln2w,
 * ln2b, fcw, fcb, fcprojw, fcprojb, then lnfw, lnfb. Parameter index of kind k (2..13, per
 * layer) and layer l: 2 + 12 l + (k - 2); lnfw is 2 + 12 L and lnfb 3 + 12 L. Backward
 * finalises the gradients of the last layer first, so DDP's buckets (contiguous slices of the
 * flat gradient buffer in reverse registration order, launched in index order) become ready one
 * after the other during backward. The llm.c layout orders the tensors per kind, then per
 * layer (gpt_config.h); mpt_gpt_params_copy maps tensor by tensor between the two, by kind and
 * layer, for the file formats (src/ckpt). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/autograd.h"
#include "mpitrain/ops.h"
#include "mpitrain/transformer.h"
#include "nn/lm_common.h"
#include "nn/tape.h"

enum { PER_LAYER = 12, FIRST_LAYER_KIND = 2, LNF_KIND = 14 };

#define GPT_LN_EPS 1e-5f
#define GPT_INIT_STD 0.02
#define GPT_SYNC_TIMEOUT_MS 600000.0 /* a host <-> device copy of up to 0.5 GB */

typedef struct gpt_block {
  const mpt_gpt_config *cfg;
  int layer;
} gpt_block;

/* Where the normal draws of one weight tensor start in mpt_gpt_init_weights' stream: the
 * generator, and Box-Muller's kept second value (deferred initialisation). */
typedef struct gpt_draw_start {
  mpt_rng rng;
  double spare;
  int has_spare;
} gpt_draw_start;

typedef struct gpt_ctx {
  mpt_gpt_config cfg; /* padded_vocab_size filled in */
  gpt_block *blocks;  /* [num_layers]: each block's checkpoint argument (recompute) */
  gpt_draw_start *starts; /* deferred: [weight kind i][layer], as init_weights draws them */
} gpt_ctx;

static void gpt_ctx_free(void *p) {
  gpt_ctx *ctx = p;
  if (ctx) free(ctx->blocks);
  if (ctx) free(ctx->starts);
  free(ctx);
}

static int gpt_index(const mpt_gpt_config *c, int kind, int layer) {
  if (kind < FIRST_LAYER_KIND) return kind;
  if (kind >= LNF_KIND) return FIRST_LAYER_KIND + PER_LAYER * c->num_layers + (kind - LNF_KIND);
  return FIRST_LAYER_KIND + PER_LAYER * layer + (kind - FIRST_LAYER_KIND);
}

static int gpt_per_layer(int kind) { return kind >= FIRST_LAYER_KIND && kind < LNF_KIND; }

/* The parameter name of file tensor `kind` in `layer`: "h3.qkvw", or "wte". */
static void gpt_param_name(int kind, int layer, char *name, size_t size) {
  if (gpt_per_layer(kind))
    snprintf(name, size, "h%d.%s", layer, mpt_gpt_tensor_name(kind));
  else
    snprintf(name, size, "%s", mpt_gpt_tensor_name(kind));
}

/* Elements of one parameter of file tensor `kind` (one layer's share of a per-layer one), and
 * where that parameter lies in the file's parameter array. */
static int64_t gpt_part_count(const mpt_gpt_config *c, const mpt_gpt_layout *lay, int kind) {
  return gpt_per_layer(kind) ? lay->count[kind] / c->num_layers : lay->count[kind];
}

static int64_t gpt_file_offset(const mpt_gpt_config *c, const mpt_gpt_layout *lay, int kind,
                               int layer) {
  return lay->offset[kind] + (gpt_per_layer(kind) ? layer : 0) * gpt_part_count(c, lay, kind);
}

mpt_status mpt_gpt_config_preset(const char *name, mpt_gpt_config *config) {
  if (!name || !config) return MPT_FAIL(MPT_EINVAL, "gpt preset: NULL name or config");
  memset(config, 0, sizeof *config);
  /* GPT-2's sizes (Radford et al., 2019) as llm.c builds them (its d12, d24, d36) */
  static const struct {
    const char *name;
    int layers, heads, channels;
  } gpt2s[] = {{"gpt2", 12, 12, 768}, {"gpt2-medium", 24, 16, 1024}, {"gpt2-large", 36, 20, 1280}};
  for (size_t i = 0; i < sizeof gpt2s / sizeof gpt2s[0]; i++)
    if (strcmp(name, gpt2s[i].name) == 0) {
      *config = (mpt_gpt_config){.max_seq_len = 1024, .vocab_size = 50257,
                                 .num_layers = gpt2s[i].layers, .num_heads = gpt2s[i].heads,
                                 .channels = gpt2s[i].channels, .padded_vocab_size = 50304};
      return MPT_OK;
    }
  if (strcmp(name, "gpt-mini") == 0) {
    *config = (mpt_gpt_config){.max_seq_len = 256, .vocab_size = 256, .num_layers = 6,
                               .num_heads = 6, .channels = 384, .padded_vocab_size = 256};
  } else {
    return MPT_FAIL(MPT_EINVAL, "gpt preset: unknown name '%s' (gpt2, gpt2-medium, gpt2-large "
                    "or gpt-mini)", name);
  }
  return MPT_OK;
}

/* The config with a zero padded vocabulary filled in, and its layout (validates it). */
static mpt_status gpt_config_resolve(const mpt_gpt_config *in, mpt_gpt_config *out,
                                     mpt_gpt_layout *layout) {
  *out = *in;
  MPT_RETURN_IF(mpt_gpt_layout_compute(out, layout));
  if (out->padded_vocab_size == 0)
    out->padded_vocab_size = (int)mpt_gpt_padded_vocab(out->vocab_size);
  return MPT_OK;
}

/* One transformer block on the residual stream x (recompute's checkpointed unit): its ln1
 * unfused (the same bits as the fused add + LayerNorm of the plain forward, transformer.h). */
static mpt_status gpt_block_forward(mpt_tape *tape, void *user, mpt_var *x, mpt_var **y) {
  const gpt_block *b = user;
  mpt_var *q[PER_LAYER], *h = NULL, *a = NULL;
  for (int k = 0; k < PER_LAYER; k++)
    MPT_RETURN_IF(mpt_tape_param(tape, gpt_index(b->cfg, FIRST_LAYER_KIND + k, b->layer), &q[k]));
  MPT_RETURN_IF(mpt_nn_layernorm(tape, x, q[0], q[1], GPT_LN_EPS, &h));
  MPT_RETURN_IF(mpt_nn_linear_nd(tape, h, q[2], q[3], &h));
  MPT_RETURN_IF(mpt_nn_causal_attention(tape, h, b->cfg->num_heads, &a));
  MPT_RETURN_IF(mpt_nn_linear_nd(tape, a, q[4], q[5], &a));
  MPT_RETURN_IF(mpt_nn_add_layernorm(tape, x, a, q[6], q[7], GPT_LN_EPS, &x, &h));
  MPT_RETURN_IF(mpt_nn_linear_gelu(tape, h, q[8], q[9], &h));
  MPT_RETURN_IF(mpt_nn_linear_nd(tape, h, q[10], q[11], &h));
  return mpt_nn_add(tape, x, h, y);
}

static mpt_status gpt_forward(mpt_model *model, mpt_tape *tape, void *vctx, mpt_var *input,
                              mpt_var **output) {
  const gpt_ctx *ctx = vctx;
  const mpt_gpt_config *c = &ctx->cfg;
  const mpt_tensor *tok = mpt_var_value(input);
  (void)model;
  MPT_RETURN_IF(mpt__lm_check_tokens("gpt", tok, c->max_seq_len));
  mpt_var *p[2 + PER_LAYER] = {0}; /* wte, wpe, then one block's (num_layers >= 1) */
  mpt_var *x = NULL, *h = NULL, *a = NULL;
  MPT_RETURN_IF(mpt_tape_param(tape, 0, &p[0]));
  MPT_RETURN_IF(mpt_tape_param(tape, 1, &p[1]));
  MPT_RETURN_IF(mpt_nn_embedding_gpt(tape, tok, c->vocab_size, p[0], p[1], &x));
  if (mpt_tape_recompute(tape)) { /* each block a checkpoint: only its input is kept */
    mpt_var *nw = NULL, *nb = NULL;
    for (int l = 0; l < c->num_layers; l++)
      MPT_RETURN_IF(mpt_tape_checkpoint(tape, gpt_block_forward, &ctx->blocks[l], x, &x));
    MPT_RETURN_IF(mpt_tape_param(tape, gpt_index(c, LNF_KIND, 0), &nw));
    MPT_RETURN_IF(mpt_tape_param(tape, gpt_index(c, LNF_KIND + 1, 0), &nb));
    MPT_RETURN_IF(mpt_nn_layernorm(tape, x, nw, nb, GPT_LN_EPS, &h));
    MPT_RETURN_IF(mpt_tape_param(tape, 0, &p[0]));
    return mpt_nn_linear_nd(tape, h, p[0], NULL, output);
  }
  /* Each residual add is fused with the LayerNorm that follows it (the next block's ln1, or
   * lnf), and the MLP's fc with its GELU: the same bits as the unfused ops (transformer.h). */
  mpt_var **q = p + FIRST_LAYER_KIND;
  for (int k = 0; k < 2; k++)
    MPT_RETURN_IF(mpt_tape_param(tape, gpt_index(c, FIRST_LAYER_KIND + k, 0), &q[k]));
  MPT_RETURN_IF(mpt_nn_layernorm(tape, x, q[0], q[1], GPT_LN_EPS, &h));
  for (int l = 0; l < c->num_layers; l++) {
    for (int k = 2; k < PER_LAYER; k++)
      MPT_RETURN_IF(mpt_tape_param(tape, gpt_index(c, FIRST_LAYER_KIND + k, l), &q[k]));
    MPT_RETURN_IF(mpt_nn_linear_nd(tape, h, q[2], q[3], &h));
    MPT_RETURN_IF(mpt_nn_causal_attention(tape, h, c->num_heads, &a));
    MPT_RETURN_IF(mpt_nn_linear_nd(tape, a, q[4], q[5], &a));
    MPT_RETURN_IF(mpt_nn_add_layernorm(tape, x, a, q[6], q[7], GPT_LN_EPS, &x, &h));
    MPT_RETURN_IF(mpt_nn_linear_gelu(tape, h, q[8], q[9], &h));
    MPT_RETURN_IF(mpt_nn_linear_nd(tape, h, q[10], q[11], &h));
    /* the next block's ln1, or lnf after the last block */
    mpt_var *nw = NULL, *nb = NULL;
    const int last = l + 1 == c->num_layers;
    MPT_RETURN_IF(mpt_tape_param(tape, last ? gpt_index(c, LNF_KIND, 0)
                                            : gpt_index(c, FIRST_LAYER_KIND, l + 1), &nw));
    MPT_RETURN_IF(mpt_tape_param(tape, last ? gpt_index(c, LNF_KIND + 1, 0)
                                            : gpt_index(c, FIRST_LAYER_KIND + 1, l + 1), &nb));
    MPT_RETURN_IF(mpt_nn_add_layernorm(tape, x, h, nw, nb, GPT_LN_EPS, &x, &h));
    q[0] = nw;
    q[1] = nb;
  }
  /* the head, tied to wte: taken again where it is used (ZeRO-3 gathers it then) */
  MPT_RETURN_IF(mpt_tape_param(tape, 0, &p[0]));
  return mpt_nn_linear_nd(tape, h, p[0], NULL, output);
}

/* Registers parameter (kind, layer) with its shape and initial value. */
static mpt_status gpt_register_one(mpt_model *m, const mpt_gpt_config *c,
                                   const mpt_gpt_layout *lay, int k, int l) {
  /* LayerNorm weights (ln1w, ln2w, lnfw) start at 1, all else at 0 (weights drawn later) */
  mpt_init_kind init = (k == 2 || k == 8 || k == 14) ? MPT_INIT_ONES : MPT_INIT_ZEROS;
  int per_layer = gpt_per_layer(k);
  int ndim = per_layer ? lay->ndim[k] - 1 : lay->ndim[k];
  const int64_t *shape = per_layer ? lay->shape[k] + 1 : lay->shape[k];
  char name[48];
  int index = -1;
  gpt_param_name(k, l, name, sizeof name);
  MPT_RETURN_IF(mpt_model_add_param(m, name, ndim, shape, init, 1, &index));
  if (index != gpt_index(c, k, l))
    return MPT_FAIL(MPT_ESTATE, "gpt: %s registered as parameter %d, expected %d", name, index,
                    gpt_index(c, k, l));
  return MPT_OK;
}

/* Registers the 12 L + 4 parameters layer-major (the top of this file). */
static mpt_status gpt_register(mpt_model *m, const mpt_gpt_config *c, const mpt_gpt_layout *lay) {
  MPT_RETURN_IF(gpt_register_one(m, c, lay, 0, 0));
  MPT_RETURN_IF(gpt_register_one(m, c, lay, 1, 0));
  for (int l = 0; l < c->num_layers; l++)
    for (int k = FIRST_LAYER_KIND; k < LNF_KIND; k++)
      MPT_RETURN_IF(gpt_register_one(m, c, lay, k, l));
  MPT_RETURN_IF(gpt_register_one(m, c, lay, LNF_KIND, 0));
  return gpt_register_one(m, c, lay, LNF_KIND + 1, 0);
}

/* The model must have the layout of `config`: 12 L + 4 parameters of its shapes. */
static mpt_status gpt_model_check(mpt_model *model, const mpt_gpt_config *config,
                                  mpt_gpt_config *c, mpt_gpt_layout *lay, const char *what) {
  if (!model || !config) return MPT_FAIL(MPT_EINVAL, "%s: NULL model or config", what);
  MPT_RETURN_IF(gpt_config_resolve(config, c, lay));
  if (mpt_model_num_params(model) != PER_LAYER * c->num_layers + 4 ||
      mpt_model_param_count(model) != lay->total || !mpt_model_params(model))
    return MPT_FAIL(MPT_ESHAPE, "%s: the model (%d parameters, %lld floats) is not a finalised "
                    "GPT of this config (%d parameters, %lld floats)", what,
                    mpt_model_num_params(model), (long long)mpt_model_param_count(model),
                    PER_LAYER * c->num_layers + 4, (long long)lay->total);
  for (int k = 0; k < MPT_GPT_NUM_TENSORS; k++)
    for (int l = 0; l < (gpt_per_layer(k) ? c->num_layers : 1); l++) {
      const mpt_param_info *pi = mpt_model_param_info(model, gpt_index(c, k, l));
      char name[48];
      gpt_param_name(k, l, name, sizeof name);
      if (strcmp(pi->name, name) != 0 || pi->count != gpt_part_count(c, lay, k))
        return MPT_FAIL(MPT_ESHAPE, "%s: parameter %d is %s of %lld floats, want %s of %lld",
                        what, gpt_index(c, k, l), pi->name, (long long)pi->count, name,
                        (long long)gpt_part_count(c, lay, k));
    }
  return MPT_OK;
}

/* A synchronous copy between the host and a device (a stream of its own, synchronised). */
static mpt_status sync_copy(mpt_device dst_dev, void *dst, mpt_device src_dev, const void *src,
                            size_t nbytes) {
  mpt_device dev = dst_dev.type != MPT_DEVICE_CPU ? dst_dev : src_dev;
  mpt_stream *stream = NULL;
  MPT_RETURN_IF(mpt_stream_init(&stream, dev, MPT_STREAM_INLINE));
  mpt_status st = mpt_op_memcpy(stream, dst_dev, dst, src_dev, src, nbytes);
  mpt_status sync = mpt_stream_synchronize(stream, GPT_SYNC_TIMEOUT_MS);
  mpt_stream_free(stream);
  return st != MPT_OK ? st : sync;
}

/* The weight kinds drawn from the normal, in the order mpt_gpt_init_weights draws them. */
static const int GPT_WEIGHTS[] = {0, 1, 4, 6, 10, 12}; /* wte wpe qkvw attprojw fcw fcprojw */
enum { GPT_NUM_WEIGHTS = 6 };

/* The stream moved past n normal draws without computing them: the kept value first, then
 * whole pairs (two generator steps each), then one pair computed when n leaves its second
 * value kept. */
static void skip_normals(gpt_draw_start *d, int64_t n) {
  if (n > 0 && d->has_spare) {
    d->has_spare = 0;
    n--;
  }
  for (int64_t i = 0; i + 1 < n; i += 2) {
    mpt_rng_next(&d->rng);
    mpt_rng_next(&d->rng);
  }
  if (n % 2) (void)mpt__lm_normal_draw(&d->rng, &d->spare, &d->has_spare);
}

/* Deferred initialisation (mpt__model_range_init): parameters [first, end) get their draws
 * from the recorded start of each weight tensor. */
static mpt_status gpt_init_range(void *vctx, mpt_model *model, int first, int end) {
  const gpt_ctx *ctx = vctx;
  const mpt_gpt_config *c = &ctx->cfg;
  mpt_gpt_layout lay;
  MPT_RETURN_IF(mpt_gpt_layout_compute(c, &lay));
  const double proj_std = GPT_INIT_STD / sqrt(2.0 * c->num_layers);
  for (int i = 0; i < GPT_NUM_WEIGHTS; i++) {
    const int k = GPT_WEIGHTS[i];
    const double std = (k == 6 || k == 12) ? proj_std : GPT_INIT_STD;
    for (int l = 0; l < (gpt_per_layer(k) ? c->num_layers : 1); l++) {
      const int p = gpt_index(c, k, l);
      if (p < first || p >= end) continue;
      gpt_draw_start d = ctx->starts[(size_t)i * (size_t)c->num_layers + (size_t)l];
      const int64_t n = gpt_part_count(c, &lay, k);
      float *w = mpt_model_params(model) + mpt_model_param_info(model, p)->offset;
      for (int64_t j = 0; j < n; j++)
        w[j] = (float)(std * mpt__lm_normal_draw(&d.rng, &d.spare, &d.has_spare));
    }
  }
  return MPT_OK;
}

/* The weights are drawn in the file's order (kind by kind, each kind layer by layer, each
 * tensor in its flat order), whatever the registration order: the values of each named
 * parameter for a seed do not depend on where it lies in the flat buffer. */
mpt_status mpt_gpt_init_weights(mpt_model *model, const mpt_gpt_config *config, uint64_t seed) {
  mpt_status st = MPT_OK;
  mpt_gpt_config c;
  mpt_gpt_layout lay;
  float *host = NULL;
  MPT_RETURN_IF(gpt_model_check(model, config, &c, &lay, "gpt init"));
  /* biases 0, LayerNorm weights 1 (as registered); bumps the model's generation */
  MPT_RETURN_IF(mpt_model_init_params(model, seed));
  mpt_device dev = mpt_model_device(model);
  int on_cpu = dev.type == MPT_DEVICE_CPU;
  static const int weights[] = {0, 1, 4, 6, 10, 12}; /* wte wpe qkvw attprojw fcw fcprojw */
  int64_t largest = 0;
  for (size_t i = 0; i < sizeof weights / sizeof weights[0]; i++)
    if (gpt_part_count(&c, &lay, weights[i]) > largest)
      largest = gpt_part_count(&c, &lay, weights[i]);
  if (!on_cpu) {
    host = malloc((size_t)largest * sizeof *host);
    if (!host) return MPT_FAIL(MPT_ENOMEM, "gpt init: %lld floats of staging", (long long)largest);
  }
  mpt_rng rng;
  mpt_rng_seed(&rng, seed);
  double spare = 0;
  int has_spare = 0;
  const double proj_std = GPT_INIT_STD / sqrt(2.0 * c.num_layers);
  for (size_t i = 0; i < sizeof weights / sizeof weights[0]; i++) {
    int k = weights[i];
    double std = (k == 6 || k == 12) ? proj_std : GPT_INIT_STD;
    const int64_t n = gpt_part_count(&c, &lay, k);
    for (int l = 0; l < (gpt_per_layer(k) ? c.num_layers : 1); l++) {
      const mpt_param_info *pi = mpt_model_param_info(model, gpt_index(&c, k, l));
      float *dst = mpt_model_params(model) + pi->offset;
      float *w = on_cpu ? dst : host;
      for (int64_t j = 0; j < n; j++)
        w[j] = (float)(std * mpt__lm_normal_draw(&rng, &spare, &has_spare));
      if (!on_cpu)
        MPT_CHECK(sync_copy(dev, dst, mpt_device_cpu(), host, (size_t)n * sizeof *host), done);
    }
  }
done:
  free(host);
  return st;
}

static mpt_status gpt_build(mpt_model **model, mpt_device device, const mpt_gpt_config *config,
                            uint64_t seed, int deferred);

mpt_status mpt_model_init_gpt(mpt_model **model, mpt_device device, const mpt_gpt_config *config,
                              uint64_t seed) {
  return gpt_build(model, device, config, seed, 0);
}

mpt_status mpt_model_init_gpt_deferred(mpt_model **model, mpt_device device,
                                       const mpt_gpt_config *config, uint64_t seed) {
  if (model) *model = NULL;
  if (device.type != MPT_DEVICE_CPU)
    return MPT_FAIL(MPT_ENOTSUP, "gpt: a deferred initialisation needs the model in host memory");
  return gpt_build(model, device, config, seed, 1);
}

/* Where each weight tensor's draws start (one pass over the stream, nothing computed but the
 * pairs cut at a tensor's end). */
static mpt_status gpt_record_starts(gpt_ctx *ctx, uint64_t seed) {
  const mpt_gpt_config *c = &ctx->cfg;
  mpt_gpt_layout lay;
  MPT_RETURN_IF(mpt_gpt_layout_compute(c, &lay));
  ctx->starts = calloc((size_t)GPT_NUM_WEIGHTS * (size_t)c->num_layers, sizeof *ctx->starts);
  if (!ctx->starts) return MPT_FAIL(MPT_ENOMEM, "gpt: the draws' starts");
  gpt_draw_start d = {.spare = 0, .has_spare = 0};
  mpt_rng_seed(&d.rng, seed);
  for (int i = 0; i < GPT_NUM_WEIGHTS; i++) {
    const int k = GPT_WEIGHTS[i];
    for (int l = 0; l < (gpt_per_layer(k) ? c->num_layers : 1); l++) {
      ctx->starts[(size_t)i * (size_t)c->num_layers + (size_t)l] = d;
      skip_normals(&d, gpt_part_count(c, &lay, k));
    }
  }
  return MPT_OK;
}

static mpt_status gpt_build(mpt_model **model, mpt_device device, const mpt_gpt_config *config,
                            uint64_t seed, int deferred) {
  mpt_status st = MPT_OK;
  mpt_model *m = NULL;
  mpt_gpt_layout lay;
  if (!model || !config) return MPT_FAIL(MPT_EINVAL, "gpt: NULL model or config");
  *model = NULL;
  gpt_ctx *ctx = calloc(1, sizeof *ctx);
  if (!ctx) return MPT_FAIL(MPT_ENOMEM, "gpt: forward context");
  st = gpt_config_resolve(config, &ctx->cfg, &lay);
  if (st == MPT_OK && !(ctx->blocks = calloc((size_t)ctx->cfg.num_layers, sizeof *ctx->blocks)))
    st = MPT_FAIL(MPT_ENOMEM, "gpt: forward context");
  for (int l = 0; st == MPT_OK && l < ctx->cfg.num_layers; l++)
    ctx->blocks[l] = (gpt_block){.cfg = &ctx->cfg, .layer = l};
  if (st == MPT_OK) st = mpt_model_init(&m, device);
  if (st != MPT_OK) {
    gpt_ctx_free(ctx);
    return st;
  }
  mpt_model_set_forward(m, gpt_forward, ctx, gpt_ctx_free);
  MPT_CHECK(gpt_register(m, &ctx->cfg, &lay), fail);
  { /* ZeRO-3's units: the embeddings, each block, the final LayerNorm */
    int *first = malloc(sizeof *first * (size_t)(ctx->cfg.num_layers + 2));
    if (!first) {
      st = MPT_FAIL(MPT_ENOMEM, "gpt: units");
      goto fail;
    }
    first[0] = 0;
    for (int l = 0; l <= ctx->cfg.num_layers; l++) first[l + 1] = FIRST_LAYER_KIND + PER_LAYER * l;
    st = mpt_model_set_units(m, ctx->cfg.num_layers + 2, first);
    free(first);
    if (st != MPT_OK) goto fail;
  }
  MPT_CHECK(mpt_model_finalize(m), fail);
  if (deferred) {
    MPT_CHECK(gpt_record_starts(ctx, seed), fail);
    MPT_CHECK(mpt__model_defer_init(m, gpt_init_range), fail);
  } else {
    MPT_CHECK(mpt_gpt_init_weights(m, &ctx->cfg, seed), fail);
  }
  *model = m;
  return MPT_OK;
fail:
  mpt_model_free(m);
  return st;
}

/* Copies every parameter between `file` (the file's parameter array, lay->total floats on the
 * host) and the model's flat buffer, one copy per tensor, matched by kind and layer (the names
 * gpt_model_check verified). to_model: file -> model, else model -> file. On a device the
 * copies are enqueued on one stream, then synchronised. */
static mpt_status gpt_transfer(mpt_model *model, const mpt_gpt_config *c,
                               const mpt_gpt_layout *lay, float *file, int to_model) {
  mpt_status st = MPT_OK;
  mpt_device dev = mpt_model_device(model), cpu = mpt_device_cpu();
  mpt_stream *stream = NULL;
  if (dev.type != MPT_DEVICE_CPU) MPT_RETURN_IF(mpt_stream_init(&stream, dev, MPT_STREAM_INLINE));
  for (int k = 0; k < MPT_GPT_NUM_TENSORS; k++)
    for (int l = 0; l < (gpt_per_layer(k) ? c->num_layers : 1); l++) {
      const mpt_param_info *pi = mpt_model_param_info(model, gpt_index(c, k, l));
      float *f = file + gpt_file_offset(c, lay, k, l), *p = mpt_model_params(model) + pi->offset;
      const size_t nbytes = (size_t)pi->count * sizeof *f;
      if (!stream)
        memcpy(to_model ? p : f, to_model ? f : p, nbytes);
      else if (to_model)
        MPT_CHECK(mpt_op_memcpy(stream, dev, p, cpu, f, nbytes), done);
      else
        MPT_CHECK(mpt_op_memcpy(stream, cpu, f, dev, p, nbytes), done);
    }
done:
  if (stream) {
    mpt_status sync = mpt_stream_synchronize(stream, GPT_SYNC_TIMEOUT_MS);
    if (st == MPT_OK) st = sync;
    mpt_stream_free(stream);
  }
  return st;
}

mpt_status mpt_gpt_params_copy(mpt_model *model, const mpt_gpt_config *config, float *flat,
                               int to_model) {
  mpt_gpt_config c;
  mpt_gpt_layout lay;
  MPT_RETURN_IF(gpt_model_check(model, config, &c, &lay, "GPT parameters"));
  if (!flat) return MPT_OK;
  MPT_RETURN_IF(gpt_transfer(model, &c, &lay, flat, to_model));
  if (to_model) mpt__model_init_clear(model); /* every value written from flat */
  return MPT_OK;
}
