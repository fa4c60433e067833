/* Tests for src/data/source.c and the loader over a data source: a dataset given as callbacks
 * yields byte for byte the batches of the equivalent in-memory dataset (every rank, shuffled
 * epochs, with and without prefetch); the sampler's sharding and padding (docs/faults.md F01) hold
 * through it; inputs of another dtype and several labels per sample come out with the declared
 * shapes; a failing callback stops the loader exactly at the batch holding the sample, with its
 * status and detail, earlier batches intact; bad descriptions are refused, free_user runs once. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpitrain/data.h"

enum { C = 2, H = 3, W = 4, SAMPLE = C * H * W };

/* The user's data: its own copy of the images and labels, and a failure to inject. */
typedef struct user_data {
  float *x;       /* [n, C, H, W] */
  int32_t *y;     /* [n] */
  int64_t fail_at; /* sample whose read fails, -1 none */
  int fail_ret;    /* what the failing read returns */
  int frees;       /* free_user calls */
} user_data;

static mpt_status user_read(void *user, int64_t i, void *input, int32_t *label) {
  user_data *u = user;
  if (i == u->fail_at) {
    if (u->fail_ret > 0) return (mpt_status)u->fail_ret;
    return mpt_error_set((mpt_status)u->fail_ret, "disk of sample %lld is gone", (long long)i);
  }
  memcpy(input, u->x + i * SAMPLE, SAMPLE * sizeof(float));
  *label = u->y[i];
  return MPT_OK;
}

static void user_free(void *user) { ((user_data *)user)->frees++; }

/* A random in-memory dataset of n samples and the same data behind callbacks. */
static mpt_data_source *make_pair(mpt_dataset *ds, user_data *u, int64_t n) {
  ck_assert_int_eq(mpt_dataset_init_synthetic(ds, n, C, H, W, 10, 42), MPT_OK);
  memset(u, 0, sizeof *u);
  u->x = ds->images.data; /* the same bytes, read through the callback */
  u->y = ds->labels.data;
  u->fail_at = -1;
  mpt_data_source_desc d = mpt_data_source_desc_default();
  d.count = n;
  d.input_ndim = 3;
  d.input_shape[0] = C;
  d.input_shape[1] = H;
  d.input_shape[2] = W;
  d.num_classes = 10;
  d.read = user_read;
  d.free_user = user_free;
  d.user = u;
  mpt_data_source *src = NULL;
  ck_assert_msg(mpt_data_source_init(&src, &d) == MPT_OK, "%s", mpt_last_error());
  return src;
}

static mpt_sampler *make_sampler(int64_t n, int w, int rank, int shuffle) {
  mpt_sampler_config c = mpt_sampler_config_default();
  c.num_replicas = w;
  c.rank = rank;
  c.shuffle = shuffle;
  c.seed = 7;
  mpt_sampler *s = NULL;
  ck_assert_int_eq(mpt_sampler_init(&s, n, &c), MPT_OK);
  return s;
}

static mpt_loader_config loader_config(int64_t b, int prefetch) {
  mpt_loader_config c = mpt_loader_config_default();
  c.batch_size = b;
  c.prefetch = prefetch;
  c.timeout_ms = 10000;
  return c;
}

