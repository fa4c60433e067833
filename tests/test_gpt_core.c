/* Tests of the CPU transformer core ops (include/mpitrain/ops_gpt.h; src/core/ops_gpt.c and
 * src/core/cpu/gpt_cpu.c) called directly: the wrappers' argument checks and empty work, an
 * exact causal softmax, and GELU against its formula in double on a dense grid. Their
 * gradients are checked by finite differences through the tape in tests/test_gpt_ops.c, and
 * the CUDA kernels against these in the op table, tests/test_backend_ops.c. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu/isa.h"
#include "core/cpu/vmath.h"
#include "mpitrain/ops_gpt.h"
#include "check_util.h"


START_TEST(test_core_ops_check_arguments_and_skip_empty_work) {
  float x[12] = {0}, w[4] = {1, 1, 1, 1}, b[4] = {0}, y[12], m[3], r[3];
  int32_t tg[3] = {0, 1, 2};
  ck_assert_int_eq(mpt_op_layernorm(NULL, x, 3, 0, w, b, 1e-5f, y, m, r), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_layernorm(NULL, x, 3, 4, w, b, -1.0f, y, m, r), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_layernorm(NULL, x, 3, 4, NULL, b, 1e-5f, y, m, r), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_xent_vocab(NULL, x, tg, 3, 4, 5, m, r), MPT_EINVAL); /* v > vp */
  ck_assert_int_eq(mpt_op_xent_vocab(NULL, x, tg, 0, 4, 4, m, r), MPT_EINVAL); /* no rows */
  ck_assert_int_eq(mpt_op_xent_vocab(NULL, x, tg, 3, 4, 2, m, r), MPT_EINVAL); /* tg[2] = 2 */
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "targets[2] = 2"));
  ck_assert_int_eq(mpt_op_embedding_gpt(NULL, tg, -1, 3, 4, 4, w, w, y), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_gelu(NULL, NULL, x, 3), MPT_EINVAL);
  OK(mpt_op_gelu(NULL, NULL, NULL, 0));
  OK(mpt_op_causal_softmax(NULL, NULL, 1, 0));
  OK(mpt_op_layernorm_backward(NULL, x, x, 3, 4, w, m, r, NULL, NULL, NULL)); /* nothing asked */
}
END_TEST

START_TEST(test_core_causal_softmax_of_equal_scores_is_uniform_over_the_past) {
  float s[2 * 9];
  for (int i = 0; i < 18; i++) s[i] = i < 9 ? 0.5f : -3.0f; /* two planes of equal scores */
  OK(mpt_op_causal_softmax(NULL, s, 2, 3));
  static const float want[9] = {1, 0, 0, 0.5f, 0.5f, 0, 1.0f / 3, 1.0f / 3, 1.0f / 3};
  for (int i = 0; i < 18; i++) ck_assert_float_eq_tol(s[i], want[i % 9], 1e-7f);
}
END_TEST

START_TEST(test_gelu_core_op_matches_double_precision_on_a_dense_grid) {
  /* the formula and its derivative in double at 4001 points of [-10, 10]: forward within
   * 4e-6 relative (a few float ulps) and the rounding of u below, backward within
   * 1e-6 relative + 1e-7 (float rounding of O(1) terms; gelu' crosses 0 near x = -0.75) */
  enum { N = 4001 };
  static float x[N], y[N], dx[N], dy[N];
  for (int i = 0; i < N; i++) {
    x[i] = -10.0f + (float)i * (20.0f / (N - 1));
    dy[i] = 1.0f;
    dx[i] = 0.0f;
  }
  OK(mpt_op_gelu(NULL, y, x, N));
  OK(mpt_op_gelu_backward(NULL, dx, dy, x, N));
  const double k = sqrt(2.0 / M_PI);
  for (int i = 0; i < N; i++) {
    const double v = x[i], u = k * (v + 0.044715 * v * v * v), th = tanh(u);
    /* 0.5 (1 + tanh u) = 1 / (1 + exp(-2u)) exactly; in the far tail 1 + tanh u cancels to 0
     * even in double, so the forward's reference takes the second form */
    const double want = v / (1.0 + exp(-2.0 * u));
    const double dwant = 0.5 * (1.0 + th) + 0.5 * v * (1.0 - th * th) * k * (1.0 + 3 * 0.044715 * v * v);
    /* plus the float rounding of u (relative 1.2e-7), which the tail's exp(2u) turns into a
     * relative error 2|u| times as large */
    ck_assert_msg(fabs(y[i] - want) <= (4e-6 + 2.5e-7 * fabs(u)) * fabs(want),
                  "gelu(%g) = %.9g, want %.9g", v, y[i], want);
    ck_assert_msg(fabs(dx[i] - dwant) <= 1e-6 * fabs(dwant) + 1e-7,
                  "gelu'(%g) = %.9g, want %.9g", v, dx[i], dwant);
  }
}
END_TEST

