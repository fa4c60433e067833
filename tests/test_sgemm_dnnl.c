/* Tests of the fp32 CPU GEMM through oneDNN (src/core/cpu/sgemm_dnnl.c) and of its routing from
 * mpt_op_gemm (src/core/cpu/ops_cpu.c; the rule: src/core/cpu/gemm_choice.c). Built with oneDNN
 * only (src/core/local.mk).
 *
 * Oracle: OpenBLAS's cblas_sgemm on the same inputs, and a double-precision loop. Both float
 * results are within the classical dot-product bound of the exact one,
 *   |c - exact| <= gamma_{k+2} (|alpha| sum_p |a_ip b_pj| + |beta c0|),  gamma_n = n u / (1 - n u),
 * u = 2^-24 (Higham, "Accuracy and Stability of Numerical Algorithms", 3.1; the + 2 covers alpha
 * and the beta term), whatever the summation order, so oneDNN's and OpenBLAS's results (the same
 * products summed in a different order) may differ by at most twice that. An indexing or
 * transpose error moves an element by O(sum |a b|), far outside it. Padding columns (j >= n of C)
 * must stay untouched, and beta 0 must overwrite C without reading it (NaN does not survive), as
 * in BLAS. */
#include <cblas.h>
#include <check.h>
#include <float.h>
#include <math.h>
#include <oneapi/dnnl/dnnl.h>
#include <omp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "core/cpu/cpu.h"
#include "mpitrain/core.h"
#include "mpitrain/ops.h"
#include "check_util.h"


static double gamma_n(int64_t n) {
  const double e = ldexp((double)n, -24);
  return e / (1 - e);
}

static float *alloc_f(int64_t n) {
  float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
  ck_assert_ptr_nonnull(p);
  return p;
}

static void rand_fill(float *x, int64_t n, uint64_t seed) {
  mpt_rng r;
  mpt_rng_seed(&r, seed);
  mpt_rng_fill_uniform(&r, x, n, -1.0f, 1.0f);
}

typedef struct gcase {
  int ta, tb;
  int64_t m, n, k, pad;
  float alpha, beta;
} gcase;

/* Runs case g through oneDNN (mpt__cpu_sgemm_dnnl) and OpenBLAS and checks both against the
 * double loop and each other (bounds above). With beta 0, C starts as NaN. */
static void check_case(const gcase *g) {
  const int64_t lda = (g->ta ? g->m : g->k) + g->pad, ldb = (g->tb ? g->k : g->n) + g->pad;
  const int64_t ldc = g->n + g->pad, arows = g->ta ? g->k : g->m, brows = g->tb ? g->n : g->k;
  float *a = alloc_f(arows * lda), *b = alloc_f(brows * ldb), *c0 = alloc_f(g->m * ldc);
  float *cd = alloc_f(g->m * ldc), *co = alloc_f(g->m * ldc);
  rand_fill(a, arows * lda, 11 + (uint64_t)g->ta);
  rand_fill(b, brows * ldb, 13 + (uint64_t)g->tb);
  rand_fill(c0, g->m * ldc, 17);
  if (g->beta == 0.0f)
    for (int64_t i = 0; i < g->m * ldc; i++)
      if (i % ldc < g->n) c0[i] = NAN;
  memcpy(cd, c0, (size_t)(g->m * ldc) * sizeof *cd);
  memcpy(co, c0, (size_t)(g->m * ldc) * sizeof *co);
  OK(mpt__cpu_sgemm_dnnl(g->ta, g->tb, g->m, g->n, g->k, g->alpha, a, lda, b, ldb, g->beta, cd,
                         ldc));
  cblas_sgemm(CblasRowMajor, g->ta ? CblasTrans : CblasNoTrans, g->tb ? CblasTrans : CblasNoTrans,
              (int)g->m, (int)g->n, (int)g->k, g->alpha, a, (int)lda, b, (int)ldb, g->beta, co,
              (int)ldc);
  char what[160];
  snprintf(what, sizeof what, "ta=%d tb=%d m=%lld n=%lld k=%lld pad=%lld alpha=%g beta=%g", g->ta,
           g->tb, (long long)g->m, (long long)g->n, (long long)g->k, (long long)g->pad,
           (double)g->alpha, (double)g->beta);
  const double gam = gamma_n(g->k + 2);
  for (int64_t i = 0; i < g->m; i++)
    for (int64_t j = 0; j < ldc; j++) {
      const float got = cd[i * ldc + j], blas = co[i * ldc + j], old = c0[i * ldc + j];
      if (j >= g->n) {
        ck_assert_msg(memcmp(&got, &old, sizeof got) == 0, "%s: padding C[%lld, %lld] written",
                      what, (long long)i, (long long)j);
        continue;
      }
      double s = 0, mag = 0;
      for (int64_t p = 0; p < g->k; p++) {
        const double av = g->ta ? a[p * lda + i] : a[i * lda + p];
        const double bv = g->tb ? b[j * ldb + p] : b[p * ldb + j];
        s += av * bv;
        mag += fabs(av * bv);
      }
      const double cterm = g->beta == 0.0f ? 0.0 : (double)g->beta * old;
      const double want = (double)g->alpha * s + cterm;
      const double tol = gam * (fabs((double)g->alpha) * mag + fabs(cterm));
      ck_assert_msg(fabs(got - want) <= tol, "%s: C[%lld, %lld] = %.9g, exact %.9g (tol %.3g)",
                    what, (long long)i, (long long)j, (double)got, want, tol);
      ck_assert_msg(fabs((double)got - blas) <= 2 * tol,
                    "%s: C[%lld, %lld] = %.9g, OpenBLAS %.9g (tol %.3g)", what, (long long)i,
                    (long long)j, (double)got, (double)blas, 2 * tol);
    }
  free(a);
  free(b);
  free(c0);
  free(cd);
  free(co);
}

