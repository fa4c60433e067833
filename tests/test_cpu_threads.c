/* Tests of the CPU ops' thread pool (src/core/cpu/cpu_pool.c, pool.h) and of the kernels that
 * split their work over it: every chunk runs exactly once, workers really take chunks, a chunk
 * that calls a parallel kernel and two callers at once both complete; and every split op
 * (embedding, LayerNorm, GELU, causal softmax, vocabulary cross-entropy, each with its
 * backward; fill, copy, axpy, scale, bias add and bias gradient; AdamW; the fused add +
 * LayerNorm and bias + GELU with its backward) gives the bits of one
 * thread at 2 and 3 threads, each run at a thread count repeated until a worker took part. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu/pool.h"
#include "mpitrain/ops.h"
#include "mpitrain/ops_gpt.h"
#include "check_util.h"


/* Deterministic values in [-a, a). */
static void fill_uniform(float *x, int64_t n, float a, uint32_t seed) {
  for (int64_t i = 0; i < n; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = a * ((float)(seed >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}

/* ---- the pool ---- */

typedef struct count_job {
  atomic_int *hits; /* [n] */
  int spin;         /* busy work per chunk, so that the workers get some */
  int nested;       /* each chunk also runs a parallel job of its own */
} count_job;

static void count_range(void *arg, int64_t b, int64_t e) {
  const count_job *j = arg;
  volatile double sink = 0.0;
  for (int k = 0; k < j->spin; k++) sink += k * 0.5;
  if (j->nested) { /* the pool is busy: runs on this thread */
    atomic_int inner[10] = {0};
    count_job in = {.hits = inner};
    mpt__cpu_parallel_for(10, 3, count_range, &in);
    for (int i = 0; i < 10; i++) ck_assert_int_eq(atomic_load(&inner[i]), 1);
  }
  for (int64_t i = b; i < e; i++) atomic_fetch_add(&j->hits[i], 1);
}

/* Runs a job of n items in chunks of 7 until a worker took a chunk (at most 200 times), each
 * item exactly once every time. */
static void run_counted(int64_t n, int nested) {
  atomic_int *hits = calloc((size_t)n, sizeof *hits);
  ck_assert_ptr_nonnull(hits);
  const int64_t w0 = mpt__cpu_pool_worker_chunks();
  for (int tries = 0; tries < 200 && mpt__cpu_pool_worker_chunks() == w0; tries++) {
    for (int64_t i = 0; i < n; i++) atomic_store(&hits[i], 0);
    count_job j = {.hits = hits, .spin = 20000, .nested = nested};
    mpt__cpu_parallel_for(n, 7, count_range, &j);
    for (int64_t i = 0; i < n; i++)
      ck_assert_msg(atomic_load(&hits[i]) == 1, "item %lld ran %d times", (long long)i,
                    atomic_load(&hits[i]));
  }
  ck_assert_msg(mpt__cpu_pool_worker_chunks() > w0, "no worker took a chunk in 200 jobs");
  free(hits);
}

START_TEST(test_pool_runs_every_chunk_once_and_workers_take_part) {
  OK(mpt_cpu_set_threads(3));
  run_counted(1001, 0);
  OK(mpt_cpu_set_threads(1)); /* one thread: all on the caller */
  const int64_t w0 = mpt__cpu_pool_worker_chunks();
  atomic_int hits[50] = {0};
  count_job j = {.hits = hits};
  mpt__cpu_parallel_for(50, 7, count_range, &j);
  for (int i = 0; i < 50; i++) ck_assert_int_eq(atomic_load(&hits[i]), 1);
  ck_assert_int_eq(mpt__cpu_pool_worker_chunks(), w0);
  mpt__cpu_parallel_for(0, 7, count_range, &j); /* nothing */
  ck_assert_int_eq(mpt__cpu_parallel_chunk(1000000, 10), 1000000); /* one thread: no split */
  OK(mpt_cpu_set_threads(2));
  ck_assert_int_eq(mpt__cpu_parallel_chunk(49, 10), 49); /* too little work: < 5 grains */
  ck_assert_int_eq(mpt__cpu_parallel_chunk(800, 10), 100); /* n / (4 threads) */
  ck_assert_int_eq(mpt__cpu_parallel_chunk(800, 150), 150); /* at least a grain */
  ck_assert_int_eq(mpt__cpu_parallel_chunk_ps(1000, 1e6, 64, 0), 128); /* grain 10, aligned */
  ck_assert_int_eq(mpt__cpu_parallel_chunk_ps(1000, 1e6, 16, 1), 512); /* even: n / threads */
  ck_assert_int_eq(mpt__cpu_parallel_chunk_ps(1000, 1e4, 16, 1), 1000); /* 10 us of work */
}
END_TEST

START_TEST(test_pool_nested_job_runs_on_the_calling_thread) {
  OK(mpt_cpu_set_threads(2));
  run_counted(301, 1);
}
END_TEST

static void *second_caller(void *arg) {
  (void)arg;
  for (int k = 0; k < 20; k++) {
    atomic_int hits[500] = {0};
    count_job j = {.hits = hits, .spin = 2000};
    mpt__cpu_parallel_for(500, 7, count_range, &j);
    for (int i = 0; i < 500; i++)
      if (atomic_load(&hits[i]) != 1) return (void *)1;
  }
  return NULL;
}

START_TEST(test_pool_two_callers_at_once_both_complete) {
  OK(mpt_cpu_set_threads(2));
  pthread_t th;
  ck_assert_int_eq(pthread_create(&th, NULL, second_caller, NULL), 0);
  void *r1 = second_caller(NULL), *r2 = NULL;
  pthread_join(th, &r2);
  ck_assert_ptr_null(r1);
  ck_assert_ptr_null(r2);
}
END_TEST

/* ---- every split op: the bits of one thread at 2 and 3 threads ---- */

/* Writes an op's outputs (all of them, as floats) into out[0, *n), from fixed inputs. */
typedef void (*op_case)(float *out, size_t *n);

static void check_same_bits(const char *name, op_case fn, size_t cap) {
  float *ref = malloc(cap * sizeof *ref), *got = malloc(cap * sizeof *got);
  ck_assert(ref && got);
  size_t nref = 0, ngot = 0;
  OK(mpt_cpu_set_threads(1));
  const int64_t w1 = mpt__cpu_pool_worker_chunks();
  fn(ref, &nref);
  ck_assert_int_eq(mpt__cpu_pool_worker_chunks(), w1);
  for (int t = 2; t <= 3; t++) {
    OK(mpt_cpu_set_threads(t));
    const int64_t w0 = mpt__cpu_pool_worker_chunks();
    for (int tries = 0; tries < 200 && mpt__cpu_pool_worker_chunks() == w0; tries++) {
      fn(got, &ngot);
      ck_assert_uint_eq(ngot, nref);
      for (size_t i = 0; i < nref; i++)
        ck_assert_msg(memcmp(&ref[i], &got[i], sizeof *ref) == 0, "%s at %d threads: output "
                      "%zu is %.9g, %.9g at 1 thread", name, t, i, got[i], ref[i]);
    }
    ck_assert_msg(mpt__cpu_pool_worker_chunks() > w0, "%s at %d threads: no worker took a chunk "
                  "in 200 runs (the op did not split?)", name, t);
  }
  OK(mpt_cpu_set_threads(1));
  free(ref);
  free(got);
}

enum { EB = 8, ET = 200, EC = 200, EV = 64 };
static void case_embedding(float *out, size_t *n) {
  static int32_t tok[EB * ET];
  static float wte[EV * EC], wpe[ET * EC], dy[EB * ET * EC];
  for (int i = 0; i < EB * ET; i++) tok[i] = (int32_t)((i * 37 + 5) % 23); /* repeats */
  fill_uniform(wte, EV * EC, 1.0f, 1);
  fill_uniform(wpe, ET * EC, 1.0f, 2);
  fill_uniform(dy, EB * ET * EC, 1.0f, 3);
  float *y = out, *dwte = y + EB * ET * EC, *dwpe = dwte + EV * EC;
  OK(mpt_op_embedding_gpt(NULL, tok, EB, ET, EC, EV, wte, wpe, y));
  fill_uniform(dwte, EV * EC, 0.5f, 4);
  fill_uniform(dwpe, ET * EC, 0.5f, 5);
  OK(mpt_op_embedding_gpt_backward(NULL, tok, EB, ET, EC, EV, dy, dwte, dwpe));
  *n = (size_t)(EB * ET * EC + EV * EC + ET * EC);
}

enum { LR = 1000, LC = 200 };
static void case_layernorm(float *out, size_t *n) {
  static float x[LR * LC], w[LC], b[LC], dy[LR * LC];
  fill_uniform(x, LR * LC, 2.0f, 11);
  for (int i = 0; i < LR * LC; i++) x[i] += 1.5f;
  fill_uniform(w, LC, 1.5f, 12);
  fill_uniform(b, LC, 0.5f, 13);
  fill_uniform(dy, LR * LC, 1.0f, 14);
  float *y = out, *m = y + LR * LC, *rs = m + LR, *dx = rs + LR, *dw = dx + LR * LC;
  float *db = dw + LC, *dx2 = db + LC, *dw2 = dx2 + LR * LC;
  OK(mpt_op_layernorm(NULL, x, LR, LC, w, b, 1e-5f, y, m, rs));
  fill_uniform(dx, LR * LC, 0.25f, 15);
  fill_uniform(dw, LC, 0.25f, 16);
  fill_uniform(db, LC, 0.25f, 17);
  OK(mpt_op_layernorm_backward(NULL, dy, x, LR, LC, w, m, rs, dx, dw, db));
  /* some gradients not asked for */
  fill_uniform(dx2, LR * LC, 0.25f, 18);
  fill_uniform(dw2, LC, 0.25f, 19);
  OK(mpt_op_layernorm_backward(NULL, dy, x, LR, LC, w, m, rs, dx2, NULL, NULL));
  OK(mpt_op_layernorm_backward(NULL, dy, x, LR, LC, w, m, rs, NULL, dw2, NULL));
  *n = (size_t)(3 * LR * LC + 2 * LR + 3 * LC);
}

enum { GN = 100003 };
static void case_gelu(float *out, size_t *n) {
  static float x[GN], dy[GN];
  fill_uniform(x, GN, 5.0f, 21);
  fill_uniform(dy, GN, 1.0f, 22);
  float *y = out, *dx = y + GN, *dxw = dx + GN;
  OK(mpt_op_gelu(NULL, y, x, GN));
  fill_uniform(dx, GN, 0.5f, 23);
  OK(mpt_op_gelu_backward(NULL, dx, dy, x, GN));
  OK(mpt_op_gelu_backward_beta(NULL, dxw, dy, x, GN, 0.0f));
  *n = 3 * (size_t)GN;
}

enum { SP = 12, ST = 130 };
static void case_causal_softmax(float *out, size_t *n) {
  float *a = out, *d = a + SP * ST * ST;
  fill_uniform(a, SP * ST * ST, 6.0f, 31);
  fill_uniform(d, SP * ST * ST, 1.0f, 32);
  OK(mpt_op_causal_softmax(NULL, a, SP, ST));
  OK(mpt_op_causal_softmax_backward(NULL, a, d, SP, ST));
  *n = 2 * (size_t)(SP * ST * ST);
}

enum { XN = 400, XVP = 384, XV = 300 };
static void case_xent_vocab(float *out, size_t *n) {
  static float l[XN * XVP];
  static int32_t tg[XN];
  fill_uniform(l, XN * XVP, 8.0f, 41);
  for (int i = 0; i < XN; i++) tg[i] = (int32_t)((i * 131 + 7) % XV);
  float *stats = out, *loss = stats + 2 * XN, *dl = loss + 1, *dlw = dl + XN * XVP;
  float dloss = 1.5f;
  OK(mpt_op_xent_vocab(NULL, l, tg, XN, XVP, XV, stats, loss));
  fill_uniform(dl, XN * XVP, 0.25f, 42);
  OK(mpt_op_xent_vocab_backward(NULL, l, tg, XN, XVP, XV, stats, &dloss, dl));
  OK(mpt_op_xent_vocab_backward_beta(NULL, l, tg, XN, XVP, XV, stats, &dloss, dlw, 0.0f));
  *n = (size_t)(2 * XN + 1 + 2 * XN * XVP);
}

enum { EN = 1100001 };
static void case_elementwise(float *out, size_t *n) {
  static float x[EN];
  fill_uniform(x, EN, 3.0f, 51);
  float *f = out, *c = f + EN, *y = c + EN;
  OK(mpt_op_fill(NULL, f, EN, 0.75f));
  OK(mpt_op_copy(NULL, c, x, EN));
  fill_uniform(y, EN, 1.0f, 52);
  OK(mpt_op_axpy(NULL, EN, -0.3f, x, y));
  OK(mpt_op_scale(NULL, y, EN, 1.7f));
  *n = 3 * (size_t)EN;
}

enum { BR = 2000, BC = 200 };
static void case_bias(float *out, size_t *n) {
  static float bias[BC], dy[BR * BC];
  fill_uniform(bias, BC, 1.0f, 61);
  fill_uniform(dy, BR * BC, 1.0f, 62);
  float *y = out, *db = y + BR * BC;
  fill_uniform(y, BR * BC, 1.0f, 63);
  OK(mpt_op_bias_add(NULL, y, bias, BR, BC, 1));
  fill_uniform(db, BC, 0.5f, 64);
  OK(mpt_op_bias_backward(NULL, db, dy, BR, BC, 1));
  *n = (size_t)(BR * BC + BC);
}

enum { AN = 100003 };
static void case_adamw(float *out, size_t *n) {
  static float g[AN];
  float *p = out, *m = p + AN, *v = m + AN;
  fill_uniform(p, AN, 1.0f, 71);
  memset(m, 0, AN * sizeof *m);
  memset(v, 0, AN * sizeof *v);
  for (int step = 1; step <= 2; step++) {
    fill_uniform(g, AN, 0.1f, 72 + (uint32_t)step);
    OK(mpt_op_adamw_step(NULL, p, g, m, v, AN, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, step));
  }
  *n = 3 * (size_t)AN;
}

/* The fused ops (ops_gpt.h): add + LayerNorm, bias + GELU and its backward (bias gradient in
 * blocks of 256 rows: 2000 rows are 8 blocks). */
static void case_fused(float *out, size_t *n) {
  static float a[BR * BC], b[BR * BC], w[BC], lb[BC], dy[BR * BC];
  fill_uniform(a, BR * BC, 2.0f, 81);
  fill_uniform(b, BR * BC, 1.0f, 82);
  fill_uniform(w, BC, 1.5f, 83);
  fill_uniform(lb, BC, 0.5f, 84);
  fill_uniform(dy, BR * BC, 1.0f, 85);
  float *s = out, *y = s + BR * BC, *m = y + BR * BC, *rs = m + BR, *g = rs + BR;
  float *dx = g + BR * BC, *db = dx + BR * BC;
  OK(mpt_op_add_layernorm(NULL, a, b, BR, BC, w, lb, 1e-5f, s, y, m, rs));
  OK(mpt_op_bias_gelu(NULL, g, a, lb, BR, BC));
  fill_uniform(db, BC, 0.5f, 86);
  OK(mpt_op_bias_gelu_backward(NULL, dx, dy, a, lb, BR, BC, db));
  *n = (size_t)(4 * BR * BC + 2 * BR + BC);
}

START_TEST(test_split_ops_give_the_bits_of_one_thread) {
  check_same_bits("embedding_gpt (+ backward)", case_embedding,
                  EB * ET * EC + EV * EC + ET * EC);
  check_same_bits("layernorm (+ backward)", case_layernorm, 3 * LR * LC + 2 * LR + 3 * LC);
  check_same_bits("gelu (+ backward)", case_gelu, 3 * GN);
  check_same_bits("causal_softmax (+ backward)", case_causal_softmax, 2 * SP * ST * ST);
  check_same_bits("xent_vocab (+ backward)", case_xent_vocab, 2 * XN + 1 + 2 * XN * XVP);
  check_same_bits("fill, copy, axpy, scale", case_elementwise, 3 * EN);
  check_same_bits("bias_add, bias_backward", case_bias, BR * BC + BC);
  check_same_bits("adamw_step", case_adamw, 3 * AN);
  check_same_bits("add_layernorm, bias_gelu (+ backward)", case_fused,
                  4 * BR * BC + 2 * BR + BC);
}
END_TEST

static Suite *cpu_threads_suite(void) {
  Suite *s = suite_create("cpu_threads");
  TCase *tc = tcase_create("cpu_threads");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_pool_runs_every_chunk_once_and_workers_take_part);
  tcase_add_test(tc, test_pool_nested_job_runs_on_the_calling_thread);
  tcase_add_test(tc, test_pool_two_callers_at_once_both_complete);
  tcase_add_test(tc, test_split_ops_give_the_bits_of_one_thread);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  SRunner *sr = srunner_create(cpu_threads_suite());
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
