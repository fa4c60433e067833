/* Tests for src/data/loader.c: a synthetic dataset where image i is filled with the value i and
 * has label i % 10, so every row of a batch tells which sample it holds. Batches must follow the
 * sampler's order exactly (checked against mpt_sampler_index), with the right sizes, padding
 * counts, drop_last, reshuffled epochs, the same results with and without the prefetch thread,
 * and a clean free at any point of an epoch. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/data.h"

enum { C = 1, H = 2, W = 3 };

/* n samples of [C, H, W]; image i is all i, label i % 10. */
static void make_dataset(mpt_dataset *ds, int64_t n) {
  ck_assert_int_eq(mpt_dataset_init_synthetic(ds, n, C, H, W, 10, 1), MPT_OK);
  float *x = ds->images.data;
  int32_t *y = ds->labels.data;
  for (int64_t i = 0; i < n; i++) {
    for (int j = 0; j < C * H * W; j++) x[i * C * H * W + j] = (float)i;
    y[i] = (int32_t)(i % 10);
  }
}

static mpt_sampler *make_sampler(int64_t n, int w, int rank, int shuffle, int drop_last) {
  mpt_sampler_config c = mpt_sampler_config_default();
  c.num_replicas = w;
  c.rank = rank;
  c.shuffle = shuffle;
  c.seed = 3;
  c.drop_last = drop_last;
  mpt_sampler *s = NULL;
  ck_assert_int_eq(mpt_sampler_init(&s, n, &c), MPT_OK);
  return s;
}

static mpt_loader *make_loader(const mpt_dataset *ds, mpt_sampler *s, int64_t b, int drop_last,
                               int prefetch) {
  mpt_loader_config c = mpt_loader_config_default();
  c.batch_size = b;
  c.drop_last = drop_last;
  c.prefetch = prefetch;
  mpt_loader *l = NULL;
  ck_assert_msg(mpt_loader_init(&l, ds, s, &c) == MPT_OK, "%s", mpt_last_error());
  return l;
}

/* Checks that batch k holds sampler positions [k*b, k*b + count) with the right contents. */
static void check_batch(const mpt_batch *bt, mpt_sampler *s, int64_t k, int64_t b) {
  ck_assert_int_eq(bt->index, k);
  ck_assert_int_eq(bt->epoch, mpt_sampler_epoch(s));
  ck_assert_int_eq(bt->images.ndim, 4);
  ck_assert_int_eq(bt->images.shape[0], bt->count);
  ck_assert_int_eq(bt->images.shape[1], C);
  ck_assert_int_eq(bt->images.shape[2], H);
  ck_assert_int_eq(bt->images.shape[3], W);
  ck_assert_int_eq(bt->images.dtype, MPT_F32);
  ck_assert_int_eq(bt->labels.shape[0], bt->count);
  ck_assert_int_eq(bt->labels.dtype, MPT_I32);
  const float *x = bt->images.data;
  const int32_t *y = bt->labels.data;
  int64_t real = 0;
  for (int64_t i = 0; i < bt->count; i++) {
    int64_t want = mpt_sampler_index(s, k * b + i);
    ck_assert_int_eq(bt->sample_indices[i], want);
    for (int j = 0; j < C * H * W; j++) ck_assert_float_eq(x[i * C * H * W + j], (float)want);
    ck_assert_int_eq(y[i], want % 10);
    real += !mpt_sampler_is_padding(s, k * b + i);
  }
  ck_assert_int_eq(bt->num_real, real);
  /* Padding is trailing: the first num_real rows are the real ones. */
  for (int64_t i = 0; i < bt->num_real; i++)
    ck_assert_int_eq(mpt_sampler_is_padding(s, k * b + i), 0);
}

/* Runs one epoch, checking every batch; returns the number of batches and writes their sizes
 * and real counts. */
