/* Tests of the core ops (src/core/ops.c and the CPU kernels in src/core/cpu/): every op against
 * a naive reference loop written here, in double where rounding matters. Batch normalisation
 * and the optimizer steps are in tests/test_ops_train.c, im2col / col2im, convolution and max
 * pooling in tests/test_ops_conv.c.
 *
 * Tolerances: where a kernel only moves or adds values, the inputs are small multiples of 1/4
 * (dyadic_fill) so every partial sum is exact in float and results must be EQUAL whatever the
 * summation order. Elsewhere each comparison states its bound next to it; they are a few float
 * ulps of the quantities involved (or the classical dot-product error bound), so an indexing
 * or formula error, which moves results by O(1), cannot hide inside them. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/backend.h" /* mpt__hash_uniform: the draw dropout documents */
#include "mpitrain/core.h"
#include "mpitrain/ops.h"
#include "check_util.h"
#include "ops_util.h"

/* ---- GEMM ---- */

/* C = alpha op(A) op(B) + beta C against a double loop. Bound: the classical dot-product error
 * bound, (k + 2) * FLT_EPSILON * (|alpha| sum|a b| + |beta c|) per element (Higham, "Accuracy
 * and Stability of Numerical Algorithms", 3.1). Padding columns of C must stay untouched. */
static void gemm_case(int ta, int tb, int64_t m, int64_t n, int64_t k, int64_t pad) {
  const int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
  const int64_t arows = ta ? k : m, brows = tb ? n : k;
  float *a = alloc_f(arows * lda), *b = alloc_f(brows * ldb);
  float *c = alloc_f(m * ldc), *c0 = alloc_f(m * ldc);
  rand_fill(a, arows * lda, 1 + ta, -1, 1);
  rand_fill(b, brows * ldb, 3 + tb, -1, 1);
  rand_fill(c0, m * ldc, 5, -1, 1);
  memcpy(c, c0, (size_t)(m * ldc) * sizeof *c);
  const float alpha = 0.75f, beta = -0.5f;
  OK(mpt_op_gemm(NULL, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc));
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < ldc; j++) {
      const float got = c[i * ldc + j], old = c0[i * ldc + j];
      if (j >= n) {
        ck_assert_msg(got == old, "padding C[%lld, %lld] was written", (long long)i, (long long)j);
        continue;
      }
      double s = 0, mag = 0;
      for (int64_t p = 0; p < k; p++) {
        const double av = ta ? a[p * lda + i] : a[i * lda + p];
        const double bv = tb ? b[j * ldb + p] : b[p * ldb + j];
        s += av * bv;
        mag += fabs(av * bv);
      }
      const double want = alpha * s + beta * old;
      const double tol = (double)(k + 2) * FLT_EPSILON * (fabs(alpha) * mag + fabs(beta * old));
      CLOSE(got, want, tol, "at C[%lld, %lld] ta=%d tb=%d m=%lld n=%lld k=%lld", (long long)i,
            (long long)j, ta, tb, (long long)m, (long long)n, (long long)k);
    }
  free(a);
  free(b);
  free(c);
  free(c0);
}

/* On every CPU GEMM library of the build (mpt_cpu_set_gemm): OpenBLAS, oneDNN when built, the
 * auto rule, and a tuned table that sends one shape to each library (mpt_cpu_gemm_for says
 * which library each case took, so both are known to run). */
