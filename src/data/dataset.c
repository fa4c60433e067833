/* In-memory datasets: an images + labels IDX pair (Fashion-MNIST and any other ubyte IDX pair),
 * normalised to float32 NCHW, and synthetic random datasets for benchmarks and tests.
 *
 * Invariants of a loaded mpt_dataset: images is F32 [N, C, H, W] and labels I32 [N] on the CPU,
 * count == N, every label is in [0, num_classes). Both files are fully validated before the
 * dataset is handed out; on any error the output is zeroed and nothing leaks. Runs on the
 * calling thread; a loaded dataset is read-only and may be shared between threads. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "mpitrain/core.h"
#include "mpitrain/data.h"

#define DEBIAN_FASHION_MNIST_DIR "/usr/share/datasets/fashion-mnist"
#define INSTALL_HINT \
  "install Debian's dataset-fashion-mnist package (apt-get install dataset-fashion-mnist) or " \
  "give the folder that holds the files (mpitrain: --data DIR)"

static const char *const fashion_files[4] = {
    "train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte"};

mpt_dataset_config mpt_dataset_config_default(void) {
  mpt_dataset_config c;
  c.mean = MPT_FASHION_MNIST_MEAN;
  c.std = MPT_FASHION_MNIST_STD;
  c.num_classes = MPT_FASHION_MNIST_CLASSES;
  c.limit = 0;
  return c;
}

void mpt_dataset_free(mpt_dataset *ds) {
  if (!ds) return;
  mpt_tensor_free(&ds->images);
  mpt_tensor_free(&ds->labels);
  memset(ds, 0, sizeof *ds);
}

int64_t mpt_dataset_sample_count(const mpt_dataset *ds) {
  return ds ? (int64_t)ds->channels * ds->height * ds->width : 0;
}

/* Allocates the two tensors for n samples of c x h x w. */
static mpt_status dataset_alloc(mpt_dataset *ds, int64_t n, int c, int h, int w) {
  mpt_status st;
  int64_t ishape[4] = {n, c, h, w};
  int64_t lshape[1] = {n};
  MPT_CHECK(mpt_tensor_init(&ds->images, mpt_device_cpu(), MPT_F32, 4, ishape), fail);
  MPT_CHECK(mpt_tensor_init(&ds->labels, mpt_device_cpu(), MPT_I32, 1, lshape), fail);
  ds->count = n;
  ds->channels = c;
  ds->height = h;
  ds->width = w;
  return MPT_OK;
fail:
  mpt_dataset_free(ds);
  return st;
}

mpt_status mpt_dataset_load_idx(const char *images_path, const char *labels_path,
                                const mpt_dataset_config *config, mpt_dataset *ds) {
  if (!ds) return MPT_FAIL(MPT_EINVAL, "mpt_dataset_load_idx: ds is NULL");
  memset(ds, 0, sizeof *ds);
  if (!images_path || !labels_path)
    return MPT_FAIL(MPT_EINVAL, "mpt_dataset_load_idx: a path is NULL");
  mpt_dataset_config cfg = config ? *config : mpt_dataset_config_default();
  if (!(cfg.std > 0.0f) || cfg.num_classes < 1 || cfg.limit < 0)
    return MPT_FAIL(MPT_EINVAL,
                    "mpt_dataset_load_idx('%s'): bad config: std %g (must be > 0), num_classes %d "
                    "(must be >= 1), limit %lld (must be >= 0)",
                    images_path, (double)cfg.std, cfg.num_classes, (long long)cfg.limit);

  mpt_status st;
  mpt_idx img = {0}, lab = {0};
  MPT_CHECK(mpt_idx_read(images_path, 0, &img), done);
  if (img.ndim != 3 && img.ndim != 4) {
    st = MPT_FAIL(MPT_EFORMAT,
                  "images file '%s' has %d dimensions; expected 3 [N, H, W] or 4 [N, C, H, W]",
                  images_path, img.ndim);
    goto done;
  }
  MPT_CHECK(mpt_idx_read(labels_path, 1, &lab), done);
  if (lab.shape[0] != img.shape[0]) {
    st = MPT_FAIL(MPT_ESHAPE,
                  "images file '%s' holds %lld images but labels file '%s' holds %lld labels",
                  images_path, (long long)img.shape[0], labels_path, (long long)lab.shape[0]);
    goto done;
  }
  for (int64_t i = 0; i < lab.count; i++) {
    if (lab.data[i] >= cfg.num_classes) {
      st = MPT_FAIL(MPT_EFORMAT, "labels file '%s': label %lld is %d, expected 0 to %d",
                    labels_path, (long long)i, (int)lab.data[i], cfg.num_classes - 1);
      goto done;
    }
  }

  int64_t n = img.shape[0];
  if (cfg.limit > 0 && cfg.limit < n) n = cfg.limit;
  int c = img.ndim == 4 ? (int)img.shape[1] : 1;
  int h = (int)img.shape[img.ndim - 2];
  int w = (int)img.shape[img.ndim - 1];
  MPT_CHECK(dataset_alloc(ds, n, c, h, w), done);
  ds->num_classes = cfg.num_classes;
  ds->mean = cfg.mean;
  ds->std = cfg.std;

  /* (p / 255 - mean) / std as p * scale + shift. */
  const float scale = 1.0f / (255.0f * cfg.std), shift = -cfg.mean / cfg.std;
  float *x = ds->images.data;
  int64_t total = n * (int64_t)c * h * w;
  for (int64_t i = 0; i < total; i++) x[i] = (float)img.data[i] * scale + shift;
  int32_t *y = ds->labels.data;
  for (int64_t i = 0; i < n; i++) y[i] = lab.data[i];
  st = MPT_OK;

done:
  mpt_idx_free(&img);
  mpt_idx_free(&lab);
  if (st != MPT_OK) mpt_dataset_free(ds);
  return st;
}

