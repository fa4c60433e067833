/* Writes the seed corpus of the fuzz targets: `make_seeds DIR` fills DIR/fuzz_idx,
 * DIR/fuzz_ckpt and DIR/fuzz_cli (they must exist) with small valid and nearly-valid inputs.
 * The committed corpus (fuzz/corpus/) was made with it (fuzz/build.sh builds it); libFuzzer
 * starts from these files, so it begins with inputs that pass the header checks.
 * Checkpoints are written with mpt_ckpt_save for fuzz_common.h's model, so they load in
 * fuzz_ckpt. Exit status 0, or 1 naming what failed. */
#include <zlib.h>

#include "fuzz_common.h"

static const char *dir;

static int put(const char *target, const char *name, const void *data, size_t size) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s/%s", dir, target, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(data, 1, size, f) != size || fclose(f) != 0) {
    fprintf(stderr, "make_seeds: cannot write %s: %s\n", path, strerror(errno));
    return 1;
  }
  return 0;
}

static int put_gz(const char *target, const char *name, const void *data, size_t size) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s/%s", dir, target, name);
  gzFile gz = gzopen(path, "wb9");
  if (!gz || gzwrite(gz, data, (unsigned)size) != (int)size || gzclose(gz) != Z_OK) {
    fprintf(stderr, "make_seeds: cannot write %s\n", path);
    return 1;
  }
  return 0;
}

/* An IDX ubyte file into buf: magic, extents, then `count` bytes i * 37 + 3 (mod 256), or
 * (labels) i % 10. Returns its size. */
static size_t idx_file(uint8_t *buf, int ndim, const uint32_t *shape, int labels) {
  size_t n = 4, count = 1;
  buf[0] = 0, buf[1] = 0, buf[2] = 0x08, buf[3] = (uint8_t)ndim;
  for (int d = 0; d < ndim; d++) {
    for (int k = 0; k < 4; k++) buf[n++] = (uint8_t)(shape[d] >> (24 - 8 * k));
    count *= shape[d];
  }
  for (size_t i = 0; i < count; i++) buf[n++] = (uint8_t)(labels ? i % 10 : i * 37 + 3);
  return n;
}

static int idx_seeds(void) {
  uint8_t buf[512];
  int bad = 0;
  const uint32_t img3[3] = {3, 4, 5}, img4[4] = {2, 2, 3, 3}, lab[1] = {12}, two[2] = {4, 6};
  size_t n = idx_file(buf, 3, img3, 0);
  bad |= put("fuzz_idx", "images_3x4x5", buf, n);
  bad |= put_gz("fuzz_idx", "images_3x4x5.gz", buf, n);
  bad |= put("fuzz_idx", "images_truncated", buf, n - 7);
  buf[n] = 0xAB;
  bad |= put("fuzz_idx", "images_trailing_byte", buf, n + 1);
  n = idx_file(buf, 4, img4, 0);
  bad |= put("fuzz_idx", "images_2x2x3x3", buf, n);
  n = idx_file(buf, 1, lab, 1);
  bad |= put("fuzz_idx", "labels_12", buf, n);
  bad |= put_gz("fuzz_idx", "labels_12.gz", buf, n);
  buf[n - 1] = 10; /* one label out of range */
  bad |= put("fuzz_idx", "labels_bad_value", buf, n);
  n = idx_file(buf, 2, two, 0);
  bad |= put("fuzz_idx", "matrix_4x6", buf, n);
  const uint8_t float_magic[8] = {0, 0, 0x0D, 1, 0, 0, 0, 1};
  bad |= put("fuzz_idx", "float_type", float_magic, sizeof float_magic);
  return bad;
}

static int ckpt_seed(const char *name, mpt_model *m, mpt_optimizer *opt, int num_rngs) {
  char tmp[] = "/tmp/mpt_seed_XXXXXX";
  if (!mkdtemp(tmp)) return 1;
  char path[512];
  snprintf(path, sizeof path, "%s/ckpt.mpt", tmp);
  mpt_ckpt_meta meta = mpt_ckpt_meta_default();
  meta.epoch = 2;
  meta.global_step = 40;
  meta.step_in_epoch = 5;
  meta.sampler_epoch = 2;
  meta.seed = 1234;
  meta.world_size = 2;
  meta.num_rngs = num_rngs;
  for (int k = 0; k < num_rngs; k++) mpt_rng_seed(&meta.rngs[k], 100 + (uint64_t)k);
  int bad = 1;
  uint8_t buf[8192];
  size_t size = 0;
  if (mpt_ckpt_save(path, m, opt, &meta) == MPT_OK) {
    FILE *f = fopen(path, "rb");
    if (f) {
      size = fread(buf, 1, sizeof buf, f);
      bad = !feof(f);
      fclose(f);
    }
  }
  unlink(path);
  rmdir(tmp);
  if (bad) {
    fprintf(stderr, "make_seeds: cannot make checkpoint %s: %s\n", name, mpt_last_error());
    return 1;
  }
  return put("fuzz_ckpt", name, buf, size);
}

