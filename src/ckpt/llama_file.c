/* Llama models as Hugging Face safetensors (include/mpitrain/llama_file.h): config.json <->
 * mpt_llama_config, and the model's parameters read and written by their Hugging Face names.
 *
 * Invariants: config.json and every tensor's presence, dtype and shape are checked before a
 * parameter is written; tensors are read one at a time through a host staging buffer of the
 * largest one. The model's names are llama.h's, which are transformers' LlamaForCausalLM
 * names, so the file's tensors map one to one (no transposes). Runs on the calling thread. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/st_model.h"
#include "mpitrain/llama_file.h"
#include "mpitrain/ops.h"

#define LLAMA_SYNC_TIMEOUT_MS 600000
#define LLAMA_NEEDS "hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, " \
                    "vocab_size, max_position_embeddings"

/* Tensor i of a Llama of config c (llama.h's order): its name and shape. */
static void llama_tensor(const mpt_llama_config *c, int i, char *name, size_t cap,
                         int *ndim, int64_t shape[2]) {
  const int64_t C = c->dim, hd = c->dim / c->n_heads, F = c->ffn_dim, V = c->vocab_size;
  const int nl = 9 * c->n_layers;
  *ndim = 2;
  if (i == 0) {
    snprintf(name, cap, "model.embed_tokens.weight");
    shape[0] = V, shape[1] = C;
    return;
  }
  if (i == 1 + nl) {
    snprintf(name, cap, "model.norm.weight");
    *ndim = 1, shape[0] = C;
    return;
  }
  if (i == 2 + nl) {
    snprintf(name, cap, "lm_head.weight");
    shape[0] = V, shape[1] = C;
    return;
  }
  static const char *const suffix[9] = {
      "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
      "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
      "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"};
  const int l = (i - 1) / 9, k = (i - 1) % 9;
  snprintf(name, cap, "model.layers.%d.%s", l, suffix[k]);
  const int64_t rows[9] = {C, c->n_heads * hd, c->n_kv_heads * hd, c->n_kv_heads * hd, C, C,
                           F, F, C};
  const int64_t cols[9] = {0, C, C, C, c->n_heads * hd, 0, C, C, F};
  shape[0] = rows[k];
  shape[1] = cols[k];
  if (!cols[k]) *ndim = 1;
}

/* A tensor transformers may hold that mpitrain does not read: the rotary inverse frequencies
 * older files saved, and, when tied, lm_head.weight. */
static int ignorable(const mpt_llama_config *c, const char *name) {
  if (c->tied_embeddings && strcmp(name, "lm_head.weight") == 0) return 1;
  if (strncmp(name, "model.layers.", 13) != 0) return 0;
  const char *p = name + 13;
  if (!(*p >= '0' && *p <= '9')) return 0;
  while (*p >= '0' && *p <= '9') p++;
  return strcmp(p, ".self_attn.rotary_emb.inv_freq") == 0;
}

static int json_true(const mpt__json *v) { return v && v->type == MPT__JSON_BOOL && v->i; }

/* A RoPE scaling object (rope_scaling, or transformers 5's rope_parameters) into *out: its
 * rope_type (or the older "type"; absent or "default": none) and, for "llama3", its four
 * numbers, all required. Other types are refused, named. */
