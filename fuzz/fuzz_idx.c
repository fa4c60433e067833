/* libFuzzer target: the IDX reader (mpt_idx_read, src/data/idx.c) and the dataset loader built
 * on it (mpt_dataset_load_idx, src/data/dataset.c).
 *
 * The input is the content of an IDX file, gzip-compressed or plain. Checked for every input:
 * - mpt_idx_read(0) never crashes, hangs or leaks; on success 1 <= ndim <= MPT_IDX_MAX_DIMS,
 *   every extent is in [1, MPT_IDX_MAX_EXTENT], count is their product and is at most
 *   MPT_IDX_MAX_NBYTES, and all count data bytes are readable (ASan checks the reads); on
 *   error the struct is zeroed;
 * - mpt_idx_read with expected_ndim 1 and 3 agrees: it succeeds with the same data exactly when
 *   the any-ndim read did and had that many dimensions;
 * - a successful images read ([N, H, W] or [N, C, H, W]) is loaded as a dataset together with a
 *   generated labels file of N labels (derived from the input, some >= 10, so the label check
 *   runs both ways); a labels read ([N]) together with a generated images file [N, 1, 2]. On
 *   success the dataset's shape, labels and every normalised pixel are compared with a naive
 *   recomputation from the raw bytes; on error the dataset must be zeroed. An images file with
 *   one label too many is always MPT_ESHAPE, a 1- or 2-dimension file as images MPT_EFORMAT.
 * The generated companion files are written to their own scratch files (fuzz_common.h). */
#include <math.h>

#include "fuzz_common.h"

static fuzz_scratch input_file, other_file;

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  fuzz_scratch_open(&input_file, "fuzz_idx_input");
  fuzz_scratch_open(&other_file, "fuzz_idx_other");
  return 0;
}

static int is_zeroed(const void *p, size_t n) {
  const uint8_t *b = p;
  for (size_t i = 0; i < n; i++)
    if (b[i]) return 0;
  return 1;
}

static void check_idx(const mpt_idx *idx) {
  if (idx->ndim < 1 || idx->ndim > MPT_IDX_MAX_DIMS) fuzz_fail("ndim %d", idx->ndim);
  int64_t prod = 1;
  for (int d = 0; d < idx->ndim; d++) {
    if (idx->shape[d] < 1 || idx->shape[d] > MPT_IDX_MAX_EXTENT)
      fuzz_fail("extent %d is %lld", d, (long long)idx->shape[d]);
    prod *= idx->shape[d];
    if (prod > MPT_IDX_MAX_NBYTES) fuzz_fail("extents exceed the byte limit");
  }
  if (prod != idx->count) fuzz_fail("count %lld, product %lld", (long long)idx->count,
                                    (long long)prod);
  if (!idx->data) fuzz_fail("no data for %lld bytes", (long long)idx->count);
  /* Touch every byte (ASan reports a short buffer). */
  volatile unsigned sum = 0;
  for (int64_t i = 0; i < idx->count; i++) sum += idx->data[i];
  (void)sum;
}

/* The labels (ndim 1) or images (ndim 3) reading must agree with the any-ndim one. */
static void check_expected_ndim(const mpt_idx *any, mpt_status any_st, int expected) {
  mpt_idx idx;
  mpt_status st = mpt_idx_read(input_file.path, expected, &idx);
  int want_ok = any_st == MPT_OK && any->ndim == expected;
  if ((st == MPT_OK) != want_ok)
    fuzz_fail("expected_ndim %d read gave %s, the any-ndim read %s (ndim %d)", expected,
              mpt_status_name(st), mpt_status_name(any_st), any->ndim);
  if (st == MPT_OK) {
    if (idx.count != any->count || memcmp(idx.data, any->data, (size_t)idx.count) != 0)
      fuzz_fail("expected_ndim %d read differs from the any-ndim read", expected);
  } else if (!is_zeroed(&idx, sizeof idx)) {
    fuzz_fail("failed read left the struct non-zero");
  }
  mpt_idx_free(&idx);
}

/* Writes an IDX ubyte file with the given extents and payload to the companion scratch file. */
static void write_companion(int ndim, const int64_t *shape, const uint8_t *payload,
                            int64_t count) {
  size_t head = 4 + 4 * (size_t)ndim;
  uint8_t *buf = malloc(head + (size_t)count);
  if (!buf) fuzz_fail("out of memory for a %lld-byte companion file", (long long)count);
  buf[0] = 0, buf[1] = 0, buf[2] = 0x08, buf[3] = (uint8_t)ndim;
  for (int d = 0; d < ndim; d++)
    for (int k = 0; k < 4; k++) buf[4 + 4 * d + k] = (uint8_t)(shape[d] >> (24 - 8 * k));
  memcpy(buf + head, payload, (size_t)count);
  fuzz_scratch_write(&other_file, buf, head + (size_t)count);
  free(buf);
}

