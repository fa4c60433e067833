/* GPT-2 models as Hugging Face safetensors + config.json (include/mpitrain/safetensors.h): the
 * names and transposes between transformers' GPT2LMHeadModel and llm.c's parameter order.
 *
 * Invariants: config.json and every tensor's presence, dtype and shape are checked before the
 * caller's buffer is written; tensors are read one at a time, the Conv1D weights through a
 * staging buffer of one layer's matrix (transposed into place). Runs on the calling thread. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/st_model.h"
#include "mpitrain/safetensors.h"

#define GPT_ST_PATH_MAX MPT__ST_PATH_MAX

/* One Hugging Face tensor and where it lies in llm.c's flat parameter array. */
typedef struct entry {
  char name[64];     /* without the prefix */
  int ndim;          /* 1 or 2 */
  int64_t shape[2];  /* the file's shape */
  int transpose;     /* the file holds [cols, rows] of mpitrain's [rows, cols] */
  int64_t rows, cols;
  int64_t offset;    /* first float in the flat array */
  int64_t count;     /* floats in the file (wte: V x C of Vp x C) */
} entry;

/* The 4 + 12 L entries for config c (valid, layout computed). */
static entry *gpt_entries(const mpt_gpt_config *c, const mpt_gpt_layout *lay, int *n_out) {
  const int L = c->num_layers;
  const int64_t C = c->channels;
  entry *e = calloc((size_t)(4 + 12 * L), sizeof *e);
  if (!e) return NULL;
  int n = 0;
  e[n++] = (entry){.name = "wte.weight", .ndim = 2, .shape = {c->vocab_size, C}, .offset = 0,
                   .count = c->vocab_size * C};
  e[n++] = (entry){.name = "wpe.weight", .ndim = 2, .shape = {c->max_seq_len, C},
                   .offset = lay->offset[1], .count = lay->count[1]};
  /* llm.c tensors 2..13 in the file's order; rows, cols of mpitrain's [out, in] weights */
  static const struct { int k; const char *suffix; int transpose; int rows4, cols4; } per[12] = {
      {2, "ln_1.weight", 0, 0, 0}, {3, "ln_1.bias", 0, 0, 0},
      {4, "attn.c_attn.weight", 1, 12, 4}, {5, "attn.c_attn.bias", 0, 0, 0},
      {6, "attn.c_proj.weight", 1, 4, 4}, {7, "attn.c_proj.bias", 0, 0, 0},
      {8, "ln_2.weight", 0, 0, 0}, {9, "ln_2.bias", 0, 0, 0},
      {10, "mlp.c_fc.weight", 1, 16, 4}, {11, "mlp.c_fc.bias", 0, 0, 0},
      {12, "mlp.c_proj.weight", 1, 4, 16}, {13, "mlp.c_proj.bias", 0, 0, 0}};
  for (int l = 0; l < L; l++)
    for (int j = 0; j < 12; j++) {
      entry *x = &e[n++];
      const int k = per[j].k;
      snprintf(x->name, sizeof x->name, "h.%d.%s", l, per[j].suffix);
      x->count = lay->count[k] / L;
      x->offset = lay->offset[k] + l * x->count;
      x->transpose = per[j].transpose;
      if (x->transpose) {
        x->rows = per[j].rows4 * C / 4;
        x->cols = per[j].cols4 * C / 4;
        x->ndim = 2;
        x->shape[0] = x->cols;
        x->shape[1] = x->rows;
      } else {
        x->ndim = 1;
        x->shape[0] = x->count;
      }
    }
  e[n++] = (entry){.name = "ln_f.weight", .ndim = 1, .shape = {C}, .offset = lay->offset[14],
                   .count = C};
  e[n++] = (entry){.name = "ln_f.bias", .ndim = 1, .shape = {C}, .offset = lay->offset[15],
                   .count = C};
  *n_out = n;
  return e;
}

int mpt_gpt_st_is_path(const char *path) { return mpt_st_is_model_path(path); }