/* Every transpose pair, beta 0 / 1 / -0.5, alpha 1 / 0.75, tight and padded leading
 * dimensions, sizes 1, odd sizes, and sizes past oneDNN's blocking (and GPT-like thin ones). */
static void check_all(void) {
  static const int64_t sizes[][3] = {{1, 1, 1},  {1, 7, 5},   {6, 1, 9},     {5, 7, 1},
                                     {7, 5, 9},  {2, 3, 1},   {67, 45, 130}, {130, 67, 45},
                                     {33, 1, 257}, {1, 65, 129}, {64, 64, 300}, {257, 96, 64}};
  static const float betas[] = {0.0f, 1.0f, -0.5f}, alphas[] = {1.0f, 0.75f};
  for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++)
    for (int t = 0; t < 4; t++)
      for (int bi = 0; bi < 3; bi++)
        for (int ai = 0; ai < 2; ai++)
          for (int64_t pad = 0; pad <= 3; pad += 3) {
            const gcase g = {t & 1, t >> 1, sizes[s][0], sizes[s][1], sizes[s][2], pad,
                             alphas[ai], betas[bi]};
            check_case(&g);
          }
}

START_TEST(test_sgemm_dnnl_within_bound_of_openblas_one_thread) {
  OK(mpt_cpu_set_threads(1));
  check_all();
}
END_TEST

START_TEST(test_sgemm_dnnl_within_bound_of_openblas_two_threads) {
  OK(mpt_cpu_set_threads(2));
  check_all();
  OK(mpt_cpu_set_threads(1));
}
END_TEST

/* Runs mpt_op_gemm and the oneDNN path on one GPT-like product (dX of a Linear, 96 x 64 x 1152,
 * beta 0) into cg and cd; co gets OpenBLAS's. */
static void three_ways(int64_t m, int64_t n, int64_t k, float *cg, float *cd, float *co) {
  float *a = alloc_f(m * k), *b = alloc_f(k * n);
  rand_fill(a, m * k, 21);
  rand_fill(b, k * n, 23);
  OK(mpt_op_gemm(NULL, 0, 0, m, n, k, 1.0f, a, k, b, n, 0.0f, cg, n));
  OK(mpt__cpu_sgemm_dnnl(0, 0, m, n, k, 1.0f, a, k, b, n, 0.0f, cd, n));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)m, (int)n, (int)k, 1.0f, a, (int)k,
              b, (int)n, 0.0f, co, (int)n);
  free(a);
  free(b);
}

