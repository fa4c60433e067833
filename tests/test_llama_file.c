/* Tests for src/ckpt/llama_file.c: Llama models as Hugging Face safetensors + config.json. The
 * tensor names and shapes are written here from transformers' LlamaForCausalLM naming (not
 * from the library's list); a model saved and loaded back bit for bit (F32, one file and
 * shards), BF16 to its round-to-nearest-even values, a tied model without lm_head.weight;
 * Llama 3.2 1B's exact shape (hidden 2048, 16 layers, 32 heads, 8 key/value heads, MLP 8192,
 * vocabulary 128256, rope_theta 500000, tied) read from a sparse file of that size (the header
 * and every tensor's shape checked; the data is not read); and every bad config or file refused
 * naming the key or the tensor. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mpitrain/llama.h"
#include "mpitrain/llama_file.h"

#define FILE_CHECK_NAME "test_llama_file"
#include "file_check.h"

static void write_text(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

/* transformers' LlamaForCausalLM tensors of c, as its state_dict names them: names[i],
 * shapes[i] (2-D; a norm has cols 0). Returns the count (lm_head only when untied). */
static int hf_tensors(const mpt_llama_config *c, char names[][96], int64_t rows[],
                      int64_t cols[]) {
  const int64_t C = c->dim, hd = c->dim / c->n_heads;
  int n = 0;
  snprintf(names[n], 96, "model.embed_tokens.weight");
  rows[n] = c->vocab_size, cols[n++] = C;
  for (int l = 0; l < c->n_layers; l++) {
    const struct { const char *s; int64_t r, k; } t[9] = {
        {"self_attn.q_proj.weight", c->n_heads * hd, C},
        {"self_attn.k_proj.weight", c->n_kv_heads * hd, C},
        {"self_attn.v_proj.weight", c->n_kv_heads * hd, C},
        {"self_attn.o_proj.weight", C, c->n_heads * hd},
        {"mlp.gate_proj.weight", c->ffn_dim, C}, {"mlp.up_proj.weight", c->ffn_dim, C},
        {"mlp.down_proj.weight", C, c->ffn_dim}, {"input_layernorm.weight", C, 0},
        {"post_attention_layernorm.weight", C, 0}};
    for (int k = 0; k < 9; k++) {
      snprintf(names[n], 96, "model.layers.%d.%s", l, t[k].s);
      rows[n] = t[k].r, cols[n++] = t[k].k;
    }
  }
  snprintf(names[n], 96, "model.norm.weight");
  rows[n] = C, cols[n++] = 0;
  if (!c->tied_embeddings) {
    snprintf(names[n], 96, "lm_head.weight");
    rows[n] = c->vocab_size, cols[n++] = C;
  }
  return n;
}

/* A safetensors file of c's tensors in `dtype` ("F32"/"BF16") whose data is a hole of the
 * right size (sparse: no disk used); `skip` a tensor left out, `extra` one added. */
static void sparse_model(const char *path, const mpt_llama_config *c, const char *dtype,
                         const char *skip, const char *extra) {
  static char names[512][96];
  static int64_t rows[512], cols[512];
  const int n = hf_tensors(c, names, rows, cols);
  const int es = strcmp(dtype, "F32") == 0 ? 4 : 2;
  size_t cap = 1 << 20, len = 0;
  char *h = malloc(cap);
  int64_t off = 0;
  len += (size_t)snprintf(h + len, cap - len, "{\"__metadata__\":{\"format\":\"pt\"}");
  for (int i = 0; i <= n; i++) {
    const char *name = i < n ? names[i] : extra;
    if (!name || (skip && strcmp(name, skip) == 0)) continue;
    const int64_t r = i < n ? rows[i] : 4, k = i < n ? cols[i] : 0;
    const int64_t bytes = r * (k ? k : 1) * es;
    if (k)
      len += (size_t)snprintf(h + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld,%lld],"
                              "\"data_offsets\":[%lld,%lld]}", name, dtype, (long long)r,
                              (long long)k, (long long)off, (long long)(off + bytes));
    else
      len += (size_t)snprintf(h + len, cap - len, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld],"
                              "\"data_offsets\":[%lld,%lld]}", name, dtype, (long long)r,
                              (long long)off, (long long)(off + bytes));
    off += bytes;
  }
  len += (size_t)snprintf(h + len, cap - len, "}");
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  unsigned char n8[8];
  for (int k = 0; k < 8; k++) n8[k] = (unsigned char)((uint64_t)len >> (8 * k));
  ck_assert_int_eq(fwrite(n8, 1, 8, f), 8);
  ck_assert_int_eq(fwrite(h, 1, len, f), len);
  fclose(f);
  ck_assert_int_eq(truncate(path, (off_t)(8 + len + off)), 0);
  free(h);
}