static int64_t run_epoch(mpt_loader *l, mpt_sampler *s, int64_t b, int64_t *sizes,
                         int64_t *reals) {
  mpt_batch bt;
  int64_t k = 0;
  int rc;
  while ((rc = mpt_loader_next(l, &bt)) == MPT_OK) {
    check_batch(&bt, s, k, b);
    if (sizes) sizes[k] = bt.count;
    if (reals) reals[k] = bt.num_real;
    k++;
  }
  ck_assert_msg(rc == MPT_LOADER_END, "next returned %d: %s", rc, mpt_last_error());
  ck_assert_int_eq(mpt_loader_next(l, &bt), MPT_LOADER_END); /* stays at the end */
  ck_assert_int_eq(k, mpt_loader_num_batches(l));
  return k;
}

START_TEST(test_loader_batches_follow_sampler_order_with_a_partial_last_batch) {
  for (int prefetch = 0; prefetch < 2; prefetch++) {
    mpt_dataset ds;
    make_dataset(&ds, 10);
    mpt_sampler *s = make_sampler(10, 1, 0, 0, 0);
    mpt_loader *l = make_loader(&ds, s, 4, 0, prefetch);
    ck_assert_int_eq(mpt_loader_num_batches(l), 3);
    int64_t sizes[3], reals[3];
    ck_assert_int_eq(run_epoch(l, s, 4, sizes, reals), 3);
    ck_assert_int_eq(sizes[0], 4);
    ck_assert_int_eq(sizes[1], 4);
    ck_assert_int_eq(sizes[2], 2);
    ck_assert_int_eq(reals[2], 2);
    mpt_loader_free(l);
    mpt_sampler_free(s);
    mpt_dataset_free(&ds);
  }
}
END_TEST

START_TEST(test_loader_drop_last_skips_the_partial_batch) {
  mpt_dataset ds;
  make_dataset(&ds, 10);
  mpt_sampler *s = make_sampler(10, 1, 0, 0, 0);
  mpt_loader *l = make_loader(&ds, s, 4, 1, 1);
  ck_assert_int_eq(mpt_loader_num_batches(l), 2);
  int64_t sizes[2];
  ck_assert_int_eq(run_epoch(l, s, 4, sizes, NULL), 2);
  ck_assert_int_eq(sizes[1], 4);
  mpt_loader_free(l);
  /* A batch larger than the list: nothing with drop_last, one short batch without. */
  l = make_loader(&ds, s, 16, 1, 1);
  ck_assert_int_eq(run_epoch(l, s, 16, NULL, NULL), 0);
  mpt_loader_free(l);
  l = make_loader(&ds, s, 16, 0, 1);
  ck_assert_int_eq(run_epoch(l, s, 16, sizes, NULL), 1);
  ck_assert_int_eq(sizes[0], 10);
  mpt_loader_free(l);
  mpt_sampler_free(s);
  mpt_dataset_free(&ds);
}
END_TEST

START_TEST(test_loader_reports_padding_rows_per_batch) {
  /* F01: N = 10, W = 4. Rank 2's list is {2, 6, 0} with 0 a repeat; rank 3's {3, 7, 1}. */
  mpt_dataset ds;
  make_dataset(&ds, 10);
  for (int prefetch = 0; prefetch < 2; prefetch++) {
    mpt_sampler *s = make_sampler(10, 4, 2, 0, 0);
    mpt_loader *l = make_loader(&ds, s, 2, 0, prefetch);
    int64_t sizes[2], reals[2];
    ck_assert_int_eq(run_epoch(l, s, 2, sizes, reals), 2);
    ck_assert_int_eq(sizes[0], 2);
    ck_assert_int_eq(reals[0], 2);
    ck_assert_int_eq(sizes[1], 1);
    ck_assert_int_eq(reals[1], 0);
    mpt_loader_free(l);
    mpt_sampler_free(s);
    s = make_sampler(10, 4, 3, 0, 0);
    l = make_loader(&ds, s, 3, 0, prefetch);
    ck_assert_int_eq(run_epoch(l, s, 3, sizes, reals), 1);
    ck_assert_int_eq(sizes[0], 3);
    ck_assert_int_eq(reals[0], 2);
    mpt_loader_free(l);
    mpt_sampler_free(s);
  }
  mpt_dataset_free(&ds);
}
END_TEST