/* With --gemm onednn (mpt_cpu_set_gemm) the op goes to oneDNN: bit for bit its result, which
 * here differs from OpenBLAS's (checked, so that the test cannot pass with both paths giving the
 * same bits). The same call twice gives the same bits (a run is reproducible). With --gemm
 * openblas the same op gives OpenBLAS's bits. */
START_TEST(test_gemm_goes_to_onednn_and_is_reproducible) {
  const int64_t m = 96, n = 64, k = 1152;
  OK(mpt_cpu_set_gemm(MPT_CPU_GEMM_ONEDNN));
  ck_assert(mpt__cpu_sgemm_dnnl_wanted(m, n, k));
  float *cg = alloc_f(m * n), *cd = alloc_f(m * n), *co = alloc_f(m * n), *c2 = alloc_f(m * n);
  for (int threads = 1; threads <= 2; threads++) {
    OK(mpt_cpu_set_threads(threads));
    three_ways(m, n, k, cg, cd, co);
    ck_assert_msg(memcmp(cd, co, (size_t)(m * n) * sizeof *cd) != 0,
                  "oneDNN and OpenBLAS agree bit for bit here: the routing is not observable");
    ck_assert_msg(memcmp(cg, cd, (size_t)(m * n) * sizeof *cg) == 0,
                  "mpt_op_gemm is not oneDNN's result (%d threads)", threads);
    three_ways(m, n, k, c2, cd, co);
    ck_assert_msg(memcmp(cg, c2, (size_t)(m * n) * sizeof *cg) == 0,
                  "two identical calls differ (%d threads)", threads);
  }
  OK(mpt_cpu_set_gemm(MPT_CPU_GEMM_OPENBLAS));
  ck_assert(!mpt__cpu_sgemm_dnnl_wanted(m, n, k));
  three_ways(m, n, k, cg, cd, co);
  ck_assert_msg(memcmp(cg, co, (size_t)(m * n) * sizeof *cg) == 0,
                "--gemm openblas: mpt_op_gemm is not OpenBLAS's result");
  OK(mpt_cpu_set_gemm(MPT_CPU_GEMM_AUTO));
  OK(mpt_cpu_set_threads(1));
  free(cg);
  free(cd);
  free(co);
  free(c2);
}
END_TEST

/* GPT-like products for the thread-count tests: a Linear's forward, dX and dW at M = 2048 (dW
 * sums over K = 2048 rows), a dW over a long K with a small output (where a library may split K
 * over the threads: oneDNN's AVX2 kernels give other bits at 2 threads than at 1 for the
 * 64 x 64 x 65536 one), and an attention block. {ta, tb, m, n, k}; beta 1 for the dW
 * (transposed A) cases, else 0. */
static const int64_t thread_cases[][5] = {{0, 1, 2048, 1152, 384}, {0, 0, 2048, 384, 1152},
                                          {1, 0, 1152, 384, 2048}, {1, 0, 64, 64, 65536},
                                          {1, 0, 16, 16, 100000},  {0, 1, 64, 256, 64}};
enum { THREAD_CASES = sizeof thread_cases / sizeof thread_cases[0] };

typedef struct tcase {
  int ta, tb;
  int64_t m, n, k;
  float beta;
  float *a, *b, *c0; /* the operands and C's initial value */
} tcase;

static tcase tcase_make(int ci) {
  const int64_t *d = thread_cases[ci];
  tcase t = {(int)d[0], (int)d[1], d[2], d[3], d[4], d[0] ? 1.0f : 0.0f, NULL, NULL, NULL};
  t.a = alloc_f(t.m * t.k);
  t.b = alloc_f(t.k * t.n);
  t.c0 = alloc_f(t.m * t.n);
  rand_fill(t.a, t.m * t.k, 41);
  rand_fill(t.b, t.k * t.n, 43);
  rand_fill(t.c0, t.m * t.n, 47);
  return t;
}

static void tcase_free(tcase *t) {
  free(t->a);
  free(t->b);
  free(t->c0);
}

/* c = the case's C after mpt_op_gemm at the current thread count (tight leading dimensions). */
static void tcase_run(const tcase *t, float *c) {
  memcpy(c, t->c0, (size_t)(t->m * t->n) * sizeof *c);
  OK(mpt_op_gemm(NULL, t->ta, t->tb, t->m, t->n, t->k, 1.0f, t->a, t->ta ? t->m : t->k, t->b,
                 t->tb ? t->k : t->n, t->beta, c, t->n));
}