START_TEST(test_source_batches_equal_the_in_memory_dataset) {
  const int64_t n = 23, b = 4;
  for (int w = 1; w <= 3; w++)
    for (int rank = 0; rank < w; rank++)
      for (int prefetch = 0; prefetch < 2; prefetch++) {
        mpt_dataset ds;
        user_data u;
        mpt_data_source *src = make_pair(&ds, &u, n);
        mpt_sampler *s1 = make_sampler(n, w, rank, 1), *s2 = make_sampler(n, w, rank, 1);
        mpt_loader_config c = loader_config(b, prefetch);
        mpt_loader *l1 = NULL, *l2 = NULL;
        ck_assert_int_eq(mpt_loader_init(&l1, &ds, s1, &c), MPT_OK);
        ck_assert_msg(mpt_loader_init_source(&l2, src, s2, &c) == MPT_OK, "%s", mpt_last_error());
        ck_assert_int_eq(mpt_loader_num_batches(l1), mpt_loader_num_batches(l2));
        for (int64_t epoch = 0; epoch < 2; epoch++) {
          ck_assert_int_eq(mpt_loader_start_epoch(l1, epoch), MPT_OK);
          ck_assert_int_eq(mpt_loader_start_epoch(l2, epoch), MPT_OK);
          mpt_batch a, bb;
          int r1, r2, k = 0;
          while ((r1 = mpt_loader_next(l1, &a)) == MPT_OK) {
            r2 = mpt_loader_next(l2, &bb);
            ck_assert_msg(r2 == MPT_OK, "batch %d: %d %s", k, r2, mpt_last_error());
            ck_assert_int_eq(a.count, bb.count);
            ck_assert_int_eq(a.num_real, bb.num_real);
            ck_assert_int_eq(a.index, bb.index);
            ck_assert_int_eq(a.epoch, bb.epoch);
            ck_assert_int_eq(bb.images.ndim, 4);
            for (int d = 0; d < 4; d++) ck_assert_int_eq(a.images.shape[d], bb.images.shape[d]);
            ck_assert_int_eq(bb.images.dtype, MPT_F32);
            ck_assert_int_eq(bb.labels.ndim, 1);
            ck_assert_int_eq(bb.labels.shape[0], bb.count);
            ck_assert_mem_eq(a.sample_indices, bb.sample_indices,
                             (size_t)a.count * sizeof(int64_t));
            ck_assert_mem_eq(a.images.data, bb.images.data,
                             (size_t)a.count * SAMPLE * sizeof(float));
            ck_assert_mem_eq(a.labels.data, bb.labels.data, (size_t)a.count * sizeof(int32_t));
            k++;
          }
          ck_assert_int_eq(r1, MPT_LOADER_END);
          ck_assert_int_eq(mpt_loader_next(l2, &bb), MPT_LOADER_END);
          ck_assert_int_eq(k, mpt_loader_num_batches(l1));
        }
        mpt_loader_free(l1);
        mpt_loader_free(l2);
        mpt_sampler_free(s1);
        mpt_sampler_free(s2);
        ck_assert_int_eq(u.frees, 0); /* the loader borrows the source */
        mpt_data_source_free(src);
        ck_assert_int_eq(u.frees, 1);
        mpt_dataset_free(&ds);
      }
}
END_TEST

/* Sample i: tokens {i, i+1, ..., i+4} (I32 [5]) and labels {i % 3, 2} ([2]). */
static mpt_status token_read(void *user, int64_t i, void *input, int32_t *label) {
  (void)user;
  int32_t *t = input;
  for (int j = 0; j < 5; j++) t[j] = (int32_t)i + j;
  label[0] = (int32_t)(i % 3);
  label[1] = 2;
  return MPT_OK;
}