static mpt_status read_config(const char *cfg_path, const char *model, mpt_gpt_config *c,
                              char dtype[12]) {
  mpt__json *root = NULL;
  MPT_RETURN_IF(mpt__st_config_read(cfg_path, model, "n_layer, n_head, n_embd, n_positions, "
                                    "vocab_size", &root));
  mpt_status st = MPT_OK;
  const char *keys[5] = {"n_positions", "vocab_size", "n_layer", "n_head", "n_embd"};
  int *fields[5] = {&c->max_seq_len, &c->vocab_size, &c->num_layers, &c->num_heads, &c->channels};
  for (int k = 0; k < 5; k++) {
    int64_t v;
    const char *key = k == 0 && !mpt__json_get(root, keys[0]) && mpt__json_get(root, "n_ctx")
                          ? "n_ctx" : keys[k];
    MPT_CHECK(mpt__st_config_int(root, cfg_path, key, 1, 1 << 30, NULL, &v), out);
    *fields[k] = (int)v;
  }
  MPT_CHECK(mpt__st_config_dtype(root, cfg_path, dtype), out);
  /* what mpitrain's GPT-2 computes with, fixed (src/nn/gpt.c): a config asking for another
   * LayerNorm epsilon, activation or an untied head is refused rather than run differently */
  double eps;
  const double eps0 = 1e-5;
  MPT_CHECK(mpt__st_config_num(root, cfg_path, "layer_norm_epsilon", 0, 1, &eps0, &eps), out);
  if (fabs(eps - eps0) > 1e-6 * eps0) {
    st = MPT_FAIL(MPT_EFORMAT, "model config '%s': layer_norm_epsilon %g is not 1e-05, the "
                  "GPT-2 LayerNorm's: a model trained with another would not compute the same",
                  cfg_path, eps);
    goto out;
  }
  const mpt__json *v = mpt__json_get(root, "activation_function");
  if (v && (v->type != MPT__JSON_STRING ||
            (strcmp(v->s, "gelu_new") != 0 && strcmp(v->s, "gelu_pytorch_tanh") != 0))) {
    st = MPT_FAIL(MPT_EFORMAT, "model config '%s': activation_function %.40s is not "
                  "\"gelu_new\" (the GPT-2 MLP's tanh GELU)", cfg_path,
                  v->type == MPT__JSON_STRING ? v->s : "(not a string)");
    goto out;
  }
  v = mpt__json_get(root, "tie_word_embeddings");
  if (v && (v->type != MPT__JSON_BOOL || !v->i)) {
    st = MPT_FAIL(MPT_EFORMAT, "model config '%s': tie_word_embeddings is not true: the GPT-2's "
                  "head is its token embedding (wte), an untied lm_head is not implemented",
                  cfg_path);
    goto out;
  }
  c->padded_vocab_size = (int)mpt_gpt_padded_vocab(c->vocab_size);
  mpt_gpt_layout lay;
  if (mpt_gpt_layout_compute(c, &lay) != MPT_OK) {
    char why[256];
    snprintf(why, sizeof why, "%s", mpt_last_error());
    st = MPT_FAIL(MPT_EFORMAT, "model config '%s': %s", cfg_path, why);
  }
out:
  mpt__json_free(root);
  return st;
}

/* name without the prefix is a tensor transformers holds that mpitrain does not read. */
static int ignorable(const char *name) {
  if (strcmp(name, "lm_head.weight") == 0) return 1;
  if (strncmp(name, "h.", 2) != 0) return 0;
  const char *p = name + 2;
  if (!(*p >= '0' && *p <= '9')) return 0;
  while (*p >= '0' && *p <= '9') p++;
  return strcmp(p, ".attn.bias") == 0 || strcmp(p, ".attn.masked_bias") == 0;
}