static mpt_status read_scaling(const mpt__json *v, const char *cfg_path, const char *what,
                               mpt_rope_scaling *out) {
  memset(out, 0, sizeof *out);
  if (v->type != MPT__JSON_OBJECT)
    return MPT_FAIL(MPT_EFORMAT, "model config '%s': %s is not an object or null", cfg_path,
                    what);
  const mpt__json *t = mpt__json_get(v, "rope_type");
  if (!t) t = mpt__json_get(v, "type");
  if (t && t->type != MPT__JSON_STRING)
    return MPT_FAIL(MPT_EFORMAT, "model config '%s': %s's rope_type is not a string", cfg_path,
                    what);
  if (!t || strcmp(t->s, "default") == 0) return MPT_OK;
  if (strcmp(t->s, "llama3") != 0)
    return MPT_FAIL(MPT_EFORMAT, "model config '%s': %s of rope_type '%.40s' is not "
                    "implemented (mpitrain's RoPE is the unscaled one or Llama 3's \"llama3\" "
                    "scaling): a model trained with it would not compute the same", cfg_path,
                    what, t->s);
  double factor, lo, hi;
  int64_t ctx;
  MPT_RETURN_IF(mpt__st_config_num(v, cfg_path, "factor", 1, 1e30, NULL, &factor));
  MPT_RETURN_IF(mpt__st_config_num(v, cfg_path, "low_freq_factor", 0, 1e30, NULL, &lo));
  MPT_RETURN_IF(mpt__st_config_num(v, cfg_path, "high_freq_factor", 0, 1e30, NULL, &hi));
  MPT_RETURN_IF(mpt__st_config_int(v, cfg_path, "original_max_position_embeddings", 1,
                                   INT32_MAX, NULL, &ctx));
  *out = (mpt_rope_scaling){.type = MPT_ROPE_LLAMA3, .factor = (float)factor,
                            .low_freq_factor = (float)lo, .high_freq_factor = (float)hi,
                            .original_max_position_embeddings = (int)ctx};
  if (mpt_rope_scaling_check(out) != MPT_OK)
    return MPT_FAIL(MPT_EFORMAT, "model config '%s': %s's llama3 numbers (factor %g >= 1, "
                    "low_freq_factor %g > 0, high_freq_factor %g > low_freq_factor) are out of "
                    "range", cfg_path, what, factor, lo, hi);
  return MPT_OK;
}

