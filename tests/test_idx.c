/* Tests for src/data/idx.c and src/data/dataset.c: IDX files written here (gzipped and raw),
 * valid and broken in each way the reader must catch, with the status and the file name in the
 * message checked; datasets normalised exactly; and, when Debian's dataset-fashion-mnist is
 * installed, the real files checked against an independent naive read. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "mpitrain/data.h"

static char tmpdir[256];

static void setup(void) {
  snprintf(tmpdir, sizeof tmpdir, "/tmp/mpt_test_idx_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static void teardown(void) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
}

/* Writes raw bytes to tmpdir/name, gzipped or not; returns the full path (static buffer per
 * call slot). */
static const char *write_file(const char *name, int gz, const uint8_t *bytes, size_t nbytes) {
  static char paths[4][512];
  static int next = 0;
  char *path = paths[next++ % 4];
  snprintf(path, 512, "%s/%s", tmpdir, name);
  if (gz) {
    gzFile f = gzopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    if (nbytes) ck_assert_int_eq(gzwrite(f, bytes, (unsigned)nbytes), (int)nbytes);
    ck_assert_int_eq(gzclose(f), Z_OK);
  } else {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    if (nbytes) ck_assert_uint_eq(fwrite(bytes, 1, nbytes, f), nbytes);
    fclose(f);
  }
  return path;
}

/* Builds an IDX image: magic, extents, then `ndata` bytes from data. Returns total length. */
static size_t build_idx(uint8_t *out, uint32_t magic, int ndim, const uint32_t *dims,
                        const uint8_t *data, size_t ndata) {
  size_t n = 0;
  for (int s = 24; s >= 0; s -= 8) out[n++] = (uint8_t)(magic >> s);
  for (int d = 0; d < ndim; d++)
    for (int s = 24; s >= 0; s -= 8) out[n++] = (uint8_t)(dims[d] >> s);
  memcpy(out + n, data, ndata);
  return n + ndata;
}

/* 3 images of 2 x 2 with pixel values 0, 10, 20, ..., 110 and labels {1, 0, 9}. */
static uint8_t pixels[12];
static const uint8_t labels3[3] = {1, 0, 9};

static const char *write_images(const char *name, int gz, size_t ndata, size_t extra) {
  uint8_t buf[256];
  uint32_t dims[3] = {3, 2, 2};
  uint8_t data[64] = {0};
  for (int i = 0; i < 12; i++) pixels[i] = data[i] = (uint8_t)(10 * i);
  for (size_t i = 12; i < 12 + extra; i++) data[i] = 0xAB;
  size_t n = build_idx(buf, 0x00000803u, 3, dims, data, ndata + extra);
  return write_file(name, gz, buf, n);
}

static const char *write_labels(const char *name, int gz, uint32_t count, const uint8_t *y) {
  uint8_t buf[256];
  size_t n = build_idx(buf, 0x00000801u, 1, &count, y, count);
  return write_file(name, gz, buf, n);
}

static void assert_error_names(mpt_status st, mpt_status want, const char *path,
                               const char *also) {
  ck_assert_msg(st == want, "status %s, expected %s (%s)", mpt_status_name(st),
                mpt_status_name(want), mpt_last_error());
  ck_assert_msg(strstr(mpt_last_error(), path) != NULL, "message '%s' does not name '%s'",
                mpt_last_error(), path);
  if (also)
    ck_assert_msg(strstr(mpt_last_error(), also) != NULL, "message '%s' does not say '%s'",
                  mpt_last_error(), also);
}

START_TEST(test_idx_reads_gzipped_and_raw_files_exactly) {
  for (int gz = 0; gz < 2; gz++) {
    const char *path = write_images(gz ? "img.gz" : "img", gz, 12, 0);
    mpt_idx idx;
    ck_assert_int_eq(mpt_idx_read(path, 3, &idx), MPT_OK);
    ck_assert_int_eq(idx.ndim, 3);
    ck_assert_int_eq(idx.shape[0], 3);
    ck_assert_int_eq(idx.shape[1], 2);
    ck_assert_int_eq(idx.shape[2], 2);
    ck_assert_int_eq(idx.count, 12);
    for (int i = 0; i < 12; i++) ck_assert_uint_eq(idx.data[i], pixels[i]);
    mpt_idx_free(&idx);
    ck_assert_ptr_null(idx.data);
    mpt_idx_free(&idx); /* zeroed: no-op */
  }
  mpt_idx_free(NULL);
}
END_TEST

