/* Tests of bf16 compute (include/mpitrain/ops_bf16.h; src/core/cpu/gemm_dnnl.c, conv_dnnl.c;
 * the tape's precision, src/nn/tape.c, tape_backward.c, ops_basic.c, gpt_ops.c).
 *
 * Bounds (ops_bf16.h): each input rounded to bf16 has relative error at most u = 2^-8; a product
 * of two bf16 values is exact in float; K products summed in float add at most gamma_K =
 * K 2^-24 / (1 - K 2^-24) relative to sum |a||b|. So every element of a bf16 GEMM is within
 *   (2u + u^2 + gamma_K (1 + u)^2) |alpha| sum_k |a_ik b_kj|  (+ 2^-23 |beta c| for beta C)
 * of the exact result (computed here in double from the float inputs). The same bound with the
 * float inputs replaced by their bf16 roundings (computed here with mpt_bf16_from_f32) drops
 * the 2u + u^2 term: that checks the rounding is the one documented (to nearest even). With
 * inputs exactly representable in bf16 and sums exact in float (small integers) the bf16 op
 * must equal the float32 op bit for bit. Each bound test also checks that the result is NOT
 * the float32 one (the error exceeds gamma_K somewhere), so a silent float32 fallback fails.
 * The whole program skips (77) on a machine whose CPU or build has no bf16 (the refusal itself
 * is tested with MPT_TEST_NO_BF16_CPU in fault-injection builds, below, and by
 * tests/test_precision.sh). */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config.h"
#include "mpitrain/autograd.h"
#include "mpitrain/core.h"
#include "mpitrain/nn.h"
#include "mpitrain/ops.h"
#include "mpitrain/ops_bf16.h"
#include "mpitrain/transformer.h"
#include "check_util.h"


static const double U = 1.0 / 256; /* 2^-8: bf16 keeps 8 significant bits */

static double gamma_k(int64_t k) {
  const double e = ldexp((double)k, -24);
  return e / (1 - e);
}

static float *alloc_f(int64_t n) {
  float *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
  ck_assert_ptr_nonnull(p);
  return p;
}

static void rand_fill(float *x, int64_t n, uint64_t seed, float lo, float hi) {
  mpt_rng r;
  mpt_rng_seed(&r, seed);
  mpt_rng_fill_uniform(&r, x, n, lo, hi);
}

/* Integers in [-8, 8]: exact in bf16; sums of a few hundred products exact in float. */
static void int_fill(float *x, int64_t n, uint64_t seed) {
  mpt_rng r;
  mpt_rng_seed(&r, seed);
  for (int64_t i = 0; i < n; i++) x[i] = (float)mpt_rng_below(&r, 17) - 8.0f;
}

static double bf(float x) { return (double)mpt_bf16_to_f32(mpt_bf16_from_f32(x)); }

/* ---- GEMM ---- */

/* op(A)[i, l] and op(B)[l, j] of row-major storage with leading dimensions. */
static float at(const float *a, int trans, int64_t ld, int64_t i, int64_t l) {
  return trans ? a[l * ld + i] : a[i * ld + l];
}

