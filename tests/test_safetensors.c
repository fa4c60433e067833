/* Tests for src/ckpt/safetensors.c and gpt_safetensors.c: Hugging Face safetensors files and
 * GPT-2 models in them. A GPT written as safetensors and read back bit-identically, an llm.c
 * file converted to safetensors and back byte-identical, the Conv1D transposes checked element
 * by element, the "transformer." prefix and the tensors transformers adds (lm_head.weight, the
 * attention-mask buffers) accepted; hand-made BF16 and F16 files read to their exact values;
 * every malformed file refused naming the file and the problem. */
#include <check.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mpitrain/gpt_file.h"
#include "mpitrain/safetensors.h"

#define FILE_CHECK_NAME "test_safetensors"
#include "file_check.h"

/* T 8, V 50 (padded to 128), L 2, H 2, C 4. */
static const mpt_gpt_config tiny = {8, 50, 2, 2, 4, 0};

/* Parameters with distinct values (i * 0.001 - 3, a few exact specials); wte's padded rows 0
 * as llm.c writes them. */
static float *tiny_params(mpt_gpt_layout *lay) {
  ck_assert_int_eq(mpt_gpt_layout_compute(&tiny, lay), MPT_OK);
  float *p = malloc((size_t)lay->total * sizeof *p);
  for (int64_t i = 0; i < lay->total; i++) p[i] = (float)i * 0.001f - 3.0f;
  memset(p + tiny.vocab_size * tiny.channels, 0,
         (size_t)(128 - tiny.vocab_size) * tiny.channels * sizeof *p);
  p[lay->offset[4] + 1] = -0.0f;
  p[lay->offset[15]] = 1e-40f; /* subnormal */
  return p;
}

/* n 0: p is a string, written without its NUL */
static void write_bytes(const char *path, const void *p, size_t n) {
  if (n == 0) n = strlen(p);
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(fwrite(p, 1, n, f), n);
  fclose(f);
}

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  char *b = malloc(*n + 1);
  ck_assert_int_eq(fread(b, 1, *n, f), *n);
  fclose(f);
  return b;
}

/* A safetensors file of header `json` (its length written before it) and `data`. */
static const char *hand_file(const char *name, const char *json, const void *data, size_t n) {
  const char *path = path_of(name);
  size_t hn = strlen(json);
  unsigned char *b = malloc(8 + hn + n + 1);
  for (int k = 0; k < 8; k++) b[k] = (unsigned char)((uint64_t)hn >> (8 * k));
  memcpy(b + 8, json, hn);
  if (n) memcpy(b + 8 + hn, data, n);
  write_bytes(path, b, 8 + hn + n);
  free(b);
  return path;
}

