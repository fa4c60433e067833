/* Tests of the DDP engine's per-pass statistics (src/ddp/ddp_stats.c) with fake timings, as the
 * engine gathers them once they exist (CUDA events on the comm and compute streams read after
 * the pass's synchronisation, or host stamps after the host's wait). The defect they guard
 * against: on a GPU the statistics were read right after finalize ENQUEUED its wait, so an
 * all-reduce that had started but not ended added (0 - start) ~ -1e9 ms and "% hidden" read 0.
 * Such a pass must never be counted. All values are exact in binary floating point. */
#include <check.h>
#include <math.h>
#include <string.h>

#include "ddp/ddp_stats.h"

/* Two buckets overlapping backward (ends at 4 ms): [1, 3] fully hidden, [2, 6] hidden for 2 of
 * its 4 ms; the compute stream is past the last bucket at 6.5 ms. */
START_TEST(test_ddp_stats_overlap_from_event_times) {
  mpt_ddp_stats x;
  memset(&x, 0, sizeof x);
  const double s[2] = {1, 2}, e[2] = {3, 6};
  ck_assert_int_eq(mpt__ddp_stats_add(&x, 2, s, e, 4, 6.5), MPT_OK);
  ck_assert_double_eq(x.backward_ms, 4);
  ck_assert_double_eq(x.allreduce_ms, 6);
  ck_assert_double_eq(x.hidden_ms, 4);
  ck_assert_double_eq(x.exposed_comm_ms, 2.5);
  ck_assert_int_eq(x.steps, 1);
  const double s2[2] = {0.5, 5}, e2[2] = {1.5, 7.25};
  ck_assert_int_eq(mpt__ddp_stats_add(&x, 2, s2, e2, 5, 7.5), MPT_OK);
  ck_assert_double_eq(x.hidden_ms, 1);
  ck_assert_double_eq(x.exposed_comm_ms, 2.5);
  ck_assert_int_eq(x.steps, 2);
  ck_assert_double_eq(x.sum_backward_ms, 9);
  ck_assert_double_eq(x.sum_allreduce_ms, 6 + 3.25);
  ck_assert_double_eq(x.sum_hidden_ms, 5);
  ck_assert_double_eq(x.sum_exposed_comm_ms, 5);
}
END_TEST

/* mpt_ddp_allreduce_grads: no backward; everything is exposed. */
START_TEST(test_ddp_stats_pass_without_backward_is_all_exposed) {
  mpt_ddp_stats x;
  memset(&x, 0, sizeof x);
  const double s[3] = {0.25, 1, 2}, e[3] = {1, 2, 3.5};
  ck_assert_int_eq(mpt__ddp_stats_add(&x, 3, s, e, 0, 3.75), MPT_OK);
  ck_assert_double_eq(x.backward_ms, 0);
  ck_assert_double_eq(x.hidden_ms, 0);
  ck_assert_double_eq(x.allreduce_ms, 3.25);
  ck_assert_double_eq(x.exposed_comm_ms, 3.75);
  /* Comm all done before backward ended: nothing exposed, never negative. */
  const double s1[1] = {1}, e1[1] = {2};
  ck_assert_int_eq(mpt__ddp_stats_add(&x, 1, s1, e1, 8, 7.5), MPT_OK);
  ck_assert_double_eq(x.exposed_comm_ms, 0);
  ck_assert_double_eq(x.hidden_ms, 1);
}
END_TEST

/* What the old code read on a GPU: bucket 1 started (host clock ~ 1e9 ms since boot, here
 * relative: its end stamp still 0, i.e. -start) or not started at all. Refused, stats kept. */
START_TEST(test_ddp_stats_refuses_a_bucket_that_has_not_finished) {
  mpt_ddp_stats x;
  memset(&x, 0, sizeof x);
  const double s0[1] = {1}, e0[1] = {2};
  ck_assert_int_eq(mpt__ddp_stats_add(&x, 1, s0, e0, 3, 3), MPT_OK);
  const mpt_ddp_stats before = x;
  const double s[2] = {1, 2}, e[2] = {3, -1e9};
  ck_assert_int_eq(mpt__ddp_stats_add(&x, 2, s, e, 4, 4.5), MPT_EINVAL);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "bucket 1"));
  ck_assert_mem_eq(&x, &before, sizeof x);
  const double sn[1] = {NAN}, en[1] = {1};
  ck_assert_int_eq(mpt__ddp_stats_add(&x, 1, sn, en, 4, 4.5), MPT_EINVAL);
  ck_assert_int_eq(mpt__ddp_stats_add(&x, 1, s0, e0, INFINITY, 4.5), MPT_EINVAL);
  ck_assert_int_eq(mpt__ddp_stats_add(&x, 1, s0, e0, 4, -1), MPT_EINVAL);
  ck_assert_int_eq(mpt__ddp_stats_add(NULL, 1, s0, e0, 4, 5), MPT_EINVAL);
  ck_assert_mem_eq(&x, &before, sizeof x);
}
END_TEST

int main(void) {
  Suite *su = suite_create("ddp_stats");
  TCase *tc = tcase_create("ddp_stats");
  tcase_add_test(tc, test_ddp_stats_overlap_from_event_times);
  tcase_add_test(tc, test_ddp_stats_pass_without_backward_is_all_exposed);
  tcase_add_test(tc, test_ddp_stats_refuses_a_bucket_that_has_not_finished);
  suite_add_tcase(su, tc);
  SRunner *sr = srunner_create(su);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