START_TEST(test_gemm_matches_naive_for_all_transposes) {
  int ran[3] = {0, 0, 0};
  const mpt_cpu_gemm settings[] = {MPT_CPU_GEMM_OPENBLAS, MPT_CPU_GEMM_ONEDNN, MPT_CPU_GEMM_AUTO,
                                   MPT_CPU_GEMM_TUNE};
  mpt_cpu_gemm_tuned table[2] = {{.m = 67, .n = 45, .k = 130, .gemm = MPT_CPU_GEMM_OPENBLAS},
                                 {.m = 7, .n = 5, .k = 9, .gemm = MPT_CPU_GEMM_ONEDNN}};
  const int onednn = mpt_cpu_set_gemm(MPT_CPU_GEMM_ONEDNN) == MPT_OK;
  if (!onednn) table[1].gemm = MPT_CPU_GEMM_OPENBLAS;
  OK(mpt_cpu_gemm_table_set(table, 2));
  for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++) {
    if (settings[i] == MPT_CPU_GEMM_ONEDNN && !onednn) continue;
    OK(mpt_cpu_set_gemm(settings[i]));
    for (int ta = 0; ta < 2; ta++)
      for (int tb = 0; tb < 2; tb++) {
        gemm_case(ta, tb, 7, 5, 9, 3);
        gemm_case(ta, tb, 67, 45, 130, 5); /* large enough for OpenBLAS's blocked kernels */
        gemm_case(ta, tb, 1, 33, 2, 1);
      }
    ran[mpt_cpu_gemm_for(7, 5, 9)]++;
    ran[mpt_cpu_gemm_for(67, 45, 130)]++;
  }
  ck_assert_int_gt(ran[MPT_CPU_GEMM_OPENBLAS], 0);
  if (onednn) ck_assert_int_gt(ran[MPT_CPU_GEMM_ONEDNN], 0);
  OK(mpt_cpu_set_gemm(MPT_CPU_GEMM_AUTO));
  OK(mpt_cpu_gemm_table_set(NULL, 0));
}
END_TEST

START_TEST(test_gemm_with_k_zero_scales_c_by_beta) {
  float c[6] = {1, 2, 3, 4, NAN, 6};
  OK(mpt_op_gemm(NULL, 0, 0, 2, 2, 0, 1.0f, NULL, 0, NULL, 0, 0.5f, c, 3));
  const float want[6] = {0.5f, 1, 3, 2, NAN, 6}; /* padding column 2 untouched */
  for (int i = 0; i < 6; i++)
    if (i != 4) ck_assert_float_eq(c[i], want[i]);
  ck_assert(isnan(c[4]));
  OK(mpt_op_gemm(NULL, 0, 0, 2, 2, 0, 1.0f, NULL, 0, NULL, 0, 0.0f, c, 3));
  ck_assert(c[0] == 0 && c[1] == 0 && c[3] == 0 && c[4] == 0); /* beta 0 overwrites NaN */
}
END_TEST

/* ---- elementwise ---- */

START_TEST(test_elementwise_ops_match_their_definitions) {
  enum { N = 1003 };
  float x[N], y[N], z[N];
  dyadic_fill(x, N, 11);
  dyadic_fill(y, N, 12);
  OK(mpt_op_fill(NULL, z, N, 2.5f));
  for (int i = 0; i < N; i++) ck_assert_float_eq(z[i], 2.5f);
  OK(mpt_op_copy(NULL, z, x, N));
  ck_assert(memcmp(z, x, sizeof z) == 0);
  OK(mpt_op_axpy(NULL, N, 0.5f, x, z)); /* z = 1.5 x: exact on quarters */
  for (int i = 0; i < N; i++) ck_assert_float_eq(z[i], 1.5f * x[i]);
  OK(mpt_op_scale(NULL, z, N, -2.0f));
  for (int i = 0; i < N; i++) ck_assert_float_eq(z[i], -3.0f * x[i]);
  OK(mpt_op_mul(NULL, z, x, y, N));
  for (int i = 0; i < N; i++) ck_assert_float_eq(z[i], x[i] * y[i]);
  OK(mpt_op_mul(NULL, z, z, y, N)); /* in place */
  for (int i = 0; i < N; i++) ck_assert_float_eq(z[i], x[i] * y[i] * y[i]);
  memcpy(z, x, sizeof z);
  OK(mpt_op_mul_backward(NULL, z, y, y, N)); /* accumulates: z = x + y*y */
  for (int i = 0; i < N; i++) ck_assert_float_eq(z[i], x[i] + y[i] * y[i]);
  const float dy = 2.0f;
  memcpy(z, y, sizeof z);
  OK(mpt_op_sum_backward(NULL, z, N, &dy, 0.25f)); /* accumulates scale * dy */
  for (int i = 0; i < N; i++) ck_assert_float_eq(z[i], y[i] + 0.5f);
  float s;
  OK(mpt_op_sum(NULL, x, N, &s)); /* quarters: exact in any order */
  double want = 0;
  for (int i = 0; i < N; i++) want += x[i];
  ck_assert_float_eq(s, (float)want);
}
END_TEST