static mpt_status read_config(const char *cfg_path, const char *model, mpt_llama_config *c,
                              char dtype[12]) {
  mpt__json *root = NULL;
  MPT_RETURN_IF(mpt__st_config_read(cfg_path, model, LLAMA_NEEDS, &root));
  mpt_status st = MPT_OK;
  memset(c, 0, sizeof *c);
  const mpt__json *v = mpt__json_get(root, "model_type");
  if (v && (v->type != MPT__JSON_STRING || strcmp(v->s, "llama") != 0)) {
    st = MPT_FAIL(MPT_EFORMAT, "model config '%s': model_type %s%.40s%s is not \"llama\" (a "
                  "LlamaForCausalLM config is read)", cfg_path,
                  v->type == MPT__JSON_STRING ? "'" : "",
                  v->type == MPT__JSON_STRING ? v->s : "(not a string)",
                  v->type == MPT__JSON_STRING ? "'" : "");
    goto out;
  }
  static const char *const keys[6] = {"vocab_size", "hidden_size", "num_hidden_layers",
                                      "num_attention_heads", "intermediate_size",
                                      "max_position_embeddings"};
  int *fields[6] = {&c->vocab_size, &c->dim, &c->n_layers, &c->n_heads, &c->ffn_dim,
                    &c->max_seq_len};
  for (int k = 0; k < 6; k++) {
    int64_t x;
    MPT_CHECK(mpt__st_config_int(root, cfg_path, keys[k], 1, INT32_MAX, NULL, &x), out);
    *fields[k] = (int)x;
  }
  int64_t kv, heads = c->n_heads;
  MPT_CHECK(mpt__st_config_int(root, cfg_path, "num_key_value_heads", 1, INT32_MAX, &heads,
                               &kv), out);
  c->n_kv_heads = (int)kv;
  if (c->n_heads % c->n_kv_heads != 0) {
    st = MPT_FAIL(MPT_EFORMAT, "model config '%s': num_attention_heads %d is not a multiple of "
                  "num_key_value_heads %d (each key/value head serves a whole group of query "
                  "heads)", cfg_path, c->n_heads, c->n_kv_heads);
    goto out;
  }
  v = mpt__json_get(root, "head_dim");
  if (v && v->type != MPT__JSON_NULL &&
      (v->type != MPT__JSON_NUMBER || !v->is_int || c->dim % c->n_heads != 0 ||
       v->i != c->dim / c->n_heads)) {
    st = MPT_FAIL(MPT_EFORMAT, "model config '%s': head_dim is not hidden_size / "
                  "num_attention_heads (%d / %d): another head size is not implemented",
                  cfg_path, c->dim, c->n_heads);
    goto out;
  }
  double theta, eps;
  const double theta0 = 10000, eps0 = 1e-6;
  MPT_CHECK(mpt__st_config_num(root, cfg_path, "rope_theta", 1, 1e30, &theta0, &theta), out);
  /* transformers 5 writes the RoPE as rope_parameters {"rope_theta": ..., "rope_type": ...,
   * and the type's numbers}; transformers 4 as rope_theta and rope_scaling */
  v = mpt__json_get(root, "rope_parameters");
  mpt_rope_scaling sp = {0}, ss = {0};
  int has_s = 0; /* rope_scaling given (not null) */
  if (v && v->type != MPT__JSON_NULL) {
    MPT_CHECK(read_scaling(v, cfg_path, "rope_parameters", &sp), out);
    double t2;
    MPT_CHECK(mpt__st_config_num(v, cfg_path, "rope_theta", 1, 1e30, &theta, &t2), out);
    if (mpt__json_get(root, "rope_theta") && t2 != theta) {
      st = MPT_FAIL(MPT_EFORMAT, "model config '%s': rope_theta %g and rope_parameters' "
                    "rope_theta %g differ", cfg_path, theta, t2);
      goto out;
    }
    theta = t2;
  }
  v = mpt__json_get(root, "rope_scaling");
  if (v && v->type != MPT__JSON_NULL) {
    MPT_CHECK(read_scaling(v, cfg_path, "rope_scaling", &ss), out);
    has_s = 1;
  }
  /* as transformers 5: a non-null rope_scaling replaces rope_parameters */
  c->rope_scaling = has_s ? ss : sp;
  MPT_CHECK(mpt__st_config_num(root, cfg_path, "rms_norm_eps", 0, 1, &eps0, &eps), out);
  c->rope_theta = (float)theta;
  c->norm_eps = (float)eps;
  v = mpt__json_get(root, "tie_word_embeddings");
  if (v && v->type != MPT__JSON_BOOL) {
    st = MPT_FAIL(MPT_EFORMAT, "model config '%s': tie_word_embeddings is not true or false",
                  cfg_path);
    goto out;
  }
  c->tied_embeddings = json_true(v);
  v = mpt__json_get(root, "hidden_act");
  if (v && (v->type != MPT__JSON_STRING || strcmp(v->s, "silu") != 0)) {
    st = MPT_FAIL(MPT_EFORMAT, "model config '%s': hidden_act %.40s is not \"silu\" (the "
                  "SwiGLU MLP's)", cfg_path, v->type == MPT__JSON_STRING ? v->s : "?");
    goto out;
  }
  static const char *const biases[2] = {"attention_bias", "mlp_bias"};
  for (int k = 0; k < 2; k++)
    if (json_true(mpt__json_get(root, biases[k]))) {
      st = MPT_FAIL(MPT_EFORMAT, "model config '%s': %s is true; the Llama has no biases",
                    cfg_path, biases[k]);
      goto out;
    }
  MPT_CHECK(mpt__st_config_dtype(root, cfg_path, dtype), out);
  if (mpt_llama_config_check(c) != MPT_OK) {
    char why[256];
    snprintf(why, sizeof why, "%s", mpt_last_error());
    st = MPT_FAIL(MPT_EFORMAT, "model config '%s': %s", cfg_path, why);
  }
out:
  mpt__json_free(root);
  return st;
}

/* Opens and checks the Llama at path: *c its config, *f its tensors (close). */
static mpt_status open_llama(const char *path, mpt_llama_config *c, mpt_st_file **f) {
  char st_path[MPT__ST_PATH_MAX], cfg_path[MPT__ST_PATH_MAX], dtype[12];
  *f = NULL;
  MPT_RETURN_IF(mpt_st_model_paths(path, st_path, cfg_path, sizeof st_path));
  MPT_RETURN_IF(read_config(cfg_path, path, c, dtype));
  MPT_RETURN_IF(mpt_st_open_model(path, f));
  mpt_status st = MPT_OK;
  const int n = mpt_llama_num_tensors(c);
  char name[96];
  int ndim;
  int64_t shape[2];
  for (int i = 0; i < n; i++) {
    llama_tensor(c, i, name, sizeof name, &ndim, shape);
    const mpt_st_tensor *t = mpt_st_find(*f, name);
    if (!t) {
      st = MPT_FAIL(MPT_EFORMAT, "safetensors model '%s' has no tensor '%s' (config '%s': %d "
                    "layers, %s head)", path, name, cfg_path, c->n_layers,
                    c->tied_embeddings ? "tied" : "untied");
      goto fail;
    }
    MPT_CHECK(mpt__st_check_tensor(*f, t, ndim, shape, dtype, cfg_path), fail);
  }
  for (int i = 0; i < mpt_st_num_tensors(*f); i++) {
    const mpt_st_tensor *t = mpt_st_tensor_at(*f, i);
    int known = ignorable(c, t->name);
    for (int k = 0; k < n && !known; k++) {
      llama_tensor(c, k, name, sizeof name, &ndim, shape);
      known = strcmp(name, t->name) == 0;
    }
    if (!known) {
      st = MPT_FAIL(MPT_EFORMAT, "safetensors file '%s' holds tensor '%s', which is not a "
                    "LlamaForCausalLM parameter of this config (%d layers, %s head)",
                    mpt_st_shard_path(*f, t->shard), t->name, c->n_layers,
                    c->tied_embeddings ? "tied" : "untied");
      goto fail;
    }
  }
  return MPT_OK;
fail:
  mpt_st_close(*f);
  *f = NULL;
  return st;
}