START_TEST(test_bf16_gemm_within_bound_all_transposes) {
  const int64_t m = 37, n = 29, k = 300;
  const int ta = _i & 1, tb = (_i >> 1) & 1;
  const int64_t lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;
  float *a = alloc_f((ta ? k : m) * lda), *b = alloc_f((tb ? n : k) * ldb);
  float *c0 = alloc_f(m * ldc), *c = alloc_f(m * ldc);
  rand_fill(a, (ta ? k : m) * lda, 1 + _i, -1, 1);
  rand_fill(b, (tb ? n : k) * ldb, 11 + _i, -2, 2);
  rand_fill(c0, m * ldc, 21 + _i, -1, 1);
  const float alpha = 0.75f;
  for (int with_beta = 0; with_beta < 2; with_beta++) {
    const float beta = with_beta ? 1.0f : 0.0f;
    memcpy(c, c0, (size_t)(m * ldc) * sizeof *c);
    OK(mpt_op_gemm_bf16(NULL, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
    double worst_vs_f32 = 0; /* the largest error relative to gamma_K sum |a b| */
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        double exact = 0, rounded = 0, mag = 0;
        for (int64_t l = 0; l < k; l++) {
          const float x = at(a, ta, lda, i, l), y = at(b, tb, ldb, l, j);
          exact += (double)x * y;
          rounded += bf(x) * bf(y);
          mag += fabs((double)x * y);
        }
        exact = alpha * exact + beta * (double)c0[i * ldc + j];
        rounded = alpha * rounded + beta * (double)c0[i * ldc + j];
        const double got = c[i * ldc + j], bmag = fabs(beta * (double)c0[i * ldc + j]);
        const double g = gamma_k(k + 1);
        const double tol = (2 * U + U * U + g * (1 + U) * (1 + U)) * alpha * mag + 0x1p-23 * bmag;
        ck_assert_msg(fabs(got - exact) <= tol, "ta %d tb %d beta %g C[%lld,%lld] = %.9g, exact "
                      "%.9g, tol %.3g", ta, tb, (double)beta, (long long)i, (long long)j, got,
                      exact, tol);
        /* against the product of the bf16-rounded inputs: only the float accumulation */
        const double tol_r = g * (1 + U) * (1 + U) * alpha * mag + 0x1p-23 * bmag;
        ck_assert_msg(fabs(got - rounded) <= tol_r, "ta %d tb %d C[%lld,%lld] = %.9g, product "
                      "of rounded inputs %.9g, tol %.3g (not rounded to nearest even?)", ta, tb,
                      (long long)i, (long long)j, got, rounded, tol_r);
        const double r = fabs(got - exact) / (g * alpha * mag);
        if (r > worst_vs_f32) worst_vs_f32 = r;
      }
    ck_assert_msg(worst_vs_f32 > 2, "the bf16 GEMM is as accurate as float32 (worst error %.3g "
                  "gamma_K sum|ab|): its inputs were not rounded", worst_vs_f32);
  }
  free(a);
  free(b);
  free(c0);
  free(c);
}
END_TEST

START_TEST(test_bf16_gemm_exact_inputs_equal_fp32) {
  const int64_t m = 19, n = 23, k = 64;
  const int ta = _i & 1, tb = (_i >> 1) & 1;
  float *a = alloc_f(m * k), *b = alloc_f(k * n), *c32 = alloc_f(m * n), *c16 = alloc_f(m * n);
  int_fill(a, m * k, 3);
  int_fill(b, k * n, 4);
  int_fill(c32, m * n, 5);
  memcpy(c16, c32, (size_t)(m * n) * sizeof *c16);
  OK(mpt_op_gemm(NULL, ta, tb, m, n, k, 1.0f, a, ta ? m : k, b, tb ? k : n, 1.0f, c32, n));
  OK(mpt_op_gemm_bf16(NULL, ta, tb, m, n, k, 1.0f, a, ta ? m : k, b, tb ? k : n, 1.0f, c16, n));
  ck_assert_msg(memcmp(c32, c16, (size_t)(m * n) * sizeof *c16) == 0,
                "ta %d tb %d: bf16 GEMM of small integers differs from float32", ta, tb);
  /* beta = 0 overwrites, alpha a power of two stays exact */
  for (int64_t i = 0; i < m * n; i++) c16[i] = NAN;
  OK(mpt_op_gemm(NULL, ta, tb, m, n, k, 0.5f, a, ta ? m : k, b, tb ? k : n, 0.0f, c32, n));
  OK(mpt_op_gemm_bf16(NULL, ta, tb, m, n, k, 0.5f, a, ta ? m : k, b, tb ? k : n, 0.0f, c16, n));
  ck_assert(memcmp(c32, c16, (size_t)(m * n) * sizeof *c16) == 0);
  free(a);
  free(b);
  free(c32);
  free(c16);
}
END_TEST

/* More shapes than a thread keeps plans for (128): the least recently used are evicted and
 * rebuilt when needed again, every result still exact. */
START_TEST(test_bf16_gemm_many_shapes_evict_plans) {
  const int64_t n = 8, k = 16, shapes = 150;
  float *a = alloc_f(shapes * k), *b = alloc_f(k * n), *c32 = alloc_f(shapes * n);
  float *c16 = alloc_f(shapes * n);
  int_fill(a, shapes * k, 7);
  int_fill(b, k * n, 8);
  for (int pass = 0; pass < 2; pass++)
    for (int64_t m = 1; m <= shapes; m++) {
      OK(mpt_op_gemm(NULL, 0, 0, m, n, k, 1.0f, a, k, b, n, 0.0f, c32, n));
      OK(mpt_op_gemm_bf16(NULL, 0, 0, m, n, k, 1.0f, a, k, b, n, 0.0f, c16, n));
      ck_assert_msg(memcmp(c32, c16, (size_t)(m * n) * sizeof(float)) == 0, "m %lld pass %d",
                    (long long)m, pass);
    }
  free(a);
  free(b);
  free(c32);
  free(c16);
}
END_TEST

/* Ties round to the even neighbour: 1 + 2^-8 -> 1, 1 + 3 2^-8 -> 1 + 2^-6; above a tie rounds
 * up: 1 + 2^-8 + 2^-20 -> 1 + 2^-7. A 1x1x1 GEMM with b = 1 shows the rounded a. */
START_TEST(test_bf16_gemm_rounds_to_nearest_even) {
  const float in[3] = {1 + 0x1p-8f, 1 + 3 * 0x1p-8f, 1 + 0x1p-8f + 0x1p-20f};
  const float want[3] = {1.0f, 1 + 0x1p-6f, 1 + 0x1p-7f};
  const float one = 1.0f;
  for (int i = 0; i < 3; i++) {
    float c = 0;
    OK(mpt_op_gemm_bf16(NULL, 0, 0, 1, 1, 1, 1.0f, &in[i], 1, &one, 1, 0.0f, &c, 1));
    ck_assert_msg(c == want[i], "bf16(%.9g) = %.9g, want %.9g", (double)in[i], (double)c,
                  (double)want[i]);
  }
}
END_TEST

START_TEST(test_bf16_gemm_arguments) {
  float x = 1, c = 3;
  ck_assert_int_eq(mpt_op_gemm_bf16(NULL, 0, 0, 2, 2, 2, 1.0f, NULL, 2, &x, 2, 0.0f, &c, 2),
                   MPT_EINVAL);
  ck_assert_int_eq(mpt_op_gemm_bf16(NULL, 0, 0, 1, 1, 1, 1.0f, &x, 1, &x, 1, 0.0f, &c, 0),
                   MPT_EINVAL);
  ck_assert_int_eq(mpt_op_gemm_ex(NULL, (mpt_precision)7, 0, 0, 1, 1, 1, 1.0f, &x, 1, &x, 1,
                                  0.0f, &c, 1), MPT_EINVAL);
  OK(mpt_op_gemm_bf16(NULL, 0, 0, 1, 1, 0, 1.0f, NULL, 1, NULL, 1, 2.0f, &c, 1)); /* k = 0 */
  ck_assert(c == 6.0f);
  mpt_precision p;
  OK(mpt_precision_parse("bf16", &p));
  ck_assert_int_eq(p, MPT_PRECISION_BF16);
  ck_assert_str_eq(mpt_precision_name(p), "bf16");
  ck_assert_int_eq(mpt_precision_parse("fp16", &p), MPT_EINVAL);
}
END_TEST

/* ---- bf16 operands rounded once: mpt_op_bf16_round, mpt_op_gemm_bf16_batched ---- */

/* The rounding of a large array is mpt_bf16_from_f32's, bit for bit: random values, ties to
 * even, values that round up into the next binade or to infinity, infinities, zeros,
 * subnormals; NaN stays NaN. */
START_TEST(test_bf16_round_array_equals_scalar) {
  const int64_t n = 3 * 65536 + 1000 + 77;
  float *x = alloc_f(n);
  uint16_t *y = calloc((size_t)n, sizeof *y);
  ck_assert_ptr_nonnull(y);
  rand_fill(x, n, 41, -3, 3);
  const float special[] = {1 + 0x1p-8f, 1 + 3 * 0x1p-8f, -(1 + 0x1p-8f + 0x1p-20f),
                           0x1.ff8p0f, FLT_MAX, -FLT_MAX, INFINITY, -INFINITY,
                           0.0f, -0.0f, 0x1p-130f, -0x1.8p-140f, 0x1p-149f, 1e-39f, NAN};
  const int ns = (int)(sizeof special / sizeof special[0]);
  for (int64_t i = 0; i < n; i += 997) x[i] = special[(i / 997) % ns];
  for (int i = 0; i < ns; i++) x[n - 1 - i] = special[i]; /* in the tail too */
  OK(mpt_op_bf16_round(NULL, x, y, n));
  for (int64_t i = 0; i < n; i++) {
    const uint16_t want = mpt_bf16_from_f32(x[i]);
    if (isnan(x[i]))
      ck_assert_msg(isnan(mpt_bf16_to_f32(y[i])), "x[%lld] NaN became 0x%04x", (long long)i,
                    y[i]);
    else
      ck_assert_msg(y[i] == want, "x[%lld] = %a: 0x%04x, want 0x%04x", (long long)i,
                    (double)x[i], y[i], want);
  }
  OK(mpt_op_bf16_round(NULL, NULL, NULL, 0));
  ck_assert_int_eq(mpt_op_bf16_round(NULL, x, NULL, 4), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_bf16_round(NULL, x, y, -1), MPT_EINVAL);
  free(x);
  free(y);
}
END_TEST

/* A batch of products laid out as the attention's heads: the operands of the batch entries
 * interleaved in the rows (stride = one entry's row width, leading dimension = the batch's),
 * C entries in planes with padded rows. Each element is within the float accumulation's bound
 * gamma_{K+1} (1 + u)^2 |alpha| sum |a b| (+ 2^-23 |beta c|) of the double product of the same
 * bf16 inputs; the padding of C is not touched. */
START_TEST(test_bf16_gemm_batched_within_bound) {
  const int64_t nb = 3, m = 37, n = 29, k = 70;
  const int ta = _i & 1, tb = (_i >> 1) & 1;
  const int64_t wa = ta ? m : k, wb = tb ? k : n, ra = ta ? k : m, rb = tb ? n : k;
  const int64_t lda = nb * wa + 3, ldb = nb * wb + 1, ldc = n + 2, sc = m * ldc + 5;
  float *fa = alloc_f(ra * lda), *fb = alloc_f(rb * ldb), *c0 = alloc_f(nb * sc);
  float *c = alloc_f(nb * sc);
  uint16_t *a = calloc((size_t)(ra * lda), sizeof *a), *b = calloc((size_t)(rb * ldb), sizeof *b);
  ck_assert(a && b);
  rand_fill(fa, ra * lda, 51 + _i, -1, 1);
  rand_fill(fb, rb * ldb, 61 + _i, -2, 2);
  rand_fill(c0, nb * sc, 71 + _i, -1, 1);
  for (int64_t i = 0; i < ra * lda; i++) a[i] = mpt_bf16_from_f32(fa[i]);
  for (int64_t i = 0; i < rb * ldb; i++) b[i] = mpt_bf16_from_f32(fb[i]);
  const float alpha = 0.625f;
  for (int with_beta = 0; with_beta < 2; with_beta++) {
    const float beta = with_beta ? 1.0f : 0.0f;
    memcpy(c, c0, (size_t)(nb * sc) * sizeof *c);
    OK(mpt_op_gemm_bf16_batched(NULL, ta, tb, nb, m, n, k, alpha, a, lda, wa, b, ldb, wb, beta,
                                c, ldc, sc));
    for (int64_t e = 0; e < nb; e++)
      for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
          double want = 0, mag = 0;
          for (int64_t l = 0; l < k; l++) {
            const double x = mpt_bf16_to_f32(ta ? a[l * lda + e * wa + i] : a[i * lda + e * wa + l]);
            const double y = mpt_bf16_to_f32(tb ? b[j * ldb + e * wb + l] : b[l * ldb + e * wb + j]);
            want += x * y;
            mag += fabs(x * y);
          }
          const double c_in = c0[e * sc + i * ldc + j];
          want = alpha * want + beta * c_in;
          const double tol = gamma_k(k + 1) * (1 + U) * (1 + U) * alpha * mag +
                             0x1p-23 * fabs(beta * c_in);
          const double got = c[e * sc + i * ldc + j];
          ck_assert_msg(fabs(got - want) <= tol, "ta %d tb %d beta %g C_%lld[%lld,%lld] = %.9g, "
                        "want %.9g, tol %.3g", ta, tb, (double)beta, (long long)e, (long long)i,
                        (long long)j, got, want, tol);
        }
        for (int64_t j = n; j < ldc && e * sc + i * ldc + j < nb * sc; j++)
          ck_assert(c[e * sc + i * ldc + j] == c0[e * sc + i * ldc + j]);
      }
  }
  free(fa);
  free(fb);
  free(a);
  free(b);
  free(c0);
  free(c);
}
END_TEST

