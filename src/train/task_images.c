/* The built-in image-classifier task (trainer.h mpt_train_task_images): samples of an
 * mpt_dataset (one image and its label per row), the mean cross-entropy, accuracy as the
 * metric, and the checks before training:
 * - the images' shape fits the model: one forward of a training and a test image in evaluation
 *   mode, so a folder whose test images differ fails at start-up, naming the file, not after
 *   the first epoch (faults.md F46);
 * - the ranks loaded the same data. Two ranks started with the same --data from different
 *   working directories, or on hosts whose copies of the dataset differ, train silently: the
 *   all-reduce keeps the replicas identical, and with sample counts that differ each rank
 *   shuffles differently, so in an epoch some samples are never seen and others twice. Every
 *   rank fingerprints what it loaded and the ranks compare (one all-gather of a few integers):
 *   per split, the sample count and shape, the number of classes, and a CRC-32 (zlib) of the
 *   images and of the labels exactly as loaded (normalised float32 and int32, after any limit),
 *   so any in-memory dataset is covered, synthetic ones included; a difference stops every
 *   rank, naming the rank and the file. Cost: one pass over the data (Fashion-MNIST: 219 MB,
 *   about 0.15 s on one core).
 * The checks run on the training thread; the data check is collective. */
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include "train/train_impl.h"

typedef struct images_task {
  mpt_train_task task; /* first: the public part, then how to free it (mpt_train_task_free) */
  void (*destroy)(void *self);
  const mpt_dataset *train, *test;
  mpt_data_source *train_source, *test_source;
  char dir[PATH_MAX]; /* the IDX files' folder, for messages ("" for data made in memory) */
} images_task;

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
  f[F_TEST_COUNT] = test ? (int32_t)test->count : 0;
  f[F_SHAPE] = (int32_t)mpt_dataset_sample_count(train);
  f[F_CLASSES] = train->num_classes;
  f[F_TRAIN_IMAGES] = (int32_t)crc_bytes(train->images.data, (size_t)train->images.count * 4);
  f[F_TRAIN_LABELS] = (int32_t)crc_bytes(train->labels.data, (size_t)train->labels.count * 4);
  f[F_TEST_IMAGES] = test ? (int32_t)crc_bytes(test->images.data, (size_t)test->images.count * 4)
                         : 0;
  f[F_TEST_LABELS] = test ? (int32_t)crc_bytes(test->labels.data, (size_t)test->labels.count * 4)
                         : 0;
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

/* Which file field `f` comes from, and how a rank describes it in the message. */
static void describe(const images_task *k, int f, char *out, size_t nbytes) {
  if (!k->dir[0]) {
    snprintf(out, nbytes, "data made in memory (synthetic, or the caller's)");
    return;
  }
  static const char *const names[NFIELDS] = {
      "train-images-idx3-ubyte", "t10k-images-idx3-ubyte",  "train-images-idx3-ubyte",
      "train-labels-idx1-ubyte", "train-images-idx3-ubyte", "train-labels-idx1-ubyte",
      "t10k-images-idx3-ubyte",  "t10k-labels-idx1-ubyte"};
  data_file(k->dir, names[f], out, nbytes);
}

static mpt_status check_same_data(const images_task *k, mpt_comm *comm) {
  const int world = mpt_comm_world_size(comm);
  if (world == 1) return MPT_OK;
  static const char *const what[NFIELDS] = {
      "the number of training samples", "the number of test samples",
      "the number of values per image",
      "the number of classes", "the training images", "the training labels", "the test images",
      "the test labels"};
  const size_t W = (size_t)world;
  int32_t mine[NFIELDS], *all = malloc(sizeof(int32_t) * NFIELDS * W);
  char *paths = NULL;
  mpt_status st = MPT_OK;
  if (!all) return MPT_FAIL(MPT_ENOMEM, "cannot allocate the data check");
  fingerprint(k->train, k->test, mine);
  MPT_CHECK(mpt_comm_allgather_sync(comm, mine, all, NFIELDS, MPT_I32), done);
  int bad = -1, f = 0;
  for (size_t r = 1; r < W && bad < 0; r++)
    for (f = 0; f < NFIELDS; f++)
      if (all[NFIELDS * r + (size_t)f] != all[f]) {
        bad = (int)r;
        break;
      }
  if (bad < 0) goto done;
  /* Collective: every rank found the same (bad, f). Each names the file it read. */
  if (!(paths = calloc(W + 1, RECORD_BYTES))) {
    st = MPT_FAIL(MPT_ENOMEM, "cannot allocate the data check");
    goto done;
  }
  char *my_path = paths + RECORD_BYTES * W; /* path, then host */
  describe(k, f, my_path, PATH_BYTES);
  snprintf(my_path + PATH_BYTES, HOST_BYTES, "%s", mpt_comm_hostname(comm));
  MPT_CHECK(mpt_comm_allgather_sync(comm, my_path, paths, RECORD_BYTES, MPT_U8), done);
  const int32_t *a = all, *b = all + NFIELDS * (size_t)bad;
  char va[64], vb[64];
  if (f <= F_CLASSES) {
    snprintf(va, sizeof va, "%" PRId32, a[f]);
    snprintf(vb, sizeof vb, "%" PRId32, b[f]);
  } else {
    snprintf(va, sizeof va, "CRC-32 %08" PRIx32, (uint32_t)a[f]);
    snprintf(vb, sizeof vb, "CRC-32 %08" PRIx32, (uint32_t)b[f]);
  }
  st = MPT_FAIL(MPT_EMISMATCH,
                "ranks loaded different data (%s): rank %d has %s from '%s' on %s, rank 0 "
                "has %s from '%s' on %s (every rank must load the same data: same --data "
                "contents, --train-limit and --test-limit; a relative --data is read from each "
                "rank's working directory)",
                what[f], bad, vb, paths + RECORD_BYTES * (size_t)bad,
                paths + RECORD_BYTES * (size_t)bad + PATH_BYTES, va, paths, paths + PATH_BYTES);
done:
  free(all);
  free(paths);
  return st;
}