START_TEST(test_gpt_round_trip_is_bit_identical_and_llmc_converts_byte_identically) {
  mpt_gpt_layout lay;
  float *p = tiny_params(&lay);
  float *q = malloc((size_t)lay.total * sizeof *q);
  /* llm.c file -> flat -> model directory -> flat -> llm.c file */
  ck_assert_int_eq(mpt_gpt_file_write(path_of("a.bin"), &tiny, p), MPT_OK);
  ck_assert_int_eq(mkdir(path_of("hf"), 0755), 0);
  ck_assert_int_eq(mpt_gpt_st_is_path(path_of("hf")), 0); /* empty: not yet a model */
  ck_assert_int_eq(mpt_gpt_file_write(path_of("hf"), &tiny, p), MPT_OK); /* dispatched */
  ck_assert_int_eq(mpt_gpt_st_is_path(path_of("hf")), 1);
  mpt_gpt_config c;
  ck_assert_int_eq(mpt_gpt_file_read_header(path_of("hf"), &c), MPT_OK);
  ck_assert_int_eq(c.max_seq_len, 8);
  ck_assert_int_eq(c.vocab_size, 50);
  ck_assert_int_eq(c.num_layers, 2);
  ck_assert_int_eq(c.num_heads, 2);
  ck_assert_int_eq(c.channels, 4);
  ck_assert_int_eq(c.padded_vocab_size, 128);
  memset(q, 0x7f, (size_t)lay.total * sizeof *q);
  ck_assert_int_eq(mpt_gpt_file_read(path_of("hf"), &tiny, &c, q, lay.total), MPT_OK);
  ck_assert_int_eq(memcmp(p, q, (size_t)lay.total * sizeof *p), 0);
  ck_assert_int_eq(mpt_gpt_file_write(path_of("b.bin"), &c, q), MPT_OK);
  size_t na, nb;
  char *a = slurp(path_of("a.bin"), &na), *b = slurp(path_of("b.bin"), &nb);
  ck_assert_int_eq(na, nb);
  ck_assert_int_eq(memcmp(a, b, na), 0);
  free(a);
  free(b);
  /* the file: 8-byte length, JSON padded to 8, metadata format pt, wte without padding,
   * data = 4 x (N - (Vp - V) C) bytes */
  size_t n;
  char *f = slurp(path_of("hf/model.safetensors"), &n);
  uint64_t hn = 0;
  for (int k = 7; k >= 0; k--) hn = hn << 8 | (unsigned char)f[k];
  ck_assert_int_eq(hn % 8, 0);
  ck_assert_int_eq(f[8], '{');
  ck_assert_int_eq(n, 8 + hn + 4 * (lay.total - (128 - 50) * 4));
  f[8 + hn] = 0;
  ck_assert_ptr_nonnull(strstr(f + 8, "\"__metadata__\":{\"format\":\"pt\"}"));
  ck_assert_ptr_nonnull(strstr(f + 8, "\"wte.weight\":{\"dtype\":\"F32\",\"shape\":[50,4],"
                                      "\"data_offsets\":[0,800]}"));
  ck_assert_ptr_nonnull(strstr(f + 8, "\"h.1.mlp.c_fc.weight\":{\"dtype\":\"F32\",\"shape\":[4,16]"));
  free(f);
  /* the Conv1D transposes, element by element: file [in, out] = mpitrain [out, in] */
  mpt_st_file *sf;
  ck_assert_int_eq(mpt_st_open(path_of("hf/model.safetensors"), &sf), MPT_OK);
  ck_assert_int_eq(mpt_st_num_tensors(sf), 4 + 12 * 2);
  ck_assert_str_eq(mpt_st_metadata(sf, "format"), "pt");
  ck_assert_ptr_null(mpt_st_metadata(sf, "other"));
  static const struct { const char *name; int k; int64_t rows, cols; } w[] = {
      {"h.1.attn.c_attn.weight", 4, 12, 4}, {"h.1.attn.c_proj.weight", 6, 4, 4},
      {"h.1.mlp.c_fc.weight", 10, 16, 4}, {"h.1.mlp.c_proj.weight", 12, 4, 16}};
  float t[64];
  for (int i = 0; i < 4; i++) {
    const mpt_st_tensor *x = mpt_st_find(sf, w[i].name);
    ck_assert_ptr_nonnull(x);
    ck_assert_int_eq(x->shape[0], w[i].cols);
    ck_assert_int_eq(x->shape[1], w[i].rows);
    ck_assert_int_eq(mpt_st_read_f32(sf, x, t, 64), MPT_OK);
    const float *m = p + lay.offset[w[i].k] + w[i].rows * w[i].cols; /* layer 1 */
    for (int64_t r = 0; r < w[i].rows; r++)
      for (int64_t k = 0; k < w[i].cols; k++)
        ck_assert_msg(memcmp(&t[k * w[i].rows + r], &m[r * w[i].cols + k], 4) == 0,
                      "%s [%lld, %lld]", w[i].name, (long long)k, (long long)r);
  }
  ASSERT_ERR(mpt_st_read_f32(sf, mpt_st_find(sf, "wte.weight"), t, 64), MPT_ESHAPE, "200 elements");
  const mpt_st_tensor *lnfb = mpt_st_find(sf, "ln_f.bias");
  ck_assert_int_eq(mpt_st_read_f32(sf, lnfb, t, 64), MPT_OK);
  ck_assert_int_eq(memcmp(t, p + lay.offset[15], 16), 0);
  mpt_st_close(sf);
  /* a FILE.safetensors with config.json beside it */
  ck_assert_int_eq(mpt_gpt_file_write(path_of("m.safetensors"), &tiny, p), MPT_OK);
  memset(q, 0, (size_t)lay.total * sizeof *q);
  ck_assert_int_eq(mpt_gpt_file_read(path_of("m.safetensors"), NULL, &c, q, lay.total), MPT_OK);
  ck_assert_int_eq(memcmp(p, q, (size_t)lay.total * sizeof *p), 0);
  /* a model expecting another config: named */
  mpt_gpt_config other = tiny;
  other.num_heads = 1;
  ASSERT_ERR(mpt_gpt_file_read(path_of("hf"), &other, &c, q, lay.total), MPT_ESHAPE,
             "has heads 2, the model expects 1");
  ASSERT_ERR(mpt_gpt_file_read(path_of("hf"), &tiny, &c, q, 100), MPT_ESHAPE, "the buffer 100");
  free(q);
  free(p);
}
END_TEST

/* Copies the tensors of an open file under new names (a transformers-style file). */
typedef struct copy_ctx {
  mpt_st_file *from;
  const char **names;
} copy_ctx;

static mpt_status copy_fill(void *ctx, int i, float *dst) {
  copy_ctx *c = ctx;
  const mpt_st_tensor *t = mpt_st_find(c->from, c->names[i]);
  if (!t) { /* the extras: zeros */
    memset(dst, 0, 16 * sizeof *dst);
    return MPT_OK;
  }
  return mpt_st_read_f32(c->from, t, dst, t->count);
}