START_TEST(test_bf16_gemm_batched_arguments) {
  const uint16_t one = 0x3f80; /* 1.0 */
  float c[4] = {3, 3, 3, 3};
  ck_assert_int_eq(mpt_op_gemm_bf16_batched(NULL, 0, 0, -1, 1, 1, 1, 1.0f, &one, 1, 1, &one, 1, 1,
                                            0.0f, c, 1, 1), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_gemm_bf16_batched(NULL, 0, 0, 2, 1, 1, 1, 1.0f, &one, 1, -1, &one, 1, 0,
                                            0.0f, c, 1, 1), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_gemm_bf16_batched(NULL, 0, 0, 1, 1, 2, 1, 1.0f, &one, 1, 0, &one, 2, 0,
                                            0.0f, c, 1, 2), MPT_EINVAL); /* ldc < n */
  ck_assert_int_eq(mpt_op_gemm_bf16_batched(NULL, 0, 1, 1, 1, 1, 2, 1.0f, &one, 1, 0, &one, 2, 0,
                                            0.0f, c, 1, 1), MPT_EINVAL); /* lda < k */
  ck_assert_int_eq(mpt_op_gemm_bf16_batched(NULL, 0, 0, 1, 1, 1, 1, 1.0f, NULL, 1, 0, &one, 1, 0,
                                            0.0f, c, 1, 1), MPT_EINVAL);
  /* k = 0: each C_i = beta C_i */
  OK(mpt_op_gemm_bf16_batched(NULL, 0, 0, 2, 1, 1, 0, 1.0f, NULL, 1, 0, NULL, 1, 0, 2.0f, c, 1, 2));
  ck_assert(c[0] == 6.0f && c[1] == 3.0f && c[2] == 6.0f && c[3] == 3.0f);
  /* batch 0: nothing */
  OK(mpt_op_gemm_bf16_batched(NULL, 0, 0, 0, 1, 1, 1, 1.0f, NULL, 1, 0, NULL, 1, 0, 0.0f, NULL, 1,
                              0));
  OK(mpt_op_gemm_bf16_batched(NULL, 0, 0, 2, 1, 1, 1, 1.0f, &one, 1, 0, &one, 1, 0, 1.0f, c, 1, 2));
  ck_assert(c[0] == 7.0f && c[2] == 7.0f && c[1] == 3.0f);
  ck_assert_int_eq(mpt_op_bf16_rounded_available(NULL), 1);
}
END_TEST

