/* Tests for src/ckpt (include/mpitrain/ckpt.h): the checkpoint format, its atomic writer and
 * validating reader, directories of checkpoints, and (with --mpi, under mpirun) the collective
 * wrappers.
 *
 * Oracles: a round trip is compared byte for byte (memcmp) with what was saved, and a resumed
 * optimizer step with an uninterrupted one; a damaged file (every truncation length sampled,
 * every single-byte change) must give an error status and leave the model's bytes untouched;
 * format errors are checked by the status and by words of the detail that name what differs;
 * a writer killed (SIGKILL, through MPT_TEST_CKPT_KILL) leaves the previous checkpoint loadable
 * with its own values.
 *
 * Models are tiny and built by hand (parameters and buffers with chosen names and shapes), on
 * the CPU. Each test works in its own temporary directory. Without --mpi the tests fork (Check's
 * default), so a crash in the reader is reported as a failed test, not a dead program. */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "config.h" /* MPT_FAULT_INJECTION: the killed-writer tests need its hook */
#include "mpitrain.h"

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                    */

enum {
  MODEL_BASE = 0,      /* a.weight [4,3], a.bias [4], b.weight [2,4]; bn.mean [4], bn.var [4] */
  MODEL_EXTRA = 1,     /* BASE + c.weight [2] */
  MODEL_SHAPE = 2,     /* a.weight [5,3] */
  MODEL_NAME = 3,      /* x.weight instead of b.weight */
  MODEL_EXTRA_BUF = 4, /* BASE + buffer bn.count [1] */
};

static mpt_model *make_model(int variant, uint64_t seed) {
  mpt_model *m = NULL;
  ck_assert_int_eq(mpt_model_init(&m, mpt_device_cpu()), MPT_OK);
  int idx;
  int64_t aw[2] = {variant == MODEL_SHAPE ? 5 : 4, 3}, ab[1] = {4}, bw[2] = {2, 4}, c[1] = {2};
  ck_assert_int_eq(mpt_model_add_param(m, "a.weight", 2, aw, MPT_INIT_FAN_IN, 3, &idx), MPT_OK);
  ck_assert_int_eq(mpt_model_add_param(m, "a.bias", 1, ab, MPT_INIT_FAN_IN, 3, &idx), MPT_OK);
  ck_assert_int_eq(mpt_model_add_param(m, variant == MODEL_NAME ? "x.weight" : "b.weight", 2, bw,
                                       MPT_INIT_FAN_IN, 4, &idx), MPT_OK);
  if (variant == MODEL_EXTRA)
    ck_assert_int_eq(mpt_model_add_param(m, "c.weight", 1, c, MPT_INIT_FAN_IN, 2, &idx), MPT_OK);
  ck_assert_int_eq(mpt_model_add_buffer(m, "bn.mean", 1, ab, MPT_INIT_ZEROS, &idx), MPT_OK);
  ck_assert_int_eq(mpt_model_add_buffer(m, "bn.var", 1, ab, MPT_INIT_ONES, &idx), MPT_OK);
  int64_t one[1] = {1};
  if (variant == MODEL_EXTRA_BUF)
    ck_assert_int_eq(mpt_model_add_buffer(m, "bn.count", 1, one, MPT_INIT_ZEROS, &idx), MPT_OK);
  ck_assert_int_eq(mpt_model_finalize(m), MPT_OK);
  ck_assert_int_eq(mpt_model_init_params(m, seed), MPT_OK);
  /* Buffers with distinct non-trivial values, from the same seed. */
  mpt_rng rng;
  mpt_rng_seed(&rng, seed ^ 0x5a5a5a5aULL);
  mpt_rng_fill_uniform(&rng, mpt_model_buffers(m), mpt_model_buffer_count(m), -2.0f, 2.0f);
  return m;
}

/* An optimizer over the model's parameters after `steps` real steps with random gradients. */
static mpt_optimizer *make_opt(mpt_model *m, mpt_optim_kind kind, float momentum, int steps,
                               uint64_t seed) {
  mpt_optimizer_config cfg = mpt_optimizer_config_default();
  cfg.kind = kind;
  cfg.momentum = momentum;
  cfg.lr = 0.05f;
  cfg.weight_decay = 0.01f;
  mpt_optimizer *opt = NULL;
  int64_t n = mpt_model_param_count(m);
  ck_assert_int_eq(mpt_optimizer_init(&opt, &cfg, mpt_device_cpu(), n), MPT_OK);
  mpt_rng rng;
  mpt_rng_seed(&rng, seed);
  for (int s = 0; s < steps; s++) {
    mpt_rng_fill_uniform(&rng, mpt_model_grads(m), n, -1.0f, 1.0f);
    ck_assert_int_eq(mpt_optimizer_step(opt, NULL, mpt_model_params(m), mpt_model_grads(m),
                                        0.05f), MPT_OK);
  }
  return opt;
}

