/* The oneDNN check macro shared by the CPU backend's oneDNN files (conv_dnnl.c, gemm_dnnl.c):
 * a failed call becomes MPT_EDEVICE naming the call and oneDNN's status, returned from the
 * enclosing function. Built only with oneDNN (MPT_HAVE_ONEDNN). */
#ifndef MPT_CORE_CPU_DNNL_CHECK_H
#define MPT_CORE_CPU_DNNL_CHECK_H

#include <oneapi/dnnl/dnnl.h>

#include "mpitrain/core.h"

static inline const char *mpt__dnnl_status_name(dnnl_status_t s) {
  switch (s) {
    case dnnl_out_of_memory: return "out of memory";
    case dnnl_invalid_arguments: return "invalid arguments";
    case dnnl_unimplemented: return "no implementation for this shape";
    case dnnl_iterator_ends: return "iterator ends";
    case dnnl_runtime_error: return "runtime error";
    case dnnl_not_required: return "not required";
    default: return "unknown";
  }
}

#define MPT_DNNL_OK(call)                                                                   \
  do {                                                                                      \
    dnnl_status_t st_ = (call);                                                             \
    if (st_ != dnnl_success)                                                                \
      return MPT_FAIL(MPT_EDEVICE, "oneDNN: %s failed with status %d (%s)", #call, (int)st_, \
                      mpt__dnnl_status_name(st_));                                          \
  } while (0)

#endif