START_TEST(test_idx_reads_data_larger_than_one_chunk) {
  /* 3 MiB of data crosses the reader's 1 MiB chunks and buffer growth. */
  const uint32_t dims[3] = {3, 1024, 1024};
  size_t ndata = 3u << 20;
  uint8_t *buf = malloc(16 + ndata);
  uint8_t *data = malloc(ndata);
  for (size_t i = 0; i < ndata; i++) data[i] = (uint8_t)(i * 7 + (i >> 12));
  size_t n = build_idx(buf, 0x00000803u, 3, dims, data, ndata);
  const char *path = write_file("big.gz", 1, buf, n);
  mpt_idx idx;
  ck_assert_int_eq(mpt_idx_read(path, 3, &idx), MPT_OK);
  ck_assert_int_eq(idx.count, (int64_t)ndata);
  ck_assert_int_eq(memcmp(idx.data, data, ndata), 0);
  mpt_idx_free(&idx);
  free(buf);
  free(data);
}
END_TEST

START_TEST(test_idx_rejects_bad_magic) {
  uint8_t buf[64];
  uint32_t dims[3] = {1, 1, 1};
  uint8_t d = 0;
  /* Not starting with two zero bytes (e.g. a PNG or a text file). */
  size_t n = build_idx(buf, 0x89504E47u, 3, dims, &d, 1);
  const char *path = write_file("notidx", 0, buf, n);
  mpt_idx idx;
  assert_error_names(mpt_idx_read(path, 3, &idx), MPT_EFORMAT, path, "0x89504E47");
  ck_assert_ptr_null(idx.data);
  /* An element type other than unsigned byte. */
  n = build_idx(buf, 0x00000D03u, 3, dims, &d, 1);
  path = write_file("float.gz", 1, buf, n);
  assert_error_names(mpt_idx_read(path, 3, &idx), MPT_EFORMAT, path, "float32");
  /* A labels file where images are expected: wrong number of dimensions. */
  path = write_labels("labels.gz", 1, 3, labels3);
  assert_error_names(mpt_idx_read(path, 3, &idx), MPT_EFORMAT, path, "0x00000803");
}
END_TEST

START_TEST(test_idx_rejects_truncated_data_naming_expected_and_got) {
  for (int gz = 0; gz < 2; gz++) {
    const char *path = write_images(gz ? "short.gz" : "short", gz, 7, 0);
    mpt_idx idx;
    assert_error_names(mpt_idx_read(path, 3, &idx), MPT_EFORMAT, path, "promises 12");
    ck_assert_ptr_nonnull(strstr(mpt_last_error(), "got 7"));
  }
}
END_TEST

START_TEST(test_idx_rejects_truncated_header) {
  uint8_t buf[8] = {0, 0, 8, 3, 0, 0};
  const char *path = write_file("head", 0, buf, 2);
  mpt_idx idx;
  assert_error_names(mpt_idx_read(path, 3, &idx), MPT_EFORMAT, path, "truncated");
  path = write_file("head2.gz", 1, buf, 6); /* magic fine, extents cut */
  assert_error_names(mpt_idx_read(path, 3, &idx), MPT_EFORMAT, path, "truncated");
}
END_TEST

START_TEST(test_idx_rejects_trailing_garbage) {
  for (int gz = 0; gz < 2; gz++) {
    const char *path = write_images(gz ? "long.gz" : "long", gz, 12, 5);
    mpt_idx idx;
    assert_error_names(mpt_idx_read(path, 3, &idx), MPT_EFORMAT, path, "5 unexpected bytes");
  }
}
END_TEST

START_TEST(test_idx_rejects_zero_and_absurd_extents_before_allocating) {
  uint8_t buf[64];
  uint8_t d = 0;
  uint32_t zero[3] = {3, 0, 2};
  size_t n = build_idx(buf, 0x00000803u, 3, zero, &d, 0);
  const char *path = write_file("zero", 0, buf, n);
  mpt_idx idx;
  assert_error_names(mpt_idx_read(path, 3, &idx), MPT_EFORMAT, path, "extent 0");
  /* 4e9 x 4e9 x 4e9 would be terabytes: refused from the header alone. */
  uint32_t huge[3] = {4000000000u, 4000000000u, 4000000000u};
  n = build_idx(buf, 0x00000803u, 3, huge, &d, 1);
  path = write_file("huge", 0, buf, n);
  assert_error_names(mpt_idx_read(path, 3, &idx), MPT_EFORMAT, path, "extent 4000000000");
  uint32_t big[3] = {100000, 1000, 1000}; /* 1e11 bytes: each extent fine, product not */
  n = build_idx(buf, 0x00000803u, 3, big, &d, 1);
  path = write_file("big", 0, buf, n);
  assert_error_names(mpt_idx_read(path, 3, &idx), MPT_EFORMAT, path, "limit");
  /* Plausible header, tiny file: a truncation error, memory only for what is there. */
  uint32_t lie[3] = {60000, 28, 28};
  n = build_idx(buf, 0x00000803u, 3, lie, &d, 1);
  path = write_file("lie.gz", 1, buf, n);
  assert_error_names(mpt_idx_read(path, 3, &idx), MPT_EFORMAT, path, "promises 47040000");
}
END_TEST