static mpt_ckpt_meta sample_meta(void) {
  mpt_ckpt_meta meta = mpt_ckpt_meta_default();
  meta.epoch = 3;
  meta.global_step = 1234;
  meta.step_in_epoch = 17;
  meta.sampler_epoch = 3;
  meta.seed = 0xfeedfacecafebeefULL;
  meta.world_size = 4;
  meta.num_rngs = 2;
  mpt_rng_seed(&meta.rngs[0], 11);
  mpt_rng_seed(&meta.rngs[1], 22);
  mpt_rng_next(&meta.rngs[1]);
  meta.global_batch = 256;
  meta.epoch_cursor = 17 * 256;
  meta.epoch_samples = 60000;
  meta.dataset_count = 60001;
  meta.batch_size = 32;
  meta.accumulate = 2;
  return meta;
}

static char tmpdir[256];

static void make_tmpdir(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/mpt_ckpt_test_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

/* Removes the files of dir (flat) and dir itself. */
static void remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char path[512];
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(d);
  rmdir(dir);
}

static void teardown_tmpdir(void) { remove_dir(tmpdir); }

static char *tmp_path(const char *name) {
  static char path[4][512];
  static int next;
  char *p = path[next++ % 4];
  snprintf(p, 512, "%s/%s", tmpdir, name);
  return p;
}

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

static void write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(data, 1, n, f), n);
  ck_assert_int_eq(fclose(f), 0);
}

static int file_exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0;
}

/* A copy of the model's parameters and buffers (to check that a failed load changed nothing). */
typedef struct snapshot {
  float *params, *buffers;
  int64_t np, nb;
} snapshot;

static snapshot take_snapshot(mpt_model *m) {
  snapshot s = {NULL, NULL, mpt_model_param_count(m), mpt_model_buffer_count(m)};
  s.params = malloc((size_t)s.np * sizeof(float));
  s.buffers = malloc((size_t)s.nb * sizeof(float));
  memcpy(s.params, mpt_model_params(m), (size_t)s.np * sizeof(float));
  memcpy(s.buffers, mpt_model_buffers(m), (size_t)s.nb * sizeof(float));
  return s;
}

static void check_snapshot(const snapshot *s, mpt_model *m, const char *what) {
  ck_assert_msg(memcmp(s->params, mpt_model_params(m), (size_t)s->np * sizeof(float)) == 0,
                "%s: the parameters changed", what);
  ck_assert_msg(memcmp(s->buffers, mpt_model_buffers(m), (size_t)s->nb * sizeof(float)) == 0,
                "%s: the buffers changed", what);
}

static void free_snapshot(snapshot *s) {
  free(s->params);
  free(s->buffers);
}

static void check_same_model(mpt_model *a, mpt_model *b) {
  ck_assert_int_eq(mpt_model_param_count(a), mpt_model_param_count(b));
  ck_assert_int_eq(mpt_model_buffer_count(a), mpt_model_buffer_count(b));
  ck_assert(memcmp(mpt_model_params(a), mpt_model_params(b),
                   (size_t)mpt_model_param_count(a) * sizeof(float)) == 0);
  ck_assert(memcmp(mpt_model_buffers(a), mpt_model_buffers(b),
                   (size_t)mpt_model_buffer_count(a) * sizeof(float)) == 0);
}

static void check_same_opt(mpt_optimizer *a, mpt_optimizer *b) {
  mpt_optimizer_state sa, sb;
  ck_assert_int_eq(mpt_optimizer_get_state(a, &sa), MPT_OK);
  ck_assert_int_eq(mpt_optimizer_get_state(b, &sb), MPT_OK);
  ck_assert_int_eq(sa.nbuffers, sb.nbuffers);
  ck_assert_int_eq(sa.count, sb.count);
  ck_assert_int_eq(sa.step_count, sb.step_count);
  for (int s = 0; s < sa.nbuffers; s++)
    ck_assert_msg(memcmp(sa.buffers[s], sb.buffers[s], (size_t)sa.count * sizeof(float)) == 0,
                  "optimizer state '%s' differs", sa.names[s]);
}

