/* Every op on every path against the CPU reference: the table of tests/backend_op_cases.c run
 * on each CPU instruction-set path this machine has (include/mpitrain/ops.h "CPU instruction
 * sets"; the library's own kernels switched in this process) and on each registered device
 * backend, compared with the CPU (harness in tests/backend_ops.h; the idea of ggml's
 * test-backend-ops). The CPU reference itself is checked against naive loops, finite
 * differences and PyTorch by the per-op tests (test_ops.c, test_gpt_ops.c, ...).
 *
 *   test_backend_ops            the CPU paths: avx512 and avx2 against the baseline, bit for
 *                               bit; a path the CPU lacks prints "SKIP" and is not asserted;
 *                               and the GEMMs on oneDNN against OpenBLAS, within the bounds
 *   test_backend_ops cuda       CUDA against the CPU, within the table's bounds; exit 77
 *                               (automake's SKIP) without a GPU
 *   test_backend_ops --offers ISA   exit 0 if this CPU runs ISA (avx512, avx2, baseline), else 1
 *
 * oneDNN's cap is set once per process (MPT_CPU_ISA), so the paths compared here share
 * oneDNN's kernels; tests/isa_paths.sh reruns this program and the per-op tests under each
 * MPT_CPU_ISA for those. Each case prints one line (path, case, result). Check runs without
 * forking (a CUDA context does not survive fork()). */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu/isa.h"
#include "mpitrain/ops.h"
#include "backend_ops.h"
#include "check_util.h"

#define TIMEOUT_MS 60000.0

enum { MAX_BUFS = 64, MAX_OUTS = 16, OUT_F32 = 0, OUT_I32, OUT_U16, OUT_HOST };

/* A case's outputs, on the host. */
typedef struct result {
  int nouts;
  struct {
    const char *name;
    int kind;
    int64_t count;
    void *data; /* count elements (OUT_HOST: one double) */
  } o[MAX_OUTS];
} result;

struct bo_ctx {
  mpt_device dev;
  mpt_stream *s;
  mpt_rng rng;
  mpt_status failed; /* the first failed upload or download (the case is void) */
  void *dev_bufs[MAX_BUFS], *host_bufs[MAX_BUFS];
  int ndev, nhost;
  result *r;
};

mpt_stream *bo_stream(bo_ctx *c) { return c->s; }
mpt_device bo_device(bo_ctx *c) { return c->dev; }

void *bo_host_bytes(bo_ctx *c, int64_t nbytes) {
  void *p = calloc(1, nbytes > 0 ? (size_t)nbytes : 1);
  ck_assert_ptr_nonnull(p);
  ck_assert_int_lt(c->nhost, MAX_BUFS);
  c->host_bufs[c->nhost++] = p;
  return p;
}

float *bo_host_uniform(bo_ctx *c, int64_t n, float lo, float hi) {
  float *h = bo_host_bytes(c, n * (int64_t)sizeof *h);
  mpt_rng_fill_uniform(&c->rng, h, n, lo, hi);
  return h;
}

float *bo_host_dyadic(bo_ctx *c, int64_t n) {
  float *h = bo_host_bytes(c, n * (int64_t)sizeof *h);
  for (int64_t i = 0; i < n; i++) h[i] = ((float)mpt_rng_below(&c->rng, 17) - 8.0f) / 4.0f;
  return h;
}

void *bo_bytes(bo_ctx *c, int64_t nbytes) {
  void *d = NULL;
  const mpt_status st = mpt_device_alloc(c->dev, (size_t)nbytes, &d);
  if (st != MPT_OK && c->failed == MPT_OK) c->failed = st;
  ck_assert_int_lt(c->ndev, MAX_BUFS);
  c->dev_bufs[c->ndev++] = d;
  return d;
}

static void *put(bo_ctx *c, const void *h, int64_t nbytes) {
  void *d = bo_bytes(c, nbytes);
  if (d && nbytes > 0) {
    const mpt_status st = mpt_op_memcpy(c->s, c->dev, d, mpt_device_cpu(), h, (size_t)nbytes);
    if (st != MPT_OK && c->failed == MPT_OK) c->failed = st;
  }
  return d;
}