/* One forward of the first sample of `ds` in evaluation mode: a shape the model does not take
 * is named with the file. */
static mpt_status check_shape(const images_task *k, mpt_model *model, const mpt_dataset *ds,
                              const char *file) {
  if (ds->count < 1 || mpt_model_device(model).type != MPT_DEVICE_CPU) return MPT_OK;
  mpt_tape *tape = NULL;
  MPT_RETURN_IF(mpt_tape_init(&tape, model, NULL));
  const int training = mpt_model_training(model);
  mpt_model_set_training(model, 0);
  mpt_tape_set_grad_enabled(tape, 0);
  const int64_t shape[4] = {1, ds->channels, ds->height, ds->width};
  mpt_tensor x = mpt_tensor_view(ds->images.data, mpt_device_cpu(), MPT_F32, 4, shape);
  mpt_var *in, *out;
  mpt_status st = mpt_tape_input(tape, &x, &in);
  if (st == MPT_OK) st = mpt_model_forward(model, tape, in, &out);
  mpt_model_set_training(model, training);
  mpt_tape_free(tape);
  if (st != MPT_ESHAPE && st != MPT_EINVAL) return st;
  char detail[1024], path[PATH_MAX];
  snprintf(detail, sizeof detail, "%s", mpt_last_error());
  if (k->dir[0])
    data_file(k->dir, file, path, sizeof path);
  else
    snprintf(path, sizeof path, "the data made in memory");
  return MPT_FAIL(MPT_ESHAPE, "'%s' holds images of %d x %d x %d (channels x height x width), "
                  "which the model does not take: %s", path, ds->channels, ds->height, ds->width,
                  detail);
}

static mpt_status images_check(void *ctx, mpt_comm *comm, const mpt_trainer_config *cfg,
                               mpt_model *model) {
  (void)cfg;
  const images_task *k = ctx;
  MPT_RETURN_IF(check_shape(k, model, k->train, "train-images-idx3-ubyte"));
  if (k->test) MPT_RETURN_IF(check_shape(k, model, k->test, "t10k-images-idx3-ubyte"));
  return check_same_data(k, comm);
}

static mpt_status images_loss(void *ctx, mpt_tape *tape, mpt_var *output,
                              const mpt_tensor *target, mpt_var **loss) {
  (void)ctx;
  return mpt_nn_cross_entropy(tape, output, target, loss);
}

static mpt_status images_metric(void *ctx, mpt_stream *stream, const mpt_tensor *output,
                                const mpt_tensor *target, int64_t rows, double *sum) {
  (void)ctx;
  int64_t correct = 0;
  if (output->ndim != 2)
    return MPT_FAIL(MPT_ESHAPE, "accuracy: the model's output has %d dimensions, want logits "
                    "[rows, classes]", output->ndim);
  MPT_RETURN_IF(mpt_op_count_correct(stream, output->data, target->data, rows,
                                     output->shape[1], &correct));
  *sum = (double)correct;
  return MPT_OK;
}

static void images_destroy(void *self) {
  images_task *k = self;
  mpt_data_source_free(k->train_source);
  mpt_data_source_free(k->test_source);
  free(k);
}

mpt_status mpt_train_task_images(mpt_train_task **out, const mpt_dataset *train,
                                 const mpt_dataset *test, const char *dir) {
  if (!out) return MPT_FAIL(MPT_EINVAL, "mpt_train_task_images: task is NULL");
  *out = NULL;
  if (!train) return MPT_FAIL(MPT_EINVAL, "mpt_train_task_images: no training data");
  images_task *k = calloc(1, sizeof *k);
  if (!k) return MPT_FAIL(MPT_ENOMEM, "cannot allocate the task");
  k->destroy = images_destroy;
  k->train = train;
  k->test = test;
  if (dir) snprintf(k->dir, sizeof k->dir, "%s", dir);
  mpt_status st = mpt_data_source_init_dataset(&k->train_source, train);
  if (st == MPT_OK && test) st = mpt_data_source_init_dataset(&k->test_source, test);
  if (st != MPT_OK) {
    images_destroy(k);
    return st;
  }
  mpt_train_task *t = &k->task;
  t->name = "classifier";
  t->unit = "samples";
  t->units_per_row = 1;
  t->eval_name = "test";
  t->metric_name = "acc";
  t->train = k->train_source;
  t->eval = k->test_source;
  t->ctx = k;
  t->check = images_check;
  t->loss = images_loss;
  t->metric = images_metric;
  *out = t;
  return MPT_OK;
}

void mpt_train_task_free(mpt_train_task *task) {
  if (!task) return;
  mpt__builtin_task *b = (mpt__builtin_task *)task;
  b->destroy(b);
}