/* The same thread count gives the same bits, call after call (a run is reproducible at a given
 * --threads), at 1, 2 and 3 threads. */
START_TEST(test_gemm_same_bits_run_to_run_at_each_thread_count) {
  for (int ci = 0; ci < THREAD_CASES; ci++) {
    tcase t = tcase_make(ci);
    float *c1 = alloc_f(t.m * t.n), *c2 = alloc_f(t.m * t.n);
    for (int threads = 1; threads <= 3; threads++) {
      OK(mpt_cpu_set_threads(threads));
      tcase_run(&t, c1);
      tcase_run(&t, c2);
      ck_assert_msg(memcmp(c1, c2, (size_t)(t.m * t.n) * sizeof *c1) == 0,
                    "ta=%d tb=%d %lld x %lld x %lld at %d threads: two calls differ", t.ta, t.tb,
                    (long long)t.m, (long long)t.n, (long long)t.k, threads);
    }
    free(c1);
    free(c2);
    tcase_free(&t);
  }
  OK(mpt_cpu_set_threads(1));
}
END_TEST

/* The GEMMs are not promised the same bits at every thread count (include/mpitrain/ops.h, "CPU
 * threads"): each count's result must be within the dot-product bound of the exact one instead,
 * |c - exact| <= gamma_{k+2} (sum_p |a_ip b_pj| + |beta c0|) (file comment), at 1, 2 and 3
 * threads. The exact result is a double loop (row i of C as a sum of rows of B scaled by
 * A[i, p], which vectorizes). */
START_TEST(test_gemm_within_bound_of_exact_at_every_thread_count) {
  for (int ci = 0; ci < THREAD_CASES; ci++) {
    tcase t = tcase_make(ci);
    const int64_t lda = t.ta ? t.m : t.k, ldb = t.tb ? t.k : t.n;
    double *bd = malloc((size_t)(t.k * t.n) * sizeof(double));
    double *sum = malloc((size_t)t.n * sizeof(double)), *mag = malloc((size_t)t.n * sizeof(double));
    double *want = malloc((size_t)(t.m * t.n) * sizeof(double));
    double *tol = malloc((size_t)(t.m * t.n) * sizeof(double));
    ck_assert(bd && sum && mag && want && tol);
    for (int64_t p = 0; p < t.k; p++) /* B as [k, n] in double */
      for (int64_t j = 0; j < t.n; j++)
        bd[p * t.n + j] = t.tb ? t.b[j * ldb + p] : t.b[p * ldb + j];
    const double gam = gamma_n(t.k + 2);
    for (int64_t i = 0; i < t.m; i++) {
      for (int64_t j = 0; j < t.n; j++) sum[j] = mag[j] = 0.0;
      for (int64_t p = 0; p < t.k; p++) {
        const double av = t.ta ? t.a[p * lda + i] : t.a[i * lda + p];
        const double *br = bd + p * t.n;
        for (int64_t j = 0; j < t.n; j++) {
          sum[j] += av * br[j];
          mag[j] += fabs(av * br[j]);
        }
      }
      for (int64_t j = 0; j < t.n; j++) {
        const double cterm = (double)t.beta * t.c0[i * t.n + j];
        want[i * t.n + j] = sum[j] + cterm;
        tol[i * t.n + j] = gam * (mag[j] + fabs(cterm));
      }
    }
    float *c = alloc_f(t.m * t.n);
    for (int threads = 1; threads <= 3; threads++) {
      OK(mpt_cpu_set_threads(threads));
      tcase_run(&t, c);
      for (int64_t e = 0; e < t.m * t.n; e++)
        if (!(fabs(c[e] - want[e]) <= tol[e]))
          ck_abort_msg("ta=%d tb=%d %lld x %lld x %lld at %d threads: C[%lld] = %.9g, exact "
                       "%.9g (tol %.3g)", t.ta, t.tb, (long long)t.m, (long long)t.n,
                       (long long)t.k, threads, (long long)e, (double)c[e], want[e], tol[e]);
    }
    free(c);
    free(bd);
    free(sum);
    free(mag);
    free(want);
    free(tol);
    tcase_free(&t);
  }
  OK(mpt_cpu_set_threads(1));
}
END_TEST