float *bo_values(bo_ctx *c, const float *host, int64_t n) {
  return put(c, host, n * (int64_t)sizeof *host);
}
int32_t *bo_ids_values(bo_ctx *c, const int32_t *host, int64_t n) {
  return put(c, host, n * (int64_t)sizeof *host);
}
float *bo_uniform(bo_ctx *c, int64_t n, float lo, float hi) {
  return bo_values(c, bo_host_uniform(c, n, lo, hi), n);
}
float *bo_dyadic(bo_ctx *c, int64_t n) { return bo_values(c, bo_host_dyadic(c, n), n); }
float *bo_filled(bo_ctx *c, int64_t n, float v) {
  float *h = bo_host_bytes(c, n * (int64_t)sizeof *h);
  for (int64_t i = 0; i < n; i++) h[i] = v;
  return bo_values(c, h, n);
}
int32_t *bo_ids(bo_ctx *c, int64_t n, int64_t limit) {
  int32_t *h = bo_host_bytes(c, n * (int64_t)sizeof *h);
  for (int64_t i = 0; i < n; i++) h[i] = (int32_t)mpt_rng_below(&c->rng, (uint64_t)limit);
  return bo_ids_values(c, h, n);
}

static size_t elem_size(int kind) {
  return kind == OUT_F32 || kind == OUT_I32 ? 4 : kind == OUT_U16 ? 2 : sizeof(double);
}

/* Downloads the output now (an op of the case may overwrite the buffer afterwards). */
static void out_add(bo_ctx *c, const char *name, const void *src, int64_t n, int kind,
                    double value) {
  result *r = c->r;
  ck_assert_int_lt(r->nouts, MAX_OUTS);
  void *h = calloc((size_t)(n > 0 ? n : 1), elem_size(kind));
  ck_assert_ptr_nonnull(h);
  r->o[r->nouts].name = name;
  r->o[r->nouts].kind = kind;
  r->o[r->nouts].count = n;
  r->o[r->nouts++].data = h;
  if (kind == OUT_HOST) {
    memcpy(h, &value, sizeof value);
    return;
  }
  mpt_status st = MPT_OK;
  if (n > 0)
    st = mpt_op_memcpy(c->s, mpt_device_cpu(), h, c->dev, src, (size_t)n * elem_size(kind));
  if (st == MPT_OK && c->s) st = mpt_stream_synchronize(c->s, TIMEOUT_MS);
  if (st != MPT_OK && c->failed == MPT_OK) c->failed = st;
}
void bo_out(bo_ctx *c, const char *name, const float *dev, int64_t n) {
  out_add(c, name, dev, n, OUT_F32, 0);
}
void bo_out_i32(bo_ctx *c, const char *name, const int32_t *dev, int64_t n) {
  out_add(c, name, dev, n, OUT_I32, 0);
}
void bo_out_u16(bo_ctx *c, const char *name, const uint16_t *dev, int64_t n) {
  out_add(c, name, dev, n, OUT_U16, 0);
}
void bo_out_host(bo_ctx *c, const char *name, double value) {
  out_add(c, name, NULL, 1, OUT_HOST, value);
}

static void result_free(result *r) {
  for (int i = 0; i < r->nouts; i++) free(r->o[i].data);
  r->nouts = 0;
}

/* Runs case `index` on (dev, s), its outputs into r: inputs drawn from the case's own seed, so
 * every path sees the same. MPT_ENOTSUP: the op is not on this path. */
static mpt_status run_case(int index, mpt_device dev, mpt_stream *s, result *r) {
  const bo_case *k = &bo_cases[index];
  bo_ctx *c = calloc(1, sizeof *c);
  ck_assert_ptr_nonnull(c);
  c->dev = dev;
  c->s = s;
  c->r = r;
  r->nouts = 0;
  mpt_rng_seed(&c->rng, 1000 + (uint64_t)index);
  mpt_status st = k->run(c, k->p);
  if (st == MPT_OK && c->failed != MPT_OK) st = c->failed;
  if (s && mpt_stream_synchronize(s, TIMEOUT_MS) != MPT_OK && st == MPT_OK)
    st = MPT_FAIL(MPT_EDEVICE, "stream: %s", mpt_last_error());
  for (int i = 0; i < c->ndev; i++) mpt_device_free(dev, c->dev_bufs[i]);
  for (int i = 0; i < c->nhost; i++) free(c->host_bufs[i]);
  free(c);
  return st;
}

