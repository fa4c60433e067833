/* Checks for the Check programs that run under mpirun (tests/test_ddp.c, test_faults.c,
 * test_dp_hybrid.c, test_comm_cuda.c).
 *
 * OK(expr): a hard check that an mpitrain call succeeded, naming the rank, the call and the
 * error detail. EXPECT(cond, fmt, ...): a soft check; the first failure of a test is remembered
 * and the test goes on, so that every rank still reaches the same collectives. expect_begin()
 * starts a test, expect_agree() ends it: every rank learns (an all-reduce over MPI_CHECK_COMM)
 * whether any rank failed, and each then fails the test, so one rank's failure never leaves the
 * others waiting in a collective. same_on_all_ranks(x, n): whether x[0..n) holds the same bits on
 * every rank. mpi_check_main: the whole main of an MPI Check program. Also rel_diff
 * (tests/check_util.h). The including file declares `static int g_rank` and defines
 * MPI_CHECK_COMM (the comm of the agreement and of same_on_all_ranks) before including this
 * header. */
#ifndef MPT_TESTS_MPI_CHECK_H
#define MPT_TESTS_MPI_CHECK_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/comm.h"

#define OK(expr)                                                                              \
  do {                                                                                        \
    mpt_status st_ = (expr);                                                                  \
    ck_assert_msg(st_ == MPT_OK, "rank %d: %s -> %s: %s", g_rank, #expr, mpt_status_name(st_), \
                  mpt_last_error());                                                          \
  } while (0)
#include "check_util.h"

static int g_bad;
static char g_why[1024];
#define EXPECT(cond, ...)                                                                     \
  do {                                                                                        \
    if (!(cond) && !g_bad) {                                                                  \
      g_bad = 1;                                                                              \
      snprintf(g_why, sizeof g_why, __VA_ARGS__);                                             \
    }                                                                                         \
  } while (0)

static inline void expect_begin(void) {
  g_bad = 0;
  g_why[0] = '\0';
}

static inline void expect_agree(void) {
  int32_t mine = g_bad, any = 0;
  OK(mpt_comm_allreduce_sync(MPI_CHECK_COMM, &mine, &any, 1, MPT_I32, MPT_REDUCE_MAX));
  ck_assert_msg(!g_bad, "rank %d: %s", g_rank, g_why);
  ck_assert_msg(!any, "rank %d: another rank failed this test (see its output)", g_rank);
}

/* 1 when x[0..n) holds the same bits on every rank (an all-reduce of its MIN and of its MAX
 * over MPI_CHECK_COMM), 0 otherwise. Collective. */
static inline int same_on_all_ranks(const float *x, int64_t n) {
  float *lo = malloc((size_t)n * sizeof *lo), *hi = malloc((size_t)n * sizeof *hi);
  ck_assert(lo && hi);
  OK(mpt_comm_allreduce_sync(MPI_CHECK_COMM, x, lo, n, MPT_F32, MPT_REDUCE_MIN));
  OK(mpt_comm_allreduce_sync(MPI_CHECK_COMM, x, hi, n, MPT_F32, MPT_REDUCE_MAX));
  int same = memcmp(lo, hi, (size_t)n * sizeof *lo) == 0;
  free(lo);
  free(hi);
  return same;
}

/* The main of an MPI Check program: makes the comm (collective deadline timeout_ms) into *comm,
 * g_rank and *world, then builds the suite (make_suite runs after the comm exists: a suite may
 * depend on the world size), runs it without forking (MPI and fork do not mix), frees the comm
 * and finalises MPI. Returns the exit status: EXIT_FAILURE (naming `prog` and the error) when
 * the comm cannot be made or a test failed. */
static inline int mpi_check_main(const char *prog, double timeout_ms, mpt_comm **comm,
                                 int *world, Suite *(*make_suite)(void)) {
  mpt_comm_config cc = mpt_comm_config_default();
  cc.timeout_ms = timeout_ms;
  mpt_status st = mpt_comm_init(comm, &cc);
  if (st != MPT_OK) {
    fprintf(stderr, "%s: mpt_comm_init: %s: %s\n", prog, mpt_status_name(st), mpt_last_error());
    mpt_comm_finalize();
    return EXIT_FAILURE;
  }
  g_rank = mpt_comm_rank(*comm);
  *world = mpt_comm_world_size(*comm);
  SRunner *sr = srunner_create(make_suite());
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  mpt_comm_free(*comm);
  mpt_comm_finalize();
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

#endif
