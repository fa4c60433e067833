/* Tests for src/data/sampler.c: PyTorch DistributedSampler semantics with exact expected
 * lists (docs/faults.md F01, F02), padding flags, drop_last, W = 1, W > N, and the shuffle checked
 * against the single-replica order and for uniformity over all permutations of 5. */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/data.h"

static mpt_sampler *make(int64_t n, int w, int rank, int shuffle, uint64_t seed, int drop_last) {
  mpt_sampler_config c = mpt_sampler_config_default();
  c.num_replicas = w;
  c.rank = rank;
  c.shuffle = shuffle;
  c.seed = seed;
  c.drop_last = drop_last;
  mpt_sampler *s = NULL;
  ck_assert_msg(mpt_sampler_init(&s, n, &c) == MPT_OK, "%s", mpt_last_error());
  return s;
}

/* Checks rank's list is exactly want[0..count) and its first `real` positions are real. */
static void expect_list(mpt_sampler *s, const int64_t *want, int64_t count, int64_t real) {
  ck_assert_int_eq(mpt_sampler_num_samples(s), count);
  ck_assert_int_eq(mpt_sampler_num_real(s), real);
  int64_t got[64];
  ck_assert_int_eq(mpt_sampler_fill(s, 0, count, got), MPT_OK);
  for (int64_t i = 0; i < count; i++) {
    ck_assert_int_eq(got[i], want[i]);
    ck_assert_int_eq(mpt_sampler_index(s, i), want[i]);
    ck_assert_int_eq(mpt_sampler_is_padding(s, i), i >= real);
  }
  ck_assert_int_eq(mpt_sampler_index(s, count), -1);
  ck_assert_int_eq(mpt_sampler_is_padding(s, count), -1);
  ck_assert_int_eq(mpt_sampler_index(s, -1), -1);
}

START_TEST(test_sampler_f01_pads_by_wrapping_from_the_front) {
  const int64_t want[4][3] = {{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}};
  const int64_t real[4] = {3, 3, 2, 2};
  for (int r = 0; r < 4; r++) {
    mpt_sampler *s = make(10, 4, r, 0, 0, 0);
    expect_list(s, want[r], 3, real[r]);
    ck_assert_int_eq(mpt_sampler_total_size(s), 12);
    mpt_sampler_free(s);
  }
}
END_TEST

START_TEST(test_sampler_f01_drop_last_truncates) {
  const int64_t want[4][2] = {{0, 4}, {1, 5}, {2, 6}, {3, 7}};
  for (int r = 0; r < 4; r++) {
    mpt_sampler *s = make(10, 4, r, 0, 0, 1);
    expect_list(s, want[r], 2, 2);
    ck_assert_int_eq(mpt_sampler_total_size(s), 8);
    mpt_sampler_free(s);
  }
}
END_TEST

START_TEST(test_sampler_f01_real_positions_count_every_sample_once) {
  /* The evaluation invariant: over the ranks' real positions each sample appears exactly once,
   * for any W, with and without shuffle. */
  for (int w = 1; w <= 12; w++) {
    for (int shuffle = 0; shuffle < 2; shuffle++) {
      int seen[10] = {0};
      int64_t total_real = 0;
      for (int r = 0; r < w; r++) {
        mpt_sampler *s = make(10, w, r, shuffle, 5, 0);
        ck_assert_int_eq(mpt_sampler_num_samples(s), (10 + w - 1) / w);
        for (int64_t i = 0; i < mpt_sampler_num_real(s); i++) seen[mpt_sampler_index(s, i)]++;
        total_real += mpt_sampler_num_real(s);
        mpt_sampler_free(s);
      }
      ck_assert_int_eq(total_real, 10);
      for (int i = 0; i < 10; i++) ck_assert_int_eq(seen[i], 1);
    }
  }
}
END_TEST

/* Order of epoch `epoch` for (n, seed) as seen by a single replica. */
static void single_order(int64_t n, uint64_t seed, int64_t epoch, int64_t *out) {
  mpt_sampler *s = make(n, 1, 0, 1, seed, 0);
  ck_assert_int_eq(mpt_sampler_set_epoch(s, epoch), MPT_OK);
  ck_assert_int_eq(mpt_sampler_fill(s, 0, n, out), MPT_OK);
  mpt_sampler_free(s);
}