/* The head-major layouts: split puts x[b, t, p, h, d] rounded at y[p, b, h, t, d], bit for bit
 * (mpt_bf16_from_f32); merge puts x[p, b, h, t, d] back at y[b, t, p, h, d], written with beta
 * 0 (into NaN) and added with beta 2 (small integers: exact). */
START_TEST(test_bf16_heads_split_merge) {
  const int64_t nb = 2, nt = 5, nh = 3, hs = 4;
  for (int64_t parts = 1; parts <= 3; parts += 2) {
    const int64_t n = nb * nt * parts * nh * hs;
    float *x = alloc_f(n), *back = alloc_f(n), *y = alloc_f(n);
    uint16_t *h16 = calloc((size_t)n, sizeof *h16);
    ck_assert_ptr_nonnull(h16);
    rand_fill(x, n, 91 + parts, -5, 5);
    OK(mpt_op_heads_split_bf16(NULL, x, nb, nt, parts, nh, hs, h16));
    int_fill(y, n, 92);
    for (int64_t i = 0; i < n; i++) back[i] = NAN;
    float *planes = alloc_f(n);
    for (int64_t b = 0; b < nb; b++)
      for (int64_t t = 0; t < nt; t++)
        for (int64_t p = 0; p < parts; p++)
          for (int64_t h = 0; h < nh; h++)
            for (int64_t d = 0; d < hs; d++) {
              const int64_t at_x = (((b * nt + t) * parts + p) * nh + h) * hs + d;
              const int64_t at_y = (((p * nb + b) * nh + h) * nt + t) * hs + d;
              ck_assert_msg(h16[at_y] == mpt_bf16_from_f32(x[at_x]), "parts %lld: split "
                            "(%lld %lld %lld %lld %lld)", (long long)parts, (long long)b,
                            (long long)t, (long long)p, (long long)h, (long long)d);
              planes[at_y] = (float)(at_x % 7) - 3.0f;
            }
    OK(mpt_op_heads_merge(NULL, planes, nb, nt, parts, nh, hs, 0.0f, back));
    float *acc = alloc_f(n);
    memcpy(acc, y, (size_t)n * sizeof *acc);
    OK(mpt_op_heads_merge(NULL, planes, nb, nt, parts, nh, hs, 2.0f, acc));
    for (int64_t i = 0; i < n; i++) {
      ck_assert_msg(back[i] == (float)(i % 7) - 3.0f, "parts %lld: merge [%lld] = %g",
                    (long long)parts, (long long)i, (double)back[i]);
      ck_assert(acc[i] == 2.0f * y[i] + (float)(i % 7) - 3.0f);
    }
    free(x);
    free(back);
    free(y);
    free(h16);
    free(planes);
    free(acc);
  }
  float f = 0;
  uint16_t u = 0;
  ck_assert_int_eq(mpt_op_heads_split_bf16(NULL, &f, -1, 1, 1, 1, 1, &u), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_heads_split_bf16(NULL, NULL, 1, 1, 1, 1, 1, &u), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_heads_merge(NULL, &f, 1, 1, 1, 1, 1, 0.0f, NULL), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_heads_merge(NULL, &f, INT64_MAX, 2, 3, 1, 1, 0.0f, &f), MPT_EINVAL);
  OK(mpt_op_heads_merge(NULL, NULL, 0, 5, 3, 2, 2, 0.0f, NULL));
}
END_TEST

/* ---- convolutions: forward, backward data, backward weights against float32 ---- */

/* Checks got against the float32 result f32 with the bound above, mag = the same op on |x|, |w|
 * (sum of |products| up to float rounding, hence the factor 1.01). */
