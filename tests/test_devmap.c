/* Tests of the pure parts of device binding (src/comm/devmap.c; docs/faults.md F11, F12) with fake
 * device lists: the pick by local rank (never a modulo), and the check of gathered (host,
 * device) claims (missing devices, two ranks on one device of one host), with the values of the
 * fault cases: 4 local ranks and 2 visible devices make local ranks 2 and 3 fail naming the
 * local rank and "2 visible". No MPI: the collective parts are in tests/test_devmap_mpi.c. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/comm.h"

#define HAS(text, needle) \
  ck_assert_msg(strstr((text), (needle)) != NULL, "'%s' lacks '%s'", (text), (needle))
#define LACKS(text, needle) \
  ck_assert_msg(strstr((text), (needle)) == NULL, "'%s' has '%s'", (text), (needle))

START_TEST(test_pick_is_the_local_rank) {
  for (int lr = 0; lr < 4; lr++) {
    int idx = -7;
    ck_assert_int_eq(mpt_device_pick(lr, 4, 4, &idx), MPT_OK);
    ck_assert_int_eq(idx, lr);
  }
  int idx = -7;
  ck_assert_int_eq(mpt_device_pick(1, 2, 8, &idx), MPT_OK); /* more devices than ranks: fine */
  ck_assert_int_eq(idx, 1);
}
END_TEST

/* F12: 4 local ranks, 2 visible devices. */
START_TEST(test_pick_beyond_visible_devices_fails_naming_both_numbers) {
  int idx = -7;
  ck_assert_int_eq(mpt_device_pick(0, 4, 2, &idx), MPT_OK);
  ck_assert_int_eq(idx, 0);
  ck_assert_int_eq(mpt_device_pick(1, 4, 2, &idx), MPT_OK);
  ck_assert_int_eq(idx, 1);
  for (int lr = 2; lr < 4; lr++) {
    idx = 5;
    ck_assert_int_eq(mpt_device_pick(lr, 4, 2, &idx), MPT_EINVAL);
    ck_assert_int_eq(idx, -1); /* never lr % 2 */
    char want[32];
    snprintf(want, sizeof want, "local rank %d", lr);
    HAS(mpt_last_error(), want);
    HAS(mpt_last_error(), "2 visible");
  }
  ck_assert_int_eq(mpt_device_pick(0, 1, 0, &idx), MPT_EINVAL); /* no device at all */
  HAS(mpt_last_error(), "0 visible");
}
END_TEST

START_TEST(test_pick_rejects_arguments_out_of_range) {
  int idx;
  ck_assert_int_eq(mpt_device_pick(-1, 4, 4, &idx), MPT_EINVAL);
  ck_assert_int_eq(mpt_device_pick(4, 4, 8, &idx), MPT_EINVAL); /* local rank >= local size */
  ck_assert_int_eq(mpt_device_pick(0, 0, 8, &idx), MPT_EINVAL);
  ck_assert_int_eq(mpt_device_pick(0, 1, -1, &idx), MPT_EINVAL);
  ck_assert_int_eq(mpt_device_pick(0, 1, 1, NULL), MPT_EINVAL);
}
END_TEST

/* Claims of `n` ranks, `per_host` per host ("node0", "node1", ...), each on device `dev[r]`. */
static mpt_device_claim *claims_make(int n, int per_host, const int *dev, int visible) {
  mpt_device_claim *c = calloc((size_t)n, sizeof *c);
  ck_assert_ptr_nonnull(c);
  for (int r = 0; r < n; r++) {
    char host[32];
    snprintf(host, sizeof host, "node%d", r / per_host);
    mpt_device_claim_fill(&c[r], r, r % per_host, per_host, MPT_DEVICE_CUDA, dev[r], visible,
                          host);
  }
  return c;
}