/* vmath.h's exp over arrays: the kernels' clones (isa.h: the path MPT_CPU_ISA or the CPU
 * picks; tests/isa_paths.sh runs this program on each) and a scalar loop. */
MPT_ISA_KERNEL_VOID(vexp_array, (float *restrict y, const float *restrict x, int64_t n),
                    (y, x, n)) {
  for (int64_t i = 0; i < n; i++) y[i] = mpt__vexpf(x[i]);
}

__attribute__((noinline)) static float vexp_one(float x) {
  volatile float v = x; /* one value at a time: the scalar code path */
  return mpt__vexpf(v);
}

static double ulp_of(double v) {
  const float f = (float)fabs(v);
  return (double)nextafterf(f, INFINITY) - (double)f;
}

START_TEST(test_vexpf_is_within_2_ulp_of_exp_and_the_same_at_every_width) {
  /* every 41st float of [-86.9, 88.72] (about 54 million) against exp in double: within 2 ulp
   * (vmath.h's bound); the vector clone and the scalar code give the same bits */
  enum { N = 1 << 16 };
  static float x[N], y[N];
  double worst = 0.0;
  float worst_x = 0.0f;
  int64_t checked = 0, differ = 0;
  const uint32_t ranges[2][2] = {{0x80000000u, 0xC2ADCCCDu}, /* -0 .. -86.9 */
                                 {0x00000000u, 0x42B17217u}}; /* 0 .. 88.7228 */
  for (int side = 0; side < 2; side++)
    for (uint64_t u = ranges[side][0]; u <= ranges[side][1];) {
      int m = 0;
      for (; m < N && u <= ranges[side][1]; m++, u += 41) {
        const uint32_t b = (uint32_t)u;
        memcpy(&x[m], &b, sizeof b);
      }
      vexp_array(y, x, m);
      for (int i = 0; i < m; i++) {
        const double want = exp((double)x[i]), err = fabs(y[i] - want) / ulp_of(want);
        if (err > worst) {
          worst = err;
          worst_x = x[i];
        }
        if ((i & 63) == 0) differ += memcmp(&y[i], &(float){vexp_one(x[i])}, sizeof(float)) != 0;
      }
      checked += m;
    }
  ck_assert_msg(worst <= 2.0, "vexpf: %.3f ulp at x = %.9g", worst, (double)worst_x);
  ck_assert_msg(checked > 50000000, "only %lld checked", (long long)checked);
  ck_assert_msg(differ == 0, "%lld values differ between the vector and the scalar code",
                (long long)differ);
  /* the ends: 0 below -87.3, +inf above ln(FLT_MAX), NaN stays NaN, exp(0) = 1 exactly */
  static const float ends[8] = {-INFINITY, -1000.0f, -87.31f, 88.73f, 1000.0f, INFINITY, 0.0f,
                                -0.0f};
  vexp_array(y, ends, 8);
  for (int i = 0; i < 3; i++) ck_assert_msg(y[i] == 0.0f, "vexpf(%g) = %g", ends[i], y[i]);
  for (int i = 3; i < 6; i++) ck_assert_msg(isinf(y[i]) && y[i] > 0, "vexpf(%g) = %g", ends[i], y[i]);
  ck_assert(y[6] == 1.0f && y[7] == 1.0f);
  ck_assert(isnan(vexp_one(NAN)));
  x[0] = NAN;
  vexp_array(y, x, 1);
  ck_assert(isnan(y[0]));
}
END_TEST