static void check_same_meta(const mpt_ckpt_meta *a, const mpt_ckpt_meta *b) {
  ck_assert_int_eq(a->epoch, b->epoch);
  ck_assert_int_eq(a->global_step, b->global_step);
  ck_assert_int_eq(a->step_in_epoch, b->step_in_epoch);
  ck_assert_int_eq(a->sampler_epoch, b->sampler_epoch);
  ck_assert_uint_eq(a->seed, b->seed);
  ck_assert_int_eq(a->world_size, b->world_size);
  ck_assert_int_eq(a->num_rngs, b->num_rngs);
  for (int r = 0; r < a->num_rngs; r++)
    for (int i = 0; i < 4; i++) ck_assert_uint_eq(a->rngs[r].s[i], b->rngs[r].s[i]);
  ck_assert_int_eq(a->global_batch, b->global_batch);
  ck_assert_int_eq(a->epoch_cursor, b->epoch_cursor);
  ck_assert_int_eq(a->epoch_samples, b->epoch_samples);
  ck_assert_int_eq(a->dataset_count, b->dataset_count);
  ck_assert_int_eq(a->batch_size, b->batch_size);
  ck_assert_int_eq(a->accumulate, b->accumulate);
}

/* The detail of the last error contains every one of the words (NULL-terminated). */
static void check_detail(const char *context, ...) {
  const char *err = mpt_last_error();
  va_list ap;
  va_start(ap, context);
  for (const char *w = va_arg(ap, const char *); w; w = va_arg(ap, const char *))
    ck_assert_msg(strstr(err, w) != NULL, "%s: detail \"%s\" lacks \"%s\"", context, err, w);
  va_end(ap);
}

/* Saves the base model with AdamW state into tmpdir/base.mpt; returns the path. */
static const char *save_base(mpt_model **model, mpt_optimizer **opt) {
  *model = make_model(MODEL_BASE, 1);
  *opt = make_opt(*model, MPT_OPTIM_ADAMW, 0, 3, 7);
  mpt_ckpt_meta meta = sample_meta();
  const char *path = tmp_path("base.mpt");
  ck_assert_int_eq(mpt_ckpt_save(path, *model, *opt, &meta), MPT_OK);
  return path;
}

/* ------------------------------------------------------------------------------------------ */
/* Round trips                                                                                */

START_TEST(test_ckpt_round_trip_is_bit_exact) {
  mpt_model *a;
  mpt_optimizer *oa;
  const char *path = save_base(&a, &oa);
  mpt_model *b = make_model(MODEL_BASE, 99);
  mpt_optimizer *ob = make_opt(b, MPT_OPTIM_ADAMW, 0, 1, 5);
  mpt_ckpt_meta want = sample_meta(), got = mpt_ckpt_meta_default();
  ck_assert_int_eq(mpt_ckpt_load(path, b, ob, &got), MPT_OK);
  check_same_model(a, b);
  check_same_opt(oa, ob);
  check_same_meta(&want, &got);
  ck_assert_int_eq(mpt_optimizer_step_count(ob), 3);
  /* read_meta sees the same meta and the optimizer state. */
  mpt_ckpt_meta m2;
  int has_opt = 0;
  ck_assert_int_eq(mpt_ckpt_read_meta(path, &m2, &has_opt), MPT_OK);
  check_same_meta(&want, &m2);
  ck_assert_int_eq(has_opt, 1);
  mpt_optimizer_free(oa), mpt_optimizer_free(ob);
  mpt_model_free(a), mpt_model_free(b);
}
END_TEST