/* 2^20 copies of 0.1f add up exactly in double (24 + 20 bits < 53); a float accumulator would
 * be wrong by about 1%, so this pins the documented double accumulation. */
START_TEST(test_sum_accumulates_in_double) {
  const int64_t n = 1 << 20;
  float *x = alloc_f(n), s;
  for (int64_t i = 0; i < n; i++) x[i] = 0.1f;
  OK(mpt_op_sum(NULL, x, n, &s));
  ck_assert_float_eq(s, (float)((double)n * (double)0.1f));
  OK(mpt_op_sum(NULL, NULL, 0, &s)); /* the empty sum is written as 0 */
  ck_assert_float_eq(s, 0.0f);
  free(x);
}
END_TEST

/* mpt_cpu_sum_squares: exact on small integers, 0 when empty, and the documented order (16
 * lanes, lane j takes i = j mod 16, lanes added in order) bit for bit on random data, where a
 * serial sum or another lane count rounds differently. */
START_TEST(test_cpu_sum_squares_in_its_documented_order) {
  enum { N = 37, R = 100003 };
  float x[N];
  for (int i = 0; i < N; i++) x[i] = (float)(i + 1);
  ck_assert(mpt_cpu_sum_squares(x, N) == 37.0 * 38.0 * 75.0 / 6.0); /* n(n+1)(2n+1)/6 */
  ck_assert(mpt_cpu_sum_squares(NULL, 0) == 0.0);
  float *r = alloc_f(R);
  uint64_t st = 12345;
  for (int64_t i = 0; i < R; i++) {
    st = st * 6364136223846793005ull + 1442695040888963407ull;
    r[i] = (float)((double)(st >> 40) / (double)(1ull << 24) - 0.5) * 3.0f;
  }
  double lane[16] = {0}, want = 0, serial = 0;
  for (int64_t i = 0; i < R; i++) {
    lane[i % 16] += (double)r[i] * (double)r[i];
    serial += (double)r[i] * (double)r[i];
  }
  for (int j = 0; j < 16; j++) want += lane[j];
  ck_assert(mpt_cpu_sum_squares(r, R) == want);
  ck_assert(serial != want); /* the data tells the orders apart */
  free(r);
}
END_TEST

START_TEST(test_bias_add_and_backward_match_naive) {
  const int64_t rows = 3, cols = 11; /* extents above and off multiples of 8 */
  for (int64_t inner = 1; inner <= 13; inner += 12) {
    const int64_t n = rows * cols * inner;
    float *y = alloc_f(n), *y0 = alloc_f(n), bias[11], db[11], db0[11];
    dyadic_fill(y0, n, 21);
    dyadic_fill(bias, cols, 22);
    dyadic_fill(db0, cols, 23);
    memcpy(y, y0, (size_t)n * sizeof *y);
    memcpy(db, db0, sizeof db);
    OK(mpt_op_bias_add(NULL, y, bias, rows, cols, inner));
    OK(mpt_op_bias_backward(NULL, db, y0, rows, cols, inner));
    for (int64_t c = 0; c < cols; c++) {
      float want = db0[c];
      for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < inner; i++) {
          const int64_t at = (r * cols + c) * inner + i;
          ck_assert_float_eq(y[at], y0[at] + bias[c]);
          want += y0[at];
        }
      ck_assert_float_eq(db[c], want); /* dbias accumulates */
    }
    free(y);
    free(y0);
  }
}
END_TEST