START_TEST(test_source_sharding_and_padding_hold_f01) {
  /* docs/faults.md F01: N = 10, W = 4, no shuffle: r0 {0,4,8} r1 {1,5,9} r2 {2,6,0} r3 {3,7,1}. */
  static const int64_t want[4][3] = {{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}};
  static const int64_t want_real[4] = {3, 3, 2, 2};
  mpt_data_source_desc d = mpt_data_source_desc_default();
  d.count = 10;
  d.input_dtype = MPT_I32;
  d.input_ndim = 1;
  d.input_shape[0] = 5;
  d.label_count = 2;
  d.num_classes = 3;
  d.read = token_read;
  mpt_data_source *src = NULL;
  ck_assert_int_eq(mpt_data_source_init(&src, &d), MPT_OK);
  ck_assert_int_eq(mpt_data_source_input_nbytes(src), 5 * 4);
  int64_t real_total = 0;
  for (int prefetch = 0; prefetch < 2; prefetch++)
    for (int r = 0; r < 4; r++) {
      mpt_sampler *s = make_sampler(10, 4, r, 0);
      mpt_loader_config c = loader_config(2, prefetch);
      mpt_loader *l = NULL;
      ck_assert_int_eq(mpt_loader_init_source(&l, src, s, &c), MPT_OK);
      ck_assert_int_eq(mpt_loader_num_batches(l), 2);
      mpt_batch bt;
      int64_t pos = 0, real = 0;
      while (mpt_loader_next(l, &bt) == MPT_OK) {
        ck_assert_int_eq(bt.images.dtype, MPT_I32);
        ck_assert_int_eq(bt.images.ndim, 2);
        ck_assert_int_eq(bt.images.shape[1], 5);
        ck_assert_int_eq(bt.labels.ndim, 2);
        ck_assert_int_eq(bt.labels.shape[0], bt.count);
        ck_assert_int_eq(bt.labels.shape[1], 2);
        const int32_t *t = bt.images.data, *y = bt.labels.data;
        for (int64_t i = 0; i < bt.count; i++, pos++) {
          int64_t idx = want[r][pos];
          ck_assert_int_eq(bt.sample_indices[i], idx);
          for (int j = 0; j < 5; j++) ck_assert_int_eq(t[i * 5 + j], idx + j);
          ck_assert_int_eq(y[2 * i], idx % 3);
          ck_assert_int_eq(y[2 * i + 1], 2);
        }
        real += bt.num_real;
      }
      ck_assert_int_eq(pos, 3);
      ck_assert_int_eq(real, want_real[r]);
      if (prefetch) real_total += real;
      mpt_loader_free(l);
      mpt_sampler_free(s);
    }
  ck_assert_int_eq(real_total, 10); /* every sample counted once over the ranks */
  mpt_data_source_free(src);
}
END_TEST

START_TEST(test_source_failing_callback_errors_at_its_batch) {
  /* N = 20, batch 4, no shuffle: sample 13 is in batch 3 (rows 12..15), sample 5 in batch 1. */
  const struct {
    int64_t fail_at, batch;
    int ret;
    mpt_status want;
  } cases[] = {{13, 3, MPT_EIO, MPT_EIO}, {5, 1, MPT_ENOENT, MPT_ENOENT}, {5, 1, 7, MPT_EIO}};
  for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
    for (int prefetch = 0; prefetch < 2; prefetch++) {
      mpt_dataset ds;
      user_data u;
      mpt_data_source *src = make_pair(&ds, &u, 20);
      u.fail_at = cases[ci].fail_at;
      u.fail_ret = cases[ci].ret;
      mpt_sampler *s = make_sampler(20, 1, 0, 0);
      mpt_loader_config c = loader_config(4, prefetch);
      mpt_loader *l = NULL;
      ck_assert_int_eq(mpt_loader_init_source(&l, src, s, &c), MPT_OK);
      /* Let the prefetch thread run ahead into the failing batch before the first next. */
      usleep(100 * 1000);
      mpt_batch bt;
      for (int64_t k = 0; k < cases[ci].batch; k++) {
        int r = mpt_loader_next(l, &bt);
        ck_assert_msg(r == MPT_OK, "case %zu prefetch %d batch %lld: %d %s", ci, prefetch,
                      (long long)k, r, mpt_last_error());
        ck_assert_int_eq(bt.index, k);
        ck_assert_int_eq(bt.sample_indices[0], 4 * k);
        ck_assert_mem_eq(bt.images.data, u.x + 4 * k * SAMPLE, 4 * SAMPLE * sizeof(float));
      }
      int r = mpt_loader_next(l, &bt);
      ck_assert_int_eq(r, cases[ci].want);
      char where[64];
      snprintf(where, sizeof where, "batch %lld of epoch 0", (long long)cases[ci].batch);
      ck_assert_msg(strstr(mpt_last_error(), where), "%s", mpt_last_error());
      snprintf(where, sizeof where, "sample %lld", (long long)cases[ci].fail_at);
      ck_assert_msg(strstr(mpt_last_error(), where), "%s", mpt_last_error());
      if (cases[ci].ret < 0)
        ck_assert_msg(strstr(mpt_last_error(), "disk of sample"), "%s", mpt_last_error());
      else
        ck_assert_msg(strstr(mpt_last_error(), "returned 7"), "%s", mpt_last_error());
      /* Sticky: the next call, a new epoch and a reset all report it. */
      ck_assert_int_eq(mpt_loader_next(l, &bt), cases[ci].want);
      ck_assert_int_eq(mpt_loader_start_epoch(l, 1), cases[ci].want);
      ck_assert_int_eq(mpt_loader_reset(l), cases[ci].want);
      mpt_loader_free(l);
      mpt_sampler_free(s);
      mpt_data_source_free(src);
      mpt_dataset_free(&ds);
    }
}
END_TEST

