/* The language-model windows under mpirun (2 and 3 ranks: tests/test_token_ddp_np2.mpi, _np3.mpi):
 * every rank opens the same shards (written by rank 0) and draws its windows through
 * mpt_token_loader with its own rank. Gathered over the ranks: the one-rank order of each epoch
 * is the same on every rank; rank r's step i is position r + i W of it; the real steps of all
 * ranks cover every window exactly once per epoch; epochs 0 and 1 differ; each step's inputs
 * and targets are the window's tokens, shifted by one. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpitrain/comm.h"
#include "mpitrain/data.h"

static mpt_comm *g_comm;
static int g_rank, g_world;
#define MPI_CHECK_COMM g_comm
#include "mpi_check.h"

enum { NW_MAX = 64 };

START_TEST(test_token_windows_are_sharded_across_real_ranks) {
  expect_begin();
  /* Rank 0 writes two shards (101 and 60 tokens; B 2, T 4: 12 + 7 = 19 windows) into a
   * folder whose name it broadcasts. */
  char dir[256] = {0};
  if (g_rank == 0) {
    snprintf(dir, sizeof dir, "/tmp/mpt_test_token_ddp_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    uint16_t t[101];
    for (int i = 0; i < 101; i++) t[i] = (uint16_t)(i * 3 % 500);
    char p[300];
    snprintf(p, sizeof p, "%s/s_0.bin", dir);
    OK(mpt_token_shard_write(p, t, 101));
    for (int i = 0; i < 60; i++) t[i] = (uint16_t)(1000 + i);
    snprintf(p, sizeof p, "%s/s_1.bin", dir);
    OK(mpt_token_shard_write(p, t, 60));
  }
  OK(mpt_comm_broadcast_sync(g_comm, dir, sizeof dir, MPT_U8, 0));
  char pattern[300];
  snprintf(pattern, sizeof pattern, "%s/s_*.bin", dir);
  mpt_token_data_config cfg = {2, 4, 2048};
  mpt_token_data *d;
  OK(mpt_token_data_init(&d, pattern, &cfg));
  int64_t nw = mpt_token_data_num_windows(d);
  EXPECT(nw == 19, "%lld windows, expected 19", (long long)nw);
  int64_t steps = (nw + g_world - 1) / g_world;
  int32_t order[2][NW_MAX];
  for (int epoch = 0; epoch < 2; epoch++) {
    /* This rank's one-rank order, gathered: it must be the same everywhere. */
    mpt_sampler_config sc = mpt_sampler_config_default();
    sc.seed = 77;
    mpt_token_loader *one, *tl;
    OK(mpt_token_loader_init(&one, d, &sc, NULL));
    OK(mpt_token_loader_start_epoch(one, epoch));
    mpt_token_batch b;
    for (int64_t i = 0; i < nw; i++) {
      ck_assert_int_eq(mpt_token_loader_next(one, &b), MPT_OK);
      order[epoch][i] = (int32_t)b.window;
    }
    mpt_token_loader_free(one);
    int32_t all_orders[8 * NW_MAX];
    OK(mpt_comm_allgather_sync(g_comm, order[epoch], all_orders, nw, MPT_I32));
    for (int r = 0; r < g_world; r++)
      EXPECT(memcmp(all_orders + r * nw, order[epoch], (size_t)nw * 4) == 0,
             "epoch %d: rank %d's order differs from rank %d's", epoch, r, g_rank);
    /* This rank's windows. */
    sc.num_replicas = g_world;
    sc.rank = g_rank;
    OK(mpt_token_loader_init(&tl, d, &sc, NULL));
    OK(mpt_token_loader_start_epoch(tl, epoch));
    EXPECT(mpt_token_loader_num_steps(tl) == steps, "steps %lld", (long long)steps);
    int32_t mine[NW_MAX], pad[NW_MAX];
    for (int64_t i = 0; i < steps; i++) {
      ck_assert_int_eq(mpt_token_loader_next(tl, &b), MPT_OK);
      mine[i] = (int32_t)b.window;
      pad[i] = b.is_padding;
      EXPECT(b.window == order[epoch][(g_rank + i * g_world) % nw],
             "epoch %d step %lld: window %lld", epoch, (long long)i, (long long)b.window);
      int32_t x[8], y[8];
      OK(mpt_token_data_read_window(d, b.window, x, y));
      EXPECT(memcmp(x, b.inputs.data, sizeof x) == 0 && memcmp(y, b.targets.data, sizeof y) == 0,
             "step %lld: tokens differ from the window's", (long long)i);
      for (int j = 0; j < 7; j++) EXPECT(y[j] == x[j + 1], "targets are not the next tokens");
    }
    EXPECT(mpt_token_loader_next(tl, &b) == MPT_LOADER_END, "more steps than %lld",
           (long long)steps);
    mpt_token_loader_free(tl);
    int32_t all[8 * NW_MAX], all_pad[8 * NW_MAX];
    OK(mpt_comm_allgather_sync(g_comm, mine, all, steps, MPT_I32));
    OK(mpt_comm_allgather_sync(g_comm, pad, all_pad, steps, MPT_I32));
    int seen[NW_MAX] = {0};
    for (int64_t k = 0; k < steps * g_world; k++)
      if (!all_pad[k]) seen[all[k]]++;
    for (int64_t w = 0; w < nw; w++)
      EXPECT(seen[w] == 1, "epoch %d: window %lld seen %d times over the ranks", epoch,
             (long long)w, seen[w]);
  }
  EXPECT(memcmp(order[0], order[1], (size_t)nw * 4) != 0, "epochs 0 and 1 have the same order");
  mpt_token_data_free(d);
  OK(mpt_comm_barrier_sync(g_comm));
  if (g_rank == 0) {
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  }
  expect_agree();
}
END_TEST

int main(void) {
  mpt_comm_config cc = mpt_comm_config_default();
  cc.timeout_ms = 30000;
  mpt_status st = mpt_comm_init(&g_comm, &cc);
  if (st != MPT_OK) {
    fprintf(stderr, "test_token_ddp: mpt_comm_init: %s: %s\n", mpt_status_name(st),
            mpt_last_error());
    mpt_comm_finalize();
    return EXIT_FAILURE;
  }
  g_rank = mpt_comm_rank(g_comm);
  g_world = mpt_comm_world_size(g_comm);
  if (g_world > 8) {
    fprintf(stderr, "test_token_ddp: at most 8 ranks\n");
    return EXIT_FAILURE;
  }
  Suite *s = suite_create("token_ddp");
  TCase *tc = tcase_create("token_ddp");
  tcase_add_test(tc, test_token_windows_are_sharded_across_real_ranks);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  mpt_comm_free(g_comm);
  mpt_comm_finalize();
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