/* Resuming: one more step after a load equals one more step of the original, bit for bit. */
START_TEST(test_ckpt_resumed_step_equals_uninterrupted_step) {
  const struct { mpt_optim_kind kind; float momentum; } cases[] = {
      {MPT_OPTIM_ADAMW, 0}, {MPT_OPTIM_SGD, 0.9f}, {MPT_OPTIM_SGD, 0}};
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    mpt_model *a = make_model(MODEL_BASE, 3), *b = make_model(MODEL_BASE, 4);
    mpt_optimizer *oa = make_opt(a, cases[c].kind, cases[c].momentum, 2, 8);
    mpt_optimizer *ob = make_opt(b, cases[c].kind, cases[c].momentum, 0, 8);
    const char *path = tmp_path("resume.mpt");
    ck_assert_int_eq(mpt_ckpt_save(path, a, oa, NULL), MPT_OK);
    ck_assert_int_eq(mpt_ckpt_load(path, b, ob, NULL), MPT_OK);
    int64_t n = mpt_model_param_count(a);
    float *g = malloc((size_t)n * sizeof *g);
    mpt_rng rng;
    mpt_rng_seed(&rng, 1000 + c);
    mpt_rng_fill_uniform(&rng, g, n, -1.0f, 1.0f);
    ck_assert_int_eq(mpt_optimizer_step(oa, NULL, mpt_model_params(a), g, 0.05f), MPT_OK);
    ck_assert_int_eq(mpt_optimizer_step(ob, NULL, mpt_model_params(b), g, 0.05f), MPT_OK);
    check_same_model(a, b);
    check_same_opt(oa, ob);
    free(g);
    mpt_optimizer_free(oa), mpt_optimizer_free(ob);
    mpt_model_free(a), mpt_model_free(b);
  }
}
END_TEST

START_TEST(test_ckpt_without_optimizer_round_trips_and_refuses_an_optimizer) {
  mpt_model *a = make_model(MODEL_BASE, 1), *b = make_model(MODEL_BASE, 2);
  const char *path = tmp_path("noopt.mpt");
  ck_assert_int_eq(mpt_ckpt_save(path, a, NULL, NULL), MPT_OK);
  int has_opt = 1;
  mpt_ckpt_meta meta;
  ck_assert_int_eq(mpt_ckpt_read_meta(path, &meta, &has_opt), MPT_OK);
  ck_assert_int_eq(has_opt, 0);
  ck_assert_int_eq(meta.world_size, 1);
  ck_assert_int_eq(meta.global_step, 0);
  mpt_optimizer *ob = make_opt(b, MPT_OPTIM_SGD, 0.9f, 0, 1);
  snapshot s = take_snapshot(b);
  ck_assert_int_eq(mpt_ckpt_load(path, b, ob, NULL), MPT_ESHAPE);
  check_detail("no optimizer state", "no optimizer state", "sgd", NULL);
  check_snapshot(&s, b, "a load refused for the optimizer");
  ck_assert_int_eq(mpt_ckpt_load(path, b, NULL, NULL), MPT_OK);
  check_same_model(a, b);
  free_snapshot(&s);
  mpt_optimizer_free(ob);
  mpt_model_free(a), mpt_model_free(b);
}
END_TEST

/* A file with optimizer state loads into a model alone (evaluation). */
START_TEST(test_ckpt_optimizer_state_is_ignored_without_an_optimizer) {
  mpt_model *a;
  mpt_optimizer *oa;
  const char *path = save_base(&a, &oa);
  mpt_model *b = make_model(MODEL_BASE, 5);
  ck_assert_int_eq(mpt_ckpt_load(path, b, NULL, NULL), MPT_OK);
  check_same_model(a, b);
  mpt_optimizer_free(oa);
  mpt_model_free(a), mpt_model_free(b);
}
END_TEST

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

/* ------------------------------------------------------------------------------------------ */
/* Crashes during a write                                                                     */

#ifdef MPT_FAULT_INJECTION
/* Saves model `m` over `path` in a child process that kills itself at `point`; returns the
 * child's pid after checking that it died of SIGKILL. */
static pid_t save_and_die(const char *path, mpt_model *m, mpt_optimizer *opt, const char *point) {
  fflush(NULL);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    setenv("MPT_TEST_CKPT_KILL", point, 1);
    mpt_ckpt_save(path, m, opt, NULL);
    _exit(3); /* not reached when the hook works */
  }
  int wst = 0;
  ck_assert_int_eq(waitpid(pid, &wst, 0), pid);
  ck_assert_msg(WIFSIGNALED(wst) && WTERMSIG(wst) == SIGKILL, "the writer was not killed at %s",
                point);
  return pid;
}

