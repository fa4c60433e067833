/* mpt_gemm_bench: the fp32 GEMMs of one GPT (or mlp) training step, timed on each CPU GEMM
 * backend side by side (bench/README.md "mpt_gemm_bench"). --model mlp: the trainer's mlp
 * (784 -> 512 -> 512 -> 10, every Linear with a bias), M = the batch per rank (--rows, default 64),
 * the small products where a library's per-call overhead and packing weigh most.
 *
 * For each Linear of the model (qkv C -> 3C, attproj C -> C, fc C -> 4C, fcproj 4C -> C, the head
 * C -> Vp tied to wte) it times the three products that mpt_nn_linear_nd (src/nn/gpt_ops.c)
 * issues, with the same transposes, leading dimensions and beta, M = B*T rows:
 *   fwd  Y [M, out]  = X [M, in] W [out, in]^T           gemm(0, 1, M, out, in), beta 0
 *   fwdb the same plus the bias row (GEMM, then mpt_op_bias_add; oneDNN: its bias argument)
 *   dx   dX [M, in]  = dY [M, out] W [out, in]          gemm(0, 0, M, in, out), beta 0
 *   dw   dW [out, in] += dY [M, out]^T X [M, in]         gemm(1, 0, out, in, M), beta 1
 * on these backends (--backends, comma-separated):
 *   openblas  cblas_sgemm called directly;
 *   dnnl      a oneDNN 2.x matmul primitive made once per shape (strided memory descriptors, so
 *             no transposing copy; beta as a sum post-op; fwdb through the bias argument);
 *   sgemm     oneDNN's BLAS-like dnnl_sgemm;
 *   mpt       mpt_op_gemm, i.e. whatever this build routes the fp32 CPU GEMM to;
 *   blis      BLIS's bli_sgemm (bench/gemm_blis.c; when configure found BLIS), a candidate the
 *             library does not use unless this bench shows it faster;
 *   xsmm      libxsmm's JIT kernels (bench/gemm_xsmm.c; when configure found libxsmm), the same
 *             kind of candidate, on the calling thread only;
 *   mkl       Intel MKL's cblas_sgemm, loaded at run time from $MPT_BENCH_MKL (default
 *             libmkl_rt.so.3; PyPI's `mkl` package has it), the same kind of candidate; its
 *             instruction set follows MKL_ENABLE_INSTRUCTIONS.
 * Backends alternate per repetition (A B C A B C ...) so that a noisy machine hits all alike;
 * each figure is the median over --reps timed calls after one untimed warm-up call. The clock
 * (--clock): `thread` (the default at one thread) is the calling thread's CPU time, which does not
 * count the time other processes hold the core (this machine is shared); `wall` (the default
 * above one thread, where the work is on other threads too) is CLOCK_MONOTONIC. Threads:
 * mpt_cpu_set_threads(--threads) (OpenBLAS) and omp_set_num_threads (oneDNN).
 * The `err` column: max |C - C_openblas| / max |C_openblas| of the last call (fwd, dx: the
 * product; dw: the accumulated gradient after one call from the same start).
 * The footer weighs each product by how often one step issues it (L per layer kind, 1 for the
 * head) and gives the step's GEMM time and GFLOP/s per backend, and the ratio to openblas.
 * Then the attention's GEMMs (src/nn/attention.c: 64-row blocks of one head at a time, T
 * --seq-len, default gpt-mini 256, gpt2 512) for one head, and the step's total over B H L heads
 * (every backend but dnnl). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* dladdr */
#endif
#include <cblas.h>
#include <dlfcn.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <oneapi/dnnl/dnnl.h>

#include "mpitrain/ops.h"

enum { B_OPENBLAS, B_DNNL, B_SGEMM, B_MPT, B_BLIS, B_XSMM, B_MKL, NBACK };
static const char *const back_names[NBACK] = {"openblas", "dnnl", "sgemm", "mpt",
                                              "blis",     "xsmm", "mkl"};