START_TEST(test_loader_real_rows_over_ranks_count_every_sample_once) {
  /* The evaluation sum over real rows is the same for W = 1, 2, 4 (and 3, 7). */
  mpt_dataset ds;
  make_dataset(&ds, 10);
  const int ws[5] = {1, 2, 3, 4, 7};
  for (int t = 0; t < 5; t++) {
    int seen[10] = {0};
    for (int r = 0; r < ws[t]; r++) {
      mpt_sampler *s = make_sampler(10, ws[t], r, 1, 0);
      mpt_loader *l = make_loader(&ds, s, 2, 0, 1);
      ck_assert_int_eq(mpt_loader_start_epoch(l, 3), MPT_OK);
      mpt_batch bt;
      while (mpt_loader_next(l, &bt) == MPT_OK)
        for (int64_t i = 0; i < bt.num_real; i++) seen[bt.sample_indices[i]]++;
      mpt_loader_free(l);
      mpt_sampler_free(s);
    }
    for (int i = 0; i < 10; i++) ck_assert_int_eq(seen[i], 1);
  }
  mpt_dataset_free(&ds);
}
END_TEST

START_TEST(test_loader_epochs_reshuffle_and_reset_repeats) {
  mpt_dataset ds;
  make_dataset(&ds, 10);
  mpt_sampler *s = make_sampler(10, 1, 0, 1, 0);
  mpt_loader *l = make_loader(&ds, s, 3, 0, 1);
  int64_t order[3][10];
  for (int64_t e = 0; e < 3; e++) {
    ck_assert_int_eq(mpt_loader_start_epoch(l, e), MPT_OK);
    ck_assert_int_eq(mpt_sampler_epoch(s), e);
    mpt_batch bt;
    int64_t n = 0;
    while (mpt_loader_next(l, &bt) == MPT_OK) {
      check_batch(&bt, s, bt.index, 3);
      for (int64_t i = 0; i < bt.count; i++) order[e][n++] = bt.sample_indices[i];
    }
    ck_assert_int_eq(n, 10);
    int seen[10] = {0};
    for (int i = 0; i < 10; i++) seen[order[e][i]]++;
    for (int i = 0; i < 10; i++) ck_assert_int_eq(seen[i], 1);
  }
  ck_assert_int_ne(memcmp(order[0], order[1], sizeof order[0]), 0);
  ck_assert_int_ne(memcmp(order[1], order[2], sizeof order[0]), 0);
  /* Reset mid-epoch restarts the same epoch in the same order. */
  mpt_batch bt;
  ck_assert_int_eq(mpt_loader_next(l, &bt), MPT_LOADER_END);
  ck_assert_int_eq(mpt_loader_start_epoch(l, 1), MPT_OK);
  ck_assert_int_eq(mpt_loader_next(l, &bt), MPT_OK);
  ck_assert_int_eq(mpt_loader_reset(l), MPT_OK);
  int64_t n = 0;
  while (mpt_loader_next(l, &bt) == MPT_OK)
    for (int64_t i = 0; i < bt.count; i++) ck_assert_int_eq(bt.sample_indices[i], order[1][n++]);
  ck_assert_int_eq(n, 10);
  ck_assert_int_eq(mpt_loader_start_epoch(l, -1), MPT_EINVAL);
  mpt_loader_free(l);
  mpt_sampler_free(s);
  mpt_dataset_free(&ds);
}
END_TEST

START_TEST(test_loader_held_batch_is_not_overwritten_by_prefetch) {
  /* Many batches of a larger dataset: while the caller checks batch k (slowly, element by
   * element, twice), the thread fills batch k + 1 into the other buffer. */
  mpt_dataset ds;
  make_dataset(&ds, 2000);
  mpt_sampler *s = make_sampler(2000, 2, 1, 1, 0);
  mpt_loader *l = make_loader(&ds, s, 7, 0, 1);
  for (int64_t e = 0; e < 3; e++) {
    ck_assert_int_eq(mpt_loader_start_epoch(l, e), MPT_OK);
    mpt_batch bt;
    int64_t k = 0;
    while (mpt_loader_next(l, &bt) == MPT_OK) {
      check_batch(&bt, s, k, 7);
      check_batch(&bt, s, k, 7);
      k++;
    }
    ck_assert_int_eq(k, (1000 + 6) / 7);
  }
  mpt_loader_free(l);
  mpt_sampler_free(s);
  mpt_dataset_free(&ds);
}
END_TEST