START_TEST(test_ckpt_killed_writer_leaves_previous_checkpoint_intact) {
  const char *points[] = {"mid-write", "before-rename"};
  for (int p = 0; p < 2; p++) {
    mpt_model *a;
    mpt_optimizer *oa;
    const char *path = save_base(&a, &oa);
    snapshot saved = take_snapshot(a);
    /* change the model, then die while writing it over the old file */
    mpt_model *newer = make_model(MODEL_BASE, 77);
    mpt_optimizer *on = make_opt(newer, MPT_OPTIM_ADAMW, 0, 5, 9);
    pid_t pid = save_and_die(path, newer, on, points[p]);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)pid);
    ck_assert_msg(file_exists(tmp), "%s: no temporary file %s", points[p], tmp);
    /* the old checkpoint is intact and loads with its own values */
    mpt_model *b = make_model(MODEL_BASE, 5);
    mpt_optimizer *ob = make_opt(b, MPT_OPTIM_ADAMW, 0, 0, 1);
    mpt_ckpt_meta meta, want = sample_meta();
    ck_assert_int_eq(mpt_ckpt_load(path, b, ob, &meta), MPT_OK);
    check_snapshot(&saved, b, points[p]);
    check_same_opt(oa, ob);
    check_same_meta(&want, &meta);
    /* the temporary file is partial (mid-write) or complete (before rename) */
    mpt_status st = mpt_ckpt_read_meta(tmp, NULL, NULL);
    ck_assert_int_eq(st, p == 0 ? MPT_EFORMAT : MPT_OK);
    /* and a later save over it works (the stale temporary file does not get in the way) */
    ck_assert_int_eq(mpt_ckpt_save(path, newer, on, NULL), MPT_OK);
    ck_assert_int_eq(mpt_ckpt_load(path, b, ob, NULL), MPT_OK);
    check_same_model(newer, b);
    unlink(tmp);
    free_snapshot(&saved);
    mpt_optimizer_free(oa), mpt_optimizer_free(ob), mpt_optimizer_free(on);
    mpt_model_free(a), mpt_model_free(b), mpt_model_free(newer);
  }
}
END_TEST
#endif /* MPT_FAULT_INJECTION */

/* A save onto a directory is refused before anything is written (core/atomic_file replaces
 * only a regular file): no temporary file is left and what was there stays. (A rename that
 * fails is the fault-injection case MPT_TEST_CKPT_FAIL=rename.) */
START_TEST(test_ckpt_failed_save_removes_its_temporary_file) {
  mpt_model *a = make_model(MODEL_BASE, 1);
  const char *target = tmp_path("adir");
  ck_assert_int_eq(mkdir(target, 0700), 0);
  char inner[600];
  snprintf(inner, sizeof inner, "%s/keep", target);
  write_file(inner, "x", 1);
  ck_assert_int_eq(mpt_ckpt_save(target, a, NULL, NULL), MPT_EINVAL);
  check_detail("folder", "is not a regular file", "a folder", NULL);
  char tmp[600];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", target, (long)getpid());
  ck_assert(!file_exists(tmp));
  ck_assert(file_exists(inner));
  unlink(inner);
  rmdir(target);
  mpt_model_free(a);
}
END_TEST

/* ------------------------------------------------------------------------------------------ */
/* Directories                                                                                */

static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  ck_assert_ptr_nonnull(d);
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
  closedir(d);
  return n;
}

START_TEST(test_ckpt_keep_last_k_deletes_the_oldest) {
  mpt_model *a = make_model(MODEL_BASE, 1);
  char dir[600], path[700];
  snprintf(dir, sizeof dir, "%s/run/ckpts", tmpdir); /* created, with its parent */
  mpt_ckpt_meta meta = mpt_ckpt_meta_default();
  for (int64_t step = 100; step <= 500; step += 100) {
    meta.global_step = step;
    ck_assert_int_eq(mpt_ckpt_save_dir(dir, 3, a, NULL, &meta, path, sizeof path), MPT_OK);
    char want[700];
    snprintf(want, sizeof want, "%s/ckpt-step%08lld.mpt", dir, (long long)step);
    ck_assert_str_eq(path, want);
    if (step == 100) { /* things that are not checkpoints are never deleted */
      char other[700];
      snprintf(other, sizeof other, "%s/notes.txt", dir);
      write_file(other, "n", 1);
      snprintf(other, sizeof other, "%s/ckpt-step00000001.mpt.tmp.999", dir);
      write_file(other, "t", 1);
    }
  }
  const char *want_present[] = {"ckpt-step00000300.mpt", "ckpt-step00000400.mpt",
                                "ckpt-step00000500.mpt", "notes.txt",
                                "ckpt-step00000001.mpt.tmp.999"};
  for (size_t i = 0; i < 5; i++) {
    snprintf(path, sizeof path, "%s/%s", dir, want_present[i]);
    ck_assert_msg(file_exists(path), "%s was deleted", want_present[i]);
  }
  ck_assert_int_eq(count_entries(dir), 5);
  /* A stale later checkpoint: the one just written is kept anyway (K = 1). */
  meta.global_step = 50;
  ck_assert_int_eq(mpt_ckpt_save_dir(dir, 1, a, NULL, &meta, path, sizeof path), MPT_OK);
  ck_assert(file_exists(path));
  snprintf(path, sizeof path, "%s/ckpt-step00000500.mpt", dir);
  ck_assert(file_exists(path));
  ck_assert_int_eq(count_entries(dir), 4); /* 500, 50, notes, tmp */
  /* K = 0 keeps everything */
  for (int64_t step = 1; step <= 3; step++) {
    meta.global_step = step;
    ck_assert_int_eq(mpt_ckpt_save_dir(dir, 0, a, NULL, &meta, NULL, 0), MPT_OK);
  }
  ck_assert_int_eq(count_entries(dir), 7);
  /* clean up the nested directories */
  remove_dir(dir);
  snprintf(dir, sizeof dir, "%s/run", tmpdir);
  rmdir(dir);
  mpt_model_free(a);
}
END_TEST