int mpt_llama_st_is_model(const char *path) {
  char st_path[MPT__ST_PATH_MAX], cfg_path[MPT__ST_PATH_MAX];
  mpt__json *root = NULL;
  if (!path || !mpt_st_is_model_path(path)) return 0;
  /* a folder without its tensors still has a config (the readers say what is missing) */
  if (mpt_st_model_paths(path, st_path, cfg_path, sizeof st_path) != MPT_OK &&
      snprintf(cfg_path, sizeof cfg_path, "%s/config.json", path) >= (int)sizeof cfg_path)
    return 0;
  int yes = 0;
  if (mpt__st_config_read(cfg_path, path, LLAMA_NEEDS, &root) == MPT_OK) {
    const mpt__json *t = mpt__json_get(root, "model_type");
    const mpt__json *a = mpt__json_get(root, "architectures");
    yes = t && t->type == MPT__JSON_STRING && strcmp(t->s, "llama") == 0;
    for (int i = 0; a && a->type == MPT__JSON_ARRAY && i < a->n && !yes; i++)
      yes = a->items[i].type == MPT__JSON_STRING &&
            strcmp(a->items[i].s, "LlamaForCausalLM") == 0;
  }
  mpt__json_free(root);
  return yes;
}

mpt_status mpt_llama_st_read_header(const char *path, mpt_llama_config *config) {
  if (!path || !config) return MPT_FAIL(MPT_EINVAL, "mpt_llama_st_read_header: NULL argument");
  mpt_llama_config c;
  mpt_st_file *f;
  MPT_RETURN_IF(open_llama(path, &c, &f));
  mpt_st_close(f);
  *config = c;
  return MPT_OK;
}

/* x with the fewest significant digits (6 to 9) that read back as the same float. */
static void shortest(char *out, size_t cap, float x) {
  for (int p = 6; p <= 9; p++) {
    snprintf(out, cap, "%.*g", p, (double)x);
    if (strtof(out, NULL) == x) break;
  }
  if (!strpbrk(out, ".eEn")) snprintf(out + strlen(out), cap - strlen(out), ".0");
}

