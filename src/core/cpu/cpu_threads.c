/* CPU compute threads of the process (include/mpitrain/ops.h, mpt_cpu_set_threads): the count
 * of the CPU ops' own pool (pool.h, and the fused attention's OpenMP team), and the count of the
 * GEMM and convolution libraries: OpenBLAS's setting, which oneDNN's GEMMs and convolutions
 * follow at each call (sgemm_dnnl.c, gemm_dnnl.c, conv_dnnl.c). The two are equal unless
 * MPT_GEMM_THREADS caps the libraries' count (a testing and debugging switch: with it at 1,
 * every result of a run is the same at every count, since the CPU ops' own kernels are by
 * construction, while the libraries' GEMMs are not; tests/test_train_gpt_threads.sh).
 * Process-wide, like OpenBLAS's own setting. */
#include <cblas.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "mpitrain/core.h"
#include "core/threads.h"
#include "mpitrain/ops.h"

/* The last mpt_cpu_set_threads count; 0 before the first call (then OpenBLAS's count). */
static atomic_int ops_threads;

/* MPT_GEMM_THREADS: unset or empty -> 0 (no cap), an integer >= 1 -> it, else -1. */
static int gemm_cap_from_env(void) {
  const char *v = getenv("MPT_GEMM_THREADS");
  if (!v || !v[0]) return 0;
  char *end = NULL;
  errno = 0;
  const long k = strtol(v, &end, 10);
  if (errno || *end || k < 1 || k > 1 << 20) return -1;
  return (int)k;
}

mpt_status mpt_cpu_set_threads(int n) {
  if (n < 1) return MPT_FAIL(MPT_EINVAL, "cpu_set_threads: %d threads (must be >= 1)", n);
  MPT_RETURN_IF(mpt_cpu_isa_init()); /* a bad MPT_CPU_ISA, before any work (isa.c) */
  const int cap = gemm_cap_from_env();
  if (cap < 0)
    return MPT_FAIL(MPT_EINVAL, "cpu_set_threads: MPT_GEMM_THREADS='%s' is not a thread count "
                    ">= 1", getenv("MPT_GEMM_THREADS"));
  /* OpenBLAS starts the threads it lacks from here: they inherit a mask with the asynchronous
   * signals blocked (core/threads.h) */
  sigset_t old;
  mpt__signals_block(&old);
  openblas_set_num_threads(cap && cap < n ? cap : n);
  mpt__signals_restore(&old);
  atomic_store(&ops_threads, n);
  return MPT_OK;
}

int mpt_cpu_threads(void) {
  const int n = atomic_load(&ops_threads);
  return n > 0 ? n : openblas_get_num_threads();
}

int mpt_cpu_gemm_threads(void) { return openblas_get_num_threads(); }

int mpt_cpu_threads_per_rank(int local_ranks, int devices) {
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const long share = (local_ranks > 0 ? local_ranks : 1) * (long)(devices > 0 ? devices : 1);
  const long n = cores > 0 ? cores / share : 1;
  return n >= 1 ? (int)n : 1;
}

const char *mpt_cpu_blas_name(void) { return openblas_get_corename(); }