/* MKL's cblas_sgemm (the CBLAS enums are the same numbers in every CBLAS) and its version. */
typedef void (*cblas_sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
                               const float *, int, float, float *, int);
static cblas_sgemm_fn mkl_sgemm;
static char mkl_version[160] = "?";
static const char *mkl_path;

/* Loads MKL from $MPT_BENCH_MKL (default libmkl_rt.so.3) on `threads` threads; 0 or -1. */
static int mkl_load(int threads) {
  const char *path = getenv("MPT_BENCH_MKL") ? getenv("MPT_BENCH_MKL") : "libmkl_rt.so.3";
  /* one thread: MKL's sequential layer, so that no second OpenMP runtime joins GNU's */
  if (threads == 1) setenv("MKL_THREADING_LAYER", "SEQUENTIAL", 0);
  void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!h || !(mkl_sgemm = (cblas_sgemm_fn)dlsym(h, "cblas_sgemm"))) {
    fprintf(stderr, "gemm_bench: cannot load MKL's cblas_sgemm from %s (%s): pip install mkl, "
            "then MPT_BENCH_MKL=VENV/lib/libmkl_rt.so.3\n", path, dlerror());
    return -1;
  }
  void (*set_threads)(int) = (void (*)(int))dlsym(h, "MKL_Set_Num_Threads");
  void (*version)(char *, int) = (void (*)(char *, int))dlsym(h, "MKL_Get_Version_String");
  mkl_path = path;
  if (set_threads) set_threads(threads);
  if (version) version(mkl_version, (int)sizeof mkl_version);
  return 0;
}

#ifdef MPT_BENCH_BLIS /* bench/gemm_blis.c */
void mpt_bench_blis_threads(int threads);
void mpt_bench_blis_sgemm(int ta, int tb, long m, long n, long k, float alpha, const float *a,
                          long lda, const float *b, long ldb, float beta, float *c, long ldc);
const char *mpt_bench_blis_arch(void);
#endif
#ifdef MPT_BENCH_XSMM /* bench/gemm_xsmm.c */
int mpt_bench_xsmm_sgemm(int ta, int tb, long m, long n, long k, float alpha, const float *a,
                         long lda, const float *b, long ldb, float beta, float *c, long ldc);
const char *mpt_bench_xsmm_arch(void);
#endif
enum { P_FWD, P_FWDB, P_DX, P_DW, NPROD };
static const char *const prod_names[NPROD] = {"fwd", "fwdb", "dx", "dw"};

typedef struct layer {
  const char *name;
  int64_t in, out, count; /* count: uses per step */
  int bias;                /* the head has none: its step forward is fwd, not fwdb */
} layer;

typedef struct shape {
  int ta, tb;
  int64_t m, n, k, lda, ldb, ldc;
  float beta;
  int bias;
} shape;