START_TEST(test_ckpt_find_latest_picks_the_highest_step) {
  char buf[700], want[700];
  ck_assert_int_eq(mpt_ckpt_find_latest(tmpdir, buf, sizeof buf), MPT_ENOENT);
  ck_assert_int_eq(mpt_ckpt_find_latest(tmp_path("nope"), buf, sizeof buf), MPT_ENOENT);
  const char *names[] = {"ckpt-step00000009.mpt", "ckpt-step00000010.mpt", "ckpt-step100.mpt",
                         "ckpt-step00000999.mpt.tmp.123", "ckpt-step.mpt", "ckpt-stepx.mpt",
                         "ckpt-step00005000.mpt.bak", "xckpt-step00007000.mpt"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) write_file(tmp_path(names[i]), "", 0);
  ck_assert_int_eq(mpt_ckpt_find_latest(tmpdir, buf, sizeof buf), MPT_OK);
  snprintf(want, sizeof want, "%s/ckpt-step100.mpt", tmpdir);
  ck_assert_str_eq(buf, want);
  /* a trailing slash does not double */
  char slash[600];
  snprintf(slash, sizeof slash, "%s/", tmpdir);
  ck_assert_int_eq(mpt_ckpt_find_latest(slash, buf, sizeof buf), MPT_OK);
  ck_assert_str_eq(buf, want);
  ck_assert_int_eq(mpt_ckpt_find_latest(tmpdir, buf, 10), MPT_EINVAL);
  /* resolve: a directory gives the latest, a file itself, a missing path ENOENT */
  ck_assert_int_eq(mpt_ckpt_resolve(tmpdir, buf, sizeof buf), MPT_OK);
  ck_assert_str_eq(buf, want);
  ck_assert_int_eq(mpt_ckpt_resolve(tmp_path(names[0]), buf, sizeof buf), MPT_OK);
  ck_assert_str_eq(buf, tmp_path(names[0]));
  ck_assert_int_eq(mpt_ckpt_resolve(tmp_path("missing"), buf, sizeof buf), MPT_ENOENT);
}
END_TEST

#ifdef MPT_FAULT_INJECTION
/* The latest checkpoint after a killed write is the last complete one, and it loads. */
START_TEST(test_ckpt_resume_dir_after_a_killed_write_loads_the_last_complete_one) {
  mpt_model *a = make_model(MODEL_BASE, 1);
  mpt_ckpt_meta meta = mpt_ckpt_meta_default();
  meta.global_step = 10;
  ck_assert_int_eq(mpt_ckpt_save_dir(tmpdir, 2, a, NULL, &meta, NULL, 0), MPT_OK);
  snapshot s = take_snapshot(a);
  mpt_model *newer = make_model(MODEL_BASE, 2);
  save_and_die(tmp_path("ckpt-step00000020.mpt"), newer, NULL, "mid-write");
  char path[700];
  ck_assert_int_eq(mpt_ckpt_resolve(tmpdir, path, sizeof path), MPT_OK);
  ck_assert_str_eq(path, tmp_path("ckpt-step00000010.mpt"));
  mpt_ckpt_meta got;
  ck_assert_int_eq(mpt_ckpt_load(path, newer, NULL, &got), MPT_OK);
  ck_assert_int_eq(got.global_step, 10);
  check_snapshot(&s, newer, "resume");
  free_snapshot(&s);
  mpt_model_free(a), mpt_model_free(newer);
}
END_TEST
#endif /* MPT_FAULT_INJECTION */