static mpt_status bad_label_read(void *user, int64_t i, void *input, int32_t *label) {
  (void)user;
  ((float *)input)[0] = (float)i;
  *label = i == 6 ? 10 : 1;
  return MPT_OK;
}

START_TEST(test_source_label_out_of_range_is_an_error_naming_the_sample) {
  mpt_data_source_desc d = mpt_data_source_desc_default();
  d.count = 8;
  d.input_ndim = 1;
  d.input_shape[0] = 1;
  d.num_classes = 10;
  d.read = bad_label_read;
  mpt_data_source *src = NULL;
  ck_assert_int_eq(mpt_data_source_init(&src, &d), MPT_OK);
  float x;
  int32_t y;
  ck_assert_int_eq(mpt_data_source_read(src, 5, &x, &y), MPT_OK);
  ck_assert_float_eq(x, 5.0f);
  ck_assert_int_eq(mpt_data_source_read(src, 6, &x, &y), MPT_EFORMAT);
  ck_assert_msg(strstr(mpt_last_error(), "sample 6: label 0 is 10"), "%s", mpt_last_error());
  ck_assert_int_eq(mpt_data_source_read(src, 8, &x, &y), MPT_EINVAL);
  ck_assert_int_eq(mpt_data_source_read(src, -1, &x, &y), MPT_EINVAL);
  mpt_sampler *s = make_sampler(8, 1, 0, 0);
  mpt_loader_config c = loader_config(4, 1);
  mpt_loader *l = NULL;
  ck_assert_int_eq(mpt_loader_init_source(&l, src, s, &c), MPT_OK);
  mpt_batch bt;
  ck_assert_int_eq(mpt_loader_next(l, &bt), MPT_OK);
  ck_assert_int_eq(mpt_loader_next(l, &bt), MPT_EFORMAT);
  ck_assert_msg(strstr(mpt_last_error(), "batch 1"), "%s", mpt_last_error());
  mpt_loader_free(l);
  mpt_sampler_free(s);
  mpt_data_source_free(src);
}
END_TEST