/* Deterministic values in [-a, a). */
static void fill_uniform(float *x, int64_t n, float a, uint32_t seed) {
  for (int64_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = a * ((float)(seed >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}

START_TEST(test_causal_softmax_and_backward_match_double_precision) {
  /* planes of T = 37 (tails of the 16 lanes): forward within 8 ulp-ish (2e-6 relative to the
   * row's largest probability), backward within 2e-6 of the row's largest |term|; exactly 0
   * above the diagonal */
  enum { P = 3, T = 37 };
  static float a[P * T * T], d[P * T * T], d0[P * T * T];
  fill_uniform(a, P * T * T, 6.0f, 11);
  fill_uniform(d0, P * T * T, 1.0f, 12);
  static double s[P * T * T];
  for (int i = 0; i < P * T * T; i++) s[i] = a[i];
  memcpy(d, d0, sizeof d);
  OK(mpt_op_causal_softmax(NULL, a, P, T));
  OK(mpt_op_causal_softmax_backward(NULL, a, d, P, T));
  for (int r = 0; r < P * T; r++) {
    const int i = r % T;
    const double *sr = s + (int64_t)r * T;
    double mx = sr[0], sum = 0.0, want[T], dot = 0.0;
    for (int j = 1; j <= i; j++) mx = sr[j] > mx ? sr[j] : mx;
    for (int j = 0; j <= i; j++) sum += exp(sr[j] - mx);
    for (int j = 0; j <= i; j++) want[j] = exp(sr[j] - mx) / sum;
    for (int j = 0; j <= i; j++) dot += want[j] * d0[(int64_t)r * T + j];
    for (int j = 0; j < T; j++) {
      const float got = a[(int64_t)r * T + j], dgot = d[(int64_t)r * T + j];
      if (j > i) {
        ck_assert_msg(got == 0.0f && dgot == 0.0f, "row %d col %d above the diagonal", r, j);
        continue;
      }
      ck_assert_msg(fabs(got - want[j]) <= 2e-6 * want[j] + 1e-9, "softmax[%d][%d] = %.9g, want "
                    "%.9g", r, j, got, want[j]);
      const double dwant = want[j] * (d0[(int64_t)r * T + j] - dot);
      ck_assert_msg(fabs(dgot - dwant) <= 2e-6 * (fabs(dwant) + want[j]), "dsoftmax[%d][%d] = "
                    "%.9g, want %.9g", r, j, dgot, dwant);
    }
  }
}
END_TEST

START_TEST(test_xent_vocab_and_backward_match_double_precision) {
  /* V = 300 real columns of Vp = 384 (a tail of the exp blocks and lanes): the row maximum
   * exactly, 1 / sum and the loss within 1e-6 relative, dlogits within 1e-6 relative + 1e-12;
   * the padding untouched */
  enum { N = 5, VP = 384, V = 300 };
  static float l[N * VP], dl[N * VP], st[2 * N];
  int32_t tg[N] = {0, 299, 17, 150, 5};
  fill_uniform(l, N * VP, 8.0f, 21);
  for (int i = 0; i < N * VP; i++) dl[i] = 0.25f;
  float loss = 0.0f, dloss = 2.0f;
  OK(mpt_op_xent_vocab(NULL, l, tg, N, VP, V, st, &loss));
  OK(mpt_op_xent_vocab_backward(NULL, l, tg, N, VP, V, st, &dloss, dl));
  double total = 0.0;
  for (int r = 0; r < N; r++) {
    const float *lr = l + r * VP;
    double mx = lr[0], sum = 0.0;
    for (int j = 1; j < V; j++) mx = lr[j] > mx ? lr[j] : mx;
    for (int j = 0; j < V; j++) sum += exp(lr[j] - mx);
    const double want = mx + log(sum);
    ck_assert_msg(st[2 * r] == mx, "max[%d] = %.9g, want %.9g", r, st[2 * r], mx);
    ck_assert_msg(fabs(st[2 * r + 1] - 1.0 / sum) <= 1e-6 / sum, "1 / sum[%d] = %.9g, want %.9g",
                  r, st[2 * r + 1], 1.0 / sum);
    total += want - lr[tg[r]];
    for (int j = 0; j < VP; j++) {
      const double g = j < V ? 2.0 / N * (exp(lr[j] - want) - (j == tg[r])) : 0.0;
      ck_assert_msg(fabs(dl[r * VP + j] - (0.25 + g)) <= 1e-6 * fabs(0.25 + g) + 1e-12,
                    "dlogits[%d][%d] = %.9g, want %.9g", r, j, dl[r * VP + j], 0.25 + g);
    }
  }
  ck_assert_double_eq_tol(loss, total / N, 1e-6 * total / N);
}
END_TEST

START_TEST(test_xent_vocab_gradient_is_right_at_large_logits) {
  /* Logits of magnitude 10, 1e2, 1e3 and 1e4 (a diverging run, a large output scale): four row
   * kinds per scale, spread over [-s, s], over [s/2, s], and s or -s plus a spread of a few
   * units (many comparable probabilities on a large offset). Against exp(l - max) / sum in
   * double on the same float logits:
   * - the loss within 1e-6 relative (a double sum rounded to float);
   * - each dlogits element within 1e-6 g (g = dloss / N; a probability carries a few float
   *   roundings, vmath.h's exp within 2 ulp and the products by 1 / sum and g: 4e-7 at most,
   *   plus 2^-24 / e for a rounded l - max);
   * - each row of dlogits sums to 0 within 2e-6 g (the probabilities sum to 1: those errors
   *   summed, at most 4e-7 + 2^-24 log V).
   * A per-row statistic rounded to float at |logit| = s moves every probability of the row by
   * up to s 2^-24 relative: the row sums then miss 0 by 3e-5 g at s = 1e3, 5e-4 g at 1e4. */
  enum { N = 8, VP = 384, V = 300 };
  static const float scales[] = {10.0f, 1e2f, 1e3f, 1e4f};
  static float l[N * VP], dl[N * VP], stats[2 * N];
  const int32_t tg[N] = {0, 299, 17, 150, 5, 42, 298, 1};
  for (int si = 0; si < 4; si++) {
    const float s = scales[si];
    fill_uniform(l, N * VP, 1.0f, 51 + (uint32_t)si);
    for (int r = 0; r < N; r++)
      for (int j = 0; j < VP; j++) {
        float *x = &l[r * VP + j];
        switch (r % 4) {
        case 0: *x *= s; break;                          /* [-s, s] */
        case 1: *x = 0.75f * s + 0.25f * s * *x; break;  /* [s/2, s] */
        case 2: *x = s + 3.0f * *x; break;               /* s + [-3, 3] */
        default: *x = -s + 3.0f * *x; break;             /* -s + [-3, 3] */
        }
      }
    memset(dl, 0, sizeof dl);
    const float dloss = 1.0f, g = dloss / N;
    float loss = 0.0f;
    OK(mpt_op_xent_vocab(NULL, l, tg, N, VP, V, stats, &loss));
    OK(mpt_op_xent_vocab_backward(NULL, l, tg, N, VP, V, stats, &dloss, dl));
    double total = 0.0;
    for (int r = 0; r < N; r++) {
      const float *lr = l + r * VP;
      const float *dr = dl + r * VP;
      double mx = lr[0], sum = 0.0, rowsum = 0.0;
      for (int j = 1; j < V; j++) mx = lr[j] > mx ? lr[j] : mx;
      for (int j = 0; j < V; j++) sum += exp(lr[j] - mx);
      total += mx + log(sum) - lr[tg[r]];
      for (int j = 0; j < V; j++) {
        const double want = g * (exp(lr[j] - mx) / sum - (j == tg[r]));
        ck_assert_msg(fabs(dr[j] - want) <= 1e-6 * g,
                      "|logit| %g: dlogits[%d][%d] = %.9g, want %.9g (%.3g g off)", (double)s,
                      r, j, (double)dr[j], want, fabs(dr[j] - want) / g);
        rowsum += dr[j];
      }
      ck_assert_msg(fabs(rowsum) <= 2e-6 * g, "|logit| %g: row %d of dlogits sums to %.3g g",
                    (double)s, r, rowsum / g);
    }
    ck_assert_msg(fabs(loss - total / N) <= 1e-6 * fabs(total / N),
                  "|logit| %g: loss %.9g, want %.9g", (double)s, (double)loss, total / N);
  }
}
END_TEST

START_TEST(test_layernorm_and_backward_match_double_precision) {
  /* rows of C = 37 (lane tails), an offset mean: y, mean, rstd within 2e-6 relative; dx, dw,
   * dbias (accumulated onto 0.5) within 1e-5 of the largest term of their sums */
  enum { R = 6, C = 37 };
  static float x[R * C], w[C], b[C], y[R * C], m[R], rs[R], dy[R * C], dx[R * C], dw[C], db[C];
  fill_uniform(x, R * C, 2.0f, 31);
  for (int i = 0; i < R * C; i++) x[i] += 3.0f;
  fill_uniform(w, C, 1.5f, 32);
  fill_uniform(b, C, 0.5f, 33);
  fill_uniform(dy, R * C, 1.0f, 34);
  for (int i = 0; i < R * C; i++) dx[i] = 0.5f;
  for (int i = 0; i < C; i++) dw[i] = db[i] = 0.5f;
  OK(mpt_op_layernorm(NULL, x, R, C, w, b, 1e-5f, y, m, rs));
  OK(mpt_op_layernorm_backward(NULL, dy, x, R, C, w, m, rs, dx, dw, db));
  double wdw[C], wdb[C];
  for (int i = 0; i < C; i++) wdw[i] = wdb[i] = 0.5;
  for (int r = 0; r < R; r++) {
    const float *xr = x + r * C, *g = dy + r * C;
    double mean = 0.0, var = 0.0, xh[C], gm = 0.0, gxm = 0.0;
    for (int i = 0; i < C; i++) mean += xr[i];
    mean /= C;
    for (int i = 0; i < C; i++) var += (xr[i] - mean) * (xr[i] - mean);
    const double rstd = 1.0 / sqrt(var / C + 1e-5);
    ck_assert_double_eq_tol(m[r], mean, 2e-6 * fabs(mean));
    ck_assert_double_eq_tol(rs[r], rstd, 2e-6 * rstd);
    for (int i = 0; i < C; i++) {
      xh[i] = (xr[i] - mean) * rstd;
      const double want = xh[i] * w[i] + b[i];
      ck_assert_msg(fabs(y[r * C + i] - want) <= 2e-6 * (fabs(xh[i] * w[i]) + fabs(b[i])),
                    "y[%d][%d] = %.9g, want %.9g", r, i, y[r * C + i], want);
      gm += (double)g[i] * w[i];
      gxm += (double)g[i] * w[i] * xh[i];
      wdw[i] += g[i] * xh[i];
      wdb[i] += g[i];
    }
    gm /= C;
    gxm /= C;
    for (int i = 0; i < C; i++) {
      const double want = 0.5 + rstd * (g[i] * w[i] - gm - xh[i] * gxm);
      ck_assert_msg(fabs(dx[r * C + i] - want) <= 1e-5 * rstd * (fabs(g[i] * w[i]) + 1.0),
                    "dx[%d][%d] = %.9g, want %.9g", r, i, dx[r * C + i], want);
    }
  }
  for (int i = 0; i < C; i++) {
    ck_assert_msg(fabs(dw[i] - wdw[i]) <= 1e-5 * (R * 3.0), "dw[%d] = %.9g, want %.9g", i,
                  dw[i], wdw[i]);
    ck_assert_msg(fabs(db[i] - wdb[i]) <= 1e-5 * R, "dbias[%d] = %.9g, want %.9g", i, db[i],
                  wdb[i]);
  }
}
END_TEST

START_TEST(test_backward_beta_0_writes_what_beta_1_adds_to_zeros) {
  /* GELU and the vocabulary cross-entropy: beta 0 into a NaN-filled buffer gives the bits
   * beta 1 gives into a zero-filled one (so nothing was read), padded columns 0 */
  enum { N = 1000, R = 3, VP = 384, V = 300 };
  static float x[N], dy[N], a[N], b[N], l[R * VP], da[R * VP], db[R * VP], st[2 * R];
  const int32_t tg[R] = {1, 299, 0};
  fill_uniform(x, N, 4.0f, 41);
  fill_uniform(dy, N, 1.0f, 42);
  fill_uniform(l, R * VP, 3.0f, 43);
  for (int i = 0; i < N; i++) a[i] = NAN, b[i] = 0.0f;
  OK(mpt_op_gelu_backward_beta(NULL, a, dy, x, N, 0.0f));
  OK(mpt_op_gelu_backward_beta(NULL, b, dy, x, N, 1.0f));
  ck_assert(memcmp(a, b, sizeof a) == 0);
  float loss = 0.0f, dloss = 1.5f;
  OK(mpt_op_xent_vocab(NULL, l, tg, R, VP, V, st, &loss));
  for (int i = 0; i < R * VP; i++) da[i] = NAN, db[i] = 0.0f;
  OK(mpt_op_xent_vocab_backward_beta(NULL, l, tg, R, VP, V, st, &dloss, da, 0.0f));
  OK(mpt_op_xent_vocab_backward_beta(NULL, l, tg, R, VP, V, st, &dloss, db, 1.0f));
  ck_assert(memcmp(da, db, sizeof da) == 0);
  ck_assert(da[VP - 1] == 0.0f && da[2 * VP + V] == 0.0f);
  ck_assert_int_eq(mpt_op_gelu_backward_beta(NULL, a, dy, x, N, 0.5f), MPT_EINVAL);
  ck_assert_int_eq(mpt_op_xent_vocab_backward_beta(NULL, l, tg, R, VP, V, st, &dloss, da, 2.0f),
                   MPT_EINVAL);
}
END_TEST

static Suite *gpt_core_suite(void) {
  Suite *s = suite_create("gpt_core");
  TCase *tc = tcase_create("gpt_core");
  tcase_add_test(tc, test_core_ops_check_arguments_and_skip_empty_work);
  tcase_add_test(tc, test_core_causal_softmax_of_equal_scores_is_uniform_over_the_past);
  tcase_add_test(tc, test_gelu_core_op_matches_double_precision_on_a_dense_grid);
  tcase_add_test(tc, test_vexpf_is_within_2_ulp_of_exp_and_the_same_at_every_width);
  tcase_add_test(tc, test_causal_softmax_and_backward_match_double_precision);
  tcase_add_test(tc, test_xent_vocab_and_backward_match_double_precision);
  tcase_add_test(tc, test_xent_vocab_gradient_is_right_at_large_logits);
  tcase_add_test(tc, test_layernorm_and_backward_match_double_precision);
  tcase_add_test(tc, test_backward_beta_0_writes_what_beta_1_adds_to_zeros);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(gpt_core_suite());
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
