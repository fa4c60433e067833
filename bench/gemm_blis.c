/* mpt_gemm_bench's BLIS backend (built when configure finds BLIS: --with-blis). Kept in a file of
 * its own because blis.h declares its own CBLAS and BLAS prototypes, which clash with OpenBLAS's
 * cblas.h. BLIS's typed API takes a row stride and a column stride per operand, so the row-major
 * products of the bench go in without copies: a row-major operand with leading dimension ld is
 * (rs ld, cs 1), and the transpose flag says whether the product uses it or its transpose. */
#include <blis.h>

void mpt_bench_blis_threads(int threads) { bli_thread_set_num_threads(threads); }

void mpt_bench_blis_sgemm(int ta, int tb, long m, long n, long k, float alpha, const float *a,
                          long lda, const float *b, long ldb, float beta, float *c, long ldc) {
  bli_sgemm(ta ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, tb ? BLIS_TRANSPOSE : BLIS_NO_TRANSPOSE, m, n,
            k, &alpha, (float *)a, lda, 1, (float *)b, ldb, 1, &beta, c, ldc, 1);
}

const char *mpt_bench_blis_arch(void) { return bli_arch_string(bli_arch_query_id()); }
