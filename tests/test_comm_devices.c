/* Collective tests of device binding (src/comm/devmap.c; docs/faults.md F11, F12) and of the NCCL
 * bootstrap's CPU part (src/comm/comm_nccl.c; F13), run under mpirun with 2 and 3 ranks on one
 * host (tests/test_comm_devices_np2.mpi, _np3.mpi) with fake device counts, so no GPU is needed:
 *
 * - every rank binds to cuda:<local rank>, even though every rank inherited a stale
 *   SLURM_LOCALID=0 (main sets it before the comm exists: MPI's local rank wins);
 * - with one device fewer than ranks, EVERY rank fails (none waits for the others) and names
 *   the last local rank and the visible count;
 * - two ranks claiming one device are named on every rank, with the device and the host;
 * - NCCL builds: the 128-byte NCCL unique id is byte-identical on every rank after the
 *   bootstrap, a new bootstrap makes a new id, a rank that could not prepare stops every rank,
 *   and an NCCL comm without a GPU (or on the CPU) fails cleanly instead of hanging.
 *
 * MPI rules: no forking (CK_NOFORK); every rank runs the same tests in the same order; value
 * checks are soft and the ranks agree on the outcome at the end of each test. */
#include "config.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/comm.h"
#ifdef MPT_HAVE_NCCL
#include "comm/comm_nccl.h"
#endif

static mpt_comm *g_comm;
static int g_rank, g_world;

#define MPI_CHECK_COMM g_comm
#include "mpi_check.h"
#define EXPECT_HAS(text, needle) \
  EXPECT(strstr((text), (needle)) != NULL, "'%s' lacks '%s'", (text), (needle))

/* F12 + stale SLURM_LOCALID: each rank gets its own local rank's device. */
START_TEST(test_every_rank_binds_to_its_local_rank) {
  expect_begin();
  ck_assert_int_eq(mpt_comm_local_size(g_comm), g_world); /* one host */
  mpt_device d = {MPT_DEVICE_CPU, -1};
  mpt_status st = mpt_comm_bind_device(g_comm, MPT_DEVICE_CUDA, g_world, &d);
  EXPECT(st == MPT_OK, "bind: %s", mpt_last_error());
  EXPECT(d.type == MPT_DEVICE_CUDA && d.index == mpt_comm_local_rank(g_comm),
         "bound to type %d index %d, local rank %d", (int)d.type, d.index,
         mpt_comm_local_rank(g_comm));
  int32_t mine = d.index, all[16] = {0};
  OK(mpt_comm_allgather_sync(g_comm, &mine, all, 1, MPT_I32));
  for (int r = 0; r < g_world; r++) EXPECT(all[r] == r, "rank %d bound to device %d", r, all[r]);
  expect_agree();
}
END_TEST

/* F12: one device fewer than local ranks: every rank fails, naming the last local rank. */
START_TEST(test_too_few_devices_fail_on_every_rank) {
  expect_begin();
  mpt_device d = {MPT_DEVICE_CUDA, 5};
  mpt_status st = mpt_comm_bind_device(g_comm, MPT_DEVICE_CUDA, g_world - 1, &d);
  char local[32], visible[32];
  snprintf(local, sizeof local, "local rank %d", g_world - 1);
  snprintf(visible, sizeof visible, "%d visible", g_world - 1);
  EXPECT(st == MPT_EINVAL, "bind returned %s", mpt_status_name(st));
  EXPECT_HAS(mpt_last_error(), local);
  EXPECT_HAS(mpt_last_error(), visible);
  EXPECT(d.type == MPT_DEVICE_CPU && d.index == 0, "device left as %d:%d", (int)d.type, d.index);
  expect_agree();
}
END_TEST

/* F11: ranks 0 and W-1 claim cuda:0 on this host: named on every rank. */
START_TEST(test_two_ranks_on_one_device_are_named_on_every_rank) {
  expect_begin();
  mpt_device d = {MPT_DEVICE_CUDA, g_rank == g_world - 1 ? 0 : g_rank};
  mpt_status st = mpt_comm_check_devices(g_comm, d);
  char pair[32], host[80];
  snprintf(pair, sizeof pair, "ranks 0 and %d", g_world - 1);
  snprintf(host, sizeof host, "host %.60s", mpt_comm_hostname(g_comm));
  EXPECT(st == MPT_EMISMATCH, "check returned %s", mpt_status_name(st));
  EXPECT_HAS(mpt_last_error(), pair);
  EXPECT_HAS(mpt_last_error(), "cuda:0");
  EXPECT_HAS(mpt_last_error(), host);
  /* The comm is still usable, and distinct devices pass. */
  d.index = g_rank;
  EXPECT(mpt_comm_check_devices(g_comm, d) == MPT_OK, "distinct: %s", mpt_last_error());
  expect_agree();
}
END_TEST

START_TEST(test_binding_to_the_cpu_is_cpu0) {
  mpt_device d = {MPT_DEVICE_CUDA, 3};
  OK(mpt_comm_bind_device(g_comm, MPT_DEVICE_CPU, -1, &d));
  ck_assert_int_eq(d.type, MPT_DEVICE_CPU);
  ck_assert_int_eq(d.index, 0);
  ck_assert_int_eq(mpt_comm_bind_device(NULL, MPT_DEVICE_CUDA, 1, &d), MPT_EINVAL);
}
END_TEST