mpt_status mpt_llama_st_config_json(const mpt_llama_config *config, mpt_st_dtype dtype,
                                    char *buf, size_t cap) {
  if (!config || !buf) return MPT_FAIL(MPT_EINVAL, "mpt_llama_st_config_json: NULL argument");
  MPT_RETURN_IF(mpt_llama_config_check(config));
  const mpt_llama_config *c = config;
  char theta[32], eps[32], sc[4][32], extra[256] = "", scaling[256] = "null";
  shortest(theta, sizeof theta, c->rope_theta);
  shortest(eps, sizeof eps, c->norm_eps);
  const mpt_rope_scaling *r = &c->rope_scaling;
  if (r->type == MPT_ROPE_LLAMA3) { /* the same numbers in both spellings */
    shortest(sc[0], sizeof sc[0], r->factor);
    shortest(sc[1], sizeof sc[1], r->high_freq_factor);
    shortest(sc[2], sizeof sc[2], r->low_freq_factor);
    snprintf(extra, sizeof extra, "\"factor\": %s, \"high_freq_factor\": %s, "
             "\"low_freq_factor\": %s, \"original_max_position_embeddings\": %d, ", sc[0],
             sc[1], sc[2], r->original_max_position_embeddings);
    snprintf(scaling, sizeof scaling, "{%s\"rope_type\": \"llama3\"}", extra);
  }
  const int n = snprintf(
      buf, cap,
      "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"attention_bias\": false,\n"
      "  \"head_dim\": %d,\n  \"hidden_act\": \"silu\",\n  \"hidden_size\": %d,\n"
      "  \"initializer_range\": 0.02,\n  \"intermediate_size\": %d,\n"
      "  \"max_position_embeddings\": %d,\n  \"mlp_bias\": false,\n  \"model_type\": \"llama\",\n"
      "  \"num_attention_heads\": %d,\n  \"num_hidden_layers\": %d,\n"
      "  \"num_key_value_heads\": %d,\n  \"rms_norm_eps\": %s,\n"
      "  \"rope_parameters\": {%s\"rope_theta\": %s, \"rope_type\": \"%s\"},\n"
      "  \"rope_scaling\": %s,\n  \"rope_theta\": %s,\n  \"tie_word_embeddings\": %s,\n"
      "  \"torch_dtype\": \"%s\",\n"
      "  \"use_cache\": true,\n  \"vocab_size\": %d\n}\n",
      c->dim / c->n_heads, c->dim, c->ffn_dim, c->max_seq_len, c->n_heads, c->n_layers,
      c->n_kv_heads, eps, extra, theta, r->type == MPT_ROPE_LLAMA3 ? "llama3" : "default",
      scaling, theta, c->tied_embeddings ? "true" : "false",
      mpt__st_torch_dtype(dtype), c->vocab_size);
  if (n < 0 || (size_t)n >= cap)
    return MPT_FAIL(MPT_EINVAL, "mpt_llama_st_config_json: %zu bytes is too small", cap);
  return MPT_OK;
}

/* Copies count floats between the host and the model's parameter memory at `offset`. */
static mpt_status transfer(mpt_model *model, mpt_stream *stream, int64_t offset, float *host,
                           int64_t count, int to_model) {
  float *p = mpt_model_params(model) + offset;
  const size_t nbytes = (size_t)count * sizeof *host;
  if (!stream) {
    memcpy(to_model ? p : host, to_model ? host : p, nbytes);
    return MPT_OK;
  }
  const mpt_device dev = mpt_model_device(model), cpu = mpt_device_cpu();
  MPT_RETURN_IF(to_model ? mpt_op_memcpy(stream, dev, p, cpu, host, nbytes)
                         : mpt_op_memcpy(stream, cpu, host, dev, p, nbytes));
  return mpt_stream_synchronize(stream, LLAMA_SYNC_TIMEOUT_MS);
}

static int64_t largest_param(mpt_model *model) {
  int64_t m = 1;
  for (int i = 0; i < mpt_model_num_params(model); i++)
    if (mpt_model_param_info(model, i)->count > m) m = mpt_model_param_info(model, i)->count;
  return m;
}

