/* Tests of the CUDA bf16 GEMM (src/core/cuda/ops_cuda.c mpt__cuda_gemm_bf16, kernels_bf16.cu;
 * include/mpitrain/ops_bf16.h). Exits 77 (automake's SKIP) and prints "SKIP: ..." without a
 * GPU of compute capability 8.0 or newer (no CPU oracle is needed: the GPU machine may have no
 * oneDNN).
 *
 * Oracle: the exact sum, in double on the host, of the products of the inputs rounded with
 * mpt_bf16_from_f32 (round to nearest even). cuBLAS multiplies the same bf16 values exactly and
 * adds in float32 (CUBLAS_COMPUTE_32F), so each element is within gamma_K sum |a b| (gamma_K =
 * K 2^-24 / (1 - K 2^-24)) of it, plus 2^-23 |beta c| for the beta term; against the exact
 * float inputs the bound grows by (2u + u^2) sum |a b|, u = 2^-8, and the error must exceed
 * gamma_K somewhere (else the inputs were not rounded). Small integers: the bf16 GEMM equals
 * the float32 GEMM of the same device bit for bit. A tape on the GPU with precision bf16 runs a
 * conv2d through im2col + the bf16 GEMM (no CUDA bf16 library convolution). Check runs without
 * forking (a CUDA context does not survive fork()). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpitrain/autograd.h"
#include "mpitrain/core.h"
#include "mpitrain/nn.h"
#include "mpitrain/ops.h"
#include "mpitrain/ops_bf16.h"
#include "check_util.h"

#define TIMEOUT_MS 60000.0

static const mpt_device GPU = {MPT_DEVICE_CUDA, 0};
static mpt_stream *S;
static const double U = 1.0 / 256; /* 2^-8: bf16 keeps 8 significant bits */

static void setup(void) { OK(mpt_stream_init(&S, GPU, MPT_STREAM_INLINE)); }
static void teardown(void) {
  mpt_stream_free(S);
  S = NULL;
}

static double gamma_k(int64_t k) {
  const double e = ldexp((double)k, -24);
  return e / (1 - e);
}

static float *hrand(int64_t n, uint64_t seed, int ints) {
  float *x = calloc((size_t)n, sizeof *x);
  ck_assert_ptr_nonnull(x);
  mpt_rng r;
  mpt_rng_seed(&r, seed);
  if (ints)
    for (int64_t i = 0; i < n; i++) x[i] = (float)mpt_rng_below(&r, 17) - 8.0f;
  else
    mpt_rng_fill_uniform(&r, x, n, -1, 1);
  return x;
}

static float *up(const float *h, int64_t n) {
  void *d = NULL;
  OK(mpt_device_alloc(GPU, (size_t)n * sizeof *h, &d));
  OK(mpt_op_memcpy(S, GPU, d, mpt_device_cpu(), h, (size_t)n * sizeof *h));
  return d;
}

static void down(float *h, const float *d, int64_t n) {
  OK(mpt_op_memcpy(S, mpt_device_cpu(), h, GPU, d, (size_t)n * sizeof *h));
  OK(mpt_stream_synchronize(S, TIMEOUT_MS));
}

static double bf(float x) { return (double)mpt_bf16_to_f32(mpt_bf16_from_f32(x)); }

START_TEST(test_cuda_gemm_bf16_within_bound_all_transposes) {
  const int64_t m = 33, n = 45, k = 520;
  for (int t = 0; t < 4; t++) {
    const int ta = t & 1, tb = t >> 1;
    const int64_t lda = (ta ? m : k) + 1, ldb = (tb ? k : n) + 2, ldc = n + 3;
    const int64_t na = (ta ? k : m) * lda, nb = (tb ? n : k) * ldb, nc = m * ldc;
    float *a = hrand(na, 1 + t, 0), *b = hrand(nb, 5 + t, 0), *c0 = hrand(nc, 9 + t, 0);
    float *c = calloc((size_t)nc, sizeof *c);
    float *da = up(a, na), *db = up(b, nb), *dc = up(c0, nc);
    const float alpha = 0.5f, beta = 1.0f;
    OK(mpt_op_gemm_bf16(S, ta, tb, m, n, k, alpha, da, lda, db, ldb, beta, dc, ldc));
    down(c, dc, nc);
    double worst = 0;
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        double rounded = 0, exact = 0, mag = 0;
        for (int64_t l = 0; l < k; l++) {
          const float x = ta ? a[l * lda + i] : a[i * lda + l];
          const float y = tb ? b[j * ldb + l] : b[l * ldb + j];
          rounded += bf(x) * bf(y);
          exact += (double)x * y;
          mag += fabs((double)x * y);
        }
        const double cb = beta * (double)c0[i * ldc + j], got = c[i * ldc + j];
        const double g = gamma_k(k + 1);
        const double tol = g * (1 + U) * (1 + U) * alpha * mag + 0x1p-23 * fabs(cb);
        ck_assert_msg(fabs(got - (alpha * rounded + cb)) <= tol, "ta %d tb %d C[%lld,%lld] = "
                      "%.9g, want %.9g (tol %.3g)", ta, tb, (long long)i, (long long)j, got,
                      alpha * rounded + cb, tol);
        const double r = fabs(got - (alpha * exact + cb)) / (g * alpha * mag);
        if (r > worst) worst = r;
      }
    ck_assert_msg(worst > 2, "ta %d tb %d: as accurate as float32: inputs not rounded", ta, tb);
    mpt_device_free(GPU, da);
    mpt_device_free(GPU, db);
    mpt_device_free(GPU, dc);
    free(a);
    free(b);
    free(c0);
    free(c);
  }
}
END_TEST