START_TEST(test_gpt_prefix_and_transformers_extras_are_accepted_others_refused) {
  mpt_gpt_layout lay;
  float *p = tiny_params(&lay);
  float *q = calloc((size_t)lay.total, sizeof *q);
  ck_assert_int_eq(mkdir(path_of("hf2"), 0755), 0);
  ck_assert_int_eq(mpt_gpt_file_write(path_of("hf2"), &tiny, p), MPT_OK);
  mpt_st_file *sf;
  ck_assert_int_eq(mpt_st_open(path_of("hf2/model.safetensors"), &sf), MPT_OK);
  const int n = mpt_st_num_tensors(sf);
  mpt_st_write_tensor w[40];
  const char *from[40];
  char names[40][96];
  for (int i = 0; i < n; i++) {
    const mpt_st_tensor *t = mpt_st_tensor_at(sf, i);
    snprintf(names[i], sizeof names[i], "transformer.%s", t->name);
    w[i].name = names[i];
    w[i].ndim = t->ndim;
    memcpy(w[i].shape, t->shape, sizeof w[i].shape);
    from[i] = t->name;
  }
  /* lm_head.weight (unprefixed, as GPT2LMHeadModel saves it) and the mask buffers */
  const char *extra[3] = {"lm_head.weight", "transformer.h.0.attn.bias",
                          "transformer.h.1.attn.masked_bias"};
  for (int k = 0; k < 3; k++) {
    w[n + k] = (mpt_st_write_tensor){.name = extra[k], .ndim = 2, .shape = {4, 4}};
    from[n + k] = "none";
  }
  copy_ctx cc = {sf, from};
  ck_assert_int_eq(mkdir(path_of("pre"), 0755), 0);
  ck_assert_int_eq(mpt_st_write_f32(path_of("pre/model.safetensors"), w, n + 3, NULL, 0,
                                    copy_fill, &cc), MPT_OK);
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", path_of("hf2/config.json"), path_of("pre/config.json"));
  ck_assert_int_eq(system(cmd), 0);
  mpt_gpt_config c;
  ck_assert_int_eq(mpt_gpt_file_read(path_of("pre"), &tiny, &c, q, lay.total), MPT_OK);
  ck_assert_int_eq(memcmp(p, q, (size_t)lay.total * sizeof *p), 0);
  /* an unknown tensor is refused, named */
  w[n] = (mpt_st_write_tensor){.name = "transformer.h.0.attn.rotary", .ndim = 1, .shape = {4}};
  ck_assert_int_eq(mpt_st_write_f32(path_of("pre/model.safetensors"), w, n + 1, NULL, 0,
                                    copy_fill, &cc), MPT_OK);
  ASSERT_ERR(mpt_gpt_file_read_header(path_of("pre"), &c), MPT_EFORMAT, "model.safetensors",
             "holds tensor 'transformer.h.0.attn.rotary', which is not a GPT-2");
  /* a missing tensor, and one of another shape */
  ck_assert_int_eq(mpt_st_write_f32(path_of("pre/model.safetensors"), w, n - 1, NULL, 0,
                                    copy_fill, &cc), MPT_OK);
  ASSERT_ERR(mpt_gpt_file_read_header(path_of("pre"), &c), MPT_EFORMAT,
             "has no tensor 'transformer.ln_f.bias'");
  w[2].shape[0] = 5; /* h.0.ln_1.weight */
  ck_assert_int_eq(mpt_st_write_f32(path_of("pre/model.safetensors"), w, n, NULL, 0, copy_fill,
                                    &cc), MPT_OK);
  ASSERT_ERR(mpt_gpt_file_read_header(path_of("pre"), &c), MPT_EFORMAT,
             "tensor 'transformer.h.0.ln_1.weight' has shape [5], the config", "gives [4]");
  mpt_st_close(sf);
  /* config.json: missing, without a field, not JSON */
  ck_assert_int_eq(unlink(path_of("pre/config.json")), 0);
  ck_assert_int_eq(mpt_gpt_st_is_path(path_of("pre")), 1); /* model.safetensors is there */
  ASSERT_ERR(mpt_gpt_file_read_header(path_of("pre"), &c), MPT_ENOENT, "pre/config.json' does "
             "not exist");
  write_bytes(path_of("pre/config.json"), "{\"n_layer\": 2, \"n_embd\": 4, \"n_positions\": 8,"
              " \"vocab_size\": 50, \"eps\": 1e-5, \"a\": [true, null]}", 0);
  ASSERT_ERR(mpt_gpt_file_read_header(path_of("pre"), &c), MPT_EFORMAT, "config.json': n_head "
             "is missing");
  write_bytes(path_of("pre/config.json"), "{\"n_layer\": 2,}", 0);
  ASSERT_ERR(mpt_gpt_file_read_header(path_of("pre"), &c), MPT_EFORMAT, "config.json': invalid "
             "JSON at byte 14: trailing comma");
  free(q);
  free(p);
}
END_TEST

