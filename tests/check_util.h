/* Shared by the single-process Check programs of tests/ (the MPI ones use tests/mpi_check.h,
 * whose OK also names the rank).
 *
 * OK(expr): a hard check that an mpitrain call returned MPT_OK; a failure names the call, the
 * status and the library's error detail (mpt_last_error). */
#ifndef MPT_TESTS_CHECK_UTIL_H
#define MPT_TESTS_CHECK_UTIL_H

#include <check.h>

#include "mpitrain/core.h"

#define OK(expr)                                                                              \
  do {                                                                                        \
    mpt_status st_ = (expr);                                                                  \
    ck_assert_msg(st_ == MPT_OK, "%s -> %s: %s", #expr, mpt_status_name(st_), mpt_last_error()); \
  } while (0)

#endif
