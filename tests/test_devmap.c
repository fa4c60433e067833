/* Tests of the pure parts of device binding (src/comm/devmap.c; docs/faults.md F11, F12) with fake
 * device lists: the pick by local rank (never a modulo), and the check of gathered (host,
 * device) claims (missing devices, two ranks on one device of one host), with the values of the
 * fault cases: 4 local ranks and 2 visible devices make local ranks 2 and 3 fail naming the
 * local rank and "2 visible". No MPI: the collective parts are in tests/test_devmap_mpi.c. */
#include <check.h>
#include <stdint.h>
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

/* ---- binding by physical identity (UUID / PCI bus id) with fake device lists ------------ */

/* A fake UUID: byte 0 = 0xA0 + gpu, the rest a pattern (never all zero). */
static void fake_uid(uint8_t *u, int gpu) {
  for (int i = 0; i < MPT_DEVICE_UID_NBYTES; i++) u[i] = (uint8_t)(0x11 * i);
  u[0] = (uint8_t)(0xA0 + gpu);
}

/* Claim of rank r (local rank lr of `local` on `host`) seeing the physical GPUs gpus[0..n). */
static void claim_with_gpus(mpt_device_claim *c, int r, int lr, int local, const char *host,
                            const int *gpus, int n) {
  uint8_t ids[MPT_DEVICE_LIST_MAX][MPT_DEVICE_UID_NBYTES];
  for (int k = 0; k < n; k++) fake_uid(ids[k], gpus[k]);
  mpt_device_claim_fill(c, r, lr, local, MPT_DEVICE_CUDA, -1, n, host);
  mpt_device_claim_set_ids(c, (const uint8_t(*)[MPT_DEVICE_UID_NBYTES])ids, n);
}

static int gpu_of(const mpt_device_claim *c) { return c->index < 0 ? -1 : c->uid[0] - 0xA0; }

/* Shared set-up: every local rank sees the same 4 GPUs (CUDA_VISIBLE_DEVICES unset or the same
 * everywhere): local rank r uses device r, as the ordinal rule did. */
START_TEST(test_assign_shared_list_is_the_local_rank) {
  const int gpus[4] = {0, 1, 2, 3};
  mpt_device_claim c[4];
  for (int r = 0; r < 4; r++) claim_with_gpus(&c[r], r, r, 4, "node0", gpus, 4);
  ck_assert_int_eq(mpt_device_assign(c, 4), MPT_OK);
  for (int r = 0; r < 4; r++) {
    ck_assert_int_eq(c[r].index, r);
    ck_assert_int_eq(gpu_of(&c[r]), r);
  }
  ck_assert_int_eq(mpt_device_claims_check(c, 4), MPT_OK);
}
END_TEST

/* Per-rank set-up (srun --gpus-per-task=1, --gpu-bind): each rank sees only its own GPU, as
 * "cuda:0". Ordinals made local rank 1 fail with "1 visible device" and called the ranks
 * duplicates; by identity each rank uses its one device. Given in scrambled rank order. */
START_TEST(test_assign_per_rank_lists_use_the_one_visible_device) {
  mpt_device_claim c[4];
  const int order[4] = {2, 0, 3, 1};
  for (int i = 0; i < 4; i++) {
    const int r = order[i], gpu = 3 - r;
    claim_with_gpus(&c[i], r, r, 4, "node0", &gpu, 1);
  }
  ck_assert_int_eq(mpt_device_assign(c, 4), MPT_OK);
  for (int i = 0; i < 4; i++) {
    ck_assert_int_eq(c[i].index, 0);
    ck_assert_int_eq(gpu_of(&c[i]), 3 - (int)c[i].rank);
  }
  ck_assert_msg(mpt_device_claims_check(c, 4) == MPT_OK, "%s", mpt_last_error());
}
END_TEST

/* Lists in different orders (CUDA_VISIBLE_DEVICES=0,1 on rank 0, 1,0 on rank 1): ordinals put
 * both ranks on GPU 0 unseen; by identity rank 1 takes GPU 1. */
START_TEST(test_assign_lists_in_different_orders_never_share_a_gpu) {
  const int a[2] = {0, 1}, b[2] = {1, 0};
  mpt_device_claim c[2];
  claim_with_gpus(&c[0], 0, 0, 2, "node0", a, 2);
  claim_with_gpus(&c[1], 1, 1, 2, "node0", b, 2);
  ck_assert_int_eq(mpt_device_assign(c, 2), MPT_OK);
  ck_assert_int_eq(gpu_of(&c[0]), 0);
  ck_assert_int_eq(gpu_of(&c[1]), 1);
  ck_assert_int_eq(c[1].index, 0);
  ck_assert_int_eq(mpt_device_claims_check(c, 2), MPT_OK);
  /* The ordinal rule's choice (rank 1 on its index 1, i.e. GPU 0) is caught by identity. */
  c[1].index = 1;
  fake_uid(c[1].uid, 0);
  ck_assert_int_eq(mpt_device_claims_check(c, 2), MPT_EMISMATCH);
  HAS(mpt_last_error(), "ranks 0 and 1 both use GPU-a0112233-4455-6677-8899-aabbccddeeff");
}
END_TEST

