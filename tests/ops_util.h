/* Shared by the Check programs of the core ops (tests/test_ops.c, tests/test_ops_conv.c,
 * tests/test_ops_train.c): a tolerance check that describes the value it compares, buffers,
 * uniform and dyadic fills, and the check that an op refused its arguments by name.
 *
 * CLOSE(got, want, tol, fmt, ...): fails unless |got - want| <= tol; the trailing printf
 * arguments describe the value.
 * alloc_f(n): n floats (at least one), never NULL.
 * rand_fill(x, n, seed, lo, hi): uniform values in [lo, hi) from mpt_rng.
 * dyadic_fill(x, n, seed): multiples of 1/4 in [-4, 4]: sums of thousands of them are exact
 * in float, so results that only move or add them must be EQUAL whatever the summation order.
 * expect_einval(st, needle): st is MPT_EINVAL and the error detail contains needle. */
#ifndef MPT_TESTS_OPS_UTIL_H
#define MPT_TESTS_OPS_UTIL_H

#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/core.h"

#define CLOSE(got, want, tol, ...)                                                  \
  do {                                                                              \
    const double got_ = (got), want_ = (want), tol_ = (tol);                        \
    if (!(fabs(got_ - want_) <= tol_)) {                                            \
      char ctx_[200];                                                               \
      snprintf(ctx_, sizeof ctx_, __VA_ARGS__);                                     \
      ck_abort_msg("%s: got %.9g, want %.9g (tol %.3g)", ctx_, got_, want_, tol_);  \
    }                                                                               \
  } while (0)

static inline float *alloc_f(int64_t n) {
  float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
  ck_assert_ptr_nonnull(p);
  return p;
}

static inline void rand_fill(float *x, int64_t n, uint64_t seed, float lo, float hi) {
  mpt_rng r;
  mpt_rng_seed(&r, seed);
  mpt_rng_fill_uniform(&r, x, n, lo, hi);
}

static inline void dyadic_fill(float *x, int64_t n, uint64_t seed) {
  mpt_rng r;
  mpt_rng_seed(&r, seed);
  for (int64_t i = 0; i < n; i++) x[i] = ((float)mpt_rng_below(&r, 33) - 16.0f) / 4.0f;
}

static inline void expect_einval(mpt_status st, const char *needle) {
  ck_assert_msg(st == MPT_EINVAL, "expected MPT_EINVAL, got %s", mpt_status_name(st));
  ck_assert_msg(strstr(mpt_last_error(), needle), "error '%s' does not name '%s'",
                mpt_last_error(), needle);
}

#endif