const char *mpt_data_default_dir(void) {
  char path[512];
  for (int i = 0; i < 4; i++) {
    snprintf(path, sizeof path, "%s/%s.gz", DEBIAN_FASHION_MNIST_DIR, fashion_files[i]);
    if (access(path, R_OK) != 0) {
      snprintf(path, sizeof path, "%s/%s", DEBIAN_FASHION_MNIST_DIR, fashion_files[i]);
      if (access(path, R_OK) != 0) return NULL;
    }
  }
  return DEBIAN_FASHION_MNIST_DIR;
}

/* Finds dir/name.gz or dir/name; MPT_ENOENT naming the .gz path if neither exists. */
static mpt_status find_file(const char *dir, const char *name, char *out, size_t nbytes) {
  int len = snprintf(out, nbytes, "%s/%s.gz", dir, name);
  if (len < 0 || (size_t)len >= nbytes)
    return MPT_FAIL(MPT_EINVAL, "data folder path '%s' is too long", dir);
  if (access(out, F_OK) == 0) return MPT_OK;
  snprintf(out, nbytes, "%s/%s", dir, name);
  if (access(out, F_OK) == 0) return MPT_OK;
  snprintf(out, nbytes, "%s/%s.gz", dir, name);
  return MPT_FAIL(MPT_ENOENT, "Fashion-MNIST file '%s' not found; " INSTALL_HINT, out);
}

mpt_status mpt_dataset_load_fashion_mnist(const char *dir, const char *split,
                                          const mpt_dataset_config *config, mpt_dataset *ds) {
  if (!ds) return MPT_FAIL(MPT_EINVAL, "mpt_dataset_load_fashion_mnist: ds is NULL");
  memset(ds, 0, sizeof *ds);
  int which;
  if (split && strcmp(split, "train") == 0)
    which = 0;
  else if (split && strcmp(split, "test") == 0)
    which = 2;
  else
    return MPT_FAIL(MPT_EINVAL, "unknown Fashion-MNIST split '%s'; expected \"train\" or \"test\"",
                    split ? split : "(null)");
  if (!dir) {
    dir = mpt_data_default_dir();
    if (!dir)
      return MPT_FAIL(MPT_ENOENT,
                      "Fashion-MNIST not found in %s; " INSTALL_HINT, DEBIAN_FASHION_MNIST_DIR);
  }
  if (access(dir, F_OK) != 0)
    return MPT_FAIL(MPT_ENOENT, "data folder '%s' does not exist; " INSTALL_HINT, dir);
  char images[1024], labels[1024];
  MPT_RETURN_IF(find_file(dir, fashion_files[which], images, sizeof images));
  MPT_RETURN_IF(find_file(dir, fashion_files[which + 1], labels, sizeof labels));
  return mpt_dataset_load_idx(images, labels, config, ds);
}

mpt_status mpt_dataset_init_synthetic(mpt_dataset *ds, int64_t count, int channels, int height,
                                      int width, int num_classes, uint64_t seed) {
  if (!ds) return MPT_FAIL(MPT_EINVAL, "mpt_dataset_init_synthetic: ds is NULL");
  memset(ds, 0, sizeof *ds);
  if (count < 0 || channels < 1 || height < 1 || width < 1 || num_classes < 1)
    return MPT_FAIL(MPT_EINVAL,
                    "mpt_dataset_init_synthetic: count %lld, shape [%d, %d, %d], num_classes %d: "
                    "extents and classes must be positive, count >= 0",
                    (long long)count, channels, height, width, num_classes);
  MPT_RETURN_IF(dataset_alloc(ds, count, channels, height, width));
  ds->num_classes = num_classes;
  ds->mean = 0.0f;
  ds->std = 1.0f;
  mpt_rng rng;
  mpt_rng_seed(&rng, seed);
  mpt_rng_fill_uniform(&rng, ds->images.data, ds->images.count, -1.0f, 1.0f);
  int32_t *y = ds->labels.data;
  for (int64_t i = 0; i < count; i++) y[i] = (int32_t)mpt_rng_below(&rng, (uint64_t)num_classes);
  return MPT_OK;
}