/* Llama 3.2 1B's config.json as transformers writes it, with `rope_scaling` and `extra` keys. */
static void config_1b(const char *path, const char *rope_scaling, const char *extra) {
  char text[2048];
  snprintf(text, sizeof text,
           "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, "
           "\"attention_dropout\": 0.0, \"bos_token_id\": 128000, \"eos_token_id\": 128001, "
           "\"head_dim\": 64, \"hidden_act\": \"silu\", \"hidden_size\": 2048, "
           "\"initializer_range\": 0.02, \"intermediate_size\": 8192, "
           "\"max_position_embeddings\": 131072, \"mlp_bias\": false, \"model_type\": \"llama\", "
           "\"num_attention_heads\": 32, \"num_hidden_layers\": 16, \"num_key_value_heads\": 8, "
           "\"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, \"rope_scaling\": %s, "
           "\"rope_theta\": 500000.0, \"tie_word_embeddings\": true, \"torch_dtype\": "
           "\"bfloat16\", \"transformers_version\": \"4.45.0.dev0\", \"use_cache\": true, "
           "\"vocab_size\": 128256%s}", rope_scaling, extra);
  write_text(path, text);
}

static const mpt_llama_config llama_1b = {128256, 2048, 16, 32, 8, 8192, 131072, 500000.0f,
                                          1e-5f, 1};

START_TEST(test_llama_3_2_1b_shape_reads_from_its_file) {
  ck_assert_int_eq(mkdir(path_of("1b"), 0755), 0);
  sparse_model(path_of("1b/model.safetensors"), &llama_1b, "BF16", NULL, NULL);
  struct stat sb;
  ck_assert_int_eq(stat(path_of("1b/model.safetensors"), &sb), 0);
  ck_assert_int_gt(sb.st_size, 2471000000LL); /* 1,235,814,400 bf16 parameters */
  config_1b(path_of("1b/config.json"), "null", "");
  mpt_llama_config c;
  ck_assert_int_eq(mpt_llama_st_is_model(path_of("1b")), 1);
  ck_assert_int_eq(mpt_llama_st_read_header(path_of("1b"), &c), MPT_OK);
  ck_assert_int_eq(memcmp(&c, &llama_1b, sizeof c), 0);
  ck_assert_int_eq(mpt_llama_param_count(&c), 1235814400LL);
  /* the real file's llama3 RoPE scaling, as transformers 4 writes it and as 5 does */
  mpt_llama_config want = llama_1b;
  want.rope_scaling = (mpt_rope_scaling){MPT_ROPE_LLAMA3, 32.0f, 1.0f, 4.0f, 8192};
  config_1b(path_of("1b/config.json"),
            "{\"factor\": 32.0, \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0, "
            "\"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}", "");
  ck_assert_int_eq(mpt_llama_st_read_header(path_of("1b"), &c), MPT_OK);
  ck_assert_int_eq(memcmp(&c, &want, sizeof c), 0);
  config_1b(path_of("1b/config.json"), "null",
            ", \"rope_parameters\": {\"factor\": 32.0, \"high_freq_factor\": 4.0, "
            "\"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192, "
            "\"rope_theta\": 500000.0, \"rope_type\": \"llama3\"}");
  ck_assert_int_eq(mpt_llama_st_read_header(path_of("1b"), &c), MPT_OK);
  ck_assert_int_eq(memcmp(&c, &want, sizeof c), 0);
  /* the two spellings disagreeing: rope_scaling wins, as in transformers 5; llama3 without
   * its numbers or with bad ones */
  config_1b(path_of("1b/config.json"),
            "{\"factor\": 8.0, \"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0, "
            "\"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}",
            ", \"rope_parameters\": {\"factor\": 32.0, \"high_freq_factor\": 4.0, "
            "\"low_freq_factor\": 1.0, \"original_max_position_embeddings\": 8192, "
            "\"rope_theta\": 500000.0, \"rope_type\": \"llama3\"}");
  ck_assert_int_eq(mpt_llama_st_read_header(path_of("1b"), &c), MPT_OK);
  ck_assert(c.rope_scaling.type == MPT_ROPE_LLAMA3 && c.rope_scaling.factor == 8.0f);
  config_1b(path_of("1b/config.json"), "{\"rope_type\": \"llama3\", \"factor\": 32.0}", "");
  ASSERT_ERR(mpt_llama_st_read_header(path_of("1b"), &c), MPT_EFORMAT,
             "low_freq_factor is missing");
  config_1b(path_of("1b/config.json"),
            "{\"factor\": 32.0, \"high_freq_factor\": 1.0, \"low_freq_factor\": 1.0, "
            "\"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}", "");
  ASSERT_ERR(mpt_llama_st_read_header(path_of("1b"), &c), MPT_EFORMAT,
             "rope_scaling's llama3 numbers", "out of range");
  config_1b(path_of("1b/config.json"), "{\"type\": \"linear\", \"factor\": 2.0}", "");
  ASSERT_ERR(mpt_llama_st_read_header(path_of("1b"), &c), MPT_EFORMAT,
             "rope_scaling of rope_type 'linear' is not implemented");
  config_1b(path_of("1b/config.json"), "{\"rope_type\": \"default\"}", "");
  ck_assert_int_eq(mpt_llama_st_read_header(path_of("1b"), &c), MPT_OK);
  /* num_attention_heads not a multiple of num_key_value_heads */
  config_1b(path_of("1b/config.json"), "null", ", \"num_key_value_heads\": 5");
  ASSERT_ERR(mpt_llama_st_read_header(path_of("1b"), &c), MPT_EFORMAT, "duplicate key");
  char text[1024];
  snprintf(text, sizeof text, "{\"hidden_size\": 2048, \"intermediate_size\": 8192, "
           "\"num_hidden_layers\": 16, \"num_attention_heads\": 32, \"num_key_value_heads\": 5, "
           "\"vocab_size\": 128256, \"max_position_embeddings\": 131072}");
  write_text(path_of("1b/config.json"), text);
  ASSERT_ERR(mpt_llama_st_read_header(path_of("1b"), &c), MPT_EFORMAT,
             "num_attention_heads 32 is not a multiple of num_key_value_heads 5");
  /* the config's dtype against the tensors'; an untied config wants lm_head.weight */
  config_1b(path_of("1b/config.json"), "null", "");
  sparse_model(path_of("1b/model.safetensors"), &llama_1b, "F32", NULL, NULL);
  ASSERT_ERR(mpt_llama_st_read_header(path_of("1b"), &c), MPT_EFORMAT,
             "tensor 'model.embed_tokens.weight' is F32, the config", "gives BF16");
  ck_assert_int_eq(unlink(path_of("1b/model.safetensors")), 0);
}
END_TEST