/* Loads (images, labels) and checks the dataset against the raw bytes. */
static void check_dataset(const char *images_path, const char *labels_path, const mpt_idx *img,
                          const uint8_t *labels, int64_t limit) {
  mpt_dataset_config cfg = mpt_dataset_config_default();
  cfg.limit = limit;
  mpt_dataset ds;
  mpt_status st = mpt_dataset_load_idx(images_path, labels_path, &cfg, &ds);
  int64_t n = img->shape[0];
  int bad_label = 0;
  for (int64_t i = 0; i < n; i++) bad_label |= labels[i] >= cfg.num_classes;
  if (st != MPT_OK) {
    if (!bad_label) fuzz_fail("dataset load failed (%s) on valid files", mpt_status_name(st));
    if (!is_zeroed(&ds, sizeof ds)) fuzz_fail("failed dataset load left the struct non-zero");
    return;
  }
  if (bad_label) fuzz_fail("dataset load accepted a label >= %d", cfg.num_classes);
  int64_t keep = limit > 0 && limit < n ? limit : n;
  int c = img->ndim == 4 ? (int)img->shape[1] : 1;
  int h = (int)img->shape[img->ndim - 2], w = (int)img->shape[img->ndim - 1];
  if (ds.count != keep || ds.channels != c || ds.height != h || ds.width != w)
    fuzz_fail("dataset shape [%lld, %d, %d, %d], expected [%lld, %d, %d, %d]",
              (long long)ds.count, ds.channels, ds.height, ds.width, (long long)keep, c, h, w);
  if (ds.images.count != keep * c * h * w || ds.labels.count != keep)
    fuzz_fail("dataset tensors hold %lld / %lld elements", (long long)ds.images.count,
              (long long)ds.labels.count);
  const float *x = ds.images.data;
  const int32_t *y = ds.labels.data;
  for (int64_t i = 0; i < keep; i++)
    if (y[i] != labels[i]) fuzz_fail("label %lld is %d, file has %d", (long long)i, y[i],
                                     labels[i]);
  for (int64_t i = 0; i < ds.images.count; i++) {
    float want = ((float)img->data[i] / 255.0f - cfg.mean) / cfg.std;
    if (!(fabsf(x[i] - want) <= 1e-5f * (1.0f + fabsf(want))))
      fuzz_fail("pixel %lld is %g, expected %g", (long long)i, (double)x[i], (double)want);
  }
  mpt_dataset_free(&ds);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fuzz_scratch_write(&input_file, data, size);
  mpt_idx idx;
  mpt_status st = mpt_idx_read(input_file.path, 0, &idx);
  if (st == MPT_OK)
    check_idx(&idx);
  else if (!is_zeroed(&idx, sizeof idx))
    fuzz_fail("failed read (%s) left the struct non-zero", mpt_status_name(st));
  check_expected_ndim(&idx, st, 1);
  check_expected_ndim(&idx, st, 3);

  if (st == MPT_OK && (idx.ndim == 3 || idx.ndim == 4)) {
    /* Images: labels are image bytes mod 11 (10 is out of range: some inputs fail). */
    int64_t n = idx.shape[0], per = idx.count / n;
    uint8_t *labels = malloc((size_t)n);
    if (!labels) fuzz_fail("out of memory");
    for (int64_t i = 0; i < n; i++) labels[i] = (uint8_t)(idx.data[i * per] % 11);
    write_companion(1, &n, labels, n);
    check_dataset(input_file.path, other_file.path, &idx, labels, (int64_t)(size % 5));
    /* One label too many: the counts differ, always MPT_ESHAPE. */
    int64_t n1 = n + 1;
    uint8_t *more = calloc((size_t)n1, 1);
    if (!more) fuzz_fail("out of memory");
    write_companion(1, &n1, more, n1);
    mpt_dataset ds;
    mpt_status st2 = mpt_dataset_load_idx(input_file.path, other_file.path, NULL, &ds);
    if (st2 != MPT_ESHAPE || !is_zeroed(&ds, sizeof ds))
      fuzz_fail("%lld images with %lld labels gave %s", (long long)n, (long long)n1,
                mpt_status_name(st2));
    free(more);
    free(labels);
  } else if (st == MPT_OK && idx.ndim == 1) {
    /* Labels: images [N, 1, 2] whose pixels are the label byte and its complement. */
    int64_t n = idx.shape[0], shape[3] = {n, 1, 2};
    uint8_t *pixels = malloc((size_t)(2 * n));
    if (!pixels) fuzz_fail("out of memory");
    for (int64_t i = 0; i < n; i++) pixels[2 * i] = idx.data[i], pixels[2 * i + 1] = ~idx.data[i];
    write_companion(3, shape, pixels, 2 * n);
    mpt_idx img = {.ndim = 3, .shape = {n, 1, 2}, .count = 2 * n, .data = pixels};
    check_dataset(other_file.path, input_file.path, &img, idx.data, (int64_t)(size % 3));
    free(pixels);
  }
  if (st == MPT_OK && (idx.ndim == 1 || idx.ndim == 2)) {
    /* Not an images file: MPT_EFORMAT whatever the labels file. */
    mpt_dataset ds;
    mpt_status st2 = mpt_dataset_load_idx(input_file.path, input_file.path, NULL, &ds);
    if (st2 != MPT_EFORMAT || !is_zeroed(&ds, sizeof ds))
      fuzz_fail("a %d-dimension images file gave %s", idx.ndim, mpt_status_name(st2));
  }
  mpt_idx_free(&idx);
  return 0;
}