START_TEST(test_loader_free_mid_epoch_is_clean) {
  mpt_dataset ds;
  make_dataset(&ds, 1000);
  mpt_sampler *s = make_sampler(1000, 1, 0, 1, 0);
  /* Freed right after init (the thread may be mid-copy), after one batch, and after a
   * restart without reading. */
  for (int when = 0; when < 3; when++) {
    mpt_loader *l = make_loader(&ds, s, 10, 0, 1);
    mpt_batch bt;
    if (when >= 1) ck_assert_int_eq(mpt_loader_next(l, &bt), MPT_OK);
    if (when == 2) ck_assert_int_eq(mpt_loader_start_epoch(l, 5), MPT_OK);
    mpt_loader_free(l);
  }
  mpt_loader_free(NULL);
  /* The sampler is still usable afterwards. */
  ck_assert_int_eq(mpt_sampler_epoch(s), 5);
  mpt_loader *l = make_loader(&ds, s, 10, 0, 1);
  ck_assert_int_eq(run_epoch(l, s, 10, NULL, NULL), 100);
  mpt_loader_free(l);
  mpt_sampler_free(s);
  mpt_dataset_free(&ds);
}
END_TEST

START_TEST(test_loader_rejects_bad_configuration) {
  mpt_dataset ds;
  make_dataset(&ds, 10);
  mpt_sampler *s = make_sampler(11, 1, 0, 0, 0);
  mpt_loader *l = NULL;
  ck_assert_int_eq(mpt_loader_init(&l, &ds, s, NULL), MPT_ESHAPE);
  ck_assert_ptr_null(l);
  mpt_sampler_free(s);
  s = make_sampler(10, 1, 0, 0, 0);
  mpt_loader_config c = mpt_loader_config_default();
  ck_assert_int_eq(c.batch_size, 64);
  ck_assert_int_eq(c.prefetch, 1);
  ck_assert(c.timeout_ms > 0);
  c.batch_size = 0;
  ck_assert_int_eq(mpt_loader_init(&l, &ds, s, &c), MPT_EINVAL);
  c.batch_size = 2;
  c.timeout_ms = 0;
  ck_assert_int_eq(mpt_loader_init(&l, &ds, s, &c), MPT_EINVAL);
  ck_assert_int_eq(mpt_loader_init(&l, NULL, s, NULL), MPT_EINVAL);
  mpt_sampler_free(s);
  /* An empty dataset gives an empty epoch. */
  mpt_dataset empty;
  ck_assert_int_eq(mpt_dataset_init_synthetic(&empty, 0, C, H, W, 10, 1), MPT_OK);
  s = make_sampler(0, 1, 0, 1, 0);
  l = make_loader(&empty, s, 4, 0, 1);
  mpt_batch bt;
  ck_assert_int_eq(mpt_loader_next(l, &bt), MPT_LOADER_END);
  mpt_loader_free(l);
  mpt_sampler_free(s);
  mpt_dataset_free(&empty);
  mpt_dataset_free(&ds);
}
END_TEST

int main(void) {
  Suite *s = suite_create("loader");
  TCase *tc = tcase_create("loader");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_loader_batches_follow_sampler_order_with_a_partial_last_batch);
  tcase_add_test(tc, test_loader_drop_last_skips_the_partial_batch);
  tcase_add_test(tc, test_loader_reports_padding_rows_per_batch);
  tcase_add_test(tc, test_loader_real_rows_over_ranks_count_every_sample_once);
  tcase_add_test(tc, test_loader_epochs_reshuffle_and_reset_repeats);
  tcase_add_test(tc, test_loader_held_batch_is_not_overwritten_by_prefetch);
  tcase_add_test(tc, test_loader_free_mid_epoch_is_clean);
  tcase_add_test(tc, test_loader_rejects_bad_configuration);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