static double check_conv(const char *what, const float *got, const float *f32, const float *mag,
                         int64_t count, int64_t k) {
  double worst = 0;
  const double g = gamma_k(k);
  for (int64_t i = 0; i < count; i++) {
    const double tol = (2 * U + U * U + 2 * g * (1 + U) * (1 + U)) * 1.01 * mag[i] + 1e-30;
    ck_assert_msg(fabs((double)got[i] - f32[i]) <= tol, "%s[%lld] = %.9g, float32 %.9g, tol %.3g",
                  what, (long long)i, (double)got[i], (double)f32[i], tol);
    const double r = fabs((double)got[i] - f32[i]) / (g * mag[i] + 1e-30);
    if (r > worst) worst = r;
  }
  return worst;
}

static void vabs(float *dst, const float *src, int64_t n) {
  for (int64_t i = 0; i < n; i++) dst[i] = fabsf(src[i]);
}

START_TEST(test_bf16_conv_within_bound_and_exact) {
  if (!mpt_op_conv2d_available(NULL)) return;
  mpt_conv_geom g = {.channels = 5, .height = 9, .width = 8, .kernel_h = 3, .kernel_w = 3,
                     .stride = 1 + _i, .pad = 1};
  OK(mpt_conv_geom_resolve(&g));
  const int64_t n = 4, o = 6, l = g.out_h * g.out_w;
  const int64_t nx = n * g.channels * g.height * g.width, nw = o * g.channels * 9, ny = n * o * l;
  float *x = alloc_f(nx), *w = alloc_f(nw), *bias = alloc_f(o), *dy = alloc_f(ny);
  float *ax = alloc_f(nx), *aw = alloc_f(nw), *ady = alloc_f(ny);
  float *y32 = alloc_f(ny), *y16 = alloc_f(ny), *ym = alloc_f(ny);
  float *dx32 = alloc_f(nx), *dx16 = alloc_f(nx), *dxm = alloc_f(nx);
  float *dw32 = alloc_f(nw), *dw16 = alloc_f(nw), *dwm = alloc_f(nw);
  float *db32 = alloc_f(o), *db16 = alloc_f(o);
  for (int exact = 0; exact < 2; exact++) {
    if (exact) {
      int_fill(x, nx, 31);
      int_fill(w, nw, 32);
      int_fill(dy, ny, 33);
      int_fill(bias, o, 34);
    } else {
      rand_fill(x, nx, 41, -1, 1);
      rand_fill(w, nw, 42, -1, 1);
      rand_fill(dy, ny, 43, -1, 1);
      rand_fill(bias, o, 44, -1, 1);
    }
    vabs(ax, x, nx);
    vabs(aw, w, nw);
    vabs(ady, dy, ny);
    memset(dx32, 0, (size_t)nx * sizeof(float));
    memset(dx16, 0, (size_t)nx * sizeof(float));
    memset(dxm, 0, (size_t)nx * sizeof(float));
    memset(dw32, 0, (size_t)nw * sizeof(float));
    memset(dw16, 0, (size_t)nw * sizeof(float));
    memset(dwm, 0, (size_t)nw * sizeof(float));
    memset(db32, 0, (size_t)o * sizeof(float));
    memset(db16, 0, (size_t)o * sizeof(float));
    OK(mpt_op_conv2d_forward(NULL, &g, n, o, x, w, bias, y32));
    OK(mpt_op_conv2d_forward_bf16(NULL, &g, n, o, x, w, bias, y16));
    OK(mpt_op_conv2d_forward(NULL, &g, n, o, ax, aw, NULL, ym));
    OK(mpt_op_conv2d_backward_data(NULL, &g, n, o, w, dy, dx32));
    OK(mpt_op_conv2d_backward_data_bf16(NULL, &g, n, o, w, dy, dx16));
    OK(mpt_op_conv2d_backward_data(NULL, &g, n, o, aw, ady, dxm));
    OK(mpt_op_conv2d_backward_weights(NULL, &g, n, o, x, dy, dw32, db32));
    OK(mpt_op_conv2d_backward_weights_bf16(NULL, &g, n, o, x, dy, dw16, db16));
    OK(mpt_op_conv2d_backward_weights(NULL, &g, n, o, ax, ady, dwm, NULL));
    if (exact) {
      ck_assert_msg(memcmp(y32, y16, (size_t)ny * sizeof(float)) == 0, "forward differs");
      ck_assert_msg(memcmp(dx32, dx16, (size_t)nx * sizeof(float)) == 0, "backward data differs");
      ck_assert_msg(memcmp(dw32, dw16, (size_t)nw * sizeof(float)) == 0,
                    "backward weights differs");
      ck_assert_msg(memcmp(db32, db16, (size_t)o * sizeof(float)) == 0, "bias gradient differs");
    } else {
      /* the bias adds |b| to the magnitude of y */
      for (int64_t i = 0; i < ny; i++) ym[i] += fabsf(bias[(i / l) % o]);
      const double wf = check_conv("y", y16, y32, ym, ny, g.channels * 9 + 1);
      const double wd = check_conv("dx", dx16, dx32, dxm, nx, o * 9);
      const double ww = check_conv("dw", dw16, dw32, dwm, nw, n * l);
      ck_assert_msg(wf > 2 && wd > 2 && ww > 2, "a bf16 convolution is as accurate as float32 "
                    "(%.3g %.3g %.3g): its inputs were not rounded", wf, wd, ww);
      /* the bias gradient sums dy as the convolution read it, rounded to bf16: each term off
       * by at most u |dy|, the float sums by gamma_{N L} */
      for (int64_t c = 0; c < o; c++) {
        double mag = 0;
        for (int64_t i = 0; i < n; i++)
          for (int64_t j = 0; j < l; j++) mag += ady[(i * o + c) * l + j];
        const double tol = (U + 2 * gamma_k(n * l)) * 1.01 * mag;
        ck_assert_msg(fabs((double)db16[c] - db32[c]) <= tol, "db[%lld] = %.9g, float32 %.9g, "
                      "tol %.3g", (long long)c, (double)db16[c], (double)db32[c], tol);
      }
    }
  }
  float *all[] = {x, w, bias, dy, ax, aw, ady, y32, y16, ym, dx32, dx16, dxm, dw32, dw16, dwm,
                  db32, db16};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}