START_TEST(test_source_rejects_bad_descriptions_and_frees_user_once) {
  user_data u;
  memset(&u, 0, sizeof u);
  mpt_data_source_desc good = mpt_data_source_desc_default();
  ck_assert_int_eq(good.label_count, 1);
  ck_assert_int_eq(good.input_dtype, MPT_F32);
  good.count = 4;
  good.input_ndim = 2;
  good.input_shape[0] = 2;
  good.input_shape[1] = 3;
  good.read = user_read;
  good.free_user = user_free;
  good.user = &u;
  mpt_data_source *src = (mpt_data_source *)&u; /* must be set to NULL on failure */
  mpt_data_source_desc d;
  int expected_frees = 0;
#define BAD(field_change)                                              \
  do {                                                                 \
    d = good;                                                          \
    field_change;                                                      \
    ck_assert_int_eq(mpt_data_source_init(&src, &d), MPT_EINVAL);      \
    ck_assert_ptr_null(src);                                           \
    ck_assert_int_eq(u.frees, ++expected_frees);                       \
  } while (0)
  BAD(d.read = NULL);
  BAD(d.count = -1);
  BAD(d.input_ndim = 0);
  BAD(d.input_ndim = MPT_DATA_MAX_DIMS + 1);
  BAD(d.input_shape[1] = 0);
  BAD(d.label_count = 0);
  BAD(d.num_classes = -2);
  BAD(d.input_dtype = (mpt_dtype)9);
  BAD(d.input_shape[0] = (int64_t)1 << 40);
#undef BAD
  ck_assert_int_eq(mpt_data_source_init(&src, &good), MPT_OK);
  ck_assert_int_eq(mpt_data_source_get_desc(src)->count, 4);
  ck_assert_int_eq(mpt_data_source_input_nbytes(src), 6 * 4);
  /* A sampler of another size is refused by the loader. */
  mpt_sampler *s = make_sampler(5, 1, 0, 0);
  mpt_loader *l = NULL;
  ck_assert_int_eq(mpt_loader_init_source(&l, src, s, NULL), MPT_ESHAPE);
  ck_assert_ptr_null(l);
  ck_assert_int_eq(mpt_loader_init_source(&l, NULL, s, NULL), MPT_EINVAL);
  mpt_sampler_free(s);
  mpt_data_source_free(src);
  ck_assert_int_eq(u.frees, expected_frees + 1);
  mpt_data_source_free(NULL);
}
END_TEST

static mpt_status slow_read(void *user, int64_t i, void *input, int32_t *label) {
  (void)user;
  if (i == 2) usleep(800 * 1000);
  ((float *)input)[0] = (float)i;
  *label = 0;
  return MPT_OK;
}

START_TEST(test_source_callback_slower_than_the_deadline_times_out) {
  /* Batch 1 (samples 2, 3) takes 500 ms to read; the loader waits 100 ms: MPT_ETIMEOUT naming
   * the batch, never a hang; free then waits for the read to finish. */
  mpt_data_source_desc d = mpt_data_source_desc_default();
  d.count = 4;
  d.input_ndim = 1;
  d.input_shape[0] = 1;
  d.read = slow_read;
  mpt_data_source *src = NULL;
  ck_assert_int_eq(mpt_data_source_init(&src, &d), MPT_OK);
  mpt_sampler *s = make_sampler(4, 1, 0, 0);
  mpt_loader_config c = loader_config(2, 1);
  c.timeout_ms = 100;
  mpt_loader *l = NULL;
  ck_assert_int_eq(mpt_loader_init_source(&l, src, s, &c), MPT_OK);
  mpt_batch bt;
  usleep(50 * 1000);
  ck_assert_int_eq(mpt_loader_next(l, &bt), MPT_OK);
  double t0 = mpt_time_ms();
  ck_assert_int_eq(mpt_loader_next(l, &bt), MPT_ETIMEOUT);
  double waited = mpt_time_ms() - t0;
  ck_assert_msg(waited >= 90 && waited < 700, "waited %.0f ms", waited);
  ck_assert_msg(strstr(mpt_last_error(), "batch 1 of epoch 0"), "%s", mpt_last_error());
  mpt_loader_free(l);
  mpt_sampler_free(s);
  mpt_data_source_free(src);
}
END_TEST

int main(void) {
  Suite *s = suite_create("source");
  TCase *tc = tcase_create("source");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_source_batches_equal_the_in_memory_dataset);
  tcase_add_test(tc, test_source_sharding_and_padding_hold_f01);
  tcase_add_test(tc, test_source_failing_callback_errors_at_its_batch);
  tcase_add_test(tc, test_source_label_out_of_range_is_an_error_naming_the_sample);
  tcase_add_test(tc, test_source_rejects_bad_descriptions_and_frees_user_once);
  tcase_add_test(tc, test_source_callback_slower_than_the_deadline_times_out);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