/* Runs through the bad configs, each a small tied model's config.json with one key changed. */
START_TEST(test_bad_llama_configs_and_files_are_refused_naming_the_problem) {
  const mpt_llama_config tiny = {256, 16, 2, 4, 2, 24, 32, 10000.0f, 1e-5f, 0};
  ck_assert_int_eq(mkdir(path_of("m"), 0755), 0);
  sparse_model(path_of("m/model.safetensors"), &tiny, "F32", NULL, NULL);
  static const char *base = "\"hidden_size\": 16, \"intermediate_size\": 24, "
                            "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                            "\"vocab_size\": 256, \"max_position_embeddings\": 32";
  static const struct { const char *keys; const char *why; } cases[] = {
      {", \"num_key_value_heads\": 3", "num_attention_heads 4 is not a multiple of "
                                       "num_key_value_heads 3"},
      {", \"num_key_value_heads\": 0", "num_key_value_heads is not an integer in [1, "},
      {", \"hidden_act\": \"gelu\"", "hidden_act gelu is not \"silu\""},
      {", \"attention_bias\": true", "attention_bias is true; the Llama has no biases"},
      {", \"mlp_bias\": true", "mlp_bias is true"},
      {", \"model_type\": \"mistral\"", "model_type 'mistral' is not \"llama\""},
      {", \"head_dim\": 8", "head_dim is not hidden_size / num_attention_heads (16 / 4)"},
      {", \"rope_theta\": \"big\"", "rope_theta is not a number in"},
      {", \"tie_word_embeddings\": 1", "tie_word_embeddings is not true or false"},
      {", \"torch_dtype\": \"int8\"", "torch_dtype 'int8' is not float32, bfloat16 or float16"},
      {", \"rope_scaling\": {\"rope_type\": \"yarn\"}", "rope_scaling of rope_type 'yarn'"},
      {", \"num_key_value_heads\": 2, \"rms_norm_eps\": -1", "rms_norm_eps is not a number in"},
      {", \"num_key_value_heads\": 2,", "trailing comma"},
      {", \"rope_parameters\": {\"rope_type\": \"dynamic\", \"rope_theta\": 5e5}",
       "rope_parameters of rope_type 'dynamic' is not implemented"},
      {", \"rope_theta\": 1e4, \"rope_parameters\": {\"rope_theta\": 5e5}",
       "rope_theta 10000 and rope_parameters' rope_theta 500000 differ"},
  };
  mpt_llama_config c;
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char text[1024];
    snprintf(text, sizeof text, "{%s%s}", base, cases[i].keys);
    write_text(path_of("m/config.json"), text);
    ASSERT_ERR(mpt_llama_st_read_header(path_of("m"), &c), MPT_EFORMAT, "m/config.json",
               cases[i].why);
  }
  char text[1024];
  snprintf(text, sizeof text, "{\"hidden_size\": 16, \"num_hidden_layers\": 2}");
  write_text(path_of("m/config.json"), text);
  ASSERT_ERR(mpt_llama_st_read_header(path_of("m"), &c), MPT_EFORMAT,
             "vocab_size is missing");
  /* a good config; then the file: a tensor missing, one extra, one of another shape */
  snprintf(text, sizeof text, "{%s, \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-5}", base);
  write_text(path_of("m/config.json"), text);
  ck_assert_int_eq(mpt_llama_st_read_header(path_of("m"), &c), MPT_OK);
  ck_assert_int_eq(memcmp(&c, &tiny, sizeof c), 0);
  /* transformers 5's rope_parameters */
  snprintf(text, sizeof text, "{%s, \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-5, "
           "\"rope_parameters\": {\"rope_theta\": 250000.0, \"rope_type\": \"default\"}}", base);
  write_text(path_of("m/config.json"), text);
  ck_assert_int_eq(mpt_llama_st_read_header(path_of("m"), &c), MPT_OK);
  ck_assert(c.rope_theta == 250000.0f);
  snprintf(text, sizeof text, "{%s, \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-5}", base);
  write_text(path_of("m/config.json"), text);
  sparse_model(path_of("m/model.safetensors"), &tiny, "F32", "model.layers.1.mlp.up_proj.weight",
               NULL);
  ASSERT_ERR(mpt_llama_st_read_header(path_of("m"), &c), MPT_EFORMAT,
             "has no tensor 'model.layers.1.mlp.up_proj.weight'");
  sparse_model(path_of("m/model.safetensors"), &tiny, "F32", NULL, "model.layers.0.self_attn.b");
  ASSERT_ERR(mpt_llama_st_read_header(path_of("m"), &c), MPT_EFORMAT,
             "holds tensor 'model.layers.0.self_attn.b', which is not a LlamaForCausalLM");
  sparse_model(path_of("m/model.safetensors"), &tiny, "F32", NULL,
               "model.layers.1.self_attn.rotary_emb.inv_freq"); /* older files: accepted */
  ck_assert_int_eq(mpt_llama_st_read_header(path_of("m"), &c), MPT_OK);
  snprintf(text, sizeof text, "{%s, \"num_key_value_heads\": 1, \"rms_norm_eps\": 1e-5}", base);
  write_text(path_of("m/config.json"), text); /* k_proj [4, 16] in a file of [8, 16] */
  ASSERT_ERR(mpt_llama_st_read_header(path_of("m"), &c), MPT_EFORMAT,
             "tensor 'model.layers.0.self_attn.k_proj.weight' has shape [8, 16], the config",
             "gives [4, 16]");
  ck_assert_int_eq(unlink(path_of("m/config.json")), 0);
  ASSERT_ERR(mpt_llama_st_read_header(path_of("m"), &c), MPT_ENOENT, "m/config.json' does not "
             "exist");
  ck_assert_int_eq(mpt_llama_st_is_model(path_of("m")), 0);
}
END_TEST