START_TEST(test_relu_forward_backward) {
  float x[6] = {-2, -0.25f, 0, 0.5f, 3, NAN}, y[6], dx[6], dy[6] = {1, 2, 3, 4, 5, 6};
  OK(mpt_op_relu(NULL, y, x, 6));
  const float want[5] = {0, 0, 0, 0.5f, 3};
  for (int i = 0; i < 5; i++) ck_assert_float_eq(y[i], want[i]);
  ck_assert(isnan(y[5])); /* NaN propagates, as torch.relu, so the finiteness check sees it */
  for (int i = 0; i < 6; i++) dx[i] = 1.0f;
  OK(mpt_op_relu_backward(NULL, dx, dy, y, 5));
  const float want_dx[5] = {1, 1, 1, 5, 6}; /* 1 + (y > 0 ? dy : 0) */
  for (int i = 0; i < 5; i++) ck_assert_float_eq(dx[i], want_dx[i]);
  OK(mpt_op_relu(NULL, x, x, 5)); /* in place */
  for (int i = 0; i < 5; i++) ck_assert_float_eq(x[i], want[i]);
  enum { N = 45 }; /* blocks of 8 and a remainder */
  float a[N], b[N], g[N], d[N];
  rand_fill(a, N, 15, -1, 1);
  rand_fill(g, N, 16, -1, 1);
  OK(mpt_op_relu(NULL, b, a, N));
  for (int i = 0; i < N; i++) d[i] = 0.5f;
  OK(mpt_op_relu_backward(NULL, d, g, b, N));
  for (int i = 0; i < N; i++) {
    ck_assert_float_eq(b[i], a[i] > 0 ? a[i] : 0.0f);
    ck_assert_float_eq(d[i], a[i] > 0 ? 0.5f + g[i] : 0.5f);
  }
  OK(mpt_op_relu(NULL, a, a, N));
  ck_assert(memcmp(a, b, sizeof a) == 0);
}
END_TEST

/* ---- softmax cross-entropy, accuracy ---- */

START_TEST(test_softmax_xent_known_values) {
  /* Uniform logits: every probability 1/k and the loss log(k). Bounds: a few ulps. */
  float logits[40], probs[40], loss;
  int32_t labels[4] = {0, 3, 9, 5};
  for (int i = 0; i < 40; i++) logits[i] = 3.7f;
  OK(mpt_op_softmax_xent(NULL, logits, labels, 4, 10, probs, &loss));
  for (int i = 0; i < 40; i++) CLOSE(probs[i], 0.1, 2 * FLT_EPSILON * 0.1, "at %d", i);
  CLOSE(loss, log(10.0), 2 * FLT_EPSILON * log(10.0), "uniform");
  /* exp of {0, ln 2, ln 3} is {1, 2, 3}: probabilities {1/6, 1/3, 1/2}; label 2 -> ln 2. */
  const float l3[3] = {0, (float)log(2.0), (float)log(3.0)};
  int32_t lab = 2;
  OK(mpt_op_softmax_xent(NULL, l3, &lab, 1, 3, probs, &loss));
  CLOSE(probs[0], 1.0 / 6, 4 * FLT_EPSILON, "p0");
  CLOSE(probs[1], 1.0 / 3, 4 * FLT_EPSILON, "p1");
  CLOSE(probs[2], 0.5, 4 * FLT_EPSILON, "p2");
  CLOSE(loss, log(2.0), 4 * FLT_EPSILON, "ln 2");
  /* Large logits do not overflow: loss of the losing class is the margin, 1000. */
  const float big[2] = {1000, 0};
  lab = 1;
  OK(mpt_op_softmax_xent(NULL, big, &lab, 1, 2, probs, &loss));
  ck_assert_float_eq(probs[0], 1.0f);
  ck_assert_float_eq(probs[1], 0.0f);
  ck_assert_float_eq(loss, 1000.0f);
  const float big_last[2] = {0, 1000}; /* the maximum is taken over the whole row */
  lab = 0;
  OK(mpt_op_softmax_xent(NULL, big_last, &lab, 1, 2, probs, &loss));
  ck_assert_float_eq(probs[1], 1.0f);
  ck_assert_float_eq(loss, 1000.0f);
}
END_TEST

