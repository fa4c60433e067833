/* Check macros for CUDA runtime and cuBLAS calls (../../../STYLE.md rule 4). Each records the
 * failing statement (its source text), file:line, the device and the library's own error name
 * and message in the thread-local error detail, then PROPAGATES a status: they never abort.
 *
 *   MPT_CUDA_CHECK(call, device, label)   st = status; goto label      (needs a local `st`)
 *   MPT_CUDA_RETURN_IF(call, device)      return status
 *   MPT_CUBLAS_RETURN_IF(call, device)    return status
 *
 * cudaErrorMemoryAllocation maps to MPT_ENOMEM, every other error to MPT_EDEVICE. The failing
 * call's non-sticky error is cleared (cudaGetLastError) so that it does not resurface in the
 * next kernel launch's check. */
#ifndef MPT_CORE_CUDA_CHECK_H
#define MPT_CORE_CUDA_CHECK_H

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "mpitrain/core.h"

/* Records "<file>:<line>: <stmt> failed on cuda:<device>: <name> (<message>)" and returns the
 * status for `err`. */
mpt_status mpt__cuda_fail(cudaError_t err, const char *stmt, const char *file, int line,
                          int device);
/* The same for a cuBLAS status (always MPT_EDEVICE, MPT_ENOMEM for CUBLAS_STATUS_ALLOC_FAILED). */
mpt_status mpt__cublas_fail(cublasStatus_t err, const char *stmt, const char *file, int line,
                            int device);

#define MPT_CUDA_CHECK(call, device, label)                                      \
  do {                                                                           \
    const cudaError_t mpt_ce_ = (call);                                          \
    if (mpt_ce_ != cudaSuccess) {                                                \
      st = mpt__cuda_fail(mpt_ce_, #call, __FILE__, __LINE__, (device));         \
      goto label;                                                                \
    }                                                                            \
  } while (0)

#define MPT_CUDA_RETURN_IF(call, device)                                         \
  do {                                                                           \
    const cudaError_t mpt_ce_ = (call);                                          \
    if (mpt_ce_ != cudaSuccess)                                                  \
      return mpt__cuda_fail(mpt_ce_, #call, __FILE__, __LINE__, (device));       \
  } while (0)

#define MPT_CUBLAS_RETURN_IF(call, device)                                       \
  do {                                                                           \
    const cublasStatus_t mpt_cb_ = (call);                                       \
    if (mpt_cb_ != CUBLAS_STATUS_SUCCESS)                                        \
      return mpt__cublas_fail(mpt_cb_, #call, __FILE__, __LINE__, (device));     \
  } while (0)

#endif