START_TEST(test_claim_fill_records_every_field) {
  mpt_device_claim c;
  memset(&c, 0xff, sizeof c);
  mpt_device_claim_fill(&c, 5, 1, 4, MPT_DEVICE_CUDA, 1, 2, "gpu-node-3");
  ck_assert_int_eq(c.rank, 5);
  ck_assert_int_eq(c.local_rank, 1);
  ck_assert_int_eq(c.local_size, 4);
  ck_assert_int_eq(c.index, 1);
  ck_assert_int_eq(c.visible_count, 2);
  ck_assert_int_eq(c.type, MPT_DEVICE_CUDA);
  ck_assert_str_eq(c.host, "gpu-node-3");
  /* FNV-1a 64 of "a" is 0xaf63dc4c8601ec8c (the published test vector). */
  mpt_device_claim_fill(&c, 0, 0, 1, MPT_DEVICE_CUDA, 0, 1, "a");
  ck_assert_uint_eq(c.host_hash, 0xaf63dc4c8601ec8cULL);
  char longname[200];
  memset(longname, 'h', sizeof longname - 1);
  longname[sizeof longname - 1] = '\0';
  mpt_device_claim_fill(&c, 0, 0, 1, MPT_DEVICE_CUDA, 0, 1, longname);
  ck_assert_uint_eq(strlen(c.host), sizeof c.host - 1); /* truncated, terminated */
}
END_TEST

START_TEST(test_claims_on_distinct_devices_pass) {
  const int dev[8] = {0, 1, 2, 3, 0, 1, 2, 3}; /* two hosts, the same indices on each */
  mpt_device_claim *c = claims_make(8, 4, dev, 4);
  ck_assert_int_eq(mpt_device_claims_check(c, 8), MPT_OK);
  ck_assert_int_eq(mpt_device_claims_check(c, 0), MPT_OK);
  ck_assert_int_eq(mpt_device_claims_check(NULL, 1), MPT_EINVAL);
  ck_assert_int_eq(mpt_device_claims_check(c, -1), MPT_EINVAL);
  free(c);
}
END_TEST

/* F11: two ranks of one host on one device: both ranks, the device and the host are named. */
START_TEST(test_two_ranks_on_one_device_of_one_host_are_named) {
  const int dev[8] = {0, 1, 2, 3, 0, 1, 1, 3}; /* ranks 5 and 6 share cuda:1 on node1 */
  mpt_device_claim *c = claims_make(8, 4, dev, 4);
  ck_assert_int_eq(mpt_device_claims_check(c, 8), MPT_EMISMATCH);
  const char *e = mpt_last_error();
  HAS(e, "ranks 5 and 6");
  HAS(e, "cuda:1");
  HAS(e, "host node1");
  LACKS(e, "node0");
  free(c);
}
END_TEST

START_TEST(test_every_duplicate_pair_is_listed_lowest_first) {
  const int dev[3] = {0, 0, 0};
  mpt_device_claim *c = claims_make(3, 3, dev, 1);
  ck_assert_int_eq(mpt_device_claims_check(c, 3), MPT_EMISMATCH);
  const char *e = mpt_last_error();
  const char *p01 = strstr(e, "ranks 0 and 1"), *p02 = strstr(e, "ranks 0 and 2"),
             *p12 = strstr(e, "ranks 1 and 2");
  ck_assert_msg(p01 && p02 && p12 && p01 < p02 && p02 < p12, "'%s'", e);
  free(c);
}
END_TEST

/* Same device index on two hosts whose names agree in the first 63 characters: different
 * hosts (the hash covers the whole name). */
