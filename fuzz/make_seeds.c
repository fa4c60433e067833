/* Writes the seed corpus of the fuzz targets: `make_seeds DIR` fills DIR/fuzz_idx,
 * DIR/fuzz_ckpt, DIR/fuzz_cli and DIR/fuzz_llmc (they must exist) with small valid and nearly-valid inputs.
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

/* gzip-compresses data[size] into out[cap] (zlib's deflate with a gzip wrapper); returns the
 * compressed size, 0 on failure. */
static size_t gzip_bytes(const void *data, size_t size, uint8_t *out, size_t cap) {
  z_stream z;
  memset(&z, 0, sizeof z);
  if (deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) return 0;
  z.next_in = (Bytef *)data;
  z.avail_in = (uInt)size;
  z.next_out = out;
  z.avail_out = (uInt)cap;
  int rc = deflate(&z, Z_FINISH);
  size_t n = cap - z.avail_out;
  deflateEnd(&z);
  return rc == Z_STREAM_END ? n : 0;
}

/* Writes data gzip-compressed as `name`; with `damage`, also a copy whose CRC-32 trailer is
 * wrong (name + "_bad_crc") and one with a byte of the deflate stream changed
 * (name + "_bad_stream"), for the reader's corrupt-stream errors. */
static int put_gz(const char *target, const char *name, const void *data, size_t size,
                  int damage) {
  uint8_t gz[4096];
  size_t n = gzip_bytes(data, size, gz, sizeof gz);
  if (n < 20) {
    fprintf(stderr, "make_seeds: cannot compress %s\n", name);
    return 1;
  }
  int bad = put(target, name, gz, n);
  if (damage) {
    char alt[256];
    gz[n - 6] ^= 0x55; /* inside the CRC-32 of the trailer */
    snprintf(alt, sizeof alt, "%s_bad_crc", name);
    bad |= put(target, alt, gz, n);
    gz[n - 6] ^= 0x55;
    gz[n / 2] ^= 0xFF; /* inside the deflate data */
    snprintf(alt, sizeof alt, "%s_bad_stream", name);
    bad |= put(target, alt, gz, n);
  }
  return bad;
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
  bad |= put_gz("fuzz_idx", "images_3x4x5.gz", buf, n, 1);
  bad |= put("fuzz_idx", "images_truncated", buf, n - 7);
  buf[n] = 0xAB;
  bad |= put("fuzz_idx", "images_trailing_byte", buf, n + 1);
  n = idx_file(buf, 4, img4, 0);
  bad |= put("fuzz_idx", "images_2x2x3x3", buf, n);
  n = idx_file(buf, 1, lab, 1);
  bad |= put("fuzz_idx", "labels_12", buf, n);
  bad |= put_gz("fuzz_idx", "labels_12.gz", buf, n, 0);
  buf[n - 1] = 10; /* one label out of range */
  bad |= put("fuzz_idx", "labels_bad_value", buf, n);
  n = idx_file(buf, 2, two, 0);
  bad |= put("fuzz_idx", "matrix_4x6", buf, n);
  /* 1 MB of zeros (about 1 KB compressed): larger than zlib's buffers, so a damaged stream
   * fails while the data (not the header) is being read. */
  const size_t big_n = 4 + 3 * 4 + 1000 * 1000;
  uint8_t *big = calloc(big_n, 1);
  if (!big) return 1;
  const uint32_t big_shape[3] = {1, 1000, 1000};
  big[2] = 0x08, big[3] = 3;
  for (int d = 0; d < 3; d++)
    for (int k = 0; k < 4; k++) big[4 + 4 * d + k] = (uint8_t)(big_shape[d] >> (24 - 8 * k));
  bad |= put_gz("fuzz_idx", "images_1x1000x1000.gz", big, big_n, 1);
  free(big);
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
    /* Plain SGD (no state buffer): the loader's state-count mismatch for SGD momentum. */
    mpt_optimizer_config cfg = mpt_optimizer_config_default();
    cfg.kind = MPT_OPTIM_SGD;
    cfg.momentum = 0.0f;
    mpt_optimizer *plain = NULL;
    bad |= mpt_optimizer_init(&plain, &cfg, mpt_device_cpu(), mpt_model_param_count(m)) != MPT_OK;
    if (plain) bad |= ckpt_seed("sgd_plain", m, plain, 0);
    mpt_optimizer_free(plain);
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
  static const char *const s8[] = {"train", "--nesterov", "--momentum", "0", NULL};
  int bad = cli_seed("cnn_adamw", s1);
  bad |= cli_seed("mlp_step_schedule", s2);
  bad |= cli_seed("dp_checkpoints", s3);
  bad |= cli_seed("synthetic_nesterov", s4);
  bad |= cli_seed("ddp_options", s5);
  bad |= cli_seed("version", s6);
  bad |= cli_seed("bad_values", s7);
  bad |= cli_seed("nesterov_no_momentum", s8);
  return bad;
}

/* fuzz_llmc: token shards (valid, a token >= 256, truncated, empty) and tiny model files
 * (valid, truncated), written by the library's own writers into the seed folder. */
static int llmc_seeds(void) {
  char path[1024];
  uint16_t tok[50];
  for (int i = 0; i < 50; i++) tok[i] = (uint16_t)(i * 37 % 256);
  int bad = 0;
  snprintf(path, sizeof path, "%s/fuzz_llmc/shard_50", dir);
  bad |= mpt_token_shard_write(path, tok, 50) != MPT_OK;
  tok[7] = 300;
  snprintf(path, sizeof path, "%s/fuzz_llmc/shard_token_300", dir);
  bad |= mpt_token_shard_write(path, tok, 50) != MPT_OK;
  snprintf(path, sizeof path, "%s/fuzz_llmc/shard_truncated", dir);
  bad |= mpt_token_shard_write(path, tok, 50) != MPT_OK || truncate(path, 1024 + 99) != 0;
  snprintf(path, sizeof path, "%s/fuzz_llmc/shard_empty", dir);
  bad |= mpt_token_shard_write(path, NULL, 0) != MPT_OK;
  mpt_gpt_config c = {4, 10, 1, 1, 2, 0};
  mpt_gpt_layout lay;
  bad |= mpt_gpt_layout_compute(&c, &lay) != MPT_OK;
  float p[400];
  for (int i = 0; i < 400; i++) p[i] = (float)i * 0.25f - 3.0f;
  snprintf(path, sizeof path, "%s/fuzz_llmc/model_tiny", dir);
  bad |= lay.total > 400 || mpt_gpt_file_write(path, &c, p) != MPT_OK;
  snprintf(path, sizeof path, "%s/fuzz_llmc/model_truncated", dir);
  bad |= mpt_gpt_file_write(path, &c, p) != MPT_OK || truncate(path, 1024 + 4 * lay.total - 4) != 0;
  if (bad) fprintf(stderr, "make_seeds: fuzz_llmc seeds: %s\n", mpt_last_error());
  return bad;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: make_seeds DIR (with DIR/fuzz_idx, fuzz_ckpt, fuzz_cli, fuzz_llmc)\n");
    return 2;
  }
  dir = argv[1];
  int bad = idx_seeds();
  bad |= ckpt_seeds();
  bad |= cli_seeds();
  bad |= llmc_seeds();
  return bad ? 1 : 0;
}
