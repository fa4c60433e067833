/* Tests for the checkpoint reader of src/ckpt (include/mpitrain/ckpt.h): the file's layout
 * read back by hand against the documented format, damaged files, versions, a different model
 * or optimizer, and bad arguments. Round trips, the atomic writer, directories and the
 * collective wrappers are tested in tests/test_ckpt.c.
 *
 * Oracles: a damaged file (every truncation length sampled, every single-byte change) must give
 * an error status and leave the model's bytes untouched; format errors are checked by the
 * status and by words of the detail that name what differs.
 *
 * Models are tiny and built by hand (parameters and buffers with chosen names and shapes), on
 * the CPU (tests/ckpt_util.h). Each test works in its own temporary directory. The tests fork
 * (Check's default), so a crash in the reader is reported as a failed test, not a dead
 * program. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "mpitrain.h"
#include "ckpt_util.h"

/* The whole file at `path` (malloc'd; its size in *n). */
static unsigned char *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot open %s", path);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *buf = malloc((size_t)len + 1);
  ck_assert_ptr_nonnull(buf);
  ck_assert_uint_eq(fread(buf, 1, (size_t)len, f), (size_t)len);
  fclose(f);
  *n = (size_t)len;
  return buf;
}

static uint32_t le32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The layout of ckpt.h, read back by hand: preamble, meta, the first signature entry, the
 * size and the CRC. */