START_TEST(test_host_identity_uses_the_whole_name) {
  char a[100], b[100];
  memset(a, 'x', 80);
  memcpy(b, a, 80);
  a[80] = 'A';
  b[80] = 'B';
  a[81] = b[81] = '\0';
  mpt_device_claim c[2];
  mpt_device_claim_fill(&c[0], 0, 0, 1, MPT_DEVICE_CUDA, 0, 1, a);
  mpt_device_claim_fill(&c[1], 1, 0, 1, MPT_DEVICE_CUDA, 0, 1, b);
  ck_assert_str_eq(c[0].host, c[1].host);
  ck_assert_int_eq(mpt_device_claims_check(c, 2), MPT_OK);
  mpt_device_claim_fill(&c[1], 1, 0, 1, MPT_DEVICE_CUDA, 0, 1, a);
  ck_assert_int_eq(mpt_device_claims_check(c, 2), MPT_EMISMATCH);
}
END_TEST

/* F12 across ranks: 4 local ranks, 2 visible devices; ranks 2 and 3 have no device. */
START_TEST(test_ranks_without_a_device_are_all_named) {
  const int dev[4] = {0, 1, -1, -1};
  mpt_device_claim *c = claims_make(4, 4, dev, 2);
  ck_assert_int_eq(mpt_device_claims_check(c, 4), MPT_EINVAL);
  char first[1024];
  snprintf(first, sizeof first, "%s", mpt_last_error());
  HAS(first, "local rank 2 (rank 2)");
  HAS(first, "local rank 3 (rank 3)");
  HAS(first, "2 visible cuda devices for 4 local ranks");
  HAS(first, "host node0");
  LACKS(first, "local rank 1");
  /* Every rank checks the same claims: the same words. */
  ck_assert_int_eq(mpt_device_claims_check(c, 4), MPT_EINVAL);
  ck_assert_str_eq(strstr(mpt_last_error(), "no cuda device"), strstr(first, "no cuda device"));
  free(c);
}
END_TEST

START_TEST(test_missing_devices_are_reported_before_duplicates) {
  const int dev[4] = {0, 0, -1, 1};
  mpt_device_claim *c = claims_make(4, 4, dev, 2);
  ck_assert_int_eq(mpt_device_claims_check(c, 4), MPT_EINVAL);
  HAS(mpt_last_error(), "local rank 2");
  free(c);
}
END_TEST

START_TEST(test_ranks_must_agree_on_the_device_type) {
  const int dev[2] = {0, 1};
  mpt_device_claim *c = claims_make(2, 2, dev, 2);
  c[1].type = MPT_DEVICE_CPU;
  ck_assert_int_eq(mpt_device_claims_check(c, 2), MPT_EINVAL);
  HAS(mpt_last_error(), "device type");
  free(c);
}
END_TEST

START_TEST(test_comm_config_defaults_to_the_host) {
  mpt_comm_config c = mpt_comm_config_default();
  ck_assert_int_eq(c.device.type, MPT_DEVICE_CPU);
  ck_assert_int_eq(c.device.index, 0);
  ck_assert_int_eq(c.backend, MPT_COMM_BACKEND_MPI);
}
END_TEST

int main(void) {
  Suite *s = suite_create("devmap");
  TCase *tc = tcase_create("devmap");
  tcase_add_test(tc, test_pick_is_the_local_rank);
  tcase_add_test(tc, test_pick_beyond_visible_devices_fails_naming_both_numbers);
  tcase_add_test(tc, test_pick_rejects_arguments_out_of_range);
  tcase_add_test(tc, test_claim_fill_records_every_field);
  tcase_add_test(tc, test_claims_on_distinct_devices_pass);
  tcase_add_test(tc, test_two_ranks_on_one_device_of_one_host_are_named);
  tcase_add_test(tc, test_every_duplicate_pair_is_listed_lowest_first);
  tcase_add_test(tc, test_host_identity_uses_the_whole_name);
  tcase_add_test(tc, test_ranks_without_a_device_are_all_named);
  tcase_add_test(tc, test_missing_devices_are_reported_before_duplicates);
  tcase_add_test(tc, test_ranks_must_agree_on_the_device_type);
  tcase_add_test(tc, test_comm_config_defaults_to_the_host);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