START_TEST(test_softmax_xent_forward_backward_match_double_reference) {
  enum { N = 6, K = 19 }; /* K: two blocks of 8 and a remainder */
  float logits[N * K], probs[N * K], dl[N * K], dl0[N * K], loss;
  const int32_t labels[N] = {0, 18, 3, 3, 9, 5};
  const float dloss = 2.0f;
  rand_fill(logits, N * K, 91, -5, 5);
  rand_fill(dl0, N * K, 92, -1, 1);
  memcpy(dl, dl0, sizeof dl);
  OK(mpt_op_softmax_xent(NULL, logits, labels, N, K, probs, &loss));
  OK(mpt_op_softmax_xent_backward(NULL, probs, labels, N, K, &dloss, dl));
  double total = 0;
  for (int i = 0; i < N; i++) {
    double z = 0, p[K];
    for (int j = 0; j < K; j++) z += exp((double)logits[i * K + j]);
    for (int j = 0; j < K; j++) {
      p[j] = exp((double)logits[i * K + j]) / z;
      /* probs are O(1) results of expf (1 ulp) and one division: 4 ulps of 1 */
      CLOSE(probs[i * K + j], p[j], 4 * FLT_EPSILON, "prob %d,%d", i, j);
      const double g = dloss * (p[j] - (j == labels[i])) / N;
      CLOSE(dl[i * K + j], dl0[i * K + j] + g, 8 * FLT_EPSILON, "dlogit %d,%d", i, j);
    }
    total += -log(p[labels[i]]);
  }
  CLOSE(loss, total / N, 8 * FLT_EPSILON * (1 + total / N), "loss");
}
END_TEST

START_TEST(test_softmax_xent_rejects_labels_out_of_range) {
  float logits[12] = {0}, probs[12], loss, dl[12] = {0};
  const int32_t labels[3] = {1, 2, 7}, neg[3] = {0, -1, 0};
  const float dloss = 1;
  expect_einval(mpt_op_softmax_xent(NULL, logits, labels, 3, 4, probs, &loss), "row 2");
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "label 7"));
  expect_einval(mpt_op_softmax_xent_backward(NULL, probs, neg, 3, 4, &dloss, dl), "row 1");
  int64_t correct = 0;
  expect_einval(mpt_op_count_correct(NULL, logits, labels, 3, 4, &correct), "label 7");
}
END_TEST

START_TEST(test_count_correct_first_maximum_wins) {
  const float logits[12] = {1, 3, 3, /**/ 0, 0, 0, /**/ -1, -2, -0.5f, /**/ 2, 9, 1};
  const int32_t labels[4] = {1, 0, 2, 0};
  int64_t correct = 5; /* accumulates */
  OK(mpt_op_count_correct(NULL, logits, labels, 4, 3, &correct));
  ck_assert_int_eq(correct, 5 + 3); /* rows 0 (tie -> class 1), 1 (all tied -> 0), 2 */
  const int32_t labels2[4] = {2, 1, 2, 1};
  OK(mpt_op_count_correct(NULL, logits, labels2, 4, 3, &correct));
  ck_assert_int_eq(correct, 8 + 2); /* rows 2, 3; a tie never goes to the later class */
}
END_TEST

/* ---- dropout ---- */

