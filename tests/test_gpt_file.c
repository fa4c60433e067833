/* Tests for src/ckpt/gpt_file.c: the llm.c model file. The layout against GPT-2 124M's known
 * parameter count (124,475,904) and hand-computed offsets; a file written and read back
 * bit-identically (NaN payloads and -0 included), its bytes checked against the format by hand;
 * every malformed file refused with the file named (wrong magic, wrong version, truncated,
 * bytes after the data, a header that does not match the length, a bad config), and a model
 * that expects another shape. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mpitrain/gpt_file.h"

#define FILE_CHECK_NAME "test_gpt_file"
#include "file_check.h"

/* T 8, V 50 (padded to 128), L 2, H 2, C 4. */
static const mpt_gpt_config tiny = {8, 50, 2, 2, 4, 0};

START_TEST(test_layout_of_gpt2_124m_has_its_known_parameter_count) {
  ck_assert_int_eq(mpt_gpt_padded_vocab(50257), 50304);
  ck_assert_int_eq(mpt_gpt_padded_vocab(256), 256);
  ck_assert_int_eq(mpt_gpt_padded_vocab(257), 384);
  ck_assert_int_eq(mpt_gpt_padded_vocab(0), -1);
  mpt_gpt_config c = {1024, 50257, 12, 12, 768, 50304};
  mpt_gpt_layout l;
  ck_assert_int_eq(mpt_gpt_layout_compute(&c, &l), MPT_OK);
  ck_assert_int_eq(l.total, 124475904);
  c.padded_vocab_size = 0; /* computed */
  ck_assert_int_eq(mpt_gpt_layout_compute(&c, &l), MPT_OK);
  ck_assert_int_eq(l.total, 124475904);
  ck_assert_int_eq(l.count[0], 50304LL * 768);
  ck_assert_int_eq(l.count[4], 12LL * 3 * 768 * 768);
  ck_assert_int_eq(l.offset[4], 50304LL * 768 + 1024 * 768 + 2 * 12 * 768);
  ck_assert_int_eq(l.count[12], 12LL * 768 * 4 * 768);
  ck_assert_int_eq(l.offset[15], l.total - 768);
  for (int i = 1; i < MPT_GPT_NUM_TENSORS; i++)
    ck_assert_int_eq(l.offset[i], l.offset[i - 1] + l.count[i - 1]);
  /* Shapes: their products are the counts; a few written out. */
  for (int i = 0; i < MPT_GPT_NUM_TENSORS; i++) {
    int64_t prod = 1;
    for (int d = 0; d < l.ndim[i]; d++) prod *= l.shape[i][d];
    ck_assert_int_eq(prod, l.count[i]);
  }
  ck_assert_int_eq(l.ndim[0], 2);
  ck_assert_int_eq(l.shape[0][0], 50304);
  ck_assert_int_eq(l.ndim[4], 3);
  ck_assert_int_eq(l.shape[4][1], 3 * 768);
  ck_assert_int_eq(l.shape[12][2], 4 * 768);
  ck_assert_int_eq(l.ndim[15], 1);
  ck_assert_str_eq(mpt_gpt_tensor_name(0), "wte");
  ck_assert_str_eq(mpt_gpt_tensor_name(12), "fcprojw");
  ck_assert_str_eq(mpt_gpt_tensor_name(15), "lnfb");
  ck_assert_str_eq(mpt_gpt_tensor_name(16), "?");
  /* Bad configs, each named. */
  mpt_gpt_config b = tiny;
  b.channels = 5;
  ASSERT_ERR(mpt_gpt_layout_compute(&b, &l), MPT_EINVAL, "channels 5 not a multiple of heads 2");
  b = tiny;
  b.num_layers = 0;
  ASSERT_ERR(mpt_gpt_layout_compute(&b, &l), MPT_EINVAL, "layers 0");
  b = tiny;
  b.padded_vocab_size = 49;
  ASSERT_ERR(mpt_gpt_layout_compute(&b, &l), MPT_EINVAL, "padded vocabulary 49");
  b = tiny;
  b.channels = MPT_GPT_MAX_CHANNELS * 2;
  ASSERT_ERR(mpt_gpt_layout_compute(&b, &l), MPT_EINVAL, "channels");
}
END_TEST