END_TEST

/* ---- the tape: linear (2-D, mpt_nn_linear) and linear_nd (3-D, the GPT's) ----
 * loss = sum(x W1^T W2^T). With precision bf16, the parameter gradients must equal, bit for
 * bit, the same chain of mpt_op_gemm_bf16 calls (forward y1, y2; backward dW2 = dy2^T y1,
 * dy1 = dy2 W2, dW1 = dy1^T x): every product of forward and backward goes through bf16. The
 * tape is switched back to fp32 between forward and backward: each node keeps its forward's
 * precision. An fp32 tape gives other gradients. */
static mpt_status forward_sum(mpt_tape *tape, int nd, const mpt_tensor *xt, mpt_var **loss) {
  mpt_var *x = NULL, *w1 = NULL, *w2 = NULL, *y = NULL;
  MPT_RETURN_IF(mpt_tape_input(tape, xt, &x));
  MPT_RETURN_IF(mpt_tape_param(tape, 0, &w1));
  MPT_RETURN_IF(mpt_tape_param(tape, 1, &w2));
  MPT_RETURN_IF(nd ? mpt_nn_linear_nd(tape, x, w1, NULL, &y) : mpt_nn_linear(tape, x, w1, NULL, &y));
  MPT_RETURN_IF(nd ? mpt_nn_linear_nd(tape, y, w2, NULL, &y) : mpt_nn_linear(tape, y, w2, NULL, &y));
  return mpt_nn_sum(tape, y, loss);
}

START_TEST(test_bf16_tape_linear_all_products) {
  const int nd = _i;
  const int64_t rows = 12, in = 40, hid = 24, out = 10;
  mpt_model *model = NULL;
  const int64_t s1[2] = {hid, in}, s2[2] = {out, hid};
  int p1, p2;
  OK(mpt_model_init(&model, mpt_device_cpu()));
  OK(mpt_model_add_param(model, "w1", 2, s1, MPT_INIT_FAN_IN, in, &p1));
  OK(mpt_model_add_param(model, "w2", 2, s2, MPT_INIT_FAN_IN, hid, &p2));
  OK(mpt_model_finalize(model));
  OK(mpt_model_init_params(model, 5));
  float *x = alloc_f(rows * in);
  rand_fill(x, rows * in, 6, -1, 1);
  const int64_t xs3[3] = {3, 4, in}, xs2[2] = {rows, in};
  mpt_tensor xt = mpt_tensor_view(x, mpt_device_cpu(), MPT_F32, nd ? 3 : 2, nd ? xs3 : xs2);
  const float *w1 = mpt_model_param(model, 0).data, *w2 = mpt_model_param(model, 1).data;

  /* the expected chain */
  float *y1 = alloc_f(rows * hid), *y2 = alloc_f(rows * out), *dy2 = alloc_f(rows * out);
  float *dy1 = alloc_f(rows * hid), *dw1 = alloc_f(hid * in), *dw2 = alloc_f(out * hid);
  for (int64_t i = 0; i < rows * out; i++) dy2[i] = 1.0f;
  OK(mpt_op_gemm_bf16(NULL, 0, 1, rows, hid, in, 1.0f, x, in, w1, in, 0.0f, y1, hid));
  OK(mpt_op_gemm_bf16(NULL, 0, 1, rows, out, hid, 1.0f, y1, hid, w2, hid, 0.0f, y2, out));
  OK(mpt_op_gemm_bf16(NULL, 1, 0, out, hid, rows, 1.0f, dy2, out, y1, hid, 1.0f, dw2, hid));
  OK(mpt_op_gemm_bf16(NULL, 0, 0, rows, hid, out, 1.0f, dy2, out, w2, hid, 1.0f, dy1, hid));
  OK(mpt_op_gemm_bf16(NULL, 1, 0, hid, in, rows, 1.0f, dy1, hid, x, in, 1.0f, dw1, in));
  double want_loss = 0;
  for (int64_t i = 0; i < rows * out; i++) want_loss += y2[i];

  mpt_tape *tape = NULL;
  OK(mpt_tape_init(&tape, model, NULL));
  ck_assert_int_eq(mpt_tape_precision(tape), MPT_PRECISION_FP32);
  for (int bf16 = 1; bf16 >= 0; bf16--) {
    OK(mpt_model_zero_grad(model, NULL));
    mpt_tape_reset(tape, 0);
    OK(mpt_tape_set_precision(tape, bf16 ? MPT_PRECISION_BF16 : MPT_PRECISION_FP32));
    mpt_var *loss = NULL;
    OK(forward_sum(tape, nd, &xt, &loss));
    OK(mpt_tape_set_precision(tape, MPT_PRECISION_FP32)); /* the nodes keep theirs */
    float l = 0;
    OK(mpt_var_item(tape, loss, &l));
    OK(mpt_tape_backward(tape, loss, 1.0f));
    const float *g1 = mpt_model_grad(model, 0).data, *g2 = mpt_model_grad(model, 1).data;
    const int same1 = memcmp(g1, dw1, (size_t)(hid * in) * sizeof(float)) == 0;
    const int same2 = memcmp(g2, dw2, (size_t)(out * hid) * sizeof(float)) == 0;
    if (bf16) {
      ck_assert_msg(same1 && same2, "nd %d: the bf16 tape's gradients differ from the bf16 GEMM "
                    "chain (dW1 %s, dW2 %s)", nd, same1 ? "same" : "differs",
                    same2 ? "same" : "differs");
      ck_assert(fabs(l - want_loss) <= 1e-4 * (1 + fabs(want_loss)));
    } else {
      ck_assert_msg(!same1 && !same2, "nd %d: the fp32 tape gave the bf16 gradients", nd);
    }
  }
  mpt_tape_free(tape);
  mpt_model_free(model);
  float *all[] = {x, y1, y2, dy2, dy1, dw1, dw2};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}
