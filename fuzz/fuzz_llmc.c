/* libFuzzer target: the llm.c file readers, token shards (mpt_token_shard_read and
 * mpt_token_data, src/data/tokens.c, token_data.c) and GPT model files (mpt_gpt_file_read,
 * src/ckpt/gpt_file.c).
 *
 * The input is the content of a file. Checked for every input:
 * - as a shard: mpt_token_shard_read (vocabulary 65536 and 256) never crashes, hangs or leaks;
 *   it succeeds exactly when the header says magic 20240520, version 1, a count N >= 0 and the
 *   size is 1024 + 2 N (and, for 256, every token is below 256), decided here independently;
 *   the tokens equal the input's bytes; read_header agrees; failures leave the struct zeroed;
 * - the same bytes with the header repaired (magic, version, the count the size implies) always
 *   read; as windows (B 1, T 2) there are floor((N - 1) / 2) of them (none if N <= 2) and each
 *   equals the tokens it should (the first 64 are compared);
 * - as a model file: mpt_gpt_file_read_header succeeds exactly when the magic and version are
 *   right, the config is valid and the size is 1024 + 4 N (N from mpt_gpt_layout_compute);
 *   then mpt_gpt_file_read returns the input's floats bit for bit, and a model expecting one
 *   layer more is refused with MPT_ESHAPE. */
#include "fuzz_common.h"

static fuzz_scratch input_file, repaired_file;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fuzz_scratch_open(&input_file, "fuzz_llmc_input");
  fuzz_scratch_open(&repaired_file, "fuzz_llmc_repaired");
  return 0;
}

static int32_t le32(const uint8_t *p) {
  return (int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                   (uint32_t)p[3] << 24);
}

static int shard_valid(const uint8_t *d, size_t size, int vocab) {
  if (size < 1024 || le32(d) != 20240520 || le32(d + 4) != 1 || le32(d + 8) < 0) return 0;
  if ((uint64_t)size != 1024 + 2 * (uint64_t)le32(d + 8)) return 0;
  for (size_t i = 1024; i + 1 < size; i += 2)
    if ((unsigned)(d[i] | d[i + 1] << 8) >= (unsigned)vocab) return 0;
  return 1;
}

static void check_shard(const char *path, const uint8_t *d, size_t size, int vocab) {
  mpt_token_shard s;
  mpt_status st = mpt_token_shard_read(path, vocab, &s);
  int want = shard_valid(d, size, vocab);
  if ((st == MPT_OK) != want)
    fuzz_fail("shard read (vocab %d) gave %s, expected %s", vocab, mpt_status_name(st),
              want ? "success" : "an error");
  if (st != MPT_OK) {
    if (s.count != 0 || s.tokens != NULL) fuzz_fail("failed shard read left the struct set");
    return;
  }
  if ((size_t)s.count != (size - 1024) / 2) fuzz_fail("shard count %lld", (long long)s.count);
  for (int64_t i = 0; i < s.count; i++)
    if (s.tokens[i] != (d[1024 + 2 * i] | d[1025 + 2 * i] << 8))
      fuzz_fail("token %lld differs", (long long)i);
  int64_t c = -1;
  if (mpt_token_shard_read_header(path, &c) != MPT_OK || c != s.count)
    fuzz_fail("read_header disagrees with the read");
  mpt_token_shard_free(&s);
}

static void check_windows(const char *path, const uint8_t *d, size_t size) {
  int64_t n = (int64_t)(size - 1024) / 2;
  mpt_token_data_config cfg = {1, 2, 65536};
  mpt_token_data *td = NULL;
  mpt_status st = mpt_token_data_init(&td, path, &cfg);
  int64_t nw = n > 2 ? (n - 1) / 2 : 0;
  if (nw == 0) {
    if (st != MPT_EFORMAT || td) fuzz_fail("%lld tokens (no window) gave %s", (long long)n,
                                           mpt_status_name(st));
    return;
  }
  if (st != MPT_OK || mpt_token_data_num_windows(td) != nw)
    fuzz_fail("windows over %lld tokens: %s", (long long)n, mpt_status_name(st));
  for (int64_t w = 0; w < nw && w < 64; w++) {
    int32_t x[2], y[2];
    if (mpt_token_data_read_window(td, w, x, y) != MPT_OK) fuzz_fail("window %lld", (long long)w);
    for (int j = 0; j < 3; j++) {
      int64_t t = 2 * w + j;
      int32_t v = d[1024 + 2 * t] | d[1025 + 2 * t] << 8;
      if ((j < 2 && x[j] != v) || (j > 0 && y[j - 1] != v))
        fuzz_fail("window %lld token %d", (long long)w, j);
    }
  }
  mpt_token_data_free(td);
}

static void check_model(const char *path, const uint8_t *d, size_t size) {
  mpt_gpt_config c;
  mpt_status st = mpt_gpt_file_read_header(path, &c);
  int want = 0;
  mpt_gpt_layout lay;
  mpt_gpt_config h = {0};
  if (size >= 1024 && le32(d) == 20240326 && le32(d + 4) == 3) {
    h.max_seq_len = le32(d + 8), h.vocab_size = le32(d + 12), h.num_layers = le32(d + 16);
    h.num_heads = le32(d + 20), h.channels = le32(d + 24), h.padded_vocab_size = le32(d + 28);
    want = h.padded_vocab_size >= 1 && mpt_gpt_layout_compute(&h, &lay) == MPT_OK &&
           (uint64_t)size == 1024 + 4 * (uint64_t)lay.total;
  }
  if ((st == MPT_OK) != want)
    fuzz_fail("model header read gave %s, expected %s", mpt_status_name(st),
              want ? "success" : "an error");
  if (st != MPT_OK) return;
  if (memcmp(&c, &h, sizeof c) != 0) fuzz_fail("model header fields differ from the bytes");
  float *p = malloc((size_t)lay.total * sizeof *p + 1);
  if (!p) fuzz_fail("out of memory");
  mpt_gpt_config got;
  if (mpt_gpt_file_read(path, &c, &got, p, lay.total) != MPT_OK)
    fuzz_fail("model read failed after its header read");
  if (memcmp(p, d + 1024, (size_t)lay.total * 4) != 0) fuzz_fail("model floats differ");
  mpt_gpt_config more = c;
  if (more.num_layers < MPT_GPT_MAX_LAYERS) {
    more.num_layers++;
    if (mpt_gpt_file_read(path, &more, &got, p, lay.total) != MPT_ESHAPE)
      fuzz_fail("a model of other shape was not refused");
  }
  free(p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_scratch_write(&input_file, data, size);
  check_shard(input_file.path, data, size, 65536);
  check_shard(input_file.path, data, size, 256);
  check_model(input_file.path, data, size);
  if (size >= 1024 && size % 2 == 0) {
    uint8_t *r = malloc(size);
    if (!r) fuzz_fail("out of memory");
    memcpy(r, data, size);
    int32_t f[3] = {20240520, 1, (int32_t)((size - 1024) / 2)};
    for (int i = 0; i < 3; i++)
      for (int k = 0; k < 4; k++) r[4 * i + k] = (uint8_t)((uint32_t)f[i] >> (8 * k));
    fuzz_scratch_write(&repaired_file, r, size);
    check_shard(repaired_file.path, r, size, 65536);
    check_windows(repaired_file.path, r, size);
    free(r);
  }
  return 0;
}