START_TEST(test_dropout_mask_follows_the_counter_based_draw) {
  const int64_t n = 100000;
  const float p = 0.3f, keep = 1.0f / (1.0f - p);
  float *x = alloc_f(n), *y = alloc_f(n), *mask = alloc_f(n), *mask2 = alloc_f(n);
  rand_fill(x, n, 101, -1, 1);
  OK(mpt_op_dropout(NULL, x, y, mask, n, p, 42));
  int64_t dropped = 0;
  for (int64_t i = 0; i < n; i++) {
    const float want = mpt__hash_uniform(42, (uint64_t)i) >= p ? keep : 0.0f;
    ck_assert_msg(mask[i] == want, "mask[%lld] = %g, want %g", (long long)i, (double)mask[i],
                  (double)want);
    ck_assert_float_eq(y[i], x[i] * mask[i]);
    dropped += mask[i] == 0.0f;
  }
  /* The dropped fraction is p within 5 standard deviations, sqrt(p (1-p) / n) = 0.00145
   * (deterministic for this seed; a biased draw moves it far more). */
  ck_assert_msg(fabs((double)dropped / n - 0.3) < 0.0073, "dropped fraction %g",
                (double)dropped / n);
  OK(mpt_op_dropout(NULL, x, y, mask2, n, p, 42)); /* same seed, same mask */
  ck_assert(memcmp(mask, mask2, (size_t)n * sizeof *mask) == 0);
  OK(mpt_op_dropout(NULL, x, y, mask2, n, p, 43)); /* another seed: ~42% of entries differ */
  int64_t differ = 0;
  for (int64_t i = 0; i < n; i++) differ += mask[i] != mask2[i];
  ck_assert_msg(differ > n / 3 && differ < n / 2, "%lld masks differ", (long long)differ);
  const float edge = mpt__hash_uniform(9, 3); /* u == p exactly: kept (u >= p) */
  OK(mpt_op_dropout(NULL, x, y, mask, 4, edge, 9));
  ck_assert_float_eq(mask[3], 1.0f / (1.0f - edge));
  OK(mpt_op_dropout(NULL, x, y, mask, n, 0.0f, 7)); /* p = 0 keeps everything */
  for (int64_t i = 0; i < n; i++) ck_assert(mask[i] == 1.0f && y[i] == x[i]);
  free(x);
  free(y);
  free(mask);
  free(mask2);
}
END_TEST

/* ---- finiteness ---- */

START_TEST(test_check_finite_finds_nan_and_inf) {
  const int64_t n = 10000; /* more than one scan block */
  float *x = alloc_f(n);
  rand_fill(x, n, 111, -1e30f, 1e30f);
  int bad = -1;
  OK(mpt_op_check_finite(NULL, x, n, &bad));
  ck_assert_int_eq(bad, 0);
  const float specials[3] = {NAN, INFINITY, -INFINITY};
  for (int s = 0; s < 3; s++) {
    const float keep = x[n - 1];
    x[n - 1] = specials[s];
    OK(mpt_op_check_finite(NULL, x, n, &bad));
    ck_assert_int_eq(bad, 1);
    x[n - 1] = keep;
  }
  x[5] = NAN;
  OK(mpt_op_check_finite(NULL, x, n, &bad));
  ck_assert_int_eq(bad, 1);
  bad = -1;
  OK(mpt_op_check_finite(NULL, NULL, 0, &bad));
  ck_assert_int_eq(bad, 0);
  free(x);
}
END_TEST

/* ---- argument checks, empty work, dispatch ---- */

