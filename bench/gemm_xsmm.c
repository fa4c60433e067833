/* mpt_gemm_bench's libxsmm backend (built when configure finds libxsmm: --with-libxsmm; Debian
 * libxsmm-dev, a static library). libxsmm (Heinecke et al., SC'16) JIT-compiles one kernel per
 * product (m, n, k, leading dimensions, alpha, beta, transposes) for the CPU's instruction set
 * (LIBXSMM_TARGET=hsw caps it at AVX2), column-major and without packing the operands: made for
 * the small products of the mlp and the attention's blocks. A candidate the library does not use
 * unless this bench shows it faster.
 *
 * A row-major product C = op(A) op(B) is, on the same arrays read column-major, the product
 * C^T = op(B)^T op(A)^T: M' = n, N' = m, K' = k, B's array first with B's transpose flag and
 * A's array second with A's. libxsmm 1.17 makes no kernel for a transposed first operand, so a
 * row-major product with B transposed (the Linear's forward, the attention's scores) first
 * transposes B with libxsmm_otrans into a scratch buffer, inside the timed call: the cost a
 * caller would pay (a caller could keep the weights transposed across a step; the bench does
 * not). Kernels come from libxsmm's registry on every call (a hash lookup), as a caller without
 * a plan would get them. One thread: libxsmm's kernels run on the calling thread. */
#include <libxsmm.h>
#include <stdio.h>
#include <stdlib.h>

static float *scratch;
static size_t scratch_count;

/* C = alpha op(A) op(B) + beta C, row-major as cblas_sgemm; 0, or -1 when libxsmm made no
 * kernel or the scratch could not grow. */
int mpt_bench_xsmm_sgemm(int ta, int tb, long m, long n, long k, float alpha, const float *a,
                         long lda, const float *b, long ldb, float beta, float *c, long ldc) {
  const float *first = b;
  libxsmm_blasint ld_first = ldb;
  if (tb) { /* B is [n, k] row-major: make B^T [k, n] row-major, i.e. tight with ld n */
    const size_t need = (size_t)k * (size_t)n;
    if (need > scratch_count) {
      float *p = realloc(scratch, need * sizeof *p);
      if (!p) return -1;
      scratch = p, scratch_count = need;
    }
    /* column-major: in is [k, n] with ld ldb (B's array), out [n, k] with ld n */
    libxsmm_otrans(scratch, b, sizeof(float), k, n, ldb, n);
    first = scratch, ld_first = n;
  }
  const int flags = ta ? LIBXSMM_GEMM_FLAG_TRANS_B : LIBXSMM_GEMM_FLAG_NONE;
  const libxsmm_blasint lda_ = lda, ldc_ = ldc;
  const libxsmm_smmfunction kernel =
      libxsmm_smmdispatch(n, m, k, &ld_first, &lda_, &ldc_, &alpha, &beta, &flags, NULL);
  if (!kernel) return -1;
  kernel(first, a, c);
  return 0;
}

const char *mpt_bench_xsmm_arch(void) {
  libxsmm_init();
  return libxsmm_get_target_arch();
}