/* MPT_GEMM_THREADS=1 (ops.h: the testing switch that tests/test_train_gpt_threads.sh uses)
 * pins the GEMMs to one thread while the library's own ops keep the count: at 2 and 3 threads
 * every case gives the bits of 1 thread (a GEMM that did not follow the cap would differ on an
 * AVX2 CPU, or with ONEDNN_MAX_CPU_ISA=AVX2, in the 64 x 64 x 65536 case), and
 * mpt_cpu_threads() is still the count. A bad value is refused. */
START_TEST(test_gemm_threads_env_pins_the_gemms_only) {
  ck_assert_int_eq(setenv("MPT_GEMM_THREADS", "1", 1), 0);
  for (int ci = 0; ci < THREAD_CASES; ci++) {
    tcase t = tcase_make(ci);
    float *c1 = alloc_f(t.m * t.n), *cn = alloc_f(t.m * t.n);
    OK(mpt_cpu_set_threads(1));
    tcase_run(&t, c1);
    for (int threads = 2; threads <= 3; threads++) {
      OK(mpt_cpu_set_threads(threads));
      ck_assert_int_eq(mpt_cpu_threads(), threads);
      ck_assert_int_eq(mpt_cpu_gemm_threads(), 1);
      ck_assert_int_eq(mpt__cpu_sgemm_dnnl_threads(2048, 384, 256), 1);
      tcase_run(&t, cn);
      ck_assert_msg(memcmp(c1, cn, (size_t)(t.m * t.n) * sizeof *c1) == 0,
                    "ta=%d tb=%d %lld x %lld x %lld: MPT_GEMM_THREADS=1 at %d threads gives "
                    "other bits than 1 thread", t.ta, t.tb, (long long)t.m, (long long)t.n,
                    (long long)t.k, threads);
    }
    free(c1);
    free(cn);
    tcase_free(&t);
  }
  ck_assert_int_eq(setenv("MPT_GEMM_THREADS", "2", 1), 0);
  OK(mpt_cpu_set_threads(3));
  ck_assert_int_eq(mpt_cpu_gemm_threads(), 2);
  OK(mpt_cpu_set_threads(1));
  ck_assert_int_eq(mpt_cpu_gemm_threads(), 1);
  static const char *const bad[] = {"0", "-1", "two", "1x", " "};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ck_assert_int_eq(setenv("MPT_GEMM_THREADS", bad[i], 1), 0);
    ck_assert_int_eq(mpt_cpu_set_threads(2), MPT_EINVAL);
    ck_assert_ptr_nonnull(strstr(mpt_last_error(), "MPT_GEMM_THREADS"));
  }
  ck_assert_int_eq(unsetenv("MPT_GEMM_THREADS"), 0);
  OK(mpt_cpu_set_threads(2));
  ck_assert_int_eq(mpt_cpu_threads(), 2);
  ck_assert_int_eq(mpt_cpu_gemm_threads(), 2);
  OK(mpt_cpu_set_threads(1));
}
END_TEST

/* mpt_cpu_set_threads governs oneDNN too: after a GEMM above the small-product limit (256^3),
 * the calling thread's OpenMP team size is OpenBLAS's thread count; a small product (an
 * attention block, 64 x 512 x 64) runs on one thread whatever the count. */
START_TEST(test_gemm_threads_follow_cpu_set_threads) {
  const int64_t n = 256;
  OK(mpt_cpu_set_gemm(MPT_CPU_GEMM_ONEDNN)); /* under auto, AVX2 sends 256^3 to OpenBLAS */
  float *a = calloc((size_t)(n * n), sizeof *a), *c = alloc_f(n * n);
  ck_assert_ptr_nonnull(a);
  for (int threads = 2; threads >= 1; threads--) {
    OK(mpt_cpu_set_threads(threads));
    omp_set_num_threads(5);
    OK(mpt_op_gemm(NULL, 0, 0, n, n, n, 1.0f, a, n, a, n, 0.0f, c, n));
    ck_assert_int_eq(omp_get_max_threads(), threads);
    ck_assert_int_eq(mpt__cpu_sgemm_dnnl_threads(n, n, n), threads);
    ck_assert_int_eq(mpt__cpu_sgemm_dnnl_threads(64, 512, 64), 1);
    ck_assert_int_eq(mpt__cpu_sgemm_dnnl_threads(2048, 384, 256), threads); /* gpt-mini's head */
  }
  OK(mpt_cpu_set_gemm(MPT_CPU_GEMM_AUTO));
  free(a);
  free(c);
}
END_TEST