/* ------------------------------------------------------------------------------------------ */
/* Collective wrappers (--mpi, under mpirun; every rank runs every test in the same order)    */

static mpt_comm *comm;
static int rank, world;

START_TEST(test_ckpt_collective_save_then_every_rank_loads_rank0s_state) {
  /* every rank trains differently; rank 0's state is what gets saved */
  mpt_model *a = make_model(MODEL_BASE, 1 + (uint64_t)rank);
  mpt_optimizer *oa = make_opt(a, MPT_OPTIM_ADAMW, 0, 2 + rank, 7 + (uint64_t)rank);
  mpt_ckpt_meta meta = sample_meta(), got;
  meta.world_size = world;
  meta.global_step = 40;
  char path[700];
  ck_assert_int_eq(mpt_ckpt_save_collective(comm, tmpdir, 2, a, oa, &meta, path, sizeof path),
                   MPT_OK);
  ck_assert_str_eq(path, tmp_path("ckpt-step00000040.mpt"));
  ck_assert(file_exists(path)); /* complete and renamed before any rank returns */
  mpt_model *ref = make_model(MODEL_BASE, 1);
  mpt_optimizer *oref = make_opt(ref, MPT_OPTIM_ADAMW, 0, 2, 7);
  mpt_model *b = make_model(MODEL_BASE, 50 + (uint64_t)rank);
  mpt_optimizer *ob = make_opt(b, MPT_OPTIM_ADAMW, 0, 0, 1);
  /* from the directory: its latest checkpoint is the one just written */
  ck_assert_int_eq(mpt_ckpt_load_collective(comm, tmpdir, b, ob, &got), MPT_OK);
  check_same_model(ref, b);
  check_same_opt(oref, ob);
  ck_assert_int_eq(got.world_size, world);
  ck_assert_int_eq(got.global_step, 40);
  mpt_optimizer_free(oa), mpt_optimizer_free(oref), mpt_optimizer_free(ob);
  mpt_model_free(a), mpt_model_free(ref), mpt_model_free(b);
}
END_TEST

START_TEST(test_ckpt_collective_save_error_reaches_every_rank) {
  mpt_model *a = make_model(MODEL_BASE, 1);
  char bad[700];
  snprintf(bad, sizeof bad, "%s/afile/sub", tmpdir);
  if (rank == 0) write_file(tmp_path("afile"), "x", 1); /* only rank 0 looks at the dir */
  char path[700] = "";
  mpt_status st = mpt_ckpt_save_collective(comm, bad, 2, a, NULL, NULL, path, sizeof path);
  ck_assert_msg(st == MPT_EIO, "rank %d: %s (%s)", rank, mpt_status_name(st), mpt_last_error());
  check_detail("collective save", "rank 0 could not write the checkpoint", "afile", NULL);
  mpt_model_free(a);
}
END_TEST

START_TEST(test_ckpt_collective_load_failure_on_one_rank_stops_every_rank) {
  mpt_model *a = make_model(MODEL_BASE, 1);
  mpt_ckpt_meta meta = mpt_ckpt_meta_default();
  meta.global_step = 60;
  char path[700], other[700];
  ck_assert_int_eq(mpt_ckpt_save_collective(comm, tmpdir, 0, a, NULL, &meta, path, sizeof path),
                   MPT_OK);
  mpt_model *a2 = make_model(MODEL_BASE, 2);
  meta.global_step = 70;
  ck_assert_int_eq(mpt_ckpt_save_collective(comm, tmpdir, 0, a2, NULL, &meta, other,
                                            sizeof other), MPT_OK);
  mpt_model *b = make_model(MODEL_BASE, 3);
  snapshot s = take_snapshot(b);
  /* the last rank cannot find its file */
  int last = world - 1;
  mpt_status st = mpt_ckpt_load_collective(comm, rank == last ? tmp_path("missing.mpt") : path,
                                           b, NULL, NULL);
  ck_assert_msg(st == MPT_ENOENT, "rank %d: %s (%s)", rank, mpt_status_name(st), mpt_last_error());
  char who[32];
  snprintf(who, sizeof who, "rank %d could not load", last);
  check_detail("one rank fails", who, NULL);
  check_snapshot(&s, b, "a collective load that failed on one rank");
  if (world > 1) { /* the last rank loads another (valid) checkpoint */
    st = mpt_ckpt_load_collective(comm, rank == last ? other : path, b, NULL, NULL);
    ck_assert_msg(st == MPT_EMISMATCH, "rank %d: %s (%s)", rank, mpt_status_name(st),
                  mpt_last_error());
    check_detail("different files", "different checkpoints", NULL);
    check_snapshot(&s, b, "a collective load of different files");
  }
  free_snapshot(&s);
  mpt_model_free(a), mpt_model_free(a2), mpt_model_free(b);
}
END_TEST