START_TEST(test_bf16_and_f16_read_to_their_exact_values) {
  /* BF16 1, -3, 0.333984375 (0x3EAB), +inf, the smallest subnormal (0x0001 = 2^-133);
   * F16 1, 2^-24 (its smallest subnormal), -5, 65504 */
  const unsigned char data[] = {0x80, 0x3F, 0x40, 0xC0, 0xAB, 0x3E, 0x80, 0x7F, 0x01, 0x00,
                                0x00, 0x3C, 0x01, 0x00, 0x00, 0xC5, 0xFF, 0x7B};
  const char *path = hand_file(
      "h.safetensors",
      "{\"x\":{\"dtype\":\"BF16\",\"shape\":[5],\"data_offsets\":[0,10]},"
      "\"y\":{\"shape\":[2,2],\"dtype\":\"F16\",\"data_offsets\":[10,18]},"
      "\"__metadata__\":{\"k\":\"v\\u00e9\\n\"}}", data, sizeof data);
  mpt_st_file *f;
  ck_assert_int_eq(mpt_st_open(path, &f), MPT_OK);
  ck_assert_str_eq(mpt_st_metadata(f, "k"), "v\xc3\xa9\n");
  const mpt_st_tensor *x = mpt_st_find(f, "x"), *y = mpt_st_find(f, "y");
  ck_assert_str_eq(x->dtype, "BF16");
  ck_assert_int_eq(x->count, 5);
  ck_assert_int_eq(y->count, 4);
  float v[5];
  ck_assert_int_eq(mpt_st_read_f32(f, x, v, 5), MPT_OK);
  const float want[5] = {1.0f, -3.0f, 0.333984375f, 1.0f / 0.0f, 0x1p-133f};
  ck_assert_int_eq(memcmp(v, want, sizeof want), 0);
  ck_assert_int_eq(mpt_st_read_f32(f, y, v, 4), MPT_OK);
  const float want16[4] = {1.0f, 0x1p-24f, -5.0f, 65504.0f};
  ck_assert_int_eq(memcmp(v, want16, sizeof want16), 0);
  mpt_st_close(f);
  /* a dtype that is known but not converted */
  path = hand_file("i.safetensors", "{\"z\":{\"dtype\":\"I32\",\"shape\":[],\"data_offsets\":[0,4]}}",
                   data, 4);
  ck_assert_int_eq(mpt_st_open(path, &f), MPT_OK);
  ASSERT_ERR(mpt_st_read_f32(f, mpt_st_find(f, "z"), v, 5), MPT_ENOTSUP, "'z' is I32");
  mpt_st_close(f);
}
END_TEST

START_TEST(test_bad_files_are_refused_naming_file_and_problem) {
  const unsigned char zeros[64] = {0};
  mpt_st_file *f = NULL;
  write_bytes(path_of("short.safetensors"), "\x10\x00\x00", 3);
  ASSERT_ERR(mpt_st_open(path_of("short.safetensors"), &f), MPT_EFORMAT, "short.safetensors",
             "3 bytes, shorter than the 8-byte header length");
  ck_assert_ptr_null(f);
  unsigned char big[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, '{', '}'};
  write_bytes(path_of("past.safetensors"), big, 10);
  ASSERT_ERR(mpt_st_open(path_of("past.safetensors"), &f), MPT_EFORMAT, "past.safetensors",
             "header length 1099511627775 is past the end of the file (the file is 10 bytes)");
  /* an absurd length in a file long enough for it (sparse) */
  const char *p = path_of("absurd.safetensors");
  big[0] = 0; big[1] = 0; big[2] = 0; big[3] = 0x08; big[4] = 0; /* 128 MiB */
  write_bytes(p, big, 10);
  ck_assert_int_eq(truncate(p, 200 << 20), 0);
  ASSERT_ERR(mpt_st_open(p, &f), MPT_EFORMAT, "header length 134217728 is absurd");
  static const struct { const char *json; size_t ndata; const char *why; } cases[] = {
      {"{\"a\":", 0, "invalid JSON at byte 5: unexpected end"},
      {"[1, 2]", 0, "the header is not a JSON object"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} x", 4,
       "invalid JSON at byte 55: bytes after the value"},
      {"{\"a\":{\"dtype\":\"F31\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
       "tensor 'a' has unknown dtype 'F31'"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8,
       "tensor 'a': F32 shape of 3 elements needs 12 bytes, its data_offsets [0, 8] hold 8"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
       "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12,
       "tensors 'a' [0, 8] and 'b' [4, 12] overlap"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", 8,
       "tensor 'a': data_offsets [0, 16] past the end of the data (8 bytes): the file is "
       "truncated"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
       "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8,
       "duplicate key 'a'"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8,
       "tensor 'a': shape[0] is not an integer >= 0"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8,
       "tensor 'a': shape[0] is not an integer >= 0"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 8,
       "data_offsets [8, 0] end before begin"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0]}}", 8,
       "tensor 'a': data_offsets is not [begin, end]"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", 8,
       "tensor 'a' has an unknown field 'x'"},
      {"{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,8]}}", 8, "tensor 'a' has no shape"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}}", 8,
       "over 4294967296 elements"},
      {"{\"__metadata__\":{\"k\":1}}", 0, "__metadata__ 'k' is not a string"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],}}", 4, "trailing comma"},
      {"{\"a\\u00\":{}}", 0, "a \\u escape needs 4 hex digits"},
      {"{\"a\":\"\x01\"}", 0, "control character in a string"},
      {"{\"a\":tru}", 0, "unknown literal"},
      {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4, "',' or '}' expected"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char name[32];
    snprintf(name, sizeof name, "bad%zu.safetensors", i);
    const char *path = hand_file(name, cases[i].json, zeros, cases[i].ndata);
    f = NULL;
    ASSERT_ERR(mpt_st_open(path, &f), MPT_EFORMAT, name, cases[i].why);
    ck_assert_ptr_null(f);
  }
  /* a good file cut short: its last tensor passes the data's end */
  const char *good = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}";
  const char *path = hand_file("cut.safetensors", good, zeros, 16);
  ck_assert_int_eq(mpt_st_open(path, &f), MPT_OK);
  mpt_st_close(f);
  ck_assert_int_eq(truncate(path, 8 + (off_t)strlen(good) + 15), 0);
  ASSERT_ERR(mpt_st_open(path, &f), MPT_EFORMAT, "cut.safetensors", "past the end of the data "
             "(15 bytes): the file is truncated");
  ASSERT_ERR(mpt_st_open(path_of("none.safetensors"), &f), MPT_ENOENT, "none.safetensors");
  /* the writer refuses a name twice */
  mpt_st_write_tensor w[2] = {{.name = "a", .ndim = 1, .shape = {1}},
                              {.name = "a", .ndim = 1, .shape = {1}}};
  ASSERT_ERR(mpt_st_write_f32(path_of("w.safetensors"), w, 2, NULL, 0, copy_fill, NULL),
             MPT_EINVAL, "tensor 'a' given twice");
  ck_assert_int_ne(access(path_of("w.safetensors"), F_OK), 0);
}
END_TEST