END_TEST

/* The causal attention on a bf16 tape (attention_bf16.c: head-major planes, all heads of a
 * sequence per call, full T x T products; T = 300, 2 sequences, 3 heads) against the same on a
 * float32 tape (itself checked by finite differences in test_gpt_ops).
 * Forward, element by element: S = scale Q K^T gets relative error at most e = 2u + u^2 +
 * gamma_hs of scale sum_l |q_il k_jl| <= e s_i (s_i: that sum's largest value in row i), so the
 * softmax A' of row i is within a factor exp(+-2 e s_i) of the exact A; Y = bf16(A') bf16(V)
 * adds 2u + u^2 and the accumulation's gamma_T. Hence
 *   |y_bf16 - y| <= ((E - 1) + (2u + u^2 + gamma_T) E) sum_j A_ij |v_jd|,  E = exp(2 e s_i),
 * plus 1e-4 of the same sum for the float32 reference's own rounding (a 20th of one bf16 step).
 * Backward (dY = random weights through mul + sum): dQ, dK, dV each within 2^-4 of its largest
 * float32 magnitude (six roundings of 2^-8 along dY, V -> dA -> dS -> dS K, with the
 * cancellation of dS = A (dA - rowsum(A dA)) at most doubling them: 6 * 2 * 2^-8 < 2^-4), and
 * farther than 2^-12 somewhere (the products were bf16, not float32). */
static mpt_status attn_loss(mpt_tape *tape, int nh, mpt_precision pr, mpt_var **y,
                            mpt_var **loss) {
  mpt_var *qkv = NULL, *w = NULL, *z = NULL;
  MPT_RETURN_IF(mpt_tape_param(tape, 0, &qkv));
  MPT_RETURN_IF(mpt_tape_param(tape, 1, &w));
  MPT_RETURN_IF(mpt_tape_set_precision(tape, pr));
  MPT_RETURN_IF(mpt_nn_causal_attention(tape, qkv, nh, y));
  MPT_RETURN_IF(mpt_tape_set_precision(tape, MPT_PRECISION_FP32));
  MPT_RETURN_IF(mpt_nn_mul(tape, *y, w, &z));
  return mpt_nn_sum(tape, z, loss);
}

START_TEST(test_bf16_tape_attention_close_to_fp32) {
  const int64_t nb = 2, nt = 300, nh = 3, hs = 16, c = nh * hs, c3 = 3 * c;
  mpt_model *model = NULL;
  const int64_t s_qkv[3] = {nb, nt, c3}, s_w[3] = {nb, nt, c};
  int p0, p1;
  OK(mpt_model_init(&model, mpt_device_cpu()));
  OK(mpt_model_add_param(model, "qkv", 3, s_qkv, MPT_INIT_ZEROS, 1, &p0));
  OK(mpt_model_add_param(model, "w", 3, s_w, MPT_INIT_ZEROS, 1, &p1));
  OK(mpt_model_finalize(model));
  float *x = mpt_model_param(model, 0).data;
  rand_fill(x, nb * nt * c3, 81, -1, 1);
  rand_fill(mpt_model_param(model, 1).data, nb * nt * c, 82, -1, 1);
  float *y[2], *g[2];
  mpt_tape *tape = NULL;
  OK(mpt_tape_init(&tape, model, NULL));
  for (int bf16 = 0; bf16 < 2; bf16++) {
    y[bf16] = alloc_f(nb * nt * c);
    g[bf16] = alloc_f(nb * nt * c3);
    OK(mpt_model_zero_grad(model, NULL));
    mpt_tape_reset(tape, 0);
    mpt_var *out = NULL, *loss = NULL;
    OK(attn_loss(tape, (int)nh, bf16 ? MPT_PRECISION_BF16 : MPT_PRECISION_FP32, &out, &loss));
    memcpy(y[bf16], mpt_var_value(out)->data, (size_t)(nb * nt * c) * sizeof(float));
    OK(mpt_tape_backward(tape, loss, 1.0f));
    memcpy(g[bf16], mpt_model_grad(model, 0).data, (size_t)(nb * nt * c3) * sizeof(float));
  }
  /* forward, element by element */
  const double scale = 1.0 / sqrt((double)hs), e = 2 * U + U * U + gamma_k(hs);
  double *a = calloc((size_t)nt, sizeof *a);
  ck_assert_ptr_nonnull(a);
  for (int64_t b = 0; b < nb; b++)
    for (int64_t h = 0; h < nh; h++)
      for (int64_t i = 0; i < nt; i++) {
        const float *q = x + (b * nt + i) * c3 + h * hs;
        double smax = 0, mx = -INFINITY, sum = 0;
        for (int64_t j = 0; j <= i; j++) {
          const float *kk = x + (b * nt + j) * c3 + c + h * hs;
          double dot = 0, mag = 0;
          for (int64_t l = 0; l < hs; l++) {
            dot += (double)q[l] * kk[l];
            mag += fabs((double)q[l] * kk[l]);
          }
          a[j] = scale * dot;
          if (a[j] > mx) mx = a[j];
          if (scale * mag > smax) smax = scale * mag;
        }
        for (int64_t j = 0; j <= i; j++) sum += (a[j] = exp(a[j] - mx));
        const double big_e = exp(2 * e * smax);
        const double rel = (big_e - 1) + (2 * U + U * U + gamma_k(nt + 1)) * big_e + 1e-4;
        for (int64_t d = 0; d < hs; d++) {
          double mag = 0;
          for (int64_t j = 0; j <= i; j++)
            mag += a[j] / sum * fabs((double)x[(b * nt + j) * c3 + 2 * c + h * hs + d]);
          const int64_t at_y = (b * nt + i) * c + h * hs + d;
          ck_assert_msg(fabs((double)y[1][at_y] - y[0][at_y]) <= rel * mag, "y[%lld,%lld,%lld]"
                        " bf16 %.9g fp32 %.9g tol %.3g", (long long)b, (long long)i,
                        (long long)(h * hs + d), (double)y[1][at_y], (double)y[0][at_y],
                        rel * mag);
        }
      }
  /* backward, normwise per section (dQ, dK, dV) */
  for (int sec = 0; sec < 3; sec++) {
    double big = 0, diff = 0;
    for (int64_t r = 0; r < nb * nt; r++)
      for (int64_t j = sec * c; j < (sec + 1) * c; j++) {
        big = fmax(big, fabs(g[0][r * c3 + j]));
        diff = fmax(diff, fabs((double)g[1][r * c3 + j] - g[0][r * c3 + j]));
      }
    ck_assert_msg(big > 0 && diff <= 0x1p-4 * big && diff > 0x1p-12 * big, "section %d of dqkv: "
                  "largest |fp32| %.3g, largest difference %.3g (want in (2^-12, 2^-4] of it)",
                  sec, big, diff);
  }
  free(a);
  for (int i = 0; i < 2; i++) {
    free(y[i]);
    free(g[i]);
  }
  mpt_tape_free(tape);
  mpt_model_free(model);
}
END_TEST