/* Opens and checks the model at path: *f open, *entries (free) with *n, *prefix. */
static mpt_status open_model(const char *path, mpt_gpt_config *c, mpt_gpt_layout *lay,
                             mpt_st_file **f, entry **entries, int *n, const char **prefix) {
  char st_path[GPT_ST_PATH_MAX], cfg_path[GPT_ST_PATH_MAX], dtype[12];
  *f = NULL;
  *entries = NULL;
  memset(c, 0, sizeof *c);
  MPT_RETURN_IF(mpt_st_model_paths(path, st_path, cfg_path, sizeof st_path));
  MPT_RETURN_IF(read_config(cfg_path, path, c, dtype));
  MPT_RETURN_IF(mpt_gpt_layout_compute(c, lay));
  MPT_RETURN_IF(mpt_st_open_model(path, f));
  mpt_status st = MPT_OK;
  if (!(*entries = gpt_entries(c, lay, n))) {
    st = MPT_FAIL(MPT_ENOMEM, "safetensors model '%s': tensor list", path);
    goto fail;
  }
  *prefix = mpt_st_find(*f, "wte.weight") || !mpt_st_find(*f, "transformer.wte.weight")
                ? "" : "transformer.";
  const size_t pn = strlen(*prefix);
  char full[96];
  for (int i = 0; i < *n; i++) {
    const entry *x = &(*entries)[i];
    snprintf(full, sizeof full, "%s%s", *prefix, x->name);
    const mpt_st_tensor *t = mpt_st_find(*f, full);
    if (!t) {
      st = MPT_FAIL(MPT_EFORMAT, "safetensors file '%s' has no tensor '%s' (config '%s': %d "
                    "layers)", st_path, full, cfg_path, c->num_layers);
      goto fail;
    }
    MPT_CHECK(mpt__st_check_tensor(*f, t, x->ndim, x->shape, dtype, cfg_path), fail);
  }
  for (int i = 0; i < mpt_st_num_tensors(*f); i++) {
    const mpt_st_tensor *t = mpt_st_tensor_at(*f, i);
    const char *name = t->name;
    const char *bare = strncmp(name, *prefix, pn) == 0 ? name + pn : NULL;
    int known = strcmp(name, "lm_head.weight") == 0 || (bare && ignorable(bare));
    for (int k = 0; k < *n && !known && bare; k++) known = strcmp((*entries)[k].name, bare) == 0;
    if (!known) {
      st = MPT_FAIL(MPT_EFORMAT, "safetensors file '%s' holds tensor '%s', which is not a GPT-2 "
                    "(GPT2LMHeadModel) parameter of this config (%d layers)",
                    mpt_st_shard_path(*f, t->shard), name, c->num_layers);
      goto fail;
    }
  }
  return MPT_OK;
fail:
  free(*entries);
  *entries = NULL;
  mpt_st_close(*f);
  *f = NULL;
  return st;
}

mpt_status mpt_gpt_st_read_header(const char *path, mpt_gpt_config *config) {
  if (!path || !config) return MPT_FAIL(MPT_EINVAL, "mpt_gpt_st_read_header: NULL argument");
  memset(config, 0, sizeof *config);
  mpt_gpt_config c;
  mpt_gpt_layout lay;
  mpt_st_file *f;
  entry *e;
  int n;
  const char *prefix;
  MPT_RETURN_IF(open_model(path, &c, &lay, &f, &e, &n, &prefix));
  free(e);
  mpt_st_close(f);
  *config = c;
  return MPT_OK;
}

mpt_status mpt_gpt_st_read(const char *path, const mpt_gpt_config *expect,
                           mpt_gpt_config *config, float *params, int64_t capacity) {
  if (!path || !params) return MPT_FAIL(MPT_EINVAL, "mpt_gpt_st_read: NULL argument");
  mpt_gpt_config c;
  mpt_gpt_layout lay;
  mpt_st_file *f;
  entry *e;
  int n;
  const char *prefix;
  MPT_RETURN_IF(open_model(path, &c, &lay, &f, &e, &n, &prefix));
  mpt_status st = MPT_OK;
  float *stage = NULL;
  if (expect) {
    const struct { const char *name; int file, want; } fl[] = {
        {"max sequence length", c.max_seq_len, expect->max_seq_len},
        {"vocabulary size", c.vocab_size, expect->vocab_size},
        {"layers", c.num_layers, expect->num_layers},
        {"heads", c.num_heads, expect->num_heads},
        {"channels", c.channels, expect->channels}};
    for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++)
      if (fl[i].want != 0 && fl[i].file != fl[i].want) {
        st = MPT_FAIL(MPT_ESHAPE, "safetensors model '%s' has %s %d, the model expects %d", path,
                      fl[i].name, fl[i].file, fl[i].want);
        goto out;
      }
    /* the padding is not in the file: the model's own padded vocabulary is used */
    if (expect->padded_vocab_size) {
      c.padded_vocab_size = expect->padded_vocab_size;
      MPT_CHECK(mpt_gpt_layout_compute(&c, &lay), out);
      free(e);
      if (!(e = gpt_entries(&c, &lay, &n))) {
        st = MPT_FAIL(MPT_ENOMEM, "safetensors model '%s': tensor list", path);
        goto out;
      }
    }
  }
  if (lay.total > capacity) {
    st = MPT_FAIL(MPT_ESHAPE, "safetensors model '%s' holds %lld parameters, the buffer %lld",
                  path, (long long)lay.total, (long long)capacity);
    goto out;
  }
  int64_t max_stage = 0;
  for (int i = 0; i < n; i++)
    if (e[i].transpose && e[i].count > max_stage) max_stage = e[i].count;
  if (!(stage = malloc((size_t)(max_stage ? max_stage : 1) * sizeof *stage))) {
    st = MPT_FAIL(MPT_ENOMEM, "safetensors model '%s': staging", path);
    goto out;
  }
  char full[96];
  for (int i = 0; i < n; i++) {
    const entry *x = &e[i];
    snprintf(full, sizeof full, "%s%s", prefix, x->name);
    const mpt_st_tensor *t = mpt_st_find(f, full);
    if (!x->transpose) {
      MPT_CHECK(mpt_st_read_f32(f, t, params + x->offset, x->count), out);
      continue;
    }
    MPT_CHECK(mpt_st_read_f32(f, t, stage, x->count), out);
    float *dst = params + x->offset; /* [rows, cols] from the file's [cols, rows] */
    for (int64_t r = 0; r < x->rows; r++)
      for (int64_t k = 0; k < x->cols; k++) dst[r * x->cols + k] = stage[k * x->rows + r];
  }
  /* wte's padded rows (no token has them; their logits are masked) */
  memset(params + (int64_t)c.vocab_size * c.channels, 0,
         (size_t)(c.padded_vocab_size - c.vocab_size) * (size_t)c.channels * sizeof *params);
  if (config) *config = c;