/* bf16 bits of x rounded to nearest even, written here from the definition (not with the
 * library's converter): the 16 dropped bits against half of the last kept bit's weight. */
static uint16_t rne_bf16(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)(u >> 16 | 0x40);
  const uint32_t lo = u & 0xFFFFu, hi = u >> 16;
  return (uint16_t)(lo > 0x8000u || (lo == 0x8000u && (hi & 1)) ? hi + 1 : hi);
}

static float f_of(uint32_t u) {
  float x;
  memcpy(&x, &u, 4);
  return x;
}

static const float *rne_values;
static mpt_status values_fill(void *ctx, int i, float *dst) {
  (void)ctx;
  (void)i;
  memcpy(dst, rne_values, 12 * sizeof *dst);
  return MPT_OK;
}

START_TEST(test_bf16_write_rounds_to_nearest_even) {
  /* ties to even both ways, just above a tie, the largest float (to infinity), -0, inf, NaN,
   * a subnormal, a value that carries into the exponent */
  const float v[12] = {1.0f, f_of(0x3F808000u), f_of(0x3F818000u), f_of(0x3F808001u),
                       f_of(0x7F7FFFFFu), -0.0f, 1.0f / 0.0f, f_of(0x7FC00001u),
                       f_of(0x00012345u), f_of(0x3FFFFFFFu), -2.5f, f_of(0x3F807FFFu)};
  const uint16_t want[12] = {0x3F80, 0x3F80, 0x3F82, 0x3F81, 0x7F80, 0x8000, 0x7F80, 0x7FC0,
                             0x0001, 0x4000, 0xC020, 0x3F80};
  for (int i = 0; i < 12; i++) ck_assert_uint_eq(rne_bf16(v[i]), want[i]);
  rne_values = v;
  mpt_st_write_tensor t = {.name = "x", .ndim = 2, .shape = {3, 4}};
  ck_assert_int_eq(mpt_st_write(path_of("b.safetensors"), &t, 1, NULL, 0, MPT_ST_BF16,
                                values_fill, NULL), MPT_OK);
  size_t n;
  char *f = slurp(path_of("b.safetensors"), &n);
  uint64_t hn = 0;
  for (int k = 7; k >= 0; k--) hn = hn << 8 | (unsigned char)f[k];
  ck_assert_int_eq(n, 8 + hn + 24);
  for (int i = 0; i < 12; i++) {
    const unsigned char *b = (const unsigned char *)f + 8 + hn + 2 * i;
    ck_assert_msg((b[0] | b[1] << 8) == want[i], "value %d: %04x, want %04x", i,
                  b[0] | b[1] << 8, want[i]);
  }
  f[8 + hn] = 0;
  ck_assert_ptr_nonnull(strstr(f + 8, "{\"x\":{\"dtype\":\"BF16\",\"shape\":[3,4],"
                                      "\"data_offsets\":[0,24]}}"));
  free(f);
  mpt_st_file *sf;
  ck_assert_int_eq(mpt_st_open(path_of("b.safetensors"), &sf), MPT_OK);
  float r[12];
  ck_assert_int_eq(mpt_st_read_f32(sf, mpt_st_find(sf, "x"), r, 12), MPT_OK);
  for (int i = 0; i < 12; i++) {
    const uint32_t u = (uint32_t)want[i] << 16;
    ck_assert_int_eq(memcmp(&r[i], &u, 4), 0);
  }
  mpt_st_close(sf);
  ASSERT_ERR(mpt_st_write(path_of("c.safetensors"), &t, 1, NULL, 0, (mpt_st_dtype)7,
                          values_fill, NULL), MPT_EINVAL, "dtype 7");
}
END_TEST

/* The file names in folder `dir`, sorted, joined by spaces. */
static void list_dir(const char *dir, char *out, size_t cap) {
  char cmd[700];
  snprintf(cmd, sizeof cmd, "ls '%s' | tr '\\n' ' '", dir);
  FILE *p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  size_t k = fread(out, 1, cap - 1, p);
  out[k] = 0;
  pclose(p);
}

