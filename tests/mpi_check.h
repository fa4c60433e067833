/* Checks for the Check programs that run under mpirun (tests/test_ddp.c, test_faults.c,
 * test_dp_hybrid.c, test_comm_cuda.c).
 *
 * OK(expr): a hard check that an mpitrain call succeeded, naming the rank, the call and the
 * error detail. EXPECT(cond, fmt, ...): a soft check; the first failure of a test is remembered
 * and the test goes on, so that every rank still reaches the same collectives. expect_begin()
 * starts a test, expect_agree() ends it: every rank learns (an all-reduce over MPI_CHECK_COMM)
 * whether any rank failed, and each then fails the test, so one rank's failure never leaves the
 * others waiting in a collective. The including file declares `static int g_rank` and defines
 * MPI_CHECK_COMM (the comm of the agreement) before including this header. */
#ifndef MPT_TESTS_MPI_CHECK_H
#define MPT_TESTS_MPI_CHECK_H

#include <check.h>
#include <stdio.h>

#include "mpitrain/comm.h"

#define OK(expr)                                                                              \
  do {                                                                                        \
    mpt_status st_ = (expr);                                                                  \
    ck_assert_msg(st_ == MPT_OK, "rank %d: %s -> %s: %s", g_rank, #expr, mpt_status_name(st_), \
                  mpt_last_error());                                                          \
  } while (0)

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

#endif