/* A dot product (m = n = 1, the clipping's squared norm) stays on OpenBLAS. */
START_TEST(test_gemm_dot_stays_on_openblas) {
  ck_assert(!mpt__cpu_sgemm_dnnl_wanted(1, 1, 1000));
  ck_assert(!mpt__cpu_sgemm_dnnl_wanted(4, 4, 0));
  OK(mpt_cpu_set_gemm(MPT_CPU_GEMM_ONEDNN)); /* even when oneDNN is asked for */
  ck_assert_int_eq(mpt_cpu_gemm_for(1, 1, 1000), MPT_CPU_GEMM_OPENBLAS);
  ck_assert_int_eq(mpt_cpu_gemm_for(1, 300, 1000), MPT_CPU_GEMM_OPENBLAS);
  ck_assert_int_eq(mpt_cpu_gemm_for(4, 4, 0), MPT_CPU_GEMM_OPENBLAS);
  float x[1000], got = 0, want = 0;
  rand_fill(x, 1000, 29);
  OK(mpt_op_gemm(NULL, 0, 0, 1, 1, 1000, 1.0f, x, 1000, x, 1, 0.0f, &got, 1));
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, 1, 1000, 1.0f, x, 1000, x, 1, 0.0f,
              &want, 1);
  ck_assert(memcmp(&got, &want, sizeof got) == 0);
  OK(mpt_cpu_set_gemm(MPT_CPU_GEMM_AUTO));
}
END_TEST

/* The auto rule (ops.h, "CPU GEMM library"), against oneDNN's own report of its instruction
 * set: with AVX-512 kernels every product with m, n > 1 goes to oneDNN; with AVX2 kernels (an
 * AVX2-only CPU, or MPT_CPU_ISA=avx2) a product goes to oneDNN from 2^27 multiply-adds on and
 * to OpenBLAS below. The settings read back, and a bad one is refused. */
START_TEST(test_gemm_auto_rule_and_settings) {
  OK(mpt_cpu_isa_init());
  const unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
  const unsigned avx512_core = (unsigned)dnnl_cpu_isa_avx512_core;
  const int avx512 = (isa & avx512_core) == avx512_core;
  ck_assert_int_eq(mpt_cpu_gemm_setting(), MPT_CPU_GEMM_AUTO);
  const mpt_cpu_gemm below = avx512 ? MPT_CPU_GEMM_ONEDNN : MPT_CPU_GEMM_OPENBLAS;
  ck_assert_int_eq(mpt_cpu_gemm_for(64, 512, 784), below);                 /* the mlp's fc1 */
  ck_assert_int_eq(mpt_cpu_gemm_for(64, 2048, 1023), below);               /* 2^27 - 2^17 */
  ck_assert_int_eq(mpt_cpu_gemm_for(64, 2048, 1024), MPT_CPU_GEMM_ONEDNN);  /* 2^27 */
  ck_assert_int_eq(mpt_cpu_gemm_for(2048, 384, 384), MPT_CPU_GEMM_ONEDNN);  /* gpt-mini attproj */
  OK(mpt_cpu_set_gemm(MPT_CPU_GEMM_OPENBLAS));
  ck_assert_int_eq(mpt_cpu_gemm_setting(), MPT_CPU_GEMM_OPENBLAS);
  ck_assert_int_eq(mpt_cpu_gemm_for(2048, 384, 384), MPT_CPU_GEMM_OPENBLAS);
  OK(mpt_cpu_set_gemm(MPT_CPU_GEMM_ONEDNN));
  ck_assert_int_eq(mpt_cpu_gemm_for(64, 512, 784), MPT_CPU_GEMM_ONEDNN);
  ck_assert_int_eq(mpt_cpu_set_gemm((mpt_cpu_gemm)7), MPT_EINVAL);
  ck_assert_int_eq(mpt_cpu_gemm_setting(), MPT_CPU_GEMM_ONEDNN); /* unchanged */
  ck_assert_str_eq(mpt_cpu_gemm_name(MPT_CPU_GEMM_ONEDNN), "onednn");
  ck_assert_str_eq(mpt_cpu_gemm_name(MPT_CPU_GEMM_OPENBLAS), "openblas");
  ck_assert_str_eq(mpt_cpu_gemm_name(MPT_CPU_GEMM_AUTO), "auto");
  ck_assert_str_eq(mpt_cpu_gemm_name((mpt_cpu_gemm)7), "unknown");
  OK(mpt_cpu_set_gemm(MPT_CPU_GEMM_AUTO));
}
END_TEST