START_TEST(test_gpt_bf16_and_sharded_models_round_trip) {
  mpt_gpt_layout lay;
  float *p = tiny_params(&lay);
  float *q = malloc((size_t)lay.total * sizeof *q);
  mpt_gpt_config c;
  char names[1024];
  /* bf16: every value read back is the round-to-nearest-even of the written one */
  ck_assert_int_eq(mkdir(path_of("b"), 0755), 0);
  mpt_st_save_options o = mpt_st_save_options_default();
  ck_assert_int_eq(o.dtype, MPT_ST_F32);
  ck_assert_int_eq(o.shard_nbytes, 5000000000LL);
  o.dtype = MPT_ST_BF16;
  ck_assert_int_eq(mpt_gpt_st_write(path_of("b"), &tiny, p, &o), MPT_OK);
  ck_assert_int_eq(mpt_gpt_file_read(path_of("b"), &tiny, &c, q, lay.total), MPT_OK);
  for (int64_t i = 0; i < lay.total; i++) {
    const uint32_t u = (uint32_t)rne_bf16(p[i]) << 16;
    ck_assert_msg(memcmp(&q[i], &u, 4) == 0, "parameter %lld: %a from %a", (long long)i,
                  (double)q[i], (double)p[i]);
  }
  size_t n;
  char *cfg = slurp(path_of("b/config.json"), &n);
  cfg[n - 1] = 0;
  ck_assert_ptr_nonnull(strstr(cfg, "\"torch_dtype\": \"bfloat16\""));
  free(cfg);
  /* sharded: the model is 2,912 bytes of F32 (wte 800, wpe 128, 976 per layer, ln_f 32);
   * 500-byte shards, filled in order: wte (800) alone, then 496, 336, 496, 480, 304 bytes */
  ck_assert_int_eq(mkdir(path_of("s"), 0755), 0);
  ck_assert_int_eq(mpt_gpt_st_write(path_of("s"), &tiny, p, NULL), MPT_OK); /* one file first */
  o.dtype = MPT_ST_F32;
  o.shard_nbytes = 500;
  ck_assert_int_eq(mpt_gpt_st_write(path_of("s"), &tiny, p, &o), MPT_OK);
  list_dir(path_of("s"), names, sizeof names);
  ck_assert_str_eq(names, "config.json model-00001-of-00006.safetensors "
                   "model-00002-of-00006.safetensors model-00003-of-00006.safetensors "
                   "model-00004-of-00006.safetensors model-00005-of-00006.safetensors "
                   "model-00006-of-00006.safetensors model.safetensors.index.json ");
  ck_assert_int_eq(mpt_gpt_st_is_path(path_of("s")), 1);
  memset(q, 0x7f, (size_t)lay.total * sizeof *q);
  ck_assert_int_eq(mpt_gpt_file_read(path_of("s"), &tiny, &c, q, lay.total), MPT_OK);
  ck_assert_int_eq(memcmp(p, q, (size_t)lay.total * sizeof *p), 0); /* bit-exact */
  char *idx = slurp(path_of("s/model.safetensors.index.json"), &n);
  idx[n - 1] = 0;
  ck_assert_ptr_nonnull(strstr(idx, "\"total_size\": 2912"));
  ck_assert_ptr_nonnull(strstr(idx, "\"wte.weight\": \"model-00001-of-00006.safetensors\""));
  ck_assert_ptr_nonnull(strstr(idx, "\"wpe.weight\": \"model-00002-of-00006.safetensors\""));
  ck_assert_ptr_nonnull(strstr(idx, "\"h.0.ln_2.bias\": \"model-00003-of-00006.safetensors\""));
  ck_assert_ptr_nonnull(strstr(idx, "\"ln_f.bias\": \"model-00006-of-00006.safetensors\""));
  free(idx);
  mpt_st_file *sf;
  ck_assert_int_eq(mpt_st_open_model(path_of("s"), &sf), MPT_OK);
  ck_assert_int_eq(mpt_st_num_shards(sf), 6);
  ck_assert_int_eq(mpt_st_num_tensors(sf), 28);
  ck_assert_str_eq(mpt_st_shard_path(sf, mpt_st_find(sf, "ln_f.bias")->shard),
                   path_of("s/model-00006-of-00006.safetensors"));
  ck_assert_ptr_null(mpt_st_shard_path(sf, 6));
  ck_assert_str_eq(mpt_st_metadata(sf, "format"), "pt");
  mpt_st_close(sf);
  /* each shard a valid file of the bytes above */
  static const int64_t shard_bytes[6] = {800, 496, 336, 496, 480, 304};
  for (int k = 1; k <= 6; k++) {
    char name[64];
    snprintf(name, sizeof name, "s/model-%05d-of-00006.safetensors", k);
    ck_assert_int_eq(mpt_st_open(path_of(name), &sf), MPT_OK);
    int64_t bytes = 0;
    for (int i = 0; i < mpt_st_num_tensors(sf); i++)
      bytes += mpt_st_tensor_at(sf, i)->end - mpt_st_tensor_at(sf, i)->begin;
    ck_assert_int_eq(bytes, shard_bytes[k - 1]);
    mpt_st_close(sf);
  }
  /* 3 shards of another count replace the 6 (960, 976, 976 bytes); one file the shards */
  o.shard_nbytes = 1000;
  ck_assert_int_eq(mpt_gpt_st_write(path_of("s"), &tiny, p, &o), MPT_OK);
  list_dir(path_of("s"), names, sizeof names);
  ck_assert_str_eq(names, "config.json model-00001-of-00003.safetensors "
                   "model-00002-of-00003.safetensors model-00003-of-00003.safetensors "
                   "model.safetensors.index.json ");
  memset(q, 0, (size_t)lay.total * sizeof *q);
  ck_assert_int_eq(mpt_gpt_file_read(path_of("s"), &tiny, &c, q, lay.total), MPT_OK);
  ck_assert_int_eq(memcmp(p, q, (size_t)lay.total * sizeof *p), 0);
  ck_assert_int_eq(mpt_gpt_st_write(path_of("s"), &tiny, p, NULL), MPT_OK);
  list_dir(path_of("s"), names, sizeof names);
  ck_assert_str_eq(names, "config.json model.safetensors ");
  ASSERT_ERR(mpt_gpt_st_write(path_of("s/model.safetensors.index.json"), &tiny, p, &o),
             MPT_EINVAL, "an index is written with its shards: give their folder");
  /* a file path is one file whatever the shard size */
  ck_assert_int_eq(mpt_gpt_st_write(path_of("one.safetensors"), &tiny, p, &o), MPT_OK);
  ck_assert_int_eq(mpt_st_open_model(path_of("one.safetensors"), &sf), MPT_OK);
  ck_assert_int_eq(mpt_st_num_shards(sf), 1);
  mpt_st_close(sf);
  free(q);
  free(p);
}
END_TEST