/* "gemm(ta=0 tb=1 m=7 n=5 k=9 pad=3)" */
static void case_label(const bo_case *k, char *buf, size_t nbytes) {
  size_t len = (size_t)snprintf(buf, nbytes, "%s(", k->op);
  const char *p = k->params;
  for (int i = 0; *p && len < nbytes; i++) {
    const size_t w = strcspn(p, " ");
    len += (size_t)snprintf(buf + len, nbytes - len, "%s%.*s=%lld", i ? " " : "", (int)w, p,
                            (long long)k->p[i]);
    p += w;
    p += strspn(p, " ");
  }
  if (len < nbytes) snprintf(buf + len, nbytes - len, ")");
}

static double value_of(const result *r, int i, int64_t j) {
  switch (r->o[i].kind) {
    case OUT_F32: return ((const float *)r->o[i].data)[j];
    case OUT_I32: return ((const int32_t *)r->o[i].data)[j];
    case OUT_U16: return ((const uint16_t *)r->o[i].data)[j];
    default: return ((const double *)r->o[i].data)[j];
  }
}

/* 1 if `got` matches `ref`: bit for bit when exact (NaN meets NaN), else within
 * atol + rtol |ref|; else 0 with the first difference in msg. */
static int outputs_match(const result *ref, const result *got, int exact, double rtol,
                         double atol, char *msg, size_t nbytes) {
  if (ref->nouts != got->nouts) {
    snprintf(msg, nbytes, "%d outputs, the reference has %d", got->nouts, ref->nouts);
    return 0;
  }
  for (int i = 0; i < ref->nouts; i++) {
    if (ref->o[i].count != got->o[i].count || ref->o[i].kind != got->o[i].kind) {
      snprintf(msg, nbytes, "%s: other size or type than the reference's", ref->o[i].name);
      return 0;
    }
    const int integral = ref->o[i].kind == OUT_I32 || ref->o[i].kind == OUT_U16;
    const size_t es = elem_size(ref->o[i].kind);
    for (int64_t j = 0; j < ref->o[i].count; j++) {
      const double w = value_of(ref, i, j), g = value_of(got, i, j);
      if (isnan(w) && isnan(g)) continue;
      const int same_bits = memcmp((const char *)ref->o[i].data + (size_t)j * es,
                                   (const char *)got->o[i].data + (size_t)j * es, es) == 0;
      const int ok = (exact || integral) ? same_bits : fabs(g - w) <= atol + rtol * fabs(w);
      if (!ok) {
        snprintf(msg, nbytes, "%s[%lld] = %.9g, reference %.9g (%s)", ref->o[i].name,
                 (long long)j, g, w, exact || integral ? "must be equal" : "beyond the bound");
        return 0;
      }
    }
  }
  return 1;
}

/* Whether got has ref's bits. Between the GEMM libraries such an output passes whatever its
 * bound gives: a case without products may hold values (a hash that overflows to inf on both)
 * that a relative bound cannot compare. */
static int same_bits(const result *ref, const result *got, const bo_case *k) {
  char scratch[320];
  return outputs_match(ref, got, 1, k->rtol, k->atol, scratch, sizeof scratch);
}

/* Runs the table on one path (dev, s; for the CPU, isa) against the CPU at ref_isa; prints a
 * line per case and a summary; returns the number of failed cases. */