static float *tiny_params(int64_t *n) {
  mpt_gpt_layout l;
  ck_assert_int_eq(mpt_gpt_layout_compute(&tiny, &l), MPT_OK);
  /* 128*4 + 8*4 + 2*4*2 + 2*12*4 + 2*12 + 2*16 + 2*4 + 2*4*2 + 2*16*4 + 2*16 + 2*4*16 + 2*4 + 8 */
  ck_assert_int_eq(l.total, 512 + 32 + 16 + 96 + 24 + 32 + 8 + 16 + 128 + 32 + 128 + 8 + 8);
  float *p = malloc((size_t)l.total * sizeof *p);
  for (int64_t i = 0; i < l.total; i++) p[i] = (float)sin((double)i) * (float)(i + 1);
  uint32_t nan_payload = 0x7FC01234u, neg_zero = 0x80000000u;
  memcpy(&p[3], &nan_payload, 4);
  memcpy(&p[7], &neg_zero, 4);
  p[9] = INFINITY;
  *n = l.total;
  return p;
}

static int32_t le32_at(const uint8_t *b, int slot) {
  const uint8_t *q = b + 4 * slot;
  return (int32_t)((uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 |
                   (uint32_t)q[3] << 24);
}

START_TEST(test_model_file_round_trip_is_bit_identical_and_matches_the_format) {
  int64_t n;
  float *p = tiny_params(&n);
  const char *path = path_of("tiny.bin");
  ck_assert_int_eq(mpt_gpt_file_write(path, &tiny, p), MPT_OK);
  /* The bytes by hand. */
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  size_t nbytes = 1024 + 4 * (size_t)n;
  uint8_t *b = malloc(nbytes + 1);
  ck_assert_int_eq(fread(b, 1, nbytes + 1, f), nbytes);
  fclose(f);
  const int32_t want[8] = {20240326, 3, 8, 50, 2, 2, 4, 128};
  for (int i = 0; i < 8; i++) ck_assert_int_eq(le32_at(b, i), want[i]);
  for (int i = 8; i < 256; i++) ck_assert_int_eq(le32_at(b, i), 0);
  for (int64_t i = 0; i < n; i++) {
    uint32_t u;
    memcpy(&u, &p[i], 4);
    ck_assert_int_eq((uint32_t)le32_at(b + 1024, (int)i), u);
  }
  free(b);
  mpt_gpt_config c;
  ck_assert_int_eq(mpt_gpt_file_read_header(path, &c), MPT_OK);
  mpt_gpt_config full = tiny;
  full.padded_vocab_size = 128;
  ck_assert_int_eq(memcmp(&c, &full, sizeof c), 0);
  float *q = calloc((size_t)n + 5, sizeof *q);
  memset(&c, 0, sizeof c);
  ck_assert_int_eq(mpt_gpt_file_read(path, &tiny, &c, q, n + 5), MPT_OK);
  ck_assert_int_eq(memcmp(q, p, (size_t)n * sizeof *q), 0);
  ck_assert_int_eq(c.padded_vocab_size, 128);
  ck_assert(q[n] == 0.0f); /* nothing past N */
  /* Written again over itself (atomic replace), no temporary file left. */
  p[0] = 42.0f;
  ck_assert_int_eq(mpt_gpt_file_write(path, &full, p), MPT_OK);
  ck_assert_int_eq(mpt_gpt_file_read(path, NULL, NULL, q, n), MPT_OK);
  ck_assert(q[0] == 42.0f);
  char cmd[600];
  snprintf(cmd, sizeof cmd, "ls '%s' | grep -q tmp", tmpdir);
  ck_assert_int_ne(system(cmd), 0);
  ASSERT_ERR(mpt_gpt_file_write(path_of("no/dir/m.bin"), &tiny, p), MPT_EIO, "no/dir/m.bin");
  free(q);
  free(p);
}
END_TEST

/* Rewrites int32 slot `slot` of the header of `path`. */
static void poke(const char *path, int slot, int32_t v) {
  FILE *f = fopen(path, "r+b");
  ck_assert_ptr_nonnull(f);
  uint8_t b[4];
  for (int k = 0; k < 4; k++) b[k] = (uint8_t)((uint32_t)v >> (8 * k));
  ck_assert_int_eq(fseek(f, 4L * slot, SEEK_SET), 0);
  ck_assert_int_eq(fwrite(b, 1, 4, f), 4);
  ck_assert_int_eq(fclose(f), 0);
}

START_TEST(test_model_file_rejects_bad_files_naming_them) {
  int64_t n;
  float *p = tiny_params(&n);
  float *q = malloc((size_t)n * sizeof *q);
  mpt_gpt_config c;
  const char *path = path_of("bad.bin");
  int64_t size = 1024 + 4 * n;

  ck_assert_int_eq(mpt_gpt_file_write(path, &tiny, p), MPT_OK);
  poke(path, 0, 20240520);
  ASSERT_ERR(mpt_gpt_file_read(path, NULL, &c, q, n), MPT_EFORMAT, "bad.bin", "magic 20240520",
             "token shard, not a model file");
  poke(path, 0, 1234);
  ASSERT_ERR(mpt_gpt_file_read_header(path, &c), MPT_EFORMAT, "bad.bin", "magic 1234");

  ck_assert_int_eq(mpt_gpt_file_write(path, &tiny, p), MPT_OK);
  poke(path, 1, 5);
  ASSERT_ERR(mpt_gpt_file_read(path, NULL, &c, q, n), MPT_EFORMAT, "version 5", "bf16");
  poke(path, 1, 1);
  ASSERT_ERR(mpt_gpt_file_read(path, NULL, &c, q, n), MPT_EFORMAT, "version 1", "expected 3");

  /* Truncated by one float, and one float too many. */
  ck_assert_int_eq(mpt_gpt_file_write(path, &tiny, p), MPT_OK);
  ck_assert_int_eq(truncate(path, size - 4), 0);
  char want[160];
  snprintf(want, sizeof want, "is %lld bytes, but its header (T 8, V 50, L 2, H 2, C 4, Vp 128) "
           "describes %lld parameters (%lld bytes): truncated", (long long)(size - 4),
           (long long)n, (long long)size);
  ASSERT_ERR(mpt_gpt_file_read(path, NULL, &c, q, n), MPT_EFORMAT, "bad.bin", want);
  ck_assert_int_eq(truncate(path, size + 4), 0);
  ASSERT_ERR(mpt_gpt_file_read_header(path, &c), MPT_EFORMAT, "bytes after the parameters");

  /* A header that does not match the length: one layer more, or other channels. */
  ck_assert_int_eq(mpt_gpt_file_write(path, &tiny, p), MPT_OK);
  poke(path, 4, 3);
  ASSERT_ERR(mpt_gpt_file_read(path, NULL, &c, q, n), MPT_EFORMAT, "L 3", "truncated");
  poke(path, 4, 2);
  poke(path, 6, 2);
  ASSERT_ERR(mpt_gpt_file_read(path, NULL, &c, q, n), MPT_EFORMAT, "C 2", "bytes after");
  /* An invalid config in the header: channels not a multiple of heads; a zero padded vocab. */
  poke(path, 6, 3);
  ASSERT_ERR(mpt_gpt_file_read_header(path, &c), MPT_EFORMAT, "bad header",
             "channels 3 not a multiple of heads 2");
  poke(path, 6, 4);
  poke(path, 7, 0);
  ASSERT_ERR(mpt_gpt_file_read_header(path, &c), MPT_EFORMAT, "padded vocabulary 0");
  poke(path, 7, 128);
  ck_assert_int_eq(mpt_gpt_file_read_header(path, &c), MPT_OK); /* restored: valid again */

  /* A model of another shape, a buffer too small. */
  mpt_gpt_config other = tiny;
  other.num_heads = 4;
  ASSERT_ERR(mpt_gpt_file_read(path, &other, &c, q, n), MPT_ESHAPE, "heads 2, the model expects 4");
  ASSERT_ERR(mpt_gpt_file_read(path, NULL, &c, q, n - 1), MPT_ESHAPE, "the buffer");

  /* Short, missing, a directory. */
  FILE *f = fopen(path, "wb");
  fputs("GPT", f);
  fclose(f);
  ASSERT_ERR(mpt_gpt_file_read_header(path, &c), MPT_EFORMAT, "bad.bin", "shorter than its");
  ASSERT_ERR(mpt_gpt_file_read_header(path_of("none.bin"), &c), MPT_ENOENT, "none.bin");
  ASSERT_ERR(mpt_gpt_file_read_header(tmpdir, &c), MPT_EIO, "not a regular file");
  free(q);
  free(p);
}
END_TEST

static void add_tests(TCase *tc) {
  tcase_add_test(tc, test_layout_of_gpt2_124m_has_its_known_parameter_count);
  tcase_add_test(tc, test_model_file_round_trip_is_bit_identical_and_matches_the_format);
  tcase_add_test(tc, test_model_file_rejects_bad_files_naming_them);
}

int main(void) { return file_check_main("gpt_file", 30, add_tests); }