START_TEST(test_bad_indexes_and_configs_are_refused_naming_the_problem) {
  const unsigned char zeros[64] = {0};
  const char *a = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  const char *b = "{\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
  const char *ab = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}";
  hand_file("x1.safetensors", a, zeros, 8);
  hand_file("x2.safetensors", b, zeros, 8);
  hand_file("x3.safetensors", ab, zeros, 16);
  mpt_st_file *f = NULL;
  write_bytes(path_of("ok.index.json"), "{\"metadata\": {\"total_size\": 16}, \"weight_map\": "
              "{\"b\": \"x2.safetensors\", \"a\": \"x1.safetensors\"}}", 0);
  ck_assert_int_eq(mpt_st_open_index(path_of("ok.index.json"), &f), MPT_OK);
  ck_assert_int_eq(mpt_st_num_shards(f), 2);
  ck_assert_str_eq(mpt_st_tensor_at(f, 0)->name, "b"); /* shard order: first mention */
  ck_assert_int_eq(mpt_st_tensor_at(f, 1)->shard, 1);
  float v[2] = {1, 1};
  ck_assert_int_eq(mpt_st_read_f32(f, mpt_st_find(f, "a"), v, 2), MPT_OK);
  ck_assert(v[0] == 0 && v[1] == 0);
  mpt_st_close(f);
  static const struct { const char *json; const char *why; } cases[] = {
      {"{\"weight_map\": {\"a\": \"x1.safetensors\", \"b\": \"gone.safetensors\"}}",
       "names shard 'gone.safetensors', which does not exist"},
      {"{\"weight_map\": {\"a\": \"x1.safetensors\", \"b\": \"x3.safetensors\"}}",
       "tensor 'a' is in two shards, 'x1.safetensors' and 'x3.safetensors'"},
      {"{\"weight_map\": {\"a\": \"x3.safetensors\"}}",
       "shard 'x3.safetensors' holds tensor 'b', which the index's weight_map does not list"},
      {"{\"weight_map\": {\"a\": \"x1.safetensors\", \"b\": \"x2.safetensors\", "
       "\"c\": \"x2.safetensors\"}}",
       "puts tensor 'c' in shard 'x2.safetensors', which does not hold it"},
      {"{\"weight_map\": {\"a\": \"x1.safetensors\", \"a\": \"x2.safetensors\"}}",
       "duplicate key 'a'"},
      {"{\"metadata\": {}}", "has no \"weight_map\" object"},
      {"{\"weight_map\": {\"a\": \"../x1.safetensors\"}}", "tensor 'a' is not mapped to a file name"},
      {"{\"weight_map\": {\"a\": 3}}", "tensor 'a' is not mapped to a file name"},
      {"{\"weight_map\": {\"a\": \"x1.safetensors\",}}", "invalid JSON at byte 38: trailing comma"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char name[32];
    snprintf(name, sizeof name, "bad%zu.index.json", i);
    write_bytes(path_of(name), cases[i].json, 0);
    f = NULL;
    ASSERT_ERR(mpt_st_open_index(path_of(name), &f), MPT_EFORMAT, name, cases[i].why);
    ck_assert_ptr_null(f);
  }
  /* a shard that is itself bad: its own message */
  hand_file("x4.safetensors", a, zeros, 4);
  write_bytes(path_of("cut.index.json"), "{\"weight_map\": {\"a\": \"x4.safetensors\"}}", 0);
  ASSERT_ERR(mpt_st_open_index(path_of("cut.index.json"), &f), MPT_EFORMAT, "x4.safetensors",
             "past the end of the data (4 bytes)");
  ASSERT_ERR(mpt_st_open_index(path_of("none.index.json"), &f), MPT_ENOENT, "none.index.json");
  /* a GPT folder: both layouts at once, neither; config dtypes */
  mpt_gpt_layout lay;
  float *p = tiny_params(&lay);
  mpt_gpt_config c;
  ck_assert_int_eq(mkdir(path_of("m"), 0755), 0);
  mpt_st_save_options o = mpt_st_save_options_default();
  o.shard_nbytes = 500;
  ck_assert_int_eq(mpt_gpt_st_write(path_of("m"), &tiny, p, &o), MPT_OK);
  char cmd[1200];
  snprintf(cmd, sizeof cmd, "cp '%s' '%s'", path_of("m/model-00001-of-00006.safetensors"),
           path_of("m/model.safetensors"));
  ck_assert_int_eq(system(cmd), 0);
  ASSERT_ERR(mpt_gpt_file_read_header(path_of("m"), &c), MPT_EFORMAT,
             "holds both model.safetensors and model.safetensors.index.json");
  ck_assert_int_eq(unlink(path_of("m/model.safetensors")), 0);
  ck_assert_int_eq(unlink(path_of("m/model-00003-of-00006.safetensors")), 0);
  ASSERT_ERR(mpt_gpt_file_read_header(path_of("m"), &c), MPT_EFORMAT,
             "names shard 'model-00003-of-00006.safetensors', which does not exist");
  ck_assert_int_eq(unlink(path_of("m/model.safetensors.index.json")), 0);
  ASSERT_ERR(mpt_gpt_file_read_header(path_of("m"), &c), MPT_ENOENT,
             "holds neither model.safetensors nor model.safetensors.index.json");
  ck_assert_int_eq(mpt_gpt_st_write(path_of("m"), &tiny, p, NULL), MPT_OK);
  write_bytes(path_of("m/config.json"), "{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 4, "
              "\"n_positions\": 8, \"vocab_size\": 50, \"torch_dtype\": \"bfloat16\"}", 0);
  ASSERT_ERR(mpt_gpt_file_read_header(path_of("m"), &c), MPT_EFORMAT,
             "tensor 'wte.weight' is F32, the config", "gives BF16 (torch_dtype)");
  write_bytes(path_of("m/config.json"), "{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 4, "
              "\"n_positions\": 8, \"vocab_size\": 50, \"dtype\": \"int8\"}", 0);
  ASSERT_ERR(mpt_gpt_file_read_header(path_of("m"), &c), MPT_EFORMAT,
             "dtype 'int8' is not float32, bfloat16 or float16");
  write_bytes(path_of("m/config.json"), "{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 4, "
              "\"n_positions\": 8, \"vocab_size\": 50, \"torch_dtype\": \"float32\"}", 0);
  ck_assert_int_eq(mpt_gpt_file_read_header(path_of("m"), &c), MPT_OK);
  write_bytes(path_of("m/config.json"), "{\"n_layer\": 2, \"n_head\": 2, \"n_embd\": 4, "
              "\"n_positions\": 8, \"vocab_size\": 51}", 0);
  ASSERT_ERR(mpt_gpt_file_read_header(path_of("m"), &c), MPT_EFORMAT,
             "tensor 'wte.weight' has shape [50, 4], the config", "gives [51, 4]");
  free(p);
}
END_TEST

