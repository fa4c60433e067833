/* Shared by the Check programs of the nn core (tests/test_tape.c, tests/test_tape_model.c,
 * tests/test_tape_ops.c): a CPU model with named parameters whose flat buffers the tests read
 * and write directly (the NULL stream: device memory is host memory).
 *
 * FAILS(expr, status): a hard check that a call returned `status`, naming the call, the status
 * it returned and the library's error detail.
 * new_model(): an empty CPU model; add_param(): a zero-initialised parameter of 1 or 2
 * dimensions, returning its index; param_data() / grad_data(): its value and gradient. */
#ifndef MPT_TESTS_TAPE_UTIL_H
#define MPT_TESTS_TAPE_UTIL_H

#include <check.h>
#include <stdint.h>

#include "mpitrain.h"
#include "mpitrain/autograd.h"
#include "check_util.h"

#define FAILS(expr, status)                                                             \
  do {                                                                                  \
    mpt_status st_ = (expr);                                                            \
    ck_assert_msg(st_ == (status), "%s -> %s, want %s (%s)", #expr, mpt_status_name(st_), \
                  mpt_status_name(status), mpt_last_error());                           \
  } while (0)

static inline mpt_model *new_model(void) {
  mpt_model *m = NULL;
  OK(mpt_model_init(&m, mpt_device_cpu()));
  return m;
}

static inline int add_param(mpt_model *m, const char *name, int ndim, int64_t d0, int64_t d1) {
  const int64_t shape[2] = {d0, d1};
  int index = -1;
  OK(mpt_model_add_param(m, name, ndim, shape, MPT_INIT_ZEROS, 0, &index));
  return index;
}

static inline float *param_data(mpt_model *m, int index) {
  return (float *)mpt_model_param(m, index).data;
}
static inline float *grad_data(mpt_model *m, int index) {
  return (float *)mpt_model_grad(m, index).data;
}

#endif