static clockid_t clock_id = CLOCK_MONOTONIC;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(clock_id, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

#define DNNL_DIE(call)                                                           \
  do {                                                                           \
    dnnl_status_t st_ = (call);                                                  \
    if (st_ != dnnl_success) {                                                   \
      fprintf(stderr, "gemm_bench: %s failed (oneDNN status %d)\n", #call, st_); \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

static dnnl_engine_t engine;
static dnnl_stream_t dstream;

typedef struct dplan {
  dnnl_primitive_t prim;
  dnnl_memory_t a, b, c, bias;
} dplan;

static void md2(dnnl_memory_desc_t *md, int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  const dnnl_dims_t dims = {rows, cols}, strides = {rs, cs};
  DNNL_DIE(dnnl_memory_desc_init_by_strides(md, 2, dims, dnnl_f32, strides));
}

static void dplan_make(dplan *p, const shape *s) {
  dnnl_memory_desc_t a_md, b_md, c_md, bias_md;
  md2(&a_md, s->m, s->k, s->ta ? 1 : s->lda, s->ta ? s->lda : 1);
  md2(&b_md, s->k, s->n, s->tb ? 1 : s->ldb, s->tb ? s->ldb : 1);
  md2(&c_md, s->m, s->n, s->ldc, 1);
  md2(&bias_md, 1, s->n, s->n, 1);
  dnnl_matmul_desc_t d;
  DNNL_DIE(dnnl_matmul_desc_init(&d, &a_md, &b_md, s->bias ? &bias_md : NULL, &c_md));
  dnnl_primitive_attr_t attr;
  DNNL_DIE(dnnl_primitive_attr_create(&attr));
  if (s->beta != 0.0f) {
    dnnl_post_ops_t po;
    DNNL_DIE(dnnl_post_ops_create(&po));
    DNNL_DIE(dnnl_post_ops_append_sum(po, s->beta));
    DNNL_DIE(dnnl_primitive_attr_set_post_ops(attr, po));
    dnnl_post_ops_destroy(po);
  }
  dnnl_primitive_desc_t pd;
  DNNL_DIE(dnnl_primitive_desc_create(&pd, &d, attr, engine, NULL));
  DNNL_DIE(dnnl_primitive_create(&p->prim, pd));
  dnnl_primitive_desc_destroy(pd);
  dnnl_primitive_attr_destroy(attr);
  DNNL_DIE(dnnl_memory_create(&p->a, &a_md, engine, DNNL_MEMORY_NONE));
  DNNL_DIE(dnnl_memory_create(&p->b, &b_md, engine, DNNL_MEMORY_NONE));
  DNNL_DIE(dnnl_memory_create(&p->c, &c_md, engine, DNNL_MEMORY_NONE));
  DNNL_DIE(dnnl_memory_create(&p->bias, &bias_md, engine, DNNL_MEMORY_NONE));
}

static void dplan_free(dplan *p) {
  dnnl_primitive_destroy(p->prim);
  dnnl_memory_destroy(p->a);
  dnnl_memory_destroy(p->b);
  dnnl_memory_destroy(p->c);
  dnnl_memory_destroy(p->bias);
}

/* One call of product s on backend `back`: the product, then (fwdb) the bias row through
 * mpt_op_bias_add on every backend but oneDNN's matmul, which takes the bias itself. */
static void run(int back, const shape *s, dplan *p, const float *a, const float *b,
                const float *bias, float *c) {
  switch (back) {
    case B_OPENBLAS:
      cblas_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans,
                  s->tb ? CblasTrans : CblasNoTrans, (int)s->m, (int)s->n, (int)s->k, 1.0f, a,
                  (int)s->lda, b, (int)s->ldb, s->beta, c, (int)s->ldc);
      break;
    case B_SGEMM:
      DNNL_DIE(dnnl_sgemm(s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', s->m, s->n, s->k, 1.0f, a, s->lda,
                          b, s->ldb, s->beta, c, s->ldc));
      break;
    case B_BLIS:
#ifdef MPT_BENCH_BLIS
      mpt_bench_blis_sgemm(s->ta, s->tb, s->m, s->n, s->k, 1.0f, a, s->lda, b, s->ldb, s->beta, c,
                           s->ldc);
#endif
      break;
    case B_MKL:
      mkl_sgemm(CblasRowMajor, s->ta ? CblasTrans : CblasNoTrans,
                s->tb ? CblasTrans : CblasNoTrans, (int)s->m, (int)s->n, (int)s->k, 1.0f, a,
                (int)s->lda, b, (int)s->ldb, s->beta, c, (int)s->ldc);
      break;
    case B_XSMM:
#ifdef MPT_BENCH_XSMM
      if (mpt_bench_xsmm_sgemm(s->ta, s->tb, s->m, s->n, s->k, 1.0f, a, s->lda, b, s->ldb,
                               s->beta, c, s->ldc) != 0) {
        fprintf(stderr, "gemm_bench: libxsmm made no kernel for %d %d %lld x %lld x %lld\n",
                s->ta, s->tb, (long long)s->m, (long long)s->n, (long long)s->k);
        exit(1);
      }
#endif
      break;
    case B_MPT:
      if (mpt_op_gemm(NULL, s->ta, s->tb, s->m, s->n, s->k, 1.0f, a, s->lda, b, s->ldb, s->beta,
                      c, s->ldc) != MPT_OK) {
        fprintf(stderr, "gemm_bench: %s\n", mpt_last_error());
        exit(1);
      }
      break;
    default: {
      DNNL_DIE(dnnl_memory_set_data_handle(p->a, (void *)a));
      DNNL_DIE(dnnl_memory_set_data_handle(p->b, (void *)b));
      DNNL_DIE(dnnl_memory_set_data_handle(p->c, c));
      DNNL_DIE(dnnl_memory_set_data_handle(p->bias, (void *)bias));
      dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, p->a}, {DNNL_ARG_WEIGHTS, p->b},
                                 {DNNL_ARG_DST, p->c}, {DNNL_ARG_BIAS, p->bias}};
      DNNL_DIE(dnnl_primitive_execute(p->prim, dstream, s->bias ? 4 : 3, args));
      DNNL_DIE(dnnl_stream_wait(dstream));
      return;
    }
  }
  if (s->bias && mpt_op_bias_add(NULL, c, bias, s->m, s->n, 1) != MPT_OK) {
    fprintf(stderr, "gemm_bench: %s\n", mpt_last_error());
    exit(1);
  }
}

/* ---- attention (src/nn/attention.c): the block GEMMs of one (sequence, head) ----
 * q, k, v are column blocks of qkv [T, 3C] (leading dimension 3C), the head's output / its
 * gradient a column block of [T, C]; the T x T matrices are tight. Per block of 64 rows r0:
 *   S   gemm(0, 1, rows, r0+rows, hs)  scale Q K^T            (forward)
 *   Y   gemm(0, 0, rows, hs, r0+rows)  A V                    (forward)
 *   dA  gemm(0, 1, rows, r0+rows, hs)  dY V^T                 (backward)
 *   dV  gemm(1, 0, rows, hs, T-r0)     A^T dY, beta 1         (backward)
 *   dQ  gemm(0, 0, rows, hs, r0+rows)  dS K, beta 1           (backward)
 *   dK  gemm(1, 0, rows, hs, T-r0)     dS^T Q, beta 1         (backward) */
enum { A_S, A_Y, A_DA, A_DV, A_DQ, A_DK, NATT };
static const char *const attn_names[NATT] = {"S", "Y", "dA", "dV", "dQ", "dK"};
enum { ABLOCK = 64 };

/* All blocks of product `kind` for one head on backend `back` (not B_DNNL); returns its FLOPs. */
static double attn_run(int back, int kind, int64_t t, int64_t c, int64_t hs, const float *qkv,
                       const float *att, float *tt, float *dqkv, const float *dy) {
  const int64_t c3 = 3 * c;
  const float *q = qkv, *kk = qkv + c, *v = qkv + 2 * c;
  double flop = 0;
  for (int64_t r0 = 0; r0 < t; r0 += ABLOCK) {
    const int64_t rows = t - r0 < ABLOCK ? t - r0 : ABLOCK, cols = r0 + rows;
    shape s;
    const float *a, *b;
    float *cc;
    switch (kind) {
      case A_S: s = (shape){0, 1, rows, cols, hs, c3, c3, t, 0.0f, 0};
        a = q + r0 * c3, b = kk, cc = tt + r0 * t; break;
      case A_Y: s = (shape){0, 0, rows, hs, cols, t, c3, c, 0.0f, 0};
        a = att + r0 * t, b = v, cc = dqkv + r0 * c; break; /* any [T, C] block */
      case A_DA: s = (shape){0, 1, rows, cols, hs, c, c3, t, 0.0f, 0};
        a = dy + r0 * c, b = v, cc = tt + r0 * t; break;
      case A_DV: s = (shape){1, 0, rows, hs, t - r0, t, c, c3, 1.0f, 0};
        a = att + r0 * t + r0, b = dy + r0 * c, cc = dqkv + 2 * c + r0 * c3; break;
      case A_DQ: s = (shape){0, 0, rows, hs, cols, t, c3, c3, 1.0f, 0};
        a = att + r0 * t, b = kk, cc = dqkv + r0 * c3; break;
      default: s = (shape){1, 0, rows, hs, t - r0, t, c3, c3, 1.0f, 0};
        a = att + r0 * t + r0, b = q + r0 * c3, cc = dqkv + c + r0 * c3; break;
    }
    run(back, &s, NULL, a, b, NULL, cc);
    flop += 2.0 * (double)s.m * (double)s.n * (double)s.k;
  }
  return flop;
}

static float *alloc_fill(size_t count, unsigned seed);

/* Times the attention products of one head (T, C, hs) on the chosen backends, alternating;
 * adds the step's time (times `heads` = B H L) to step_s. */
static void attn_bench(const int *order, int nuse, int reps, int64_t t, int64_t c, int64_t hs,
                       double heads, double *step_s, double *step_flop) {
  float *qkv = alloc_fill((size_t)(t * 3 * c), 41), *att = alloc_fill((size_t)(t * t), 42);
  float *tt = alloc_fill((size_t)(t * t), 43), *dqkv = alloc_fill((size_t)(t * 3 * c), 44);
  float *dy = alloc_fill((size_t)(t * c), 45);
  double *tm = calloc((size_t)(NBACK * reps), sizeof *tm);
  for (int kind = 0; kind < NATT; kind++) {
    double flop = 0;
    for (int j = 0; j < nuse; j++) /* warm-up */
      if (order[j] != B_DNNL) flop = attn_run(order[j], kind, t, c, hs, qkv, att, tt, dqkv, dy);
    for (int r = 0; r < reps; r++)
      for (int j = 0; j < nuse; j++) {
        if (order[j] == B_DNNL) continue;
        const double t0 = now_s();
        attn_run(order[j], kind, t, c, hs, qkv, att, tt, dqkv, dy);
        tm[order[j] * reps + r] = now_s() - t0;
      }
    printf("  %-8s %-4s %2s %2s %6s %6s %6s %4s", "attn", attn_names[kind], "", "", "", "", "",
           "");
    for (int j = 0; j < nuse; j++) {
      const int b = order[j];
      if (b == B_DNNL) {
        printf(" %9s %8s", "-", "");
        continue;
      }
      qsort(tm + b * reps, (size_t)reps, sizeof *tm, cmp_double);
      const double med = tm[b * reps + reps / 2];
      printf(" %9.1f %8s", flop / med * 1e-9, "");
      step_s[b] += heads * med;
    }
    printf("   (%lld blocks of %d rows, per head)\n", (long long)((t + ABLOCK - 1) / ABLOCK),
           ABLOCK);
    *step_flop += heads * flop;
    fflush(stdout);
  }
  free(tm);
  free(qkv), free(att), free(tt), free(dqkv), free(dy);
}

static float *alloc_fill(size_t count, unsigned seed) {
  float *x = aligned_alloc(64, (count * sizeof(float) + 63) & ~(size_t)63);
  if (!x) {
    fprintf(stderr, "gemm_bench: out of memory (%zu floats)\n", count);
    exit(1);
  }
  for (size_t i = 0; i < count; i++) {
    seed = seed * 1664525u + 1013904223u;
    x[i] = (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
  }
  return x;
}

static void usage(FILE *f) {
  fprintf(f, "usage: mpt_gemm_bench [--model gpt-mini|gpt2|mlp] [--rows M] [--threads N] [--reps R]\n"
             "                      [--backends openblas,dnnl,sgemm,mpt,blis,xsmm,mkl]\n"
             "                      [--only NAME] [--clock thread|wall]\n"
             "                      [--seq-len T (0: no attention)]\n");
}

int main(int argc, char **argv) {
  const char *model = "gpt-mini", *backends = "openblas,dnnl,mpt", *only = NULL, *clk = NULL;
  int64_t rows = -1, seq = -1;
  int threads = 1, reps = 5;
  for (int i = 1; i < argc; i++) {
    const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(o, "-h") || !strcmp(o, "--help")) {
      usage(stdout);
      return 0;
    }
    if (!v) {
      usage(stderr);
      return 2;
    }
    i++;
    if (!strcmp(o, "--model")) model = v;
    else if (!strcmp(o, "--rows")) rows = atoll(v);
    else if (!strcmp(o, "--threads")) threads = atoi(v);
    else if (!strcmp(o, "--reps")) reps = atoi(v);
    else if (!strcmp(o, "--backends")) backends = v;
    else if (!strcmp(o, "--only")) only = v;
    else if (!strcmp(o, "--clock")) clk = v;
    else if (!strcmp(o, "--seq-len")) seq = atoll(v);
    else {
      usage(stderr);
      return 2;
    }
  }
  int64_t c = 0, vp = 0, nl = 0;
  const int mlp = !strcmp(model, "mlp");
  if (!strcmp(model, "gpt-mini")) c = 384, vp = 256, nl = 6, seq = seq < 0 ? 256 : seq;
  else if (!strcmp(model, "gpt2")) c = 768, vp = 50304, nl = 12, seq = seq < 0 ? 512 : seq;
  else if (mlp) seq = 0; /* the trainer's mlp: 784 -> 512 -> 512 -> 10, M = the batch */
  else {
    fprintf(stderr, "gemm_bench: unknown model %s (gpt-mini, gpt2 or mlp)\n", model);
    return 2;
  }
  if (rows < 0) rows = mlp ? 64 : 2048;
  if (rows < 1 || threads < 1 || reps < 1 || (seq > 0 && rows % seq)) {
    usage(stderr);
    return 2;
  }
  if (!clk) clk = threads == 1 ? "thread" : "wall";
  if (!strcmp(clk, "thread")) clock_id = CLOCK_THREAD_CPUTIME_ID;
  else if (strcmp(clk, "wall")) {
    fprintf(stderr, "gemm_bench: --clock %s (want thread or wall)\n", clk);
    return 2;
  }
  int use[NBACK] = {0}, nuse = 0, order[NBACK];
  for (int b = 0; b < NBACK; b++) {
    const char *hit = strstr(backends, back_names[b]);
    if (hit) use[b] = 1, order[nuse++] = b;
  }
#ifndef MPT_BENCH_BLIS
  if (use[B_BLIS]) {
    fprintf(stderr, "gemm_bench: built without BLIS (configure --with-blis; libblis-dev)\n");
    return 2;
  }
#endif
#ifndef MPT_BENCH_XSMM
  if (use[B_XSMM]) {
    fprintf(stderr, "gemm_bench: built without libxsmm (configure --with-libxsmm; libxsmm-dev)\n");
    return 2;
  }
#endif
  if (use[B_MKL] && mkl_load(threads) != 0) return 2;
  if (use[B_XSMM] && threads != 1) {
    fprintf(stderr, "gemm_bench: xsmm runs on the calling thread: use --threads 1\n");
    return 2;
  }
  if (!use[B_OPENBLAS]) {
    fprintf(stderr, "gemm_bench: --backends must include openblas (the reference)\n");
    return 2;
  }
  const layer gpt_layers[] = {{"qkv", c, 3 * c, nl, 1},    {"attproj", c, c, nl, 1},
                              {"fc", c, 4 * c, nl, 1},     {"fcproj", 4 * c, c, nl, 1},
                              {"head", c, vp, 1, 0}};
  const layer mlp_layers[] = {{"fc1", 784, 512, 1, 1}, {"fc2", 512, 512, 1, 1},
                              {"fc3", 512, 10, 1, 1}};
  const layer *layers = mlp ? mlp_layers : gpt_layers;
  const size_t nlayers = mlp ? 3 : 5;
  if (mpt_cpu_set_threads(threads) != MPT_OK) return 1;
  omp_set_num_threads(threads);
#ifdef MPT_BENCH_BLIS
  mpt_bench_blis_threads(threads);
#endif
  /* Which library cblas_sgemm resolved to: with BLIS linked too, both define it. */
  Dl_info dli;
  const char *cblas_from = dladdr((void *)cblas_sgemm, &dli) && dli.dli_fname ? dli.dli_fname : "?";
  DNNL_DIE(dnnl_engine_create(&engine, dnnl_cpu, 0));
  DNNL_DIE(dnnl_stream_create(&dstream, engine, dnnl_stream_default_flags));

  printf("# mpt_gemm_bench: model %s (C %lld, Vp %lld, L %lld), M = B*T = %lld, threads %d, "
         "reps %d (median), clock %s, OpenBLAS core %s, cblas_sgemm from %s\n", model,
         (long long)c, (long long)vp, (long long)nl, (long long)rows, threads, reps, clk,
         openblas_get_corename(), cblas_from);
#ifdef MPT_BENCH_BLIS
  if (use[B_BLIS]) printf("# BLIS configuration: %s\n", mpt_bench_blis_arch());
#endif
#ifdef MPT_BENCH_XSMM
  if (use[B_XSMM]) printf("# libxsmm target: %s\n", mpt_bench_xsmm_arch());
#endif
  if (use[B_MKL]) printf("# MKL: %s (%s)\n", mkl_version, mkl_path);
  printf("# %-8s %-4s %2s %2s %6s %6s %6s %4s", "layer", "prod", "ta", "tb", "m", "n", "k",
         "beta");
  for (int j = 0; j < nuse; j++) printf(" %9s %8s", back_names[order[j]], "err");
  printf("   (GFLOP/s; err vs openblas)\n");
  double step_s[NBACK] = {0}, step_flop = 0;
  for (size_t li = 0; li < nlayers; li++) {
    const layer *L = &layers[li];
    if (only && strcmp(only, L->name)) continue;
    float *x = alloc_fill((size_t)(rows * L->in), 1), *w = alloc_fill((size_t)(L->out * L->in), 2);
    float *dy = alloc_fill((size_t)(rows * L->out), 3), *bias = alloc_fill((size_t)L->out, 4);
    const size_t cmax = (size_t)(rows * (L->in > L->out ? L->in : L->out));
    const size_t wcount = (size_t)(L->out * L->in);
    float *cref = alloc_fill(cmax > wcount ? cmax : wcount, 5);
    float *cout = alloc_fill(cmax > wcount ? cmax : wcount, 5);
    const shape shapes[NPROD] = {
        {0, 1, rows, L->out, L->in, L->in, L->in, L->out, 0.0f, 0},
        {0, 1, rows, L->out, L->in, L->in, L->in, L->out, 0.0f, 1},
        {0, 0, rows, L->in, L->out, L->out, L->in, L->in, 0.0f, 0},
        {1, 0, L->out, L->in, rows, L->out, L->in, L->in, 1.0f, 0}};
    const float *as[NPROD] = {x, x, dy, dy}, *bs[NPROD] = {w, w, w, x};
    const int step_fwd = L->bias ? P_FWDB : P_FWD; /* the forward the step issues */
    for (int pi = 0; pi < NPROD; pi++) {
      const shape *s = &shapes[pi];
      if (pi == P_FWDB && !L->bias) continue;
      dplan plan = {0};
      if (use[B_DNNL]) dplan_make(&plan, s);
      double *t = calloc((size_t)(NBACK * reps), sizeof *t);
      const size_t ccount = (size_t)(s->m * s->ldc);
      float errs[NBACK] = {0};
      /* reference: one OpenBLAS call from the fixed start (dw accumulates onto it) */
      float *start = alloc_fill(ccount, 7);
      memcpy(cref, start, ccount * sizeof(float));
      run(B_OPENBLAS, s, NULL, as[pi], bs[pi], bias, cref);
      for (int j = 0; j < nuse; j++) { /* untimed warm-up, and the error of one call */
        memcpy(cout, start, ccount * sizeof(float));
        run(order[j], s, &plan, as[pi], bs[pi], bias, cout);
        float md = 0, mr = 0;
        for (size_t i = 0; i < ccount; i++) {
          md = fmaxf(md, fabsf(cout[i] - cref[i]));
          mr = fmaxf(mr, fabsf(cref[i]));
        }
        errs[order[j]] = mr > 0 ? md / mr : md;
      }
      for (int r = 0; r < reps; r++)
        for (int j = 0; j < nuse; j++) {
          const double t0 = now_s();
          run(order[j], s, &plan, as[pi], bs[pi], bias, cout);
          t[order[j] * reps + r] = now_s() - t0;
        }
      const int in_step = pi == step_fwd || pi == P_DX || pi == P_DW;
      const double flop = 2.0 * (double)s->m * (double)s->n * (double)s->k;
      printf("  %-8s %-4s %2d %2d %6lld %6lld %6lld %4.0f", L->name, prod_names[pi], s->ta, s->tb,
             (long long)s->m, (long long)s->n, (long long)s->k, s->beta);
      for (int j = 0; j < nuse; j++) {
        const int b = order[j];
        qsort(t + b * reps, (size_t)reps, sizeof *t, cmp_double);
        const double med = t[b * reps + reps / 2];
        printf(" %9.1f %8.1e", flop / med * 1e-9, errs[b]);
        if (in_step) step_s[b] += (double)L->count * med;
      }
      printf("\n");
      if (in_step) step_flop += (double)L->count * flop;
      fflush(stdout);
      free(t);
      free(start);
      if (use[B_DNNL]) dplan_free(&plan);
    }
    free(x), free(w), free(dy), free(bias), free(cref), free(cout);
  }
  if (step_flop > 0) {
    printf("# step (fwdb + dx + dw of every Linear, %.1f GFLOP):", step_flop * 1e-9);
    for (int j = 0; j < nuse; j++)
      printf("  %s %.1f ms %.1f GFLOP/s (x%.3f)", back_names[order[j]], step_s[order[j]] * 1e3,
             step_flop / step_s[order[j]] * 1e-9, step_s[B_OPENBLAS] / step_s[order[j]]);
    printf("\n");
  }
  if (seq > 0 && (!only || !strcmp(only, "attn"))) {
    const int64_t hs = 64, nh = c / hs;
    double att_s[NBACK] = {0}, att_flop = 0;
    attn_bench(order, nuse, reps, seq, c, hs, (double)(rows / seq * nh * nl), att_s, &att_flop);
    printf("# attention (T %lld, %lld heads of 64, %lld sequences, %lld layers; %.1f GFLOP):",
           (long long)seq, (long long)nh, (long long)(rows / seq), (long long)nl,
           att_flop * 1e-9);
    for (int j = 0; j < nuse; j++)
      if (order[j] != B_DNNL)
        printf("  %s %.1f ms %.1f GFLOP/s (x%.3f)", back_names[order[j]],
               att_s[order[j]] * 1e3, att_flop / att_s[order[j]] * 1e-9,
               att_s[B_OPENBLAS] / att_s[order[j]]);
    printf("\n");
  }
  dnnl_stream_destroy(dstream);
  dnnl_engine_destroy(engine);
  return 0;
}
