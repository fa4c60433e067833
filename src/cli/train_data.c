/* The data agreement check (FAULTS.md-style fault: ranks training on different data). Two ranks
 * started with the same --data from different working directories, or on hosts whose copies of
 * the dataset differ, train silently: the all-reduce keeps the replicas identical, and with
 * sample counts that differ each rank shuffles differently, so in an epoch some samples are never
 * seen and others twice. Before training, every rank fingerprints what it loaded and the ranks
 * compare (one all-gather of a few integers); a difference stops every rank, naming the rank and
 * the file.
 *
 * What is compared, per split (train, test): the sample count and shape, the number of classes,
 * and a CRC-32 (zlib) of the images and of the labels exactly as loaded (normalised float32 and
 * int32, after --train-limit / --test-limit), so the check covers any in-memory dataset, synthetic
 * ones included. Cost: one pass over the data at start-up (Fashion-MNIST: 219 MB, measured at
 * about 0.15 s on one core here). For datasets too large to hash whole (token shards of many GB),
 * the same record would hold each file's size plus a CRC of its header and of a fixed sample of
 * blocks; nothing loads such datasets yet.
 *
 * Runs on the training thread; collective over the trainer's host comm (every rank sees the same
 * table and takes the same branch). */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <zlib.h>

#include "cli/train_impl.h"
#include "mpitrain/ckpt.h"


enum {
  F_TRAIN_COUNT, F_TEST_COUNT, F_SHAPE, F_CLASSES, /* counts, C * H * W, classes */
  F_TRAIN_IMAGES, F_TRAIN_LABELS, F_TEST_IMAGES, F_TEST_LABELS, /* CRC-32 of the contents */
  NFIELDS
};
enum { PATH_BYTES = 512, HOST_BYTES = 64, RECORD_BYTES = PATH_BYTES + HOST_BYTES };