START_TEST(test_bad_arguments_return_einval_naming_the_op) {
  float a[16] = {0}, c[16] = {0};
  mpt_conv_geom g = {.channels = 1, .height = 4, .width = 4, .kernel_h = 2, .kernel_w = 2,
                     .stride = 2};
  int32_t lab[2] = {0, 0}, am[4];
  int bad;
  expect_einval(mpt_op_gemm(NULL, 0, 0, -1, 2, 2, 1, a, 2, a, 2, 0, c, 2), "m = -1");
  expect_einval(mpt_op_gemm(NULL, 0, 0, 2, 2, 3, 1, a, 2, a, 2, 0, c, 2), "lda = 2");
  expect_einval(mpt_op_gemm(NULL, 1, 1, 2, 3, 4, 1, a, 2, a, 3, 0, c, 3), "ldb = 3");
  expect_einval(mpt_op_gemm(NULL, 0, 0, 2, 2, 2, 1, NULL, 2, a, 2, 0, c, 2), "mpt_op_gemm: a");
  expect_einval(mpt_op_gemm(NULL, 0, 0, 2, 4, 2, 1, a, 2, a, 4, 0, c, 3), "ldc = 3");
  expect_einval(mpt_op_fill(NULL, NULL, 5, 0), "mpt_op_fill: x is NULL");
  expect_einval(mpt_op_fill(NULL, a, -1, 0), "count = -1");
  expect_einval(mpt_op_mul(NULL, a, NULL, a, 3), "mpt_op_mul: a is NULL");
  expect_einval(mpt_op_mul_backward(NULL, a, a, NULL, 3), "mpt_op_mul_backward: b is NULL");
  expect_einval(mpt_op_bias_add(NULL, a, a, 2, -3, 1), "cols = -3");
  expect_einval(mpt_op_im2col(NULL, &g, a, c), "mpt_conv_geom_resolve"); /* not resolved */
  OK(mpt_conv_geom_resolve(&g));
  g.pad = 1;
  OK(mpt_conv_geom_resolve(&g));
  expect_einval(mpt_op_maxpool(NULL, &g, 1, a, c, am), "pad = 1");
  expect_einval(mpt_op_softmax_xent(NULL, a, lab, 2, 0, c, c), "k = 0");
  expect_einval(mpt_op_dropout(NULL, a, c, c, 4, 1.0f, 1), "p = 1");
  expect_einval(mpt_op_dropout(NULL, a, c, c, 4, NAN, 1), "p = nan");
  expect_einval(mpt_op_sgd_step(NULL, a, a, c, 4, 0.1f, 0.9f, 0.1f, 0, 1, 1), "nesterov");
  expect_einval(mpt_op_sgd_step(NULL, a, a, NULL, 4, 0.1f, 0.9f, 0, 0, 0, 1), "momentum_buf");
  expect_einval(mpt_op_sgd_step(NULL, a, a, c, 4, -0.1f, 0, 0, 0, 0, 1), "lr = -0.1");
  expect_einval(mpt_op_adamw_step(NULL, a, a, c, c, 4, 0.1f, 0.9f, 0.999f, 1e-8f, 0, 0),
                "step = 0");
  expect_einval(mpt_op_adamw_step(NULL, a, a, c, c, 4, 0.1f, 1.0f, 0.999f, 1e-8f, 0, 1),
                "beta1 = 1");
  expect_einval(mpt_op_batchnorm_train(NULL, a, 1, 2, 1, a, a, 1e-5f, 0.1f, NULL, NULL, c, c,
                                       c), "one value per channel");
  expect_einval(mpt_op_check_finite(NULL, a, 4, NULL), "nonfinite is NULL");
  expect_einval(mpt_op_memcpy(NULL, mpt_device_cpu(), NULL, mpt_device_cpu(), a, 4), "dst");
  const int32_t wild[4] = {0, 1, 16, 2}; /* 16: one past the 4x4 plane */
  g.pad = 0;
  OK(mpt_conv_geom_resolve(&g));
  mpt_status st = mpt_op_maxpool_backward(NULL, &g, 1, a, wild, c);
  ck_assert_int_eq(st, MPT_EINVAL); /* a corrupt argmax is refused, not written through */
  (void)bad;
}
END_TEST