static int run_path(const char *path, mpt_device dev, mpt_stream *s, mpt_cpu_isa isa,
                    mpt_cpu_isa ref_isa, mpt_cpu_gemm gemm, mpt_cpu_gemm ref_gemm) {
  const int cpu = dev.type == MPT_DEVICE_CPU;
  const mpt_cpu_isa initial = mpt_cpu_isa_active();
  int failed = 0, passed = 0, absent = 0;
  for (int i = 0; i < bo_ncases; i++) {
    const bo_case *k = &bo_cases[i];
    char label[160], msg[320] = "";
    case_label(k, label, sizeof label);
    if ((k->flags & BO_HOST) && !cpu) continue;
    result ref = {0}, got = {0};
    OK(mpt__cpu_isa_select(ref_isa));
    OK(mpt_cpu_set_gemm(ref_gemm));
    mpt_status st = run_case(i, mpt_device_cpu(), NULL, &ref);
    const char *verdict = "ok";
    if (st == MPT_ENOTSUP) {
      verdict = "not on the CPU reference here";
      absent++;
    } else if (st != MPT_OK) {
      snprintf(msg, sizeof msg, ": %s", mpt_last_error());
      verdict = "FAIL on the reference";
      failed++;
    } else {
      if (cpu) OK(mpt__cpu_isa_select(isa));
      OK(mpt_cpu_set_gemm(gemm));
      st = run_case(i, dev, s, &got);
      const int exact = (cpu && gemm == ref_gemm) || (k->flags & BO_EXACT);
      if (st == MPT_ENOTSUP) {
        verdict = "not on this path";
        absent++;
      } else if (st != MPT_OK) {
        snprintf(msg, sizeof msg, ": %s", mpt_last_error());
        verdict = "FAIL";
        failed++;
      } else if (!(gemm != ref_gemm && same_bits(&ref, &got, k)) &&
                 !outputs_match(&ref, &got, exact, k->rtol, k->atol, msg + 2, sizeof msg - 2)) {
        msg[0] = ':';
        msg[1] = ' ';
        verdict = "FAIL";
        failed++;
      } else {
        verdict = exact ? "ok (same bits)" : "ok (within the bound)";
        passed++;
      }
    }
    printf("  %-13s %-52s %s%s\n", path, label, verdict, msg);
    result_free(&ref);
    result_free(&got);
  }
  OK(mpt__cpu_isa_select(initial));
  OK(mpt_cpu_set_gemm(MPT_CPU_GEMM_AUTO));
  printf("%s: %d cases ok, %d not on this path, %d failed\n", path, passed, absent, failed);
  fflush(stdout);
  return failed;
}

/* One CPU path against the baseline, or a visible skip where the CPU lacks it. */
static void cpu_path(mpt_cpu_isa isa) {
  char path[32];
  snprintf(path, sizeof path, "cpu:%s", mpt_cpu_isa_name(isa));
  if (isa > mpt_cpu_isa_best()) {
    printf("SKIP: %s: this CPU lacks it (best: %s); not tested here\n", path,
           mpt_cpu_isa_name(mpt_cpu_isa_best()));
    return;
  }
  const int failed = run_path(path, mpt_device_cpu(), NULL, isa, MPT_CPU_ISA_BASELINE,
                             MPT_CPU_GEMM_AUTO, MPT_CPU_GEMM_AUTO);
  ck_assert_msg(failed == 0, "%s: %d cases differ from the baseline (lines above)", path,
                failed);
}

START_TEST(test_cpu_avx512_path_matches_baseline_bit_for_bit) { cpu_path(MPT_CPU_ISA_AVX512); }
END_TEST

START_TEST(test_cpu_avx2_path_matches_baseline_bit_for_bit) { cpu_path(MPT_CPU_ISA_AVX2); }
END_TEST

/* Both CPU GEMM libraries (ops.h "CPU GEMM library"): every case with its fp32 products on
 * oneDNN against the same case on OpenBLAS, within the table's bounds (the libraries sum in
 * other orders); a build without oneDNN prints "SKIP". */
START_TEST(test_cpu_onednn_gemms_match_openblas_within_the_bounds) {
  if (mpt_cpu_set_gemm(MPT_CPU_GEMM_ONEDNN) != MPT_OK) {
    printf("SKIP: cpu:onednn-gemm: this build has no oneDNN\n");
    return;
  }
  const mpt_cpu_isa isa = mpt_cpu_isa_active();
  const int failed = run_path("cpu:onednn-gemm", mpt_device_cpu(), NULL, isa, isa,
                              MPT_CPU_GEMM_ONEDNN, MPT_CPU_GEMM_OPENBLAS);
  ck_assert_msg(failed == 0, "oneDNN's GEMMs: %d cases outside the bounds of OpenBLAS's (lines "
                "above)", failed);
}
END_TEST