#ifdef MPT_HAVE_NCCL
static int all_zero(const unsigned char *p, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (p[i]) return 0;
  return 1;
}

/* F13: the id is byte-identical on every rank; a second bootstrap makes a new one. */
START_TEST(test_nccl_id_is_identical_on_every_rank) {
  expect_begin();
  unsigned char id[2][MPT__NCCL_ID_NBYTES];
  for (int k = 0; k < 2; k++) {
    mpt_status st = mpt__nccl_id_bootstrap(g_comm, id[k], 0, mpt_time_ms() + 60000);
    EXPECT(st == MPT_OK, "bootstrap %d: %s", k, mpt_last_error());
  }
  unsigned char *all = calloc((size_t)g_world, MPT__NCCL_ID_NBYTES);
  ck_assert_ptr_nonnull(all);
  OK(mpt_comm_allgather_sync(g_comm, id[0], all, MPT__NCCL_ID_NBYTES, MPT_U8));
  EXPECT(!all_zero(all, MPT__NCCL_ID_NBYTES), "rank 0's id is all zeros");
  for (int r = 1; r < g_world; r++)
    EXPECT(memcmp(all, all + (size_t)r * MPT__NCCL_ID_NBYTES, MPT__NCCL_ID_NBYTES) == 0,
           "rank %d's id differs from rank 0's", r);
  EXPECT(memcmp(id[0], id[1], MPT__NCCL_ID_NBYTES) != 0, "two bootstraps gave the same id");
  free(all);
  expect_agree();
}
END_TEST

START_TEST(test_nccl_bootstrap_stops_every_rank_when_one_cannot_prepare) {
  expect_begin();
  unsigned char id[MPT__NCCL_ID_NBYTES];
  const int bad = g_world - 1;
  mpt_status st = mpt__nccl_id_bootstrap(g_comm, id, g_rank == bad, mpt_time_ms() + 60000);
  if (g_rank == bad) {
    EXPECT(st == MPT_OK, "the failing rank reports its own error, got %s", mpt_status_name(st));
  } else {
    char who[64];
    snprintf(who, sizeof who, "rank %d could not prepare", bad);
    EXPECT(st == MPT_ECOMM, "got %s", mpt_status_name(st));
    EXPECT_HAS(mpt_last_error(), who);
  }
  expect_agree();
}
END_TEST

/* Without a GPU, an NCCL comm fails on every rank at once (its stream cannot be created), and
 * on the CPU it is refused before any collective. */
START_TEST(test_nccl_comm_fails_cleanly_without_a_gpu) {
  mpt_comm_config cc = mpt_comm_config_default();
  cc.backend = MPT_COMM_BACKEND_NCCL;
  cc.timeout_ms = 20000;
  mpt_comm *c = NULL;
  ck_assert_int_eq(mpt_comm_init(&c, &cc), MPT_EINVAL); /* device cpu */
  ck_assert_ptr_null(c);
  ck_assert_msg(strstr(mpt_last_error(), "needs a CUDA device") != NULL, "%s", mpt_last_error());
  if (mpt_device_count(MPT_DEVICE_CUDA) > 0) return; /* a GPU machine: test_comm_cuda covers it */
  cc.device = (mpt_device){MPT_DEVICE_CUDA, 0};
  mpt_status st = mpt_comm_init(&c, &cc);
  ck_assert_msg(st != MPT_OK && c == NULL, "rank %d: %s", g_rank, mpt_status_name(st));
  OK(mpt_comm_barrier_sync(g_comm)); /* every rank got here: nobody waits in NCCL */
}
END_TEST
#endif

int main(void) {
  /* Stale: inherited from a batch shell by every rank. MPI's local rank must win (F12). */
  setenv("SLURM_LOCALID", "0", 1);
  mpt_comm_config cc = mpt_comm_config_default();
  cc.timeout_ms = 60000;
  mpt_status st = mpt_comm_init(&g_comm, &cc);
  if (st != MPT_OK) {
    fprintf(stderr, "mpt_comm_init: %s\n", mpt_last_error());
    return 1;
  }
  g_rank = mpt_comm_rank(g_comm);
  g_world = mpt_comm_world_size(g_comm);
  if (g_world < 2 || g_world > 16) {
    fprintf(stderr, "run with 2 to 16 ranks (tests/test_comm_devices_np2.mpi)\n");
    mpt_comm_free(g_comm);
    mpt_comm_finalize();
    return 1;
  }
  Suite *s = suite_create("comm_devices");
  TCase *tc = tcase_create("devices");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_every_rank_binds_to_its_local_rank);
  tcase_add_test(tc, test_too_few_devices_fail_on_every_rank);
  tcase_add_test(tc, test_two_ranks_on_one_device_are_named_on_every_rank);
  tcase_add_test(tc, test_binding_to_the_cpu_is_cpu0);
#ifdef MPT_HAVE_NCCL
  tcase_add_test(tc, test_nccl_id_is_identical_on_every_rank);
  tcase_add_test(tc, test_nccl_bootstrap_stops_every_rank_when_one_cannot_prepare);
  tcase_add_test(tc, test_nccl_comm_fails_cleanly_without_a_gpu);
#endif
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  mpt_comm_free(g_comm);
  mpt_comm_finalize();
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