mpt_status mpt_llama_load(mpt_model *model, const mpt_llama_config *config, const char *path) {
  if (!model || !config || !path) return MPT_FAIL(MPT_EINVAL, "llama load: NULL argument");
  MPT_RETURN_IF(mpt_llama_check_model(model, config));
  mpt_llama_config c;
  mpt_st_file *f;
  MPT_RETURN_IF(open_llama(path, &c, &f));
  mpt_status st = MPT_OK;
  float *stage = NULL;
  mpt_stream *stream = NULL;
  const struct { const char *key; double file, want; } fl[] = {
      {"vocab_size", c.vocab_size, config->vocab_size}, {"hidden_size", c.dim, config->dim},
      {"num_hidden_layers", c.n_layers, config->n_layers},
      {"num_attention_heads", c.n_heads, config->n_heads},
      {"num_key_value_heads", c.n_kv_heads, config->n_kv_heads},
      {"intermediate_size", c.ffn_dim, config->ffn_dim},
      {"max_position_embeddings", c.max_seq_len, config->max_seq_len},
      {"rope_theta", c.rope_theta, config->rope_theta},
      {"rms_norm_eps", c.norm_eps, config->norm_eps},
      {"tie_word_embeddings", c.tied_embeddings, config->tied_embeddings},
      {"RoPE scaling type (1 llama3)", c.rope_scaling.type, config->rope_scaling.type},
      {"RoPE scaling factor", c.rope_scaling.factor, config->rope_scaling.factor},
      {"RoPE low_freq_factor", c.rope_scaling.low_freq_factor,
       config->rope_scaling.low_freq_factor},
      {"RoPE high_freq_factor", c.rope_scaling.high_freq_factor,
       config->rope_scaling.high_freq_factor},
      {"RoPE original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings,
       config->rope_scaling.original_max_position_embeddings}};
  for (size_t i = 0; i < sizeof fl / sizeof fl[0]; i++)
    if (fl[i].file != fl[i].want) {
      st = MPT_FAIL(MPT_ESHAPE, "safetensors model '%s' has %s %g, the model %g", path,
                    fl[i].key, fl[i].file, fl[i].want);
      goto out;
    }
  const int64_t m = largest_param(model);
  if (!(stage = malloc((size_t)m * sizeof *stage))) {
    st = MPT_FAIL(MPT_ENOMEM, "llama load: %lld floats of staging", (long long)m);
    goto out;
  }
  if (mpt_model_device(model).type != MPT_DEVICE_CPU)
    MPT_CHECK(mpt_stream_init(&stream, mpt_model_device(model), MPT_STREAM_INLINE), out);
  for (int i = 0; i < mpt_model_num_params(model); i++) {
    const mpt_param_info *pi = mpt_model_param_info(model, i);
    const mpt_st_tensor *t = mpt_st_find(f, pi->name);
    MPT_CHECK(mpt_st_read_f32(f, t, stage, pi->count), out);
    for (int64_t j = 0; j < pi->count; j++)
      if (!isfinite(stage[j])) {
        st = MPT_FAIL(MPT_EFORMAT, "safetensors model '%s': tensor '%s' element %lld is %g: the "
                      "file holds non-finite weights", path, pi->name, (long long)j,
                      (double)stage[j]);
        goto out;
      }
    MPT_CHECK(transfer(model, stream, pi->offset, stage, pi->count, 1), out);
  }
out:
  mpt_stream_free(stream);
  free(stage);
  mpt_st_close(f);
  return st;
}

typedef struct save_ctx {
  mpt_model *model;
  mpt_stream *stream;
} save_ctx;

static mpt_status fill_param(void *ctx, int i, float *dst) {
  const save_ctx *s = ctx;
  const mpt_param_info *pi = mpt_model_param_info(s->model, i);
  return transfer(s->model, s->stream, pi->offset, dst, pi->count, 0);
}

mpt_status mpt_llama_save(mpt_model *model, const mpt_llama_config *config, const char *path,
                          const mpt_st_save_options *opts) {
  if (!model || !config || !path) return MPT_FAIL(MPT_EINVAL, "llama save: NULL argument");
  MPT_RETURN_IF(mpt_llama_check_model(model, config));
  const mpt_st_save_options o = opts ? *opts : mpt_st_save_options_default();
  const int n = mpt_model_num_params(model);
  mpt_st_write_tensor *t = calloc((size_t)n + 1, sizeof *t);
  if (!t) return MPT_FAIL(MPT_ENOMEM, "llama save %s: tensor list", path);
  mpt_status st = MPT_OK;
  save_ctx sc = {model, NULL};
  char json[2048];
  for (int i = 0; i < n; i++) {
    const mpt_param_info *pi = mpt_model_param_info(model, i);
    t[i].name = pi->name;
    t[i].ndim = pi->ndim;
    for (int d = 0; d < pi->ndim && d < MPT_ST_MAX_DIMS; d++) t[i].shape[d] = pi->shape[d];
  }
  MPT_CHECK(mpt_llama_st_config_json(config, o.dtype, json, sizeof json), out);
  if (mpt_model_device(model).type != MPT_DEVICE_CPU)
    MPT_CHECK(mpt_stream_init(&sc.stream, mpt_model_device(model), MPT_STREAM_INLINE), out);
  static const char *const meta[2] = {"format", "pt"};
  MPT_CHECK(mpt_st_write_model(path, t, n, meta, 1, json, &o, fill_param, &sc), out);
out:
  mpt_stream_free(sc.stream);
  free(t);
  return st;
}
