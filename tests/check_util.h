/* Shared by the Check programs of tests/ (the MPI ones through tests/mpi_check.h, which
 * includes it after defining its own OK, one that also names the rank).
 *
 * OK(expr): a hard check that an mpitrain call returned MPT_OK; a failure names the call, the
 * status and the library's error detail (mpt_last_error).
 * rel_diff(a, b, n): max |a - b| over the n elements, relative to max(|b|, 1e-3) (b is the
 * reference): the measure of the equivalence tests (DDP or DP against one process).
 * run_suite(s): runs every test of the suite (Check's default fork mode, normal output) and
 * returns the program's exit status: EXIT_SUCCESS when none failed, else EXIT_FAILURE. */
#ifndef MPT_TESTS_CHECK_UTIL_H
#define MPT_TESTS_CHECK_UTIL_H

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "mpitrain/core.h"

#ifndef OK
#define OK(expr)                                                                              \
  do {                                                                                        \
    mpt_status st_ = (expr);                                                                  \
    ck_assert_msg(st_ == MPT_OK, "%s -> %s: %s", #expr, mpt_status_name(st_), mpt_last_error()); \
  } while (0)
#endif

static inline double rel_diff(const float *a, const float *b, int64_t n) {
  double diff = 0, scale = 1e-3;
  for (int64_t i = 0; i < n; i++) {
    const double d = fabs((double)a[i] - (double)b[i]);
    if (d > diff) diff = d;
    if (fabs((double)b[i]) > scale) scale = fabs((double)b[i]);
  }
  return diff / scale;
}

static inline int run_suite(Suite *s) {
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

#endif