START_TEST(test_sampler_f02_shuffle_depends_on_seed_and_epoch_alone) {
  const int64_t n = 10;
  const int w = 4;
  int64_t order0[10], order1[10], again[10];
  single_order(n, 42, 0, order0);
  single_order(n, 42, 1, order1);
  ck_assert_int_ne(memcmp(order0, order1, sizeof order0), 0); /* epochs differ */
  for (int64_t e = 0; e < 2; e++) {
    const int64_t *order = e == 0 ? order0 : order1;
    int seen[10] = {0};
    for (int r = 0; r < w; r++) {
      /* A rank that visited other epochs first gets the same order as a fresh one. */
      mpt_sampler *s = make(n, w, r, 1, 42, 0);
      ck_assert_int_eq(mpt_sampler_set_epoch(s, 7), MPT_OK);
      ck_assert_int_eq(mpt_sampler_set_epoch(s, e), MPT_OK);
      ck_assert_int_eq(mpt_sampler_epoch(s), e);
      for (int64_t i = 0; i < 3; i++) {
        /* Rank r's position i is padded position r + i*W of the shared order. */
        ck_assert_int_eq(mpt_sampler_index(s, i), order[(r + i * w) % n]);
        if (!mpt_sampler_is_padding(s, i)) seen[mpt_sampler_index(s, i)]++;
      }
      mpt_sampler_free(s);
    }
    for (int i = 0; i < 10; i++) ck_assert_int_eq(seen[i], 1);
  }
  single_order(n, 42, 0, again);
  ck_assert_int_eq(memcmp(order0, again, sizeof order0), 0);
  single_order(n, 43, 0, again);
  ck_assert_int_ne(memcmp(order0, again, sizeof order0), 0); /* seeds differ */
}
END_TEST

START_TEST(test_sampler_shuffle_is_a_permutation_every_epoch) {
  const int64_t n = 1000;
  int64_t *order = malloc(n * sizeof *order);
  char *seen = malloc(n);
  for (int64_t e = 0; e < 5; e++) {
    single_order(n, 9, e, order);
    memset(seen, 0, n);
    int64_t fixed = 0;
    for (int64_t i = 0; i < n; i++) {
      ck_assert(order[i] >= 0 && order[i] < n);
      ck_assert_int_eq(seen[order[i]], 0);
      seen[order[i]] = 1;
      fixed += order[i] == i;
    }
    ck_assert_int_lt(fixed, 10); /* really shuffled (expected ~1 fixed point) */
  }
  free(order);
  free(seen);
}
END_TEST

START_TEST(test_sampler_shuffle_reaches_all_permutations_evenly) {
  /* 12000 epochs over N = 5: each of the 120 permutations expected 100 times. Sattolo's
   * variant or a biased swap would miss some or skew the counts. */
  int counts[5 * 5 * 5 * 5 * 5] = {0};
  mpt_sampler *s = make(5, 1, 0, 1, 2024, 0);
  for (int64_t e = 0; e < 12000; e++) {
    ck_assert_int_eq(mpt_sampler_set_epoch(s, e), MPT_OK);
    int key = 0;
    for (int i = 0; i < 5; i++) key = key * 5 + (int)mpt_sampler_index(s, i);
    counts[key]++;
  }
  mpt_sampler_free(s);
  int perms = 0;
  for (int k = 0; k < 3125; k++) {
    if (!counts[k]) continue;
    perms++;
    ck_assert_msg(counts[k] > 60 && counts[k] < 140, "permutation %d seen %d times", k,
                  counts[k]);
  }
  ck_assert_int_eq(perms, 120);
}
END_TEST

START_TEST(test_sampler_single_replica_is_sequential_or_random) {
  const int64_t want[7] = {0, 1, 2, 3, 4, 5, 6};
  mpt_sampler *s = make(7, 1, 0, 0, 0, 0);
  expect_list(s, want, 7, 7);
  mpt_sampler_free(s);
  s = make(7, 1, 0, 0, 0, 1);
  expect_list(s, want, 7, 7);
  mpt_sampler_free(s);
  /* Defaults: W = 1, shuffle on. */
  mpt_sampler_config c = mpt_sampler_config_default();
  ck_assert_int_eq(c.num_replicas, 1);
  ck_assert_int_eq(c.rank, 0);
  ck_assert_int_eq(c.shuffle, 1);
  ck_assert_int_eq(c.drop_last, 0);
  ck_assert_int_eq(mpt_sampler_init(&s, 7, NULL), MPT_OK);
  ck_assert_int_eq(mpt_sampler_num_samples(s), 7);
  ck_assert_int_eq(mpt_sampler_num_real(s), 7);
  mpt_sampler_free(s);
}
END_TEST