START_TEST(test_sizes_parse_as_transformers_writes_them) {
  static const struct { const char *text; int64_t nbytes; } good[] = {
      {"5GB", 5000000000LL}, {"5gb", 5000000000LL}, {"2GiB", 2147483648LL}, {"10KB", 10000},
      {"10kib", 10240}, {"123", 123}, {"7B", 7}, {"3MB", 3000000}, {"1MiB", 1048576},
      {"1TB", 1000000000000LL}};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
    int64_t v = 0;
    ck_assert_int_eq(mpt_st_parse_size(good[i].text, &v), MPT_OK);
    ck_assert_int_eq(v, good[i].nbytes);
  }
  static const char *const bad[] = {"", "0", "0GB", "5 GB", "-5GB", "5XB", "GB", "1.5GB",
                                    "99999999999999999999", "9999999999TB"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    int64_t v = 0;
    ASSERT_ERR(mpt_st_parse_size(bad[i], &v), MPT_EINVAL, "is not a positive whole number");
  }
}
END_TEST

static void add_tests(TCase *tc) {
  tcase_add_test(tc, test_gpt_round_trip_is_bit_identical_and_llmc_converts_byte_identically);
  tcase_add_test(tc, test_gpt_prefix_and_transformers_extras_are_accepted_others_refused);
  tcase_add_test(tc, test_bf16_and_f16_read_to_their_exact_values);
  tcase_add_test(tc, test_bad_files_are_refused_naming_file_and_problem);
  tcase_add_test(tc, test_bf16_write_rounds_to_nearest_even);
  tcase_add_test(tc, test_gpt_bf16_and_sharded_models_round_trip);
  tcase_add_test(tc, test_bad_indexes_and_configs_are_refused_naming_the_problem);
  tcase_add_test(tc, test_sizes_parse_as_transformers_writes_them);
}

int main(void) { return file_check_main("safetensors", 30, add_tests); }