/* Current virtual size of this process (VmSize), in bytes; 0 if unknown. */
static unsigned long long vm_size_bytes(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  unsigned long long kib = 0;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmSize: %llu kB", &kib) == 1) break;
  if (f) fclose(f);
  return kib * 1024;
}

typedef struct dot_job {
  mpt_status st;
  char detail[512];
  double seconds;
} dot_job;

/* A new thread's first GEMM that stays on OpenBLAS (the dot), under an address-space limit 64
 * MiB above what the process maps (below OpenBLAS's 128 MiB per-thread buffer). */
static void *dot_under_limit(void *arg) {
  dot_job *job = arg;
  float x[64], out = 0;
  rand_fill(x, 64, 31);
  struct rlimit old, tight;
  getrlimit(RLIMIT_AS, &old);
  tight = old;
  tight.rlim_cur = (rlim_t)(vm_size_bytes() + (64ull << 20));
  setrlimit(RLIMIT_AS, &tight);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  job->st = mpt_op_gemm(NULL, 0, 0, 1, 1, 64, 1.0f, x, 64, x, 1, 0.0f, &out, 1);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  setrlimit(RLIMIT_AS, &old);
  snprintf(job->detail, sizeof job->detail, "%s", mpt_last_error());
  job->seconds = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  return NULL;
}

/* The OpenBLAS guard (ops_cpu.c blas_thread_prepare) still protects what stays on OpenBLAS: a
 * thread that cannot map OpenBLAS's buffer gets MPT_ENOMEM naming OpenBLAS at once instead of
 * spinning in OpenBLAS's allocation loop. (tests/test_dp.c tested it through a DataParallel
 * replica's Linear GEMMs, which now go to oneDNN.) Runs in Check's child process. */
START_TEST(test_openblas_thread_without_buffer_memory_fails_at_once) {
  pthread_t t;
  dot_job job = {MPT_OK, "", 0};
  ck_assert_int_eq(pthread_create(&t, NULL, dot_under_limit, &job), 0);
  ck_assert_int_eq(pthread_join(t, NULL), 0);
  ck_assert_msg(job.st == MPT_ENOMEM, "status %s: %s", mpt_status_name(job.st), job.detail);
  ck_assert_msg(strstr(job.detail, "OpenBLAS") != NULL, "detail: %s", job.detail);
  ck_assert_msg(job.seconds < 2.0, "the GEMM took %.1f s to fail", job.seconds);
}
END_TEST

int main(void) {
  Suite *s = suite_create("sgemm_dnnl");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_sgemm_dnnl_within_bound_of_openblas_one_thread);
  tcase_add_test(tc, test_sgemm_dnnl_within_bound_of_openblas_two_threads);
  tcase_add_test(tc, test_gemm_goes_to_onednn_and_is_reproducible);
  tcase_add_test(tc, test_gemm_same_bits_run_to_run_at_each_thread_count);
  tcase_add_test(tc, test_gemm_within_bound_of_exact_at_every_thread_count);
  tcase_add_test(tc, test_gemm_threads_env_pins_the_gemms_only);
  tcase_add_test(tc, test_gemm_threads_follow_cpu_set_threads);
  tcase_add_test(tc, test_gemm_dot_stays_on_openblas);
  tcase_add_test(tc, test_gemm_auto_rule_and_settings);
  tcase_add_test(tc, test_openblas_thread_without_buffer_memory_fails_at_once);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