START_TEST(test_empty_work_returns_ok_without_touching_memory) {
  OK(mpt_op_gemm(NULL, 0, 0, 0, 5, 5, 1, NULL, 5, NULL, 5, 0, NULL, 5));
  OK(mpt_op_gemm(NULL, 1, 0, 3, 0, 5, 1, NULL, 0, NULL, 0, 0, NULL, 0));
  OK(mpt_op_fill(NULL, NULL, 0, 1));
  OK(mpt_op_copy(NULL, NULL, NULL, 0));
  OK(mpt_op_axpy(NULL, 0, 1, NULL, NULL));
  OK(mpt_op_relu_backward(NULL, NULL, NULL, NULL, 0));
  OK(mpt_op_bias_add(NULL, NULL, NULL, 0, 4, 3));
  OK(mpt_op_bias_backward(NULL, NULL, NULL, 5, 4, 0));
  OK(mpt_op_softmax_xent(NULL, NULL, NULL, 0, 10, NULL, NULL));
  OK(mpt_op_count_correct(NULL, NULL, NULL, 0, 0, NULL));
  OK(mpt_op_dropout(NULL, NULL, NULL, NULL, 0, 0.5f, 1));
  OK(mpt_op_sgd_step(NULL, NULL, NULL, NULL, 0, 0.1f, 0.9f, 0, 0, 0, 1));
  OK(mpt_op_adamw_step(NULL, NULL, NULL, NULL, NULL, 0, 0.1f, 0.9f, 0.999f, 1e-8f, 0, 1));
  OK(mpt_op_batchnorm_train(NULL, NULL, 0, 3, 4, NULL, NULL, 1e-5f, 0.1f, NULL, NULL, NULL,
                            NULL, NULL));
  OK(mpt_op_batchnorm_backward(NULL, NULL, NULL, 4, 3, 2, NULL, NULL, NULL, NULL, NULL, NULL));
  OK(mpt_op_memcpy(NULL, mpt_device_cpu(), NULL, mpt_device_cpu(), NULL, 0));
  mpt_conv_geom g = {.channels = 1, .height = 4, .width = 4, .kernel_h = 2, .kernel_w = 2,
                     .stride = 2};
  OK(mpt_conv_geom_resolve(&g));
  OK(mpt_op_maxpool(NULL, &g, 0, NULL, NULL, NULL));
}
END_TEST

START_TEST(test_ops_dispatch_through_a_cpu_stream) {
  mpt_stream *s = NULL;
  OK(mpt_stream_init(&s, mpt_device_cpu(), MPT_STREAM_INLINE));
  float a[4] = {1, 2, 3, 4}, b[4] = {0};
  OK(mpt_op_gemm(s, 0, 0, 2, 2, 2, 1, a, 2, a, 2, 0, b, 2)); /* [[1,2],[3,4]]^2 */
  ck_assert(b[0] == 7 && b[1] == 10 && b[2] == 15 && b[3] == 22);
  OK(mpt_op_memcpy(s, mpt_device_cpu(), b, mpt_device_cpu(), a, sizeof a));
  ck_assert(memcmp(a, b, sizeof a) == 0);
  mpt_device cuda = {MPT_DEVICE_CUDA, 0};
  ck_assert_int_eq(mpt_op_memcpy(s, cuda, b, mpt_device_cpu(), a, sizeof a), MPT_ENOTSUP);
  mpt_stream_free(s);
}
END_TEST

int main(void) {
  Suite *suite = suite_create("ops");
  TCase *tc = tcase_create("cpu");
  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, test_gemm_matches_naive_for_all_transposes);
  tcase_add_test(tc, test_gemm_with_k_zero_scales_c_by_beta);
  tcase_add_test(tc, test_elementwise_ops_match_their_definitions);
  tcase_add_test(tc, test_sum_accumulates_in_double);
  tcase_add_test(tc, test_bias_add_and_backward_match_naive);
  tcase_add_test(tc, test_relu_forward_backward);
  tcase_add_test(tc, test_softmax_xent_known_values);
  tcase_add_test(tc, test_softmax_xent_forward_backward_match_double_reference);
  tcase_add_test(tc, test_softmax_xent_rejects_labels_out_of_range);
  tcase_add_test(tc, test_count_correct_first_maximum_wins);
  tcase_add_test(tc, test_dropout_mask_follows_the_counter_based_draw);
  tcase_add_test(tc, test_check_finite_finds_nan_and_inf);
  tcase_add_test(tc, test_bad_arguments_return_einval_naming_the_op);
  tcase_add_test(tc, test_empty_work_returns_ok_without_touching_memory);
  tcase_add_test(tc, test_ops_dispatch_through_a_cpu_stream);
  tcase_add_test(tc, test_cpu_sum_squares_in_its_documented_order);
  suite_add_tcase(suite, tc);
  return run_suite(suite);
}