START_TEST(test_idx_rejects_empty_missing_directory_and_corrupt_gzip) {
  mpt_idx idx;
  const char *path = write_file("empty", 0, NULL, 0);
  assert_error_names(mpt_idx_read(path, 1, &idx), MPT_EFORMAT, path, "empty");
  path = write_file("empty.gz", 1, NULL, 0);
  assert_error_names(mpt_idx_read(path, 1, &idx), MPT_EFORMAT, path, "empty");

  char missing[512];
  snprintf(missing, sizeof missing, "%s/no-such-file.gz", tmpdir);
  assert_error_names(mpt_idx_read(missing, 1, &idx), MPT_ENOENT, missing, NULL);
  assert_error_names(mpt_idx_read(tmpdir, 1, &idx), MPT_EIO, tmpdir, NULL);

  /* A gzip file whose deflate stream is damaged in the middle. */
  uint8_t raw[4096 + 16];
  uint32_t dims[3] = {4, 32, 32};
  uint8_t data[4096];
  for (int i = 0; i < 4096; i++) data[i] = (uint8_t)((i * 131) ^ (i >> 3));
  size_t n = build_idx(raw, 0x00000803u, 3, dims, data, sizeof data);
  path = write_file("corrupt.gz", 1, raw, n);
  FILE *f = fopen(path, "r+b");
  ck_assert_ptr_nonnull(f);
  fseek(f, 0, SEEK_END);
  long len = ftell(f);
  for (long off = 20; off < len - 10; off += 7) {
    fseek(f, off, SEEK_SET);
    fputc(0xFF, f);
  }
  fclose(f);
  mpt_status st = mpt_idx_read(path, 3, &idx);
  ck_assert_msg(st == MPT_EIO || st == MPT_EFORMAT, "status %s", mpt_status_name(st));
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), path));
  ck_assert_ptr_null(idx.data);
}
END_TEST

/* Regression: opening a FIFO waited for a writer, so a FIFO in the data folder hung
 * the program forever. Now refused at once as not a regular file (a hang fails by the timeout). */
START_TEST(test_idx_refuses_a_fifo_without_waiting_for_a_writer) {
  char path[512];
  snprintf(path, sizeof path, "%s/fifo-images", tmpdir);
  ck_assert_int_eq(mkfifo(path, 0600), 0);
  mpt_idx idx;
  assert_error_names(mpt_idx_read(path, 3, &idx), MPT_EIO, path, "not a regular file");
  ck_assert_ptr_null(idx.data);
  unlink(path);
}
END_TEST

