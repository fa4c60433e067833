/* libFuzzer target: the safetensors reader (mpt_st_open, mpt_st_read_f32,
 * src/ckpt/safetensors.c and its JSON parser src/ckpt/json.c) and the GPT-2 mapping
 * (mpt_gpt_st_read, src/ckpt/gpt_safetensors.c).
 *
 * The input is the content of a file. Checked for every input:
 * - mpt_st_open never crashes, hangs or leaks; on failure *out is NULL;
 * - when it succeeds: the 8-byte length N fits the file and every tensor's offsets satisfy
 *   begin <= end <= size - 8 - N and end - begin = count x dtype size, no two tensors overlap,
 *   no two share a name, and mpt_st_find finds each; every F32 / BF16 / F16 tensor (up to 1 MiB)
 *   reads, and its values equal the input's bytes decoded here independently (F32 bit for bit,
 *   BF16 as the high half of a float);
 * - as model.safetensors of a 1-layer GPT-2 (config.json: T 2, V 3, C 2, H 1):
 *   mpt_gpt_st_read never crashes, and when it succeeds wte's padded rows are 0. */
#include "fuzz_common.h"

#include "mpitrain/safetensors.h"

static fuzz_scratch input_file;
static char model_dir[512];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void remove_model_dir(void) {
  char p[600];
  snprintf(p, sizeof p, "%s/config.json", model_dir);
  unlink(p);
  snprintf(p, sizeof p, "%s/model.safetensors", model_dir);
  unlink(p);
  rmdir(model_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fuzz_scratch_open(&input_file, "fuzz_st_input");
  const char *t = getenv("TMPDIR");
  snprintf(model_dir, sizeof model_dir, "%s/mpt_fuzz_st_XXXXXX", t && t[0] ? t : "/tmp");
  if (!mkdtemp(model_dir)) fuzz_fail("mkdtemp %s: %s", model_dir, strerror(errno));
  atexit(remove_model_dir);
  char p[600];
  snprintf(p, sizeof p, "%s/config.json", model_dir);
  FILE *f = fopen(p, "w");
  if (!f) fuzz_fail("cannot write %s", p);
  fputs("{\"n_layer\": 1, \"n_head\": 1, \"n_embd\": 2, \"n_positions\": 2, \"vocab_size\": 3}", f);
  fclose(f);
  return 0;
}

static void check_open(const uint8_t *d, size_t size) {
  mpt_st_file *f = (mpt_st_file *)1;
  mpt_status st = mpt_st_open(input_file.path, &f);
  if (st != MPT_OK) {
    if (f) fuzz_fail("failed open left *out set");
    return;
  }
  uint64_t hn = 0;
  for (int k = 7; k >= 0; k--) hn = hn << 8 | d[k];
  if (size < 8 || hn > size - 8) fuzz_fail("opened with header length %llu in %zu bytes",
                                           (unsigned long long)hn, size);
  const int64_t data = (int64_t)(size - 8 - hn);
  const int n = mpt_st_num_tensors(f);
  for (int i = 0; i < n; i++) {
    const mpt_st_tensor *t = mpt_st_tensor_at(f, i);
    if (t->begin < 0 || t->begin > t->end || t->end > data ||
        t->end - t->begin != t->count * t->dtype_nbytes)
      fuzz_fail("tensor '%s' [%lld, %lld] of %lld x %d in %lld bytes", t->name,
                (long long)t->begin, (long long)t->end, (long long)t->count, t->dtype_nbytes,
                (long long)data);
    if (mpt_st_find(f, t->name) != t) fuzz_fail("tensor '%s' not found by name", t->name);
    for (int j = 0; j < i; j++) {
      const mpt_st_tensor *u = mpt_st_tensor_at(f, j);
      if (strcmp(u->name, t->name) == 0) fuzz_fail("name '%s' twice", t->name);
      if (t->begin < u->end && u->begin < t->end) fuzz_fail("'%s' and '%s' overlap", u->name, t->name);
    }
    const int kind = strcmp(t->dtype, "F32") == 0 ? 0 : strcmp(t->dtype, "BF16") == 0 ? 1
                   : strcmp(t->dtype, "F16") == 0 ? 2 : -1;
    if (kind < 0 || t->count > (1 << 18)) continue;
    float *v = malloc((size_t)(t->count ? t->count : 1) * sizeof *v);
    if (mpt_st_read_f32(f, t, v, t->count) != MPT_OK) fuzz_fail("tensor '%s' does not read", t->name);
    const uint8_t *p = d + 8 + hn + t->begin;
    for (int64_t j = 0; j < t->count && kind < 2; j++) {
      uint32_t u = kind == 0 ? (uint32_t)p[4 * j] | (uint32_t)p[4 * j + 1] << 8 |
                                   (uint32_t)p[4 * j + 2] << 16 | (uint32_t)p[4 * j + 3] << 24
                             : ((uint32_t)p[2 * j] | (uint32_t)p[2 * j + 1] << 8) << 16;
      if (memcmp(&u, &v[j], 4) != 0) fuzz_fail("tensor '%s' element %lld differs", t->name, (long long)j);
    }
    free(v);
  }
  mpt_st_close(f);
}

static void check_gpt(const uint8_t *d, size_t size) {
  char p[600];
  snprintf(p, sizeof p, "%s/model.safetensors", model_dir);
  FILE *f = fopen(p, "wb");
  if (!f || fwrite(d, 1, size, f) != size) fuzz_fail("cannot write %s", p);
  fclose(f);
  mpt_gpt_config c = {2, 3, 1, 1, 2, 0};
  mpt_gpt_layout lay;
  if (mpt_gpt_layout_compute(&c, &lay) != MPT_OK) fuzz_fail("layout");
  float params[512];
  if (lay.total > 512) fuzz_fail("layout of %lld", (long long)lay.total);
  memset(params, 0xff, sizeof params);
  if (mpt_gpt_st_read(model_dir, NULL, &c, params, 512) != MPT_OK) return;
  for (int64_t i = 3 * 2; i < lay.count[0]; i++)
    if (params[i] != 0.0f) fuzz_fail("wte padded element %lld is %g", (long long)i, (double)params[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_scratch_write(&input_file, data, size);
  check_open(data, size);
  check_gpt(data, size);
  mpt_error_clear();
  return 0;
}