/* A true physical duplicate: two ranks of one host whose only visible device is one GPU. */
START_TEST(test_assign_true_duplicate_is_refused_naming_both_ranks) {
  const int g = 5;
  mpt_device_claim c[3];
  claim_with_gpus(&c[0], 0, 0, 2, "node0", &g, 1);
  claim_with_gpus(&c[1], 1, 1, 2, "node0", &g, 1);
  claim_with_gpus(&c[2], 2, 0, 1, "node1", &g, 1); /* the same bytes on another host: fine */
  ck_assert_int_eq(mpt_device_assign(c, 3), MPT_OK);
  ck_assert_int_eq(gpu_of(&c[0]), 5);
  ck_assert_int_eq(c[1].index, -1);
  ck_assert_int_eq(gpu_of(&c[2]), 5);
  ck_assert_int_eq(mpt_device_claims_check(c, 3), MPT_EINVAL);
  const char *e = mpt_last_error();
  HAS(e, "local rank 1 (rank 1) on host node0");
  HAS(e, "GPU-a5112233");
  HAS(e, "used by rank 0");
  LACKS(e, "node1");
}
END_TEST

/* F12 with identities: 4 local ranks sharing 2 GPUs: local ranks 2 and 3 fail, named with the
 * count; never a modulo. */
START_TEST(test_assign_more_local_ranks_than_gpus_fails_naming_the_count) {
  const int gpus[2] = {0, 1};
  mpt_device_claim c[4];
  for (int r = 0; r < 4; r++) claim_with_gpus(&c[r], r, r, 4, "node0", gpus, 2);
  ck_assert_int_eq(mpt_device_assign(c, 4), MPT_OK);
  ck_assert_int_eq(c[2].index, -1);
  ck_assert_int_eq(c[3].index, -1);
  ck_assert_int_eq(mpt_device_claims_check(c, 4), MPT_EINVAL);
  HAS(mpt_last_error(), "local rank 2 (rank 2)");
  HAS(mpt_last_error(), "local rank 3 (rank 3)");
  HAS(mpt_last_error(), "2 visible cuda devices for 4 local ranks");
}
END_TEST

/* Without identities (fake counts, no driver) the ordinal rule stands. */
START_TEST(test_assign_without_ids_keeps_the_ordinal_pick) {
  const int dev[4] = {-1, -1, -1, -1};
  mpt_device_claim *c = claims_make(4, 4, dev, 3);
  ck_assert_int_eq(mpt_device_assign(c, 4), MPT_OK);
  ck_assert_int_eq(c[0].index, 0);
  ck_assert_int_eq(c[2].index, 2);
  ck_assert_int_eq(c[3].index, -1);
  ck_assert_int_eq(mpt_device_assign(NULL, 1), MPT_EINVAL);
  free(c);
}
END_TEST

/* PCI bus ids stand in for a missing UUID, and are printed as such. */
START_TEST(test_pci_identity_is_named_as_a_bus_id) {
  mpt_device_claim c[2];
  uint8_t id[1][MPT_DEVICE_UID_NBYTES] = {{'p', 'c', 'i', 0, 0, 0, 0, 0x65, 0x00}};
  for (int r = 0; r < 2; r++) {
    mpt_device_claim_fill(&c[r], r, r, 2, MPT_DEVICE_CUDA, -1, 1, "node0");
    mpt_device_claim_set_ids(&c[r], (const uint8_t(*)[MPT_DEVICE_UID_NBYTES])id, 1);
  }
  ck_assert_int_eq(mpt_device_assign(c, 2), MPT_OK);
  ck_assert_int_eq(mpt_device_claims_check(c, 2), MPT_EINVAL);
  HAS(mpt_last_error(), "PCI 0000:65:00 is used by rank 0");
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
  tcase_add_test(tc, test_assign_shared_list_is_the_local_rank);
  tcase_add_test(tc, test_assign_per_rank_lists_use_the_one_visible_device);
  tcase_add_test(tc, test_assign_lists_in_different_orders_never_share_a_gpu);
  tcase_add_test(tc, test_assign_true_duplicate_is_refused_naming_both_ranks);
  tcase_add_test(tc, test_assign_more_local_ranks_than_gpus_fails_naming_the_count);
  tcase_add_test(tc, test_assign_without_ids_keeps_the_ordinal_pick);
  tcase_add_test(tc, test_pci_identity_is_named_as_a_bus_id);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