static uint16_t rne_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  const uint32_t lo = u & 0xFFFFu, hi = u >> 16;
  return (uint16_t)(lo > 0x8000u || (lo == 0x8000u && (hi & 1)) ? hi + 1 : hi);
}

START_TEST(test_llama_saves_and_loads_back_bit_for_bit) {
  for (int tied = 0; tied < 2; tied++) {
    mpt_llama_config c;
    ck_assert_int_eq(mpt_llama_config_preset("llama-tiny", &c), MPT_OK);
    c.tied_embeddings = tied;
    c.rope_theta = 500000.0f;
    mpt_model *a, *b;
    ck_assert_int_eq(mpt_model_init_llama(&a, mpt_device_cpu(), &c, 7), MPT_OK);
    ck_assert_int_eq(mpt_model_init_llama(&b, mpt_device_cpu(), &c, 8), MPT_OK);
    const int64_t n = mpt_model_param_count(a);
    const float *pa = mpt_model_params(a), *pb = mpt_model_params(b);
    ck_assert_int_ne(memcmp(pa, pb, (size_t)n * 4), 0);
    char dir[32];
    snprintf(dir, sizeof dir, "t%d", tied);
    ck_assert_int_eq(mkdir(path_of(dir), 0755), 0);
    ck_assert_int_eq(mpt_llama_save(a, &c, path_of(dir), NULL), MPT_OK);
    ck_assert_int_eq(mpt_llama_load(b, &c, path_of(dir)), MPT_OK);
    ck_assert_int_eq(memcmp(pa, pb, (size_t)n * 4), 0);
    /* the file holds transformers' names and shapes exactly (lm_head only when untied) */
    mpt_st_file *f;
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors", path_of(dir));
    ck_assert_int_eq(mpt_st_open(p, &f), MPT_OK);
    static char names[64][96];
    int64_t rows[64], cols[64];
    const int nt = hf_tensors(&c, names, rows, cols);
    ck_assert_int_eq(mpt_st_num_tensors(f), nt);
    ck_assert_int_eq(nt, 9 * 2 + 2 + !tied);
    for (int i = 0; i < nt; i++) {
      const mpt_st_tensor *t = mpt_st_find(f, names[i]);
      ck_assert_msg(t != NULL, "no %s", names[i]);
      ck_assert_int_eq(t->ndim, cols[i] ? 2 : 1);
      ck_assert_int_eq(t->shape[0], rows[i]);
      if (cols[i]) ck_assert_int_eq(t->shape[1], cols[i]);
    }
    ck_assert_str_eq(mpt_st_metadata(f, "format"), "pt");
    mpt_st_close(f);
    mpt_llama_config back;
    ck_assert_int_eq(mpt_llama_st_read_header(path_of(dir), &back), MPT_OK);
    ck_assert_int_eq(memcmp(&back, &c, sizeof c), 0); /* theta and eps: the same floats */
    /* shards of 20 KB: the same values; bf16: each rounded to nearest even */
    mpt_st_save_options o = mpt_st_save_options_default();
    o.shard_nbytes = 20000;
    ck_assert_int_eq(mpt_llama_save(a, &c, path_of(dir), &o), MPT_OK);
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", path_of(dir));
    ck_assert_int_eq(access(p, F_OK), 0);
    memset(mpt_model_params(b), 0, (size_t)n * 4);
    ck_assert_int_eq(mpt_llama_load(b, &c, path_of(dir)), MPT_OK);
    ck_assert_int_eq(memcmp(pa, pb, (size_t)n * 4), 0);
    o.dtype = MPT_ST_BF16;
    o.shard_nbytes = MPT_ST_DEFAULT_SHARD_NBYTES;
    ck_assert_int_eq(mpt_llama_save(a, &c, path_of(dir), &o), MPT_OK);
    ck_assert_int_eq(access(p, F_OK), -1);
    ck_assert_int_eq(mpt_llama_load(b, &c, path_of(dir)), MPT_OK);
    for (int64_t i = 0; i < n; i++) {
      const uint32_t u = (uint32_t)rne_bf16(pa[i]) << 16;
      ck_assert_msg(memcmp(&pb[i], &u, 4) == 0, "parameter %lld", (long long)i);
    }
    /* a model of another config: named */
    mpt_llama_config other = c;
    other.rope_theta = 10000.0f;
    mpt_model *m;
    ck_assert_int_eq(mpt_model_init_llama(&m, mpt_device_cpu(), &other, 1), MPT_OK);
    ASSERT_ERR(mpt_llama_load(m, &other, path_of(dir)), MPT_ESHAPE, "has rope_theta 500000, "
               "the model 10000");
    mpt_model_free(m);
    /* a non-finite weight is refused, named */
    pa = mpt_model_params(a);
    ((float *)pa)[mpt_model_param_info(a, 3)->offset + 5] = NAN;
    ck_assert_int_eq(mpt_llama_save(a, &c, path_of(dir), NULL), MPT_OK);
    ASSERT_ERR(mpt_llama_load(b, &c, path_of(dir)), MPT_EFORMAT,
               "tensor 'model.layers.0.self_attn.k_proj.weight' element 5 is nan");
    mpt_model_free(a);
    mpt_model_free(b);
  }
}
END_TEST