/* CRC-32 of n bytes, in chunks that fit zlib's uInt. */
static uint32_t crc_bytes(const void *data, size_t n) {
  uLong crc = crc32(0L, Z_NULL, 0);
  const unsigned char *p = data;
  while (n > 0) {
    uInt chunk = n > (1u << 30) ? (1u << 30) : (uInt)n;
    crc = crc32(crc, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return (uint32_t)crc;
}

static void fingerprint(const mpt_dataset *train, const mpt_dataset *test, int32_t *f) {
  f[F_TRAIN_COUNT] = (int32_t)train->count;
  f[F_TEST_COUNT] = (int32_t)test->count;
  f[F_SHAPE] = (int32_t)mpt_dataset_sample_count(train);
  f[F_CLASSES] = train->num_classes;
  f[F_TRAIN_IMAGES] = (int32_t)crc_bytes(train->images.data, (size_t)train->images.count * 4);
  f[F_TRAIN_LABELS] = (int32_t)crc_bytes(train->labels.data, (size_t)train->labels.count * 4);
  f[F_TEST_IMAGES] = (int32_t)crc_bytes(test->images.data, (size_t)test->images.count * 4);
  f[F_TEST_LABELS] = (int32_t)crc_bytes(test->labels.data, (size_t)test->labels.count * 4);
}

/* The file this rank read for `base` (as the loader picks it: NAME.gz first, then NAME), as an
 * absolute path when it can be resolved, into out. */
static void data_file(const char *dir, const char *base, char *out, size_t nbytes) {
  char path[PATH_MAX + 64], real[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s.gz", dir, base);
  if (access(path, F_OK) != 0) snprintf(path, sizeof path, "%s/%s", dir, base);
  const char *src = realpath(path, real) ? real : path;
  size_t len = strlen(src) < nbytes ? strlen(src) : nbytes - 1; /* cut a long path */
  memcpy(out, src, len);
  out[len] = '\0';
}

/* Which file field `k` comes from, and how a rank describes it in the message. */
static void describe(const trainer *t, int k, char *out, size_t nbytes) {
  const mpt_cli_options *o = t->o;
  if (o->synthetic) {
    snprintf(out, nbytes, "synthetic data (--seed %" PRIu64 ")", (uint64_t)o->seed);
    return;
  }
  static const char *const names[NFIELDS] = {
      "train-images-idx3-ubyte", "t10k-images-idx3-ubyte",  "train-images-idx3-ubyte",
      "train-labels-idx1-ubyte", "train-images-idx3-ubyte", "train-labels-idx1-ubyte",
      "t10k-images-idx3-ubyte",  "t10k-labels-idx1-ubyte"};
  const char *dir = o->data_dir[0] ? o->data_dir : mpt_data_default_dir();
  data_file(dir ? dir : ".", names[k], out, nbytes);
}

/* See train_impl.h. */
mpt_status trainer_check_same_data(trainer *t) {
  if (t->world == 1) return MPT_OK;
  static const char *const what[NFIELDS] = {
      "the number of training samples", "the number of test samples",
      "the number of values per image",
      "the number of classes", "the training images", "the training labels", "the test images",
      "the test labels"};
  const size_t W = (size_t)t->world;
  int32_t mine[NFIELDS], *all = malloc(sizeof(int32_t) * NFIELDS * W);
  char *paths = NULL;
  mpt_status st = MPT_OK;
  if (!all) return MPT_FAIL(MPT_ENOMEM, "cannot allocate the data check");
  fingerprint(&t->train, &t->test, mine);
  MPT_CHECK(mpt_comm_allgather_sync(t->comm, mine, all, NFIELDS, MPT_I32), done);
  int bad = -1, k = 0;
  for (size_t r = 1; r < W && bad < 0; r++)
    for (k = 0; k < NFIELDS; k++)
      if (all[NFIELDS * r + k] != all[k]) {
        bad = (int)r;
        break;
      }
  if (bad < 0) goto done;
  /* Collective: every rank found the same (bad, k). Each names the file it read. */
  if (!(paths = calloc(W + 1, RECORD_BYTES))) {
    st = MPT_FAIL(MPT_ENOMEM, "cannot allocate the data check");
    goto done;
  }
  char *my_path = paths + RECORD_BYTES * W; /* path, then host */
  describe(t, k, my_path, PATH_BYTES);
  snprintf(my_path + PATH_BYTES, HOST_BYTES, "%s", mpt_comm_hostname(t->comm));
  MPT_CHECK(mpt_comm_allgather_sync(t->comm, my_path, paths, RECORD_BYTES, MPT_U8), done);
  const int32_t *a = all, *b = all + NFIELDS * (size_t)bad;
  char va[64], vb[64];
  if (k <= F_CLASSES) {
    snprintf(va, sizeof va, "%" PRId32, a[k]);
    snprintf(vb, sizeof vb, "%" PRId32, b[k]);
  } else {
    snprintf(va, sizeof va, "CRC-32 %08" PRIx32, (uint32_t)a[k]);
    snprintf(vb, sizeof vb, "CRC-32 %08" PRIx32, (uint32_t)b[k]);
  }
  st = MPT_FAIL(MPT_EMISMATCH,
                "ranks loaded different data (%s): rank %d has %s from '%s' on %s, rank 0 "
                "has %s from '%s' on %s (every rank must load the same data: same --data "
                "contents, --train-limit and --test-limit; a relative --data is read from each "
                "rank's working directory)",
                what[k], bad, vb, paths + RECORD_BYTES * (size_t)bad,
                paths + RECORD_BYTES * (size_t)bad + PATH_BYTES, va, paths, paths + PATH_BYTES);
done:
  free(all);
  free(paths);
  return st;
}

/* See train_impl.h. (faults.md F46) */
mpt_status trainer_check_data_shape(trainer *t) {
  const mpt_cli_options *o = t->o;
  const int cnn = strcmp(o->model, "cnn") == 0;
  static const char *const file[2] = {"train-images-idx3-ubyte", "t10k-images-idx3-ubyte"};
  const mpt_dataset *set[2] = {&t->train, &t->test};
  for (int i = 0; i < 2; i++) {
    const mpt_dataset *d = set[i];
    int fits = cnn ? d->channels == o->cnn.in_channels && d->height == o->cnn.height &&
                     d->width == o->cnn.width
                   : mpt_dataset_sample_count(d) == o->mlp.input_size;
    if (fits) continue;
    char path[PATH_BYTES], want[96];
    if (o->synthetic)
      snprintf(path, sizeof path, "synthetic data");
    else
      data_file(o->data_dir[0] ? o->data_dir : mpt_data_default_dir(), file[i], path,
                sizeof path);
    if (cnn)
      snprintf(want, sizeof want, "images of %" PRId64 " x %" PRId64 " x %" PRId64,
               (int64_t)o->cnn.in_channels, (int64_t)o->cnn.height, (int64_t)o->cnn.width);
    else
      snprintf(want, sizeof want, "images of %" PRId64 " values", (int64_t)o->mlp.input_size);
    return MPT_FAIL(MPT_ESHAPE, "'%s' holds images of %d x %d x %d (channels x height x width), "
                    "--model %s takes %s", path, d->channels, d->height, d->width, o->model,
                    want);
  }
  return MPT_OK;
}

/* Whether two paths name the same file: both exist with the same device and inode, or neither
 * exists and they spell the same path once their folders are resolved. */
static int same_file(const char *a, const char *b) {
  struct stat sa, sb;
  int ea = stat(a, &sa) == 0, eb = stat(b, &sb) == 0;
  if (ea || eb) return ea && eb && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  char da[PATH_MAX], db[PATH_MAX], ra[PATH_MAX], rb[PATH_MAX];
  snprintf(da, sizeof da, "%s", a);
  snprintf(db, sizeof db, "%s", b);
  char *ba = strrchr(da, '/'), *bb = strrchr(db, '/');
  const char *na = ba ? ba + 1 : a, *nb = bb ? bb + 1 : b;
  if (strcmp(na, nb) != 0) return 0;
  if (ba) ba[ba == da] = '\0'; /* "/x" -> "/" */
  if (bb) bb[bb == db] = '\0';
  return realpath(ba ? da : ".", ra) && realpath(bb ? db : ".", rb) && strcmp(ra, rb) == 0;
}

/* See train_impl.h. (faults.md F48) */
mpt_status trainer_check_outputs(const mpt_cli_options *o) {
  enum { NOUT = 3, NIN = 5 };
  const char *out_name[NOUT] = {"--save-params", "--metrics-json", "--trace"};
  const char *out[NOUT] = {o->save_params, o->metrics_json, o->trace};
  static const char *const base[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                      "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};
  char in[NIN][PATH_MAX];
  const char *in_name[NIN] = {"a --data file", "a --data file", "a --data file",
                              "a --data file", "the --resume checkpoint"};
  const char *dir = o->data_dir[0] ? o->data_dir : mpt_data_default_dir();
  for (int i = 0; i < NIN; i++) in[i][0] = '\0';
  for (int i = 0; i < 4 && dir && !o->synthetic; i++) data_file(dir, base[i], in[i], PATH_MAX);
  if (o->resume[0] && mpt_ckpt_resolve(o->resume, in[4], PATH_MAX) != MPT_OK) in[4][0] = '\0';
  for (int k = 0; k < NOUT; k++) {
    if (!out[k][0]) continue;
    for (int i = 0; i < NIN; i++)
      if (in[i][0] && same_file(out[k], in[i]))
        return MPT_FAIL(MPT_EINVAL, "%s '%s' is %s ('%s'): the run would replace its own input "
                        "(give another path)", out_name[k], out[k], in_name[i], in[i]);
    for (int j = 0; j < k; j++)
      if (out[j][0] && same_file(out[k], out[j]))
        return MPT_FAIL(MPT_EINVAL, "%s '%s' and %s '%s' are the same file: one would replace "
                        "the other (give two paths)", out_name[j], out[j], out_name[k], out[k]);
  }
  return MPT_OK;
}