START_TEST(test_sampler_more_replicas_than_samples_repeats_the_list) {
  /* N = 3, W = 5: padded list [0 1 2 0 1]. */
  const int64_t want5[5] = {0, 1, 2, 0, 1};
  for (int r = 0; r < 5; r++) {
    mpt_sampler *s = make(3, 5, r, 0, 0, 0);
    expect_list(s, &want5[r], 1, r < 3 ? 1 : 0);
    mpt_sampler_free(s);
    s = make(3, 5, r, 0, 0, 1); /* drop_last: nothing for anyone */
    ck_assert_int_eq(mpt_sampler_num_samples(s), 0);
    ck_assert_int_eq(mpt_sampler_num_real(s), 0);
    ck_assert_int_eq(mpt_sampler_fill(s, 0, 0, NULL), MPT_OK);
    mpt_sampler_free(s);
  }
  /* N = 2, W = 7: the padding (5) exceeds N, the list repeats: [0 1 0 1 0 1 0]. */
  for (int r = 0; r < 7; r++) {
    mpt_sampler *s = make(2, 7, r, 0, 0, 0);
    int64_t want = r % 2;
    expect_list(s, &want, 1, r < 2 ? 1 : 0);
    mpt_sampler_free(s);
  }
  /* N = 3, W = 8, shuffled, wrapping more than once: position p holds order[p mod N]. */
  int64_t order[3];
  single_order(3, 11, 4, order);
  for (int r = 0; r < 8; r++) {
    mpt_sampler *s = make(3, 8, r, 1, 11, 0);
    ck_assert_int_eq(mpt_sampler_set_epoch(s, 4), MPT_OK);
    ck_assert_int_eq(mpt_sampler_index(s, 0), order[r % 3]);
    mpt_sampler_free(s);
  }
}
END_TEST

START_TEST(test_sampler_divisible_count_has_no_padding) {
  const int64_t want[4][3] = {{0, 4, 8}, {1, 5, 9}, {2, 6, 10}, {3, 7, 11}};
  for (int drop = 0; drop < 2; drop++) {
    for (int r = 0; r < 4; r++) {
      mpt_sampler *s = make(12, 4, r, 0, 0, drop);
      expect_list(s, want[r], 3, 3);
      ck_assert_int_eq(mpt_sampler_total_size(s), 12);
      mpt_sampler_free(s);
    }
  }
}
END_TEST

START_TEST(test_sampler_fill_of_a_subrange_matches_index) {
  mpt_sampler *s = make(101, 3, 2, 1, 77, 0);
  ck_assert_int_eq(mpt_sampler_num_samples(s), 34);
  ck_assert_int_eq(mpt_sampler_num_real(s), 33); /* positions 2 + 3i < 101: i <= 32 */
  int64_t got[10];
  ck_assert_int_eq(mpt_sampler_fill(s, 24, 10, got), MPT_OK);
  for (int i = 0; i < 10; i++) ck_assert_int_eq(got[i], mpt_sampler_index(s, 24 + i));
  ck_assert_int_eq(mpt_sampler_fill(s, 25, 10, got), MPT_EINVAL);
  ck_assert_int_eq(mpt_sampler_fill(s, -1, 1, got), MPT_EINVAL);
  mpt_sampler_free(s);
}
END_TEST

START_TEST(test_sampler_rejects_bad_configuration) {
  mpt_sampler_config c = mpt_sampler_config_default();
  mpt_sampler *s = (mpt_sampler *)&c; /* must be reset to NULL on failure */
  c.num_replicas = 4;
  c.rank = 4;
  ck_assert_int_eq(mpt_sampler_init(&s, 10, &c), MPT_EINVAL);
  ck_assert_ptr_null(s);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "rank 4"));
  c.rank = -1;
  ck_assert_int_eq(mpt_sampler_init(&s, 10, &c), MPT_EINVAL);
  c.rank = 0;
  c.num_replicas = 0;
  ck_assert_int_eq(mpt_sampler_init(&s, 10, &c), MPT_EINVAL);
  c.num_replicas = 1;
  ck_assert_int_eq(mpt_sampler_init(&s, -3, &c), MPT_EINVAL);
  ck_assert_int_eq(mpt_sampler_init(&s, 0, &c), MPT_OK); /* an empty dataset is fine */
  ck_assert_int_eq(mpt_sampler_num_samples(s), 0);
  ck_assert_int_eq(mpt_sampler_set_epoch(s, -1), MPT_EINVAL);
  ck_assert_int_eq(mpt_sampler_set_epoch(s, 3), MPT_OK);
  mpt_sampler_free(s);
  mpt_sampler_free(NULL);
}
END_TEST

int main(void) {
  Suite *s = suite_create("sampler");
  TCase *tc = tcase_create("sampler");
  tcase_add_test(tc, test_sampler_f01_pads_by_wrapping_from_the_front);
  tcase_add_test(tc, test_sampler_f01_drop_last_truncates);
  tcase_add_test(tc, test_sampler_f01_real_positions_count_every_sample_once);
  tcase_add_test(tc, test_sampler_f02_shuffle_depends_on_seed_and_epoch_alone);
  tcase_add_test(tc, test_sampler_shuffle_is_a_permutation_every_epoch);
  tcase_add_test(tc, test_sampler_shuffle_reaches_all_permutations_evenly);
  tcase_add_test(tc, test_sampler_single_replica_is_sequential_or_random);
  tcase_add_test(tc, test_sampler_more_replicas_than_samples_repeats_the_list);
  tcase_add_test(tc, test_sampler_divisible_count_has_no_padding);
  tcase_add_test(tc, test_sampler_fill_of_a_subrange_matches_index);
  tcase_add_test(tc, test_sampler_rejects_bad_configuration);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