START_TEST(test_ckpt_layout_matches_the_documented_format) {
  mpt_model *a;
  mpt_optimizer *oa;
  const char *path = save_base(&a, &oa);
  size_t n;
  unsigned char *b = read_file(path, &n);
  ck_assert(memcmp(b, "MPTCKPT\0", 8) == 0);
#define LE32(off) le32(b + (off))
#define LE64(off) ((uint64_t)le32(b + (off)) | (uint64_t)le32(b + (off) + 4) << 32)
  ck_assert_uint_eq(LE32(8), MPT_CKPT_VERSION);
  ck_assert_uint_eq(LE32(12), 0);
  ck_assert_uint_eq(LE64(16), n);
  ck_assert_uint_eq(LE64(24), 3);    /* epoch */
  ck_assert_uint_eq(LE64(32), 1234); /* global step */
  ck_assert_uint_eq(LE64(40), 17);   /* step in epoch */
  ck_assert_uint_eq(LE64(48), 3);    /* sampler epoch */
  ck_assert_uint_eq(LE64(56), 0xfeedfacecafebeefULL);
  ck_assert_uint_eq(LE32(64), 4); /* world size */
  ck_assert_uint_eq(LE32(68), 2); /* RNGs */
  size_t off = 72 + 2 * 32;          /* version 2's resume block */
  ck_assert_uint_eq(LE64(off), 256);          /* global batch */
  ck_assert_uint_eq(LE64(off + 8), 17 * 256); /* epoch cursor */
  ck_assert_uint_eq(LE64(off + 16), 60000);   /* epoch samples */
  ck_assert_uint_eq(LE64(off + 24), 60001);   /* data set count */
  ck_assert_uint_eq(LE64(off + 32), 32);      /* batch size */
  ck_assert_uint_eq(LE32(off + 40), 2);       /* accumulate */
  ck_assert_uint_eq(LE32(off + 44), 0);       /* reserved */
  off += 48;
  ck_assert_uint_eq(LE32(off), 3);     /* parameters */
  ck_assert_uint_eq(LE32(off + 4), 2); /* buffers */
  ck_assert_uint_eq(LE32(off + 8), 8); /* strlen("a.weight") */
  ck_assert(memcmp(b + off + 12, "a.weight", 8) == 0);
  ck_assert_uint_eq(LE32(off + 20), MPT_F32);
  ck_assert_uint_eq(LE32(off + 24), 2);
  ck_assert_uint_eq(LE64(off + 28), 4);
  ck_assert_uint_eq(LE64(off + 36), 3);
  /* The first parameter value: after the signature (3 + 2 entries) and the optimizer header. */
  size_t data = n - 4 - 4 * (size_t)(mpt_model_param_count(a) + mpt_model_buffer_count(a) +
                                     2 * mpt_model_param_count(a));
  float first;
  uint32_t bits = LE32(data);
  memcpy(&first, &bits, 4);
  ck_assert(memcmp(&first, mpt_model_params(a), 4) == 0);
  ck_assert_uint_eq(LE32(n - 4), (uint32_t)crc32(0, b, (uInt)(n - 4)));
#undef LE32
#undef LE64
  free(b);
  mpt_optimizer_free(oa);
  mpt_model_free(a);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Damaged files                                                                              */

START_TEST(test_ckpt_truncation_is_a_clear_error) {
  mpt_model *a;
  mpt_optimizer *oa;
  const char *path = save_base(&a, &oa);
  size_t n;
  unsigned char *full = read_file(path, &n);
  mpt_model *b = make_model(MODEL_BASE, 9);
  mpt_optimizer *ob = make_opt(b, MPT_OPTIM_ADAMW, 0, 1, 3);
  snapshot s = take_snapshot(b);
  size_t lens[32];
  int nl = 0;
  for (int k = 0; k < 10; k++) lens[nl++] = n * (size_t)k / 10;
  const size_t interior[] = {1, 7, 8, 23, 24, 27, 28, 100, n - 5, n - 4, n - 1};
  for (size_t i = 0; i < sizeof interior / sizeof interior[0]; i++) lens[nl++] = interior[i];
  const char *cut = tmp_path("cut.mpt");
  for (int i = 0; i < nl; i++) {
    write_file(cut, full, lens[i]);
    mpt_status st = mpt_ckpt_load(cut, b, ob, NULL);
    ck_assert_msg(st == MPT_EFORMAT, "truncated to %zu of %zu bytes: %s (%s)", lens[i], n,
                  mpt_status_name(st), mpt_last_error());
    char want[64], got[64];
    snprintf(got, sizeof got, "%zu", lens[i]);
    snprintf(want, sizeof want, "expected %zu bytes", n);
    if (lens[i] >= 24) check_detail("truncated", "truncated", want, got, NULL);
    else if (lens[i] >= 8) check_detail("truncated", "truncated", got, NULL);
    check_snapshot(&s, b, "truncated");
    ck_assert_int_eq(mpt_optimizer_step_count(ob), 1);
    ck_assert_int_eq(mpt_ckpt_read_meta(cut, NULL, NULL), MPT_EFORMAT);
  }
  free_snapshot(&s);
  free(full);
  mpt_optimizer_free(oa), mpt_optimizer_free(ob);
  mpt_model_free(a), mpt_model_free(b);
}
END_TEST

/* Every byte of the file, changed (xor 0x01 and xor 0xff): an error, never a crash, never a
 * change to the model. CRC-32 detects every error burst of up to 32 bits. */
START_TEST(test_ckpt_every_byte_flip_is_detected) {
  mpt_model *a;
  mpt_optimizer *oa;
  const char *path = save_base(&a, &oa);
  size_t n;
  unsigned char *full = read_file(path, &n);
  mpt_model *b = make_model(MODEL_BASE, 9);
  mpt_optimizer *ob = make_opt(b, MPT_OPTIM_ADAMW, 0, 1, 3);
  snapshot s = take_snapshot(b);
  const char *bad = tmp_path("flip.mpt");
  const unsigned char masks[2] = {0x01, 0xff};
  int crc_errors = 0;
  for (size_t pos = 0; pos < n; pos++) {
    for (int k = 0; k < 2; k++) {
      full[pos] ^= masks[k];
      write_file(bad, full, n);
      full[pos] ^= masks[k];
      mpt_status st = mpt_ckpt_load(bad, b, ob, NULL);
      ck_assert_msg(st == MPT_EFORMAT || (st == MPT_ENOTSUP && pos >= 8 && pos < 12),
                    "byte %zu ^ 0x%02x: %s (%s)", pos, masks[k], mpt_status_name(st),
                    mpt_last_error());
      if (strstr(mpt_last_error(), "CRC-32 mismatch")) crc_errors++;
      check_snapshot(&s, b, "flipped byte");
      ck_assert_int_eq(mpt_optimizer_step_count(ob), 1);
    }
  }
  /* Past the preamble and before the trailer, the CRC is what catches it. */
  ck_assert_int_ge(crc_errors, 2 * (int)(n - 24 - 4));
  free_snapshot(&s);
  free(full);
  mpt_optimizer_free(oa), mpt_optimizer_free(ob);
  mpt_model_free(a), mpt_model_free(b);
}
END_TEST

/* Recomputes the trailing CRC of buf[n] (to forge a file that passes the checksum). */
static void fix_crc(unsigned char *buf, size_t n) {
  uint32_t c = (uint32_t)crc32(0, buf, (uInt)(n - 4));
  for (int i = 0; i < 4; i++) buf[n - 4 + i] = (unsigned char)(c >> (8 * i));
}

START_TEST(test_ckpt_wrong_magic_is_refused) {
  mpt_model *a;
  mpt_optimizer *oa;
  const char *path = save_base(&a, &oa);
  size_t n;
  unsigned char *full = read_file(path, &n);
  full[6] = 'X';
  fix_crc(full, n);
  const char *bad = tmp_path("magic.mpt");
  write_file(bad, full, n);
  snapshot s = take_snapshot(a);
  ck_assert_int_eq(mpt_ckpt_load(bad, a, oa, NULL), MPT_EFORMAT);
  check_detail("magic", "not an mpitrain checkpoint", NULL);
  const char text[] = "this is a text file, not a checkpoint at all\n";
  write_file(bad, text, sizeof text - 1);
  ck_assert_int_eq(mpt_ckpt_load(bad, a, oa, NULL), MPT_EFORMAT);
  check_detail("text", "not an mpitrain checkpoint", NULL);
  check_snapshot(&s, a, "wrong magic");
  ck_assert_int_eq(mpt_ckpt_load(tmp_path("missing.mpt"), a, oa, NULL), MPT_ENOENT);
  ck_assert_int_eq(mpt_ckpt_load(tmpdir, a, oa, NULL), MPT_EIO); /* a directory */
  free_snapshot(&s);
  free(full);
  mpt_optimizer_free(oa);
  mpt_model_free(a);
}
END_TEST

/* A version-1 file (written before the resume block existed: the same layout without it)
 * still loads, bit for bit, and reads as version 1 with the resume fields 0 (not recorded). The
 * file is made from a version-2 one by hand: the 48 bytes of the block cut out, the version,
 * size and CRC rewritten. */
START_TEST(test_ckpt_version_1_file_still_loads) {
  mpt_model *a;
  mpt_optimizer *oa;
  const char *path = save_base(&a, &oa);
  size_t n;
  unsigned char *full = read_file(path, &n);
  const size_t block = 72 + 2 * 32, cut = 48, m = n - cut;
  unsigned char *v1 = malloc(m);
  ck_assert_ptr_nonnull(v1);
  memcpy(v1, full, block);
  memcpy(v1 + block, full + block + cut, n - block - cut);
  v1[8] = 1, v1[9] = v1[10] = v1[11] = 0;
  for (int i = 0; i < 8; i++) v1[16 + i] = (unsigned char)((uint64_t)m >> (8 * i));
  fix_crc(v1, m);
  const char *old = tmp_path("v1.mpt");
  write_file(old, v1, m);
  mpt_model *b = make_model(MODEL_BASE, 99);
  mpt_optimizer *ob = make_opt(b, MPT_OPTIM_ADAMW, 0, 1, 5);
  mpt_ckpt_meta got;
  ck_assert_int_eq(mpt_ckpt_load(old, b, ob, &got), MPT_OK);
  check_same_model(a, b);
  check_same_opt(oa, ob);
  ck_assert_uint_eq(got.format_version, 1);
  mpt_ckpt_meta want = sample_meta();
  want.global_batch = want.epoch_cursor = want.epoch_samples = want.dataset_count = 0;
  want.batch_size = 0;
  want.accumulate = 0;
  check_same_meta(&want, &got);
  ck_assert_int_eq(mpt_ckpt_read_meta(path, &got, NULL), MPT_OK);
  ck_assert_uint_eq(got.format_version, MPT_CKPT_VERSION);
  free(v1);
  free(full);
  mpt_optimizer_free(oa), mpt_optimizer_free(ob);
  mpt_model_free(a), mpt_model_free(b);
}
END_TEST

START_TEST(test_ckpt_future_version_names_both_versions) {
  mpt_model *a;
  mpt_optimizer *oa;
  const char *path = save_base(&a, &oa);
  size_t n;
  unsigned char *full = read_file(path, &n);
  full[8] = 7; /* version 7, a valid CRC: only the version is wrong */
  fix_crc(full, n);
  const char *bad = tmp_path("future.mpt");
  write_file(bad, full, n);
  snapshot s = take_snapshot(a);
  ck_assert_int_eq(mpt_ckpt_load(bad, a, oa, NULL), MPT_ENOTSUP);
  check_detail("version", "version 7", "version 2", "newer", NULL);
  ck_assert_int_eq(mpt_ckpt_read_meta(bad, NULL, NULL), MPT_ENOTSUP);
  check_snapshot(&s, a, "future version");
  free_snapshot(&s);
  free(full);
  mpt_optimizer_free(oa);
  mpt_model_free(a);
}
END_TEST

/* A file whose CRC is right but whose lengths lie (a buggy or hostile writer): still an error,
 * and no allocation follows the lie. */
START_TEST(test_ckpt_forged_lengths_with_a_valid_crc_are_refused) {
  mpt_model *a;
  mpt_optimizer *oa;
  const char *path = save_base(&a, &oa);
  size_t n;
  unsigned char *full = read_file(path, &n);
  unsigned char *copy = malloc(n);
  const char *bad = tmp_path("forged.mpt");
  const size_t sig = 72 + 2 * 32 + 48;
  /* offset of a field, and the bytes to put there (little-endian) */
  const struct { size_t off; uint32_t v; const char *what; } forged[] = {
      {68, 9, "RNG count"},          {68, 0xffffffffu, "RNG count"},
      {sig, 0xffffffffu, "params"},  {sig + 4, 1000000, "buffers"},
      {sig + 8, 0xfffffff0u, "name length"}, {sig + 8, 0, "name length"},
      {sig + 20, 77, "dtype"},       {sig + 24, 7, "ndim"},
      {sig + 28, 0xffffffffu, "extent"}, {sig + 32, 0x80000000u, "extent sign"},
      {64, 0, "world size"},         {28, 0x80000000u, "epoch sign"},
      {136 + 4, 0x80000000u, "global batch sign"}, {136 + 40, 0x80000000u, "accumulate sign"},
      {136 + 44, 1, "reserved"},
  };
  mpt_model *b = make_model(MODEL_BASE, 9);
  snapshot s = take_snapshot(b);
  for (size_t i = 0; i < sizeof forged / sizeof forged[0]; i++) {
    memcpy(copy, full, n);
    for (int k = 0; k < 4; k++) copy[forged[i].off + k] = (unsigned char)(forged[i].v >> (8 * k));
    fix_crc(copy, n);
    write_file(bad, copy, n);
    mpt_status st = mpt_ckpt_load(bad, b, NULL, NULL);
    ck_assert_msg(st == MPT_EFORMAT || st == MPT_ESHAPE, "forged %s: %s (%s)", forged[i].what,
                  mpt_status_name(st), mpt_last_error());
    st = mpt_ckpt_read_meta(bad, NULL, NULL);
    ck_assert_msg(st == MPT_EFORMAT, "read_meta, forged %s: %s (%s)", forged[i].what,
                  mpt_status_name(st), mpt_last_error());
    check_snapshot(&s, b, forged[i].what);
  }
  free_snapshot(&s);
  free(copy);
  free(full);
  mpt_optimizer_free(oa);
  mpt_model_free(a), mpt_model_free(b);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* A different model or optimizer                                                             */

/* Saves variant `from`, loads into variant `into`: MPT_ESHAPE naming the words; nothing
 * changed. */
static void check_mismatch(int from, int into, const char *w1, const char *w2, const char *w3) {
  mpt_model *a = make_model(from, 1), *b = make_model(into, 2);
  const char *path = tmp_path("variant.mpt");
  ck_assert_int_eq(mpt_ckpt_save(path, a, NULL, NULL), MPT_OK);
  snapshot s = take_snapshot(b);
  ck_assert_int_eq(mpt_ckpt_load(path, b, NULL, NULL), MPT_ESHAPE);
  check_detail("different model", "different model", w1, w2, w3, NULL);
  check_snapshot(&s, b, "different model");
  free_snapshot(&s);
  mpt_model_free(a), mpt_model_free(b);
}

START_TEST(test_ckpt_different_model_names_the_difference) {
  /* the model has an extra parameter */
  check_mismatch(MODEL_BASE, MODEL_EXTRA, "'c.weight'", "[2]", "not in the checkpoint");
  /* the checkpoint has an extra parameter */
  check_mismatch(MODEL_EXTRA, MODEL_BASE, "'c.weight'", "extra", "[2]");
  /* a different shape */
  check_mismatch(MODEL_BASE, MODEL_SHAPE, "'a.weight'", "[4, 3] in the checkpoint",
                 "[5, 3] in the model");
  /* a different name */
  check_mismatch(MODEL_BASE, MODEL_NAME, "parameter 2", "'b.weight' in the checkpoint",
                 "'x.weight' in the model");
  /* buffers too */
  check_mismatch(MODEL_BASE, MODEL_EXTRA_BUF, "buffer 2", "'bn.count'", "not in the checkpoint");
  check_mismatch(MODEL_EXTRA_BUF, MODEL_BASE, "buffer 2", "'bn.count'", "extra");
}
END_TEST

START_TEST(test_ckpt_different_optimizer_is_refused) {
  mpt_model *a;
  mpt_optimizer *oa;
  const char *path = save_base(&a, &oa); /* AdamW */
  mpt_model *b = make_model(MODEL_BASE, 2);
  snapshot s = take_snapshot(b);
  mpt_optimizer *sgd = make_opt(b, MPT_OPTIM_SGD, 0.9f, 0, 1);
  ck_assert_int_eq(mpt_ckpt_load(path, b, sgd, NULL), MPT_ESHAPE);
  check_detail("kind", "adamw in the checkpoint", "sgd given", NULL);
  check_snapshot(&s, b, "different optimizer");
  /* SGD with momentum saved, SGD without loaded: the state differs. */
  mpt_optimizer *mom = make_opt(a, MPT_OPTIM_SGD, 0.9f, 1, 1);
  ck_assert_int_eq(mpt_ckpt_save(path, a, mom, NULL), MPT_OK);
  mpt_optimizer *plain = make_opt(b, MPT_OPTIM_SGD, 0.0f, 0, 1);
  ck_assert_int_eq(mpt_ckpt_load(path, b, plain, NULL), MPT_ESHAPE);
  check_detail("momentum", "momentum_buffer", NULL);
  check_snapshot(&s, b, "different optimizer state");
  free_snapshot(&s);
  mpt_optimizer_free(oa), mpt_optimizer_free(sgd), mpt_optimizer_free(mom);
  mpt_optimizer_free(plain);
  mpt_model_free(a), mpt_model_free(b);
}
END_TEST

START_TEST(test_ckpt_bad_arguments_are_refused) {
  mpt_model *a = make_model(MODEL_BASE, 1);
  mpt_ckpt_meta meta = mpt_ckpt_meta_default();
  ck_assert_int_eq(mpt_ckpt_save(NULL, a, NULL, NULL), MPT_EINVAL);
  ck_assert_int_eq(mpt_ckpt_save(tmp_path("x.mpt"), NULL, NULL, NULL), MPT_EINVAL);
  meta.num_rngs = MPT_CKPT_MAX_RNGS + 1;
  ck_assert_int_eq(mpt_ckpt_save(tmp_path("x.mpt"), a, NULL, &meta), MPT_EINVAL);
  meta = mpt_ckpt_meta_default();
  meta.global_step = -1;
  ck_assert_int_eq(mpt_ckpt_save(tmp_path("x.mpt"), a, NULL, &meta), MPT_EINVAL);
  meta = mpt_ckpt_meta_default();
  meta.world_size = 0;
  ck_assert_int_eq(mpt_ckpt_save(tmp_path("x.mpt"), a, NULL, &meta), MPT_EINVAL);
  ck_assert(!file_exists(tmp_path("x.mpt")));
  /* an unwritable place: the error names the file */
  ck_assert_int_eq(mpt_ckpt_save("/nonexistent-dir/x.mpt", a, NULL, NULL), MPT_EIO);
  check_detail("unwritable", "/nonexistent-dir/x.mpt", NULL);
  ck_assert_int_eq(mpt_ckpt_load(NULL, a, NULL, NULL), MPT_EINVAL);
  mpt_model *unfinished = NULL;
  ck_assert_int_eq(mpt_model_init(&unfinished, mpt_device_cpu()), MPT_OK);
  int64_t sh[1] = {3};
  int idx;
  ck_assert_int_eq(mpt_model_add_param(unfinished, "p", 1, sh, MPT_INIT_ZEROS, 1, &idx), MPT_OK);
  ck_assert_int_eq(mpt_ckpt_save(tmp_path("y.mpt"), unfinished, NULL, NULL), MPT_ESTATE);
  mpt_model_free(unfinished);
  mpt_model_free(a);
}
END_TEST

/* Regression: opening a FIFO waited for a writer, so --resume naming a FIFO hung the
 * program forever. Now refused at once as not a regular file (a hang fails by the timeout). */
START_TEST(test_ckpt_fifo_is_refused_without_waiting_for_a_writer) {
  mpt_model *a = make_model(MODEL_BASE, 1);
  const char *path = tmp_path("fifo.mpt");
  ck_assert_int_eq(mkfifo(path, 0600), 0);
  mpt_ckpt_meta meta;
  ck_assert_int_eq(mpt_ckpt_read_meta(path, &meta, NULL), MPT_EIO);
  check_detail("fifo", path, "not a regular file", NULL);
  ck_assert_int_eq(mpt_ckpt_load(path, a, NULL, NULL), MPT_EIO);
  check_detail("fifo", path, "not a regular file", NULL);
  unlink(path);
  mpt_model_free(a);
}
END_TEST

static Suite *ckpt_format_suite(void) {
  Suite *s = suite_create("ckpt_format");
  TCase *tc = tcase_create("format");
  tcase_add_checked_fixture(tc, make_tmpdir, teardown_tmpdir);
  tcase_set_timeout(tc, 20);
  tcase_add_test(tc, test_ckpt_layout_matches_the_documented_format);
  tcase_add_test(tc, test_ckpt_truncation_is_a_clear_error);
  tcase_add_test(tc, test_ckpt_every_byte_flip_is_detected);
  tcase_add_test(tc, test_ckpt_wrong_magic_is_refused);
  tcase_add_test(tc, test_ckpt_future_version_names_both_versions);
  tcase_add_test(tc, test_ckpt_version_1_file_still_loads);
  tcase_add_test(tc, test_ckpt_forged_lengths_with_a_valid_crc_are_refused);
  tcase_add_test(tc, test_ckpt_different_model_names_the_difference);
  tcase_add_test(tc, test_ckpt_different_optimizer_is_refused);
  tcase_add_test(tc, test_ckpt_bad_arguments_are_refused);
  tcase_add_test(tc, test_ckpt_fifo_is_refused_without_waiting_for_a_writer);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return run_suite(ckpt_format_suite()); }