START_TEST(test_config_json_prints_floats_that_read_back_the_same) {
  mpt_llama_config c;
  ck_assert_int_eq(mpt_llama_config_preset("llama-tiny", &c), MPT_OK);
  char json[2048];
  c.norm_eps = 1e-6f;
  c.rope_theta = 500000.0f;
  ck_assert_int_eq(mpt_llama_st_config_json(&c, MPT_ST_BF16, json, sizeof json), MPT_OK);
  ck_assert_ptr_nonnull(strstr(json, "\"rms_norm_eps\": 1e-06,"));
  ck_assert_ptr_nonnull(strstr(json, "\"rope_theta\": 500000.0,"));
  ck_assert_ptr_nonnull(strstr(json, "\"rope_parameters\": {\"rope_theta\": 500000.0, "
                                     "\"rope_type\": \"default\"},"));
  ck_assert_ptr_nonnull(strstr(json, "\"torch_dtype\": \"bfloat16\","));
  ck_assert_ptr_nonnull(strstr(json, "\"num_key_value_heads\": 2,"));
  ck_assert_ptr_nonnull(strstr(json, "\"tie_word_embeddings\": false,"));
  ck_assert_ptr_nonnull(strstr(json, "\"architectures\": [\"LlamaForCausalLM\"]"));
  ck_assert_ptr_nonnull(strstr(json, "\"rope_scaling\": null,"));
  /* llama3 scaling: written in both spellings, read back the same */
  c.rope_scaling = (mpt_rope_scaling){MPT_ROPE_LLAMA3, 32.0f, 1.0f, 4.0f, 8192};
  ck_assert_int_eq(mpt_llama_st_config_json(&c, MPT_ST_F32, json, sizeof json), MPT_OK);
  ck_assert_ptr_nonnull(strstr(json, "\"rope_parameters\": {\"factor\": 32.0, "
                                     "\"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0, "
                                     "\"original_max_position_embeddings\": 8192, "
                                     "\"rope_theta\": 500000.0, \"rope_type\": \"llama3\"},"));
  ck_assert_ptr_nonnull(strstr(json, "\"rope_scaling\": {\"factor\": 32.0, "
                                     "\"high_freq_factor\": 4.0, \"low_freq_factor\": 1.0, "
                                     "\"original_max_position_embeddings\": 8192, "
                                     "\"rope_type\": \"llama3\"},"));
  ck_assert_int_eq(mkdir(path_of("w"), 0755), 0);
  write_text(path_of("w/config.json"), json);
  sparse_model(path_of("w/model.safetensors"), &c, "F32", NULL, NULL);
  mpt_llama_config back;
  ck_assert_int_eq(mpt_llama_st_read_header(path_of("w"), &back), MPT_OK);
  ck_assert_int_eq(memcmp(&back, &c, sizeof c), 0);
  c.rope_scaling.high_freq_factor = 0.5f; /* below low_freq_factor */
  ASSERT_ERR(mpt_llama_st_config_json(&c, MPT_ST_F32, json, sizeof json), MPT_EINVAL,
             "high_freq_factor 0.5 must be finite and > low_freq_factor 1");
  c.rope_scaling = (mpt_rope_scaling){0};
  ASSERT_ERR(mpt_llama_st_config_json(&c, MPT_ST_F32, json, 100), MPT_EINVAL, "too small");
  c.n_kv_heads = 3;
  ck_assert_int_ne(mpt_llama_st_config_json(&c, MPT_ST_F32, json, sizeof json), MPT_OK);
}
END_TEST

static void add_tests(TCase *tc) {
  tcase_add_test(tc, test_llama_3_2_1b_shape_reads_from_its_file);
  tcase_add_test(tc, test_bad_llama_configs_and_files_are_refused_naming_the_problem);
  tcase_add_test(tc, test_llama_saves_and_loads_back_bit_for_bit);
  tcase_add_test(tc, test_config_json_prints_floats_that_read_back_the_same);
}

int main(void) { return file_check_main("llama_file", 120, add_tests); }
