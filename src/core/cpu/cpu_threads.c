/* CPU compute threads of the process (include/mpitrain/ops.h, mpt_cpu_set_threads): the
 * OpenBLAS thread count, which the library convolutions (oneDNN) follow at each call
 * (conv_dnnl.c), so one call sets both. Process-wide, like OpenBLAS's own setting. */
#include <cblas.h>
#include <unistd.h>

#include "core/error.h"
#include "core/threads.h"
#include "mpitrain/ops.h"

mpt_status mpt_cpu_set_threads(int n) {
  if (n < 1) return MPT_FAIL(MPT_EINVAL, "cpu_set_threads: %d threads (must be >= 1)", n);
  /* OpenBLAS starts the threads it lacks from here: they inherit a mask with the asynchronous
   * signals blocked (core/threads.h) */
  sigset_t old;
  mpt__signals_block(&old);
  openblas_set_num_threads(n);
  mpt__signals_restore(&old);
  return MPT_OK;
}

int mpt_cpu_threads(void) { return openblas_get_num_threads(); }

int mpt_cpu_threads_per_rank(int local_ranks, int devices) {
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const long share = (local_ranks > 0 ? local_ranks : 1) * (long)(devices > 0 ? devices : 1);
  const long n = cores > 0 ? cores / share : 1;
  return n >= 1 ? (int)n : 1;
}

const char *mpt_cpu_blas_name(void) { return openblas_get_corename(); }