START_TEST(test_bf16_tape_precision_arguments) {
  mpt_model *model = NULL;
  const int64_t s[1] = {2};
  int p;
  OK(mpt_model_init(&model, mpt_device_cpu()));
  OK(mpt_model_add_param(model, "w", 1, s, MPT_INIT_FAN_IN, 2, &p));
  OK(mpt_model_finalize(model));
  mpt_tape *tape = NULL;
  OK(mpt_tape_init(&tape, model, NULL));
  ck_assert_int_eq(mpt_tape_set_precision(tape, (mpt_precision)3), MPT_EINVAL);
  ck_assert_int_eq(mpt_tape_set_precision(NULL, MPT_PRECISION_BF16), MPT_EINVAL);
  ck_assert_int_eq(mpt_tape_precision(tape), MPT_PRECISION_FP32);
  mpt_tape_free(tape);
  mpt_model_free(model);
}
END_TEST

#ifdef MPT_FAULT_INJECTION
/* MPT_TEST_NO_BF16_CPU=1: the CPU counts as one without AVX-512 BF16. Every bf16 entry point
 * refuses with MPT_ENOTSUP naming the missing instructions, and the tape keeps fp32. */
START_TEST(test_bf16_refused_without_bf16_cpu) {
  mpt_model *model = NULL;
  const int64_t s[1] = {2};
  int p;
  OK(mpt_model_init(&model, mpt_device_cpu()));
  OK(mpt_model_add_param(model, "w", 1, s, MPT_INIT_FAN_IN, 2, &p));
  OK(mpt_model_finalize(model));
  mpt_tape *tape = NULL;
  OK(mpt_tape_init(&tape, model, NULL));
  setenv("MPT_TEST_NO_BF16_CPU", "1", 1);
  ck_assert_int_eq(mpt_op_bf16_check(NULL), MPT_ENOTSUP);
  ck_assert_msg(strstr(mpt_last_error(), "AVX-512 BF16"), "message: %s", mpt_last_error());
  float a = 1, c = 0;
  ck_assert_int_eq(mpt_op_gemm_bf16(NULL, 0, 0, 1, 1, 1, 1.0f, &a, 1, &a, 1, 0.0f, &c, 1),
                   MPT_ENOTSUP);
  ck_assert_int_eq(mpt_tape_set_precision(tape, MPT_PRECISION_BF16), MPT_ENOTSUP);
  ck_assert_int_eq(mpt_tape_precision(tape), MPT_PRECISION_FP32);
  unsetenv("MPT_TEST_NO_BF16_CPU");
  OK(mpt_op_bf16_check(NULL));
  OK(mpt_tape_set_precision(tape, MPT_PRECISION_BF16));
  mpt_tape_free(tape);
  mpt_model_free(model);
}
END_TEST
#endif

int main(void) {
  if (mpt_op_bf16_check(NULL) != MPT_OK) {
    printf("SKIP: no bf16 compute here: %s\n", mpt_last_error());
    return 77;
  }
  Suite *s = suite_create("bf16");
  TCase *tc = tcase_create("bf16");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_bf16_gemm_within_bound_all_transposes, 0, 4);
  tcase_add_loop_test(tc, test_bf16_gemm_exact_inputs_equal_fp32, 0, 4);
  tcase_add_test(tc, test_bf16_gemm_rounds_to_nearest_even);
  tcase_add_test(tc, test_bf16_gemm_many_shapes_evict_plans);
  tcase_add_test(tc, test_bf16_gemm_arguments);
  tcase_add_test(tc, test_bf16_round_array_equals_scalar);
  tcase_add_loop_test(tc, test_bf16_gemm_batched_within_bound, 0, 4);
  tcase_add_test(tc, test_bf16_gemm_batched_arguments);
  tcase_add_test(tc, test_bf16_heads_split_merge);
  tcase_add_loop_test(tc, test_bf16_conv_within_bound_and_exact, 0, 2);
  tcase_add_loop_test(tc, test_bf16_tape_linear_all_products, 0, 2);
  tcase_add_test(tc, test_bf16_tape_attention_close_to_fp32);
  tcase_add_test(tc, test_bf16_tape_precision_arguments);
#ifdef MPT_FAULT_INJECTION
  tcase_add_test(tc, test_bf16_refused_without_bf16_cpu);
#endif
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