START_TEST(test_dataset_normalises_pixels_and_copies_labels) {
  const char *img = write_images("i.gz", 1, 12, 0);
  const char *lab = write_labels("l.gz", 1, 3, labels3);
  mpt_dataset_config cfg = mpt_dataset_config_default();
  ck_assert_float_eq(cfg.mean, 0.2860f);
  ck_assert_float_eq(cfg.std, 0.3530f);
  ck_assert_int_eq(cfg.num_classes, 10);
  mpt_dataset ds;
  ck_assert_int_eq(mpt_dataset_load_idx(img, lab, NULL, &ds), MPT_OK);
  ck_assert_int_eq(ds.count, 3);
  ck_assert_int_eq(ds.images.ndim, 4);
  ck_assert_int_eq(ds.images.shape[0], 3);
  ck_assert_int_eq(ds.images.shape[1], 1);
  ck_assert_int_eq(ds.images.shape[2], 2);
  ck_assert_int_eq(ds.images.shape[3], 2);
  ck_assert_int_eq(ds.images.dtype, MPT_F32);
  ck_assert_int_eq(ds.labels.dtype, MPT_I32);
  ck_assert_int_eq(ds.num_classes, 10);
  const float *x = ds.images.data;
  for (int i = 0; i < 12; i++) {
    double want = (pixels[i] / 255.0 - 0.2860) / 0.3530;
    ck_assert_double_eq_tol(x[i], want, 1e-5);
  }
  const int32_t *y = ds.labels.data;
  for (int i = 0; i < 3; i++) ck_assert_int_eq(y[i], labels3[i]);
  mpt_dataset_free(&ds);
  mpt_dataset_free(&ds);
  mpt_dataset_free(NULL);

  /* Custom normalisation and a limit. */
  cfg.mean = 0.5f;
  cfg.std = 2.0f;
  cfg.limit = 2;
  ck_assert_int_eq(mpt_dataset_load_idx(img, lab, &cfg, &ds), MPT_OK);
  ck_assert_int_eq(ds.count, 2);
  ck_assert_int_eq(ds.images.shape[0], 2);
  x = ds.images.data;
  for (int i = 0; i < 8; i++) ck_assert_double_eq_tol(x[i], (pixels[i] / 255.0 - 0.5) / 2.0, 1e-6);
  mpt_dataset_free(&ds);
  cfg.std = 0.0f;
  ck_assert_int_eq(mpt_dataset_load_idx(img, lab, &cfg, &ds), MPT_EINVAL);
}
END_TEST

START_TEST(test_dataset_reads_four_dimensional_images_as_nchw) {
  uint8_t buf[64], data[12];
  uint32_t dims[4] = {2, 3, 1, 2};
  for (int i = 0; i < 12; i++) data[i] = (uint8_t)(20 * i);
  size_t n = build_idx(buf, 0x00000804u, 4, dims, data, 12);
  const char *img = write_file("rgb", 0, buf, n);
  const uint8_t y[2] = {4, 2};
  const char *lab = write_labels("rgbl", 0, 2, y);
  mpt_dataset_config cfg = mpt_dataset_config_default();
  cfg.mean = 0.0f;
  cfg.std = 1.0f;
  mpt_dataset ds;
  ck_assert_int_eq(mpt_dataset_load_idx(img, lab, &cfg, &ds), MPT_OK);
  ck_assert_int_eq(ds.channels, 3);
  ck_assert_int_eq(ds.height, 1);
  ck_assert_int_eq(ds.width, 2);
  ck_assert_int_eq(mpt_dataset_sample_count(&ds), 6);
  for (int i = 0; i < 12; i++)
    ck_assert_double_eq_tol(((float *)ds.images.data)[i], data[i] / 255.0, 1e-6);
  mpt_dataset_free(&ds);
}
END_TEST

START_TEST(test_dataset_rejects_count_mismatch_naming_both_files) {
  const char *img = write_images("i3.gz", 1, 12, 0);
  const uint8_t y[4] = {0, 1, 2, 3};
  const char *lab = write_labels("l4.gz", 1, 4, y);
  mpt_dataset ds;
  assert_error_names(mpt_dataset_load_idx(img, lab, NULL, &ds), MPT_ESHAPE, img, "3 images");
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), lab));
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "4 labels"));
  ck_assert_ptr_null(ds.images.data);
  ck_assert_ptr_null(ds.labels.data);
}
END_TEST

START_TEST(test_dataset_rejects_label_out_of_range_naming_index_and_value) {
  const char *img = write_images("i.gz", 1, 12, 0);
  const uint8_t y[3] = {1, 10, 2};
  const char *lab = write_labels("bad.gz", 1, 3, y);
  mpt_dataset ds;
  assert_error_names(mpt_dataset_load_idx(img, lab, NULL, &ds), MPT_EFORMAT, lab, "label 1 is 10");
  /* With 11 classes the same file is fine. */
  mpt_dataset_config cfg = mpt_dataset_config_default();
  cfg.num_classes = 11;
  ck_assert_int_eq(mpt_dataset_load_idx(img, lab, &cfg, &ds), MPT_OK);
  mpt_dataset_free(&ds);
  /* A broken images file is reported with its own name. */
  const char *bad = write_images("trunc.gz", 1, 5, 0);
  assert_error_names(mpt_dataset_load_idx(bad, lab, &cfg, &ds), MPT_EFORMAT, bad, NULL);
}
END_TEST

