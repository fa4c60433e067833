/* Shared by the Check programs of src/ckpt (tests/test_ckpt.c, tests/test_ckpt_format.c): tiny
 * models built by hand on the CPU (make_model: a base layout and variants that differ in one
 * way), optimizers with some steps of state (make_opt), a full set of metadata (sample_meta),
 * a temporary directory per test (make_tmpdir / teardown_tmpdir, tmp_path), snapshots of a
 * model (a failed load must change nothing), comparisons of models, optimizer states and
 * metadata, and check_detail, which looks for words in the last error's detail (and, through
 * tests/check_util.h, run_suite). */
#ifndef MPT_TESTS_CKPT_UTIL_H
#define MPT_TESTS_CKPT_UTIL_H

#include <check.h>
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "mpitrain.h"
#include "check_util.h"

enum {
  MODEL_BASE = 0,      /* a.weight [4,3], a.bias [4], b.weight [2,4]; bn.mean [4], bn.var [4] */
  MODEL_EXTRA = 1,     /* BASE + c.weight [2] */
  MODEL_SHAPE = 2,     /* a.weight [5,3] */
  MODEL_NAME = 3,      /* x.weight instead of b.weight */
  MODEL_EXTRA_BUF = 4, /* BASE + buffer bn.count [1] */
};

static inline mpt_model *make_model(int variant, uint64_t seed) {
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
static inline mpt_optimizer *make_opt(mpt_model *m, mpt_optim_kind kind, float momentum,
                                      int steps, uint64_t seed) {
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

static inline mpt_ckpt_meta sample_meta(void) {
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

static inline void make_tmpdir(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/mpt_ckpt_test_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

/* Removes the files of dir (flat) and dir itself. */
static inline void remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char path[1024]; /* dir (up to 600 bytes in the tests) / a name of up to 255 */
  while ((e = readdir(d)) != NULL) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  closedir(d);
  rmdir(dir);
}

static inline void teardown_tmpdir(void) { remove_dir(tmpdir); }

static inline char *tmp_path(const char *name) {
  static char path[4][512];
  static int next;
  char *p = path[next++ % 4];
  snprintf(p, 512, "%s/%s", tmpdir, name);
  return p;
}

static inline void write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_uint_eq(fwrite(data, 1, n, f), n);
  ck_assert_int_eq(fclose(f), 0);
}

static inline int file_exists(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0;
}

/* A copy of the model's parameters and buffers (to check that a failed load changed nothing). */
typedef struct snapshot {
  float *params, *buffers;
  int64_t np, nb;
} snapshot;

static inline snapshot take_snapshot(mpt_model *m) {
  snapshot s = {NULL, NULL, mpt_model_param_count(m), mpt_model_buffer_count(m)};
  s.params = malloc((size_t)s.np * sizeof(float));
  s.buffers = malloc((size_t)s.nb * sizeof(float));
  memcpy(s.params, mpt_model_params(m), (size_t)s.np * sizeof(float));
  memcpy(s.buffers, mpt_model_buffers(m), (size_t)s.nb * sizeof(float));
  return s;
}

static inline void check_snapshot(const snapshot *s, mpt_model *m, const char *what) {
  ck_assert_msg(memcmp(s->params, mpt_model_params(m), (size_t)s->np * sizeof(float)) == 0,
                "%s: the parameters changed", what);
  ck_assert_msg(memcmp(s->buffers, mpt_model_buffers(m), (size_t)s->nb * sizeof(float)) == 0,
                "%s: the buffers changed", what);
}

static inline void free_snapshot(snapshot *s) {
  free(s->params);
  free(s->buffers);
}

static inline void check_same_model(mpt_model *a, mpt_model *b) {
  ck_assert_int_eq(mpt_model_param_count(a), mpt_model_param_count(b));
  ck_assert_int_eq(mpt_model_buffer_count(a), mpt_model_buffer_count(b));
  ck_assert(memcmp(mpt_model_params(a), mpt_model_params(b),
                   (size_t)mpt_model_param_count(a) * sizeof(float)) == 0);
  ck_assert(memcmp(mpt_model_buffers(a), mpt_model_buffers(b),
                   (size_t)mpt_model_buffer_count(a) * sizeof(float)) == 0);
}

static inline void check_same_opt(mpt_optimizer *a, mpt_optimizer *b) {
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

static inline void check_same_meta(const mpt_ckpt_meta *a, const mpt_ckpt_meta *b) {
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
static inline void check_detail(const char *context, ...) {
  const char *err = mpt_last_error();
  va_list ap;
  va_start(ap, context);
  for (const char *w = va_arg(ap, const char *); w; w = va_arg(ap, const char *))
    ck_assert_msg(strstr(err, w) != NULL, "%s: detail \"%s\" lacks \"%s\"", context, err, w);
  va_end(ap);
}

/* Saves the base model with AdamW state into tmpdir/base.mpt; returns the path. */
static inline const char *save_base(mpt_model **model, mpt_optimizer **opt) {
  *model = make_model(MODEL_BASE, 1);
  *opt = make_opt(*model, MPT_OPTIM_ADAMW, 0, 3, 7);
  mpt_ckpt_meta meta = sample_meta();
  const char *path = tmp_path("base.mpt");
  ck_assert_int_eq(mpt_ckpt_save(path, *model, *opt, &meta), MPT_OK);
  return path;
}

#endif