static int ckpt_seeds(void) {
  mpt_model *m = fuzz_ckpt_model();
  mpt_optimizer *sgd = m ? fuzz_ckpt_optimizer(m, MPT_OPTIM_SGD) : NULL;
  mpt_optimizer *adamw = m ? fuzz_ckpt_optimizer(m, MPT_OPTIM_ADAMW) : NULL;
  int bad = !m || !sgd || !adamw;
  if (!bad) {
    /* One step each, so the state buffers and step counts are not zero. */
    int64_t n = mpt_model_param_count(m);
    float *g = mpt_model_grads(m);
    for (int64_t i = 0; i < n; i++) g[i] = 0.01f * (float)(i % 7) - 0.03f;
    bad |= mpt_optimizer_step(sgd, NULL, mpt_model_params(m), g, 0.05f) != MPT_OK;
    bad |= mpt_optimizer_step(adamw, NULL, mpt_model_params(m), g, 0.05f) != MPT_OK;
  }
  if (!bad) {
    bad |= ckpt_seed("no_optimizer", m, NULL, 0);
    bad |= ckpt_seed("sgd_momentum", m, sgd, 1);
    bad |= ckpt_seed("adamw_2rngs", m, adamw, 2);
  }
  mpt_optimizer_free(sgd);
  mpt_optimizer_free(adamw);
  mpt_model_free(m);
  return bad;
}

static int cli_seed(const char *name, const char *const *args) {
  char buf[1024];
  size_t n = 0;
  for (int i = 0; args[i]; i++) {
    size_t len = strlen(args[i]);
    if (i > 0) buf[n++] = '\0';
    memcpy(buf + n, args[i], len);
    n += len;
  }
  return put("fuzz_cli", name, buf, n);
}

static int cli_seeds(void) {
  static const char *const s1[] = {"train", "--model", "cnn", "--epochs", "2", "--batch-size",
                                   "32", "--lr", "0.1", "--optimizer", "adamw", NULL};
  static const char *const s2[] = {"train", "--hidden", "128,64,32", "--dropout", "0.25",
                                   "--schedule", "step", "--step-size", "3", "--gamma", "0.5",
                                   "--warmup-steps", "10", NULL};
  static const char *const s3[] = {"train", "--mode", "dp", "--devices", "cpu:2",
                                   "--checkpoint-dir", "ck", "--checkpoint-every", "epoch",
                                   "--keep", "2", "--resume", "ck", "--stop-at-step", "9", NULL};
  static const char *const s4[] = {"train", "--synthetic", "--train-limit", "512",
                                   "--test-limit", "128", "--threads", "1", "--no-shuffle",
                                   "--drop-last", "--nesterov", "--momentum", "0.9",
                                   "--timeout", "2.5", "--buffers", "average", NULL};
  static const char *const s5[] = {"train", "--bucket-cap-mb", "4", "--first-bucket-cap-mb",
                                   "0.5", "--no-overlap", "--find-unused-parameters",
                                   "--accumulate", "3", "--check-collectives", "--device", "cpu",
                                   "--seed", "42", "--max-steps", "5", NULL};
  static const char *const s6[] = {"--version", NULL};
  static const char *const s7[] = {"train", "--lr=nan", "--epochs", NULL};
  int bad = cli_seed("cnn_adamw", s1);
  bad |= cli_seed("mlp_step_schedule", s2);
  bad |= cli_seed("dp_checkpoints", s3);
  bad |= cli_seed("synthetic_nesterov", s4);
  bad |= cli_seed("ddp_options", s5);
  bad |= cli_seed("version", s6);
  bad |= cli_seed("bad_values", s7);
  return bad;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: make_seeds DIR (with DIR/fuzz_idx, fuzz_ckpt, fuzz_cli)\n");
    return 2;
  }
  dir = argv[1];
  int bad = idx_seeds();
  bad |= ckpt_seeds();
  bad |= cli_seeds();
  return bad ? 1 : 0;
}