START_TEST(test_fashion_mnist_loader_finds_files_and_explains_missing_ones) {
  mpt_dataset ds;
  char dir[512];
  snprintf(dir, sizeof dir, "%s/nowhere", tmpdir);
  assert_error_names(mpt_dataset_load_fashion_mnist(dir, "test", NULL, &ds), MPT_ENOENT, dir,
                     "apt-get install dataset-fashion-mnist");
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "--data DIR"));
  /* A folder with only the test images: the labels file is named as missing. */
  write_images("t10k-images-idx3-ubyte.gz", 1, 12, 0);
  snprintf(dir, sizeof dir, "%s/t10k-labels-idx1-ubyte.gz", tmpdir);
  assert_error_names(mpt_dataset_load_fashion_mnist(tmpdir, "test", NULL, &ds), MPT_ENOENT, dir,
                     "dataset-fashion-mnist");
  /* Uncompressed names are accepted too. */
  write_labels("t10k-labels-idx1-ubyte", 0, 3, labels3);
  ck_assert_int_eq(mpt_dataset_load_fashion_mnist(tmpdir, "test", NULL, &ds), MPT_OK);
  ck_assert_int_eq(ds.count, 3);
  ck_assert_int_eq(((int32_t *)ds.labels.data)[2], 9);
  mpt_dataset_free(&ds);
  ck_assert_int_eq(mpt_dataset_load_fashion_mnist(tmpdir, "valid", NULL, &ds), MPT_EINVAL);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "valid"));
}
END_TEST

START_TEST(test_synthetic_dataset_is_seeded_and_in_range) {
  mpt_dataset a, b;
  ck_assert_int_eq(mpt_dataset_init_synthetic(&a, 50, 1, 4, 4, 7, 123), MPT_OK);
  ck_assert_int_eq(mpt_dataset_init_synthetic(&b, 50, 1, 4, 4, 7, 123), MPT_OK);
  ck_assert_int_eq(a.count, 50);
  ck_assert_int_eq(a.images.shape[2], 4);
  ck_assert_int_eq(memcmp(a.images.data, b.images.data, 50 * 16 * sizeof(float)), 0);
  ck_assert_int_eq(memcmp(a.labels.data, b.labels.data, 50 * sizeof(int32_t)), 0);
  int seen[7] = {0};
  for (int i = 0; i < 50; i++) {
    int32_t y = ((int32_t *)a.labels.data)[i];
    ck_assert(y >= 0 && y < 7);
    seen[y] = 1;
  }
  for (int i = 0; i < 50 * 16; i++) {
    float x = ((float *)a.images.data)[i];
    ck_assert(x >= -1.0f && x < 1.0f);
  }
  int classes = 0;
  for (int c = 0; c < 7; c++) classes += seen[c];
  ck_assert_int_ge(classes, 5);
  mpt_dataset_free(&b);
  ck_assert_int_eq(mpt_dataset_init_synthetic(&b, 50, 1, 4, 4, 7, 124), MPT_OK);
  ck_assert_int_ne(memcmp(a.images.data, b.images.data, 50 * 16 * sizeof(float)), 0);
  mpt_dataset_free(&a);
  mpt_dataset_free(&b);
  ck_assert_int_eq(mpt_dataset_init_synthetic(&a, 5, 0, 4, 4, 7, 1), MPT_EINVAL);
}
END_TEST

/* Naive independent read of a gzipped IDX file: all bytes after the header. */
static uint8_t *naive_read(const char *path, int header, long expect) {
  gzFile f = gzopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  uint8_t *buf = malloc((size_t)expect + header + 1);
  long n = 0;
  int c;
  while ((c = gzgetc(f)) != -1 && n < expect + header + 1) buf[n++] = (uint8_t)c;
  gzclose(f);
  ck_assert_int_eq(n, expect + header);
  return buf;
}