static int run_mpi(void) {
  mpt_comm_config cfg = mpt_comm_config_default();
  cfg.timeout_ms = 60000;
  if (mpt_comm_init(&comm, &cfg) != MPT_OK) {
    fprintf(stderr, "test_ckpt: mpt_comm_init: %s\n", mpt_last_error());
    return EXIT_FAILURE;
  }
  rank = mpt_comm_rank(comm);
  world = mpt_comm_world_size(comm);
  memset(tmpdir, 0, sizeof tmpdir);
  if (rank == 0) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/mpt_ckpt_mpi_XXXXXX");
    if (!mkdtemp(tmpdir)) tmpdir[0] = '\0';
  }
  if (mpt_comm_broadcast_sync(comm, tmpdir, sizeof tmpdir, MPT_U8, 0) != MPT_OK || !tmpdir[0]) {
    fprintf(stderr, "test_ckpt: rank %d: no shared temporary directory\n", rank);
    mpt_comm_abort(comm, 1);
  }
  Suite *s = suite_create("ckpt_mpi");
  TCase *tc = tcase_create("collective");
  tcase_add_test(tc, test_ckpt_collective_save_then_every_rank_loads_rank0s_state);
  tcase_add_test(tc, test_ckpt_collective_save_error_reaches_every_rank);
  tcase_add_test(tc, test_ckpt_collective_load_failure_on_one_rank_stops_every_rank);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr), any = 0;
  srunner_free(sr);
  mpt_comm_allreduce_sync(comm, &failed, &any, 1, MPT_I32, MPT_REDUCE_MAX);
  mpt_comm_barrier_sync(comm);
  if (rank == 0) remove_dir(tmpdir);
  mpt_comm_free(comm);
  mpt_comm_finalize();
  return any == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

/* ------------------------------------------------------------------------------------------ */

static Suite *ckpt_suite(void) {
  Suite *s = suite_create("ckpt");
  TCase *tc = tcase_create("format");
  tcase_add_checked_fixture(tc, make_tmpdir, teardown_tmpdir);
  tcase_set_timeout(tc, 20);
  tcase_add_test(tc, test_ckpt_round_trip_is_bit_exact);
  tcase_add_test(tc, test_ckpt_resumed_step_equals_uninterrupted_step);
  tcase_add_test(tc, test_ckpt_without_optimizer_round_trips_and_refuses_an_optimizer);
  tcase_add_test(tc, test_ckpt_optimizer_state_is_ignored_without_an_optimizer);
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
  TCase *tw = tcase_create("atomic_write_and_directories");
  tcase_add_checked_fixture(tw, make_tmpdir, teardown_tmpdir);
  tcase_set_timeout(tw, 20);
#ifdef MPT_FAULT_INJECTION /* else the MPT_TEST_CKPT_KILL hook is not built: left out */
  tcase_add_test(tw, test_ckpt_killed_writer_leaves_previous_checkpoint_intact);
#endif
  tcase_add_test(tw, test_ckpt_failed_save_removes_its_temporary_file);
  tcase_add_test(tw, test_ckpt_keep_last_k_deletes_the_oldest);
  tcase_add_test(tw, test_ckpt_find_latest_picks_the_highest_step);
#ifdef MPT_FAULT_INJECTION
  tcase_add_test(tw, test_ckpt_resume_dir_after_a_killed_write_loads_the_last_complete_one);
#endif
  suite_add_tcase(s, tw);
  return s;
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "--mpi") == 0) return run_mpi();
  SRunner *sr = srunner_create(ckpt_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