/* The switch itself: MPT_CPU_ISA's path is the active one; a path above the CPU's best is
 * refused, and the active path stays. */
START_TEST(test_isa_switch_takes_the_asked_path_and_refuses_a_missing_one) {
  const char *env = getenv("MPT_CPU_ISA");
  const mpt_cpu_isa active = mpt_cpu_isa_active(), best = mpt_cpu_isa_best();
  if (env && *env)
    ck_assert_str_eq(mpt_cpu_isa_name(active), env);
  else
    ck_assert_int_eq(active, best);
  ck_assert_int_le(active, best);
  if (best < MPT_CPU_ISA_AVX512) {
    ck_assert_int_eq(mpt__cpu_isa_select(MPT_CPU_ISA_AVX512), MPT_ENOTSUP);
    ck_assert_int_eq(mpt_cpu_isa_active(), active);
  }
  ck_assert_int_eq(mpt__cpu_isa_select((mpt_cpu_isa)7), MPT_EINVAL);
}
END_TEST

START_TEST(test_cuda_matches_cpu_within_the_bounds) {
  const mpt_device gpu = {MPT_DEVICE_CUDA, 0};
  mpt_stream *s = NULL;
  OK(mpt_stream_init(&s, gpu, MPT_STREAM_INLINE));
  const mpt_cpu_isa isa = mpt_cpu_isa_active();
  const int failed = run_path("cuda:0", gpu, s, isa, isa, MPT_CPU_GEMM_AUTO, MPT_CPU_GEMM_AUTO);
  mpt_stream_free(s);
  ck_assert_msg(failed == 0, "cuda: %d cases differ from the CPU (lines above)", failed);
}
END_TEST

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--offers") == 0) {
    for (int l = MPT_CPU_ISA_BASELINE; l <= MPT_CPU_ISA_AVX512; l++)
      if (strcmp(argv[2], mpt_cpu_isa_name((mpt_cpu_isa)l)) == 0)
        return l <= (int)mpt_cpu_isa_best() ? 0 : 1;
    fprintf(stderr, "test_backend_ops: unknown instruction set '%s'\n", argv[2]);
    return 2;
  }
  const int cuda = argc == 2 && strcmp(argv[1], "cuda") == 0;
  if (argc > 1 && !cuda) {
    fprintf(stderr, "usage: test_backend_ops [cuda | --offers avx512|avx2|baseline]\n");
    return 2;
  }
  if (mpt_cpu_isa_init() != MPT_OK) {
    fprintf(stderr, "test_backend_ops: %s\n", mpt_last_error());
    return 1;
  }
  printf("CPU: paths this CPU offers up to %s; MPT_CPU_ISA %s (oneDNN capped as it says)\n",
         mpt_cpu_isa_name(mpt_cpu_isa_best()), getenv("MPT_CPU_ISA") ? getenv("MPT_CPU_ISA")
                                                                     : "unset");
  if (cuda && mpt_device_count(MPT_DEVICE_CUDA) == 0) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  Suite *suite = suite_create("backend_ops");
  TCase *tc = tcase_create(cuda ? "cuda" : "cpu");
  tcase_set_timeout(tc, 600);
  if (cuda) {
    tcase_add_test(tc, test_cuda_matches_cpu_within_the_bounds);
  } else {
    tcase_add_test(tc, test_isa_switch_takes_the_asked_path_and_refuses_a_missing_one);
    tcase_add_test(tc, test_cpu_avx512_path_matches_baseline_bit_for_bit);
    tcase_add_test(tc, test_cpu_avx2_path_matches_baseline_bit_for_bit);
    tcase_add_test(tc, test_cpu_onednn_gemms_match_openblas_within_the_bounds);
  }
  suite_add_tcase(suite, tc);
  SRunner *sr = srunner_create(suite);
  srunner_set_fork_status(sr, CK_NOFORK); /* a CUDA context does not survive fork() */
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