START_TEST(test_cuda_gemm_bf16_small_integers_equal_fp32) {
  const int64_t m = 17, n = 31, k = 96;
  float *a = hrand(m * k, 21, 1), *b = hrand(k * n, 22, 1), *c0 = hrand(m * n, 23, 1);
  float *c32 = calloc((size_t)(m * n), sizeof *c32), *c16 = calloc((size_t)(m * n), sizeof *c16);
  float *da = up(a, m * k), *db = up(b, k * n), *d32 = up(c0, m * n), *d16 = up(c0, m * n);
  OK(mpt_op_gemm(S, 0, 1, m, n, k, 1.0f, da, k, db, k, 1.0f, d32, n)); /* B read as [n, k] */
  OK(mpt_op_gemm_bf16(S, 0, 1, m, n, k, 1.0f, da, k, db, k, 1.0f, d16, n));
  down(c32, d32, m * n);
  down(c16, d16, m * n);
  ck_assert_msg(memcmp(c32, c16, (size_t)(m * n) * sizeof *c16) == 0,
                "bf16 GEMM of small integers differs from float32 on the GPU");
  mpt_device_free(GPU, da);
  mpt_device_free(GPU, db);
  mpt_device_free(GPU, d32);
  mpt_device_free(GPU, d16);
  free(a);
  free(b);
  free(c0);
  free(c32);
  free(c16);
}
END_TEST

/* conv2d of small integers on a bf16 tape on the GPU equals the fp32 tape's (im2col + bf16
 * GEMM; every product and sum exact). */
START_TEST(test_cuda_tape_bf16_conv_falls_back_to_im2col) {
  ck_assert_int_eq(mpt_op_conv2d_bf16_available(S), 0);
  mpt_model *model = NULL;
  const int64_t ws[4] = {4, 3, 3, 3};
  int pw;
  OK(mpt_model_init(&model, GPU));
  OK(mpt_model_add_param(model, "w", 4, ws, MPT_INIT_FAN_IN, 27, &pw));
  OK(mpt_model_finalize(model));
  float *w = hrand(4 * 27, 31, 1), *x = hrand(2 * 3 * 6 * 6, 32, 1);
  OK(mpt_op_memcpy(S, GPU, mpt_model_params(model), mpt_device_cpu(), w, 4 * 27 * sizeof *w));
  float *dx = up(x, 2 * 3 * 36);
  const int64_t xs[4] = {2, 3, 6, 6};
  mpt_tensor xt = mpt_tensor_view(dx, GPU, MPT_F32, 4, xs);
  float y[2][2 * 4 * 16];
  for (int p = 0; p < 2; p++) {
    mpt_tape *tape = NULL;
    OK(mpt_tape_init(&tape, model, S));
    OK(mpt_tape_set_precision(tape, p ? MPT_PRECISION_BF16 : MPT_PRECISION_FP32));
    mpt_var *xv = NULL, *wv = NULL, *yv = NULL;
    OK(mpt_tape_input(tape, &xt, &xv));
    OK(mpt_tape_param(tape, 0, &wv));
    OK(mpt_nn_conv2d(tape, xv, wv, NULL, 1, 0, &yv));
    down(y[p], mpt_var_value(yv)->data, 2 * 4 * 16);
    mpt_tape_free(tape);
  }
  ck_assert(memcmp(y[0], y[1], sizeof y[0]) == 0);
  mpt_device_free(GPU, dx);
  mpt_model_free(model);
  free(w);
  free(x);
}
END_TEST

int main(void) {
  if (mpt_device_count(MPT_DEVICE_CUDA) == 0) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  mpt_stream *probe = NULL;
  if (mpt_stream_init(&probe, GPU, MPT_STREAM_INLINE) != MPT_OK ||
      mpt_op_bf16_check(probe) != MPT_OK) {
    printf("SKIP: no bf16 on cuda:0: %s\n", mpt_last_error());
    mpt_stream_free(probe);
    return 77;
  }
  mpt_stream_free(probe);
  Suite *suite = suite_create("cuda_bf16");
  TCase *tc = tcase_create("cuda_bf16");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_cuda_gemm_bf16_within_bound_all_transposes);
  tcase_add_test(tc, test_cuda_gemm_bf16_small_integers_equal_fp32);
  tcase_add_test(tc, test_cuda_tape_bf16_conv_falls_back_to_im2col);
  suite_add_tcase(suite, tc);
  SRunner *sr = srunner_create(suite);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