out:
  free(stage);
  free(e);
  mpt_st_close(f);
  return st;
}

typedef struct write_ctx {
  const entry *e;
  const float *params;
} write_ctx;

static mpt_status fill_entry(void *ctx, int i, float *dst) {
  const write_ctx *w = ctx;
  const entry *x = &w->e[i];
  const float *src = w->params + x->offset;
  if (!x->transpose) {
    memcpy(dst, src, (size_t)x->count * sizeof *dst);
    return MPT_OK;
  }
  for (int64_t k = 0; k < x->cols; k++) /* the file's [cols, rows] */
    for (int64_t r = 0; r < x->rows; r++) dst[k * x->rows + r] = src[r * x->cols + k];
  return MPT_OK;
}

mpt_status mpt_gpt_st_write(const char *path, const mpt_gpt_config *config, const float *params,
                            const mpt_st_save_options *opts) {
  if (!path || !config || !params) return MPT_FAIL(MPT_EINVAL, "mpt_gpt_st_write: NULL argument");
  const mpt_st_save_options o = opts ? *opts : mpt_st_save_options_default();
  mpt_gpt_config c = *config;
  if (!c.padded_vocab_size) c.padded_vocab_size = (int)mpt_gpt_padded_vocab(c.vocab_size);
  mpt_gpt_layout lay;
  MPT_RETURN_IF(mpt_gpt_layout_compute(&c, &lay));
  int n;
  entry *e = gpt_entries(&c, &lay, &n);
  mpt_st_write_tensor *t = calloc((size_t)n + 1, sizeof *t);
  mpt_status st = MPT_OK;
  if (!e || !t) {
    st = MPT_FAIL(MPT_ENOMEM, "safetensors model write %s: tensor list", path);
    goto out;
  }
  for (int i = 0; i < n; i++) {
    t[i].name = e[i].name;
    t[i].ndim = e[i].ndim;
    t[i].shape[0] = e[i].shape[0];
    t[i].shape[1] = e[i].shape[1];
  }
  static const char *const meta[2] = {"format", "pt"};
  write_ctx w = {.e = e, .params = params};
  char json[600];
  snprintf(json, sizeof json,
           "{\n  \"activation_function\": \"gelu_new\",\n"
           "  \"architectures\": [\"GPT2LMHeadModel\"],\n"
           "  \"layer_norm_epsilon\": 1e-05,\n  \"model_type\": \"gpt2\",\n"
           "  \"n_ctx\": %d,\n  \"n_embd\": %d,\n  \"n_head\": %d,\n"
           "  \"n_layer\": %d,\n  \"n_positions\": %d,\n"
           "  \"tie_word_embeddings\": true,\n  \"torch_dtype\": \"%s\",\n"
           "  \"vocab_size\": %d\n}\n",
           c.max_seq_len, c.channels, c.num_heads, c.num_layers, c.max_seq_len,
           mpt__st_torch_dtype(o.dtype), c.vocab_size);
  MPT_CHECK(mpt_st_write_model(path, t, n, meta, 1, json, &o, fill_entry, &w), out);
out:
  free(t);
  free(e);
  return st;
}