START_TEST(test_fashion_mnist_real_test_split_matches_naive_read) {
  const char *dir = mpt_data_default_dir();
  if (!dir) {
    fprintf(stderr, "test_idx: dataset-fashion-mnist not installed; real-data test skipped\n");
    return;
  }
  mpt_dataset ds;
  ck_assert_msg(mpt_dataset_load_fashion_mnist(NULL, "test", NULL, &ds) == MPT_OK, "%s",
                mpt_last_error());
  ck_assert_int_eq(ds.count, 10000);
  ck_assert_int_eq(ds.channels, 1);
  ck_assert_int_eq(ds.height, 28);
  ck_assert_int_eq(ds.width, 28);
  ck_assert_int_eq(ds.num_classes, 10);

  char path[512];
  snprintf(path, sizeof path, "%s/t10k-labels-idx1-ubyte.gz", dir);
  uint8_t *raw_labels = naive_read(path, 8, 10000);
  snprintf(path, sizeof path, "%s/t10k-images-idx3-ubyte.gz", dir);
  uint8_t *raw_images = naive_read(path, 16, 10000L * 784);

  /* The test split has exactly 1000 images of each class. */
  int per_class[10] = {0};
  const int32_t *y = ds.labels.data;
  for (int i = 0; i < 10000; i++) {
    ck_assert(y[i] >= 0 && y[i] < 10);
    ck_assert_int_eq(y[i], raw_labels[8 + i]);
    per_class[y[i]]++;
  }
  for (int c = 0; c < 10; c++) ck_assert_int_eq(per_class[c], 1000);

  /* Normalised mean of the first 100 images, against the naive mean of their raw pixels. */
  const float *x = ds.images.data;
  double sum_norm = 0.0, sum_raw = 0.0;
  for (long i = 0; i < 100L * 784; i++) {
    sum_norm += x[i];
    sum_raw += raw_images[16 + i] / 255.0;
  }
  double mean_raw = sum_raw / (100.0 * 784);
  double want = (mean_raw - 0.2860) / 0.3530;
  ck_assert_double_eq_tol(sum_norm / (100.0 * 784), want, 1e-5);
  /* Whole split: the pixel mean is close to the training mean (0.2868 on the test split). */
  double all = 0.0;
  for (long i = 0; i < 10000L * 784; i++) all += x[i];
  all /= 10000.0 * 784;
  ck_assert_double_eq_tol(all * 0.3530 + 0.2860, 0.2868, 0.002);
  free(raw_labels);
  free(raw_images);
  mpt_dataset_free(&ds);
}
END_TEST

START_TEST(test_fashion_mnist_real_train_split_has_the_documented_statistics) {
  if (!mpt_data_default_dir()) return;
  mpt_dataset ds;
  ck_assert_msg(mpt_dataset_load_fashion_mnist(NULL, "train", NULL, &ds) == MPT_OK, "%s",
                mpt_last_error());
  ck_assert_int_eq(ds.count, 60000);
  /* Normalised with its own statistics, the training set has mean ~0 and std ~1. */
  const float *x = ds.images.data;
  double s = 0.0, s2 = 0.0;
  int64_t n = ds.images.count;
  for (int64_t i = 0; i < n; i++) {
    s += x[i];
    s2 += (double)x[i] * x[i];
  }
  double mean = s / n, var = s2 / n - mean * mean;
  ck_assert_double_eq_tol(mean, 0.0, 0.001);
  ck_assert_double_eq_tol(sqrt(var), 1.0, 0.002);
  mpt_dataset_free(&ds);
}
END_TEST

int main(void) {
  Suite *s = suite_create("idx");
  TCase *tc = tcase_create("idx");
  /* Unchecked: one temp folder for the whole case, removed by the parent even when a test
   * fails (a failing test exits its child before a checked teardown would run). File names
   * are distinct per content, so tests do not disturb each other. */
  tcase_add_unchecked_fixture(tc, setup, teardown);
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_idx_reads_gzipped_and_raw_files_exactly);
  tcase_add_test(tc, test_idx_reads_data_larger_than_one_chunk);
  tcase_add_test(tc, test_idx_rejects_bad_magic);
  tcase_add_test(tc, test_idx_rejects_truncated_data_naming_expected_and_got);
  tcase_add_test(tc, test_idx_rejects_truncated_header);
  tcase_add_test(tc, test_idx_rejects_trailing_garbage);
  tcase_add_test(tc, test_idx_rejects_zero_and_absurd_extents_before_allocating);
  tcase_add_test(tc, test_idx_rejects_empty_missing_directory_and_corrupt_gzip);
  tcase_add_test(tc, test_idx_refuses_a_fifo_without_waiting_for_a_writer);
  tcase_add_test(tc, test_dataset_normalises_pixels_and_copies_labels);
  tcase_add_test(tc, test_dataset_reads_four_dimensional_images_as_nchw);
  tcase_add_test(tc, test_dataset_rejects_count_mismatch_naming_both_files);
  tcase_add_test(tc, test_dataset_rejects_label_out_of_range_naming_index_and_value);
  tcase_add_test(tc, test_fashion_mnist_loader_finds_files_and_explains_missing_ones);
  tcase_add_test(tc, test_synthetic_dataset_is_seeded_and_in_range);
  tcase_add_test(tc, test_fashion_mnist_real_test_split_matches_naive_read);
  tcase_add_test(tc, test_fashion_mnist_real_train_split_has_the_documented_statistics);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
