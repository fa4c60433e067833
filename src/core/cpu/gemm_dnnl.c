/* bf16 GEMM on the CPU through oneDNN 2.x's matmul primitive (ops.h mpt_op_gemm_bf16), and the
 * check that the CPU can run it natively (mpt_op_bf16_check). Compiled only with oneDNN
 * (MPT_HAVE_ONEDNN; src/core/local.mk).
 *
 * C (M x N, f32, row stride ldc) = alpha * bf16(op(A)) * bf16(op(B)) + beta * C:
 *   1. A and B are rounded to bf16 (round to nearest even, mpt_bf16_round_array: the same
 *      bits as mpt_bf16_from_f32) into this thread's packing buffers, tight (the leading
 *      dimensions lda / ldb are dropped; a transposed operand stays transposed). The rounding
 *      loop is memory-bound: AVX-512 BF16's vcvtne2ps2bf16 was measured here no faster than
 *      mpt_bf16_round_array's AVX-512F clone over 140 M values, so it is not used;
 *   2. one oneDNN matmul with bf16 src and weights described by strides (so op(A) and op(B) need
 *      no transposing copy) and an f32 destination that is C itself (strides {ldc, 1}); the
 *      products are accumulated in f32 inside oneDNN's AVX-512 BF16 kernels (vdpbf16ps);
 *      alpha is an output scale and beta a "sum" post-op, so nothing else touches C.
 * Plans (primitive, memories, stream) are cached per calling thread and per (m, n, k,
 * transposes, ldc, alpha, beta, thread count) in a thread-specific list (at most
 * PLANS_PER_THREAD, the oldest evicted), freed with the packing buffers when the thread exits.
 * As for the convolutions (conv_dnnl.c), the OpenMP thread count is set to OpenBLAS's at each
 * call, so a bf16 GEMM uses as many threads as an f32 one.
 *
 * The check refuses a CPU without AVX-512 BF16 (cpuid, and oneDNN's effective ISA, which
 * MPT_CPU_ISA=avx2 or baseline caps below it: src/core/cpu/isa.c): oneDNN would otherwise
 * emulate bf16 with f32 arithmetic and conversions, slower than plain f32 for nothing; the
 * message says which of the two is missing. In a fault-injection build MPT_TEST_NO_BF16_CPU=1
 * makes it refuse this CPU too, so the error path is tested on a machine that has the
 * instructions.
 * Runs synchronously on the calling thread. */
#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu/cpu.h"
#include "core/cpu/dnnl_check.h"
#include "core/fault.h"
#include "core/threads.h"

enum { PLANS_PER_THREAD = 128, KEY_LEN = 16 };

/* What a plan computes (one kind so far): a matmul of bf16 operands. */
enum { KIND_GEMM = 0 };
/* The key's fields, in order: C[i] (m x n, row stride ldc) = alpha op(A[i]) op(B[i]) + beta C[i]
 * for i < batch (A[i] at a + i sa, B[i] at b + i sb, C[i] at c + i sc). */
enum { K_KIND, K_BATCH, K_M, K_N, K_K, K_TA, K_TB, K_LDA, K_LDB, K_LDC, K_SA, K_SB, K_SC, K_ALPHA,
       K_BETA, K_THREADS };

typedef struct gplan {
  struct gplan *next;
  int64_t key[KEY_LEN]; /* K_* above */
  dnnl_stream_t stream;
  dnnl_primitive_t prim;
  dnnl_memory_t a, b, c; /* bf16 op(A), bf16 op(B), f32 C */
} gplan;

/* One per thread: its plans (newest first) and the bf16 packing buffers. */
typedef struct gthread {
  gplan *plans;
  uint16_t *pack[2];
  size_t cap[2]; /* elements */
} gthread;

static dnnl_engine_t engine;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static dnnl_status_t engine_status = dnnl_runtime_error;
static pthread_key_t thread_key;
static int cpu_by_cpuid; /* AVX-512 BF16 by cpuid */
static int cpu_bf16;     /* ... and by oneDNN's effective ISA (MPT_CPU_ISA may cap it) */
static dnnl_cpu_isa_t cpu_isa;

static void gplan_free(gplan *p) {
  if (p->prim) dnnl_primitive_destroy(p->prim);
  if (p->a) dnnl_memory_destroy(p->a);
  if (p->b) dnnl_memory_destroy(p->b);
  if (p->c) dnnl_memory_destroy(p->c);
  if (p->stream) dnnl_stream_destroy(p->stream);
  free(p);
}

static void gthread_free(void *v) {
  gthread *t = v;
  for (gplan *p = t->plans, *next; p; p = next) {
    next = p->next;
    gplan_free(p);
  }
  free(t->pack[0]);
  free(t->pack[1]);
  free(t);
}

static void init_once(void) {
  (void)mpt__cpu_isa_resolve(); /* caps oneDNN before its first call (isa.c) */
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  cpu_by_cpuid = __builtin_cpu_supports("avx512bf16");
#else
  cpu_by_cpuid = 0;
#endif
  cpu_isa = dnnl_get_effective_cpu_isa();
  cpu_bf16 = cpu_by_cpuid &&
             (cpu_isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
  engine_status = dnnl_engine_create(&engine, dnnl_cpu, 0);
  if (engine_status == dnnl_success && pthread_key_create(&thread_key, gthread_free) != 0)
    engine_status = dnnl_out_of_memory;
}

static const char *isa_name(dnnl_cpu_isa_t isa) {
  switch ((int)isa) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
  }
}

/* Which CPUs run it, for the messages (and the README's "--precision"). */
#define BF16_CPUS "Intel Xeon Cooper Lake, Sapphire Rapids or later; AMD EPYC Zen 4 or later"

mpt_status mpt__cpu_bf16_check(mpt_stream *s) {
  (void)s;
  MPT_RETURN_IF(mpt_cpu_isa_init()); /* a bad MPT_CPU_ISA (isa.c) */
  pthread_once(&once, init_once);
  const char *forced = mpt__test_env("MPT_TEST_NO_BF16_CPU");
  const int refused = forced && strcmp(forced, "1") == 0;
  if (!cpu_by_cpuid || refused)
    return MPT_FAIL(MPT_ENOTSUP, "bf16 compute needs a CPU with AVX-512 BF16 (avx512_bf16 in "
                    "/proc/cpuinfo: " BF16_CPUS "); this one has none%s (oneDNN's ISA: %s), and "
                    "emulating bf16 would be slower than fp32: use --precision fp32 here",
                    refused ? " (MPT_TEST_NO_BF16_CPU=1 says so)" : "", isa_name(cpu_isa));
  if (!cpu_bf16 && mpt_cpu_isa_active() != MPT_CPU_ISA_AVX512)
    return MPT_FAIL(MPT_ENOTSUP, "bf16 compute needs AVX-512 BF16: this CPU has it, but "
                    "MPT_CPU_ISA=%s keeps oneDNN below it (oneDNN's ISA: %s): unset MPT_CPU_ISA "
                    "(or set it to avx512), or use --precision fp32",
                    mpt_cpu_isa_name(mpt_cpu_isa_active()), isa_name(cpu_isa));
  if (!cpu_bf16)
    return MPT_FAIL(MPT_ENOTSUP, "bf16 compute needs AVX-512 BF16: this CPU has it, but oneDNN "
                    "may not use it (oneDNN's ISA: %s; is ONEDNN_MAX_CPU_ISA or DNNL_MAX_CPU_ISA "
                    "set?): lift that cap, or use --precision fp32", isa_name(cpu_isa));
  MPT_DNNL_OK(engine_status);
  return MPT_OK;
}

/* A [rows, cols] matrix, or [batch, rows, cols] when batch > 1, with these strides. */
static mpt_status strided_md(dnnl_memory_desc_t *md, int64_t batch, int64_t rows, int64_t cols,
                             int64_t bs, int64_t rs, int64_t cs, dnnl_data_type_t dt) {
  if (batch == 1) {
    const dnnl_dims_t dims = {rows, cols}, strides = {rs, cs};
    MPT_DNNL_OK(dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides));
  } else {
    const dnnl_dims_t dims = {batch, rows, cols}, strides = {bs, rs, cs};
    MPT_DNNL_OK(dnnl_memory_desc_init_by_strides(md, 3, dims, dt, strides));
  }
  return MPT_OK;
}

static mpt_status gplan_build(gplan *p, const int64_t *key, float alpha, float beta) {
  const int64_t nb = key[K_BATCH], m = key[K_M], n = key[K_N], k = key[K_K];
  const int64_t lda = key[K_LDA], ldb = key[K_LDB];
  const int ta = (int)key[K_TA], tb = (int)key[K_TB];
  dnnl_memory_desc_t a_md, b_md, c_md;
  /* op(A) [m, k]: stored [m, k] (strides {lda, 1}) or, transposed, [k, m] (strides {1, lda}). */
  MPT_RETURN_IF(strided_md(&a_md, nb, m, k, key[K_SA], ta ? 1 : lda, ta ? lda : 1, dnnl_bf16));
  MPT_RETURN_IF(strided_md(&b_md, nb, k, n, key[K_SB], tb ? 1 : ldb, tb ? ldb : 1, dnnl_bf16));
  MPT_RETURN_IF(strided_md(&c_md, nb, m, n, key[K_SC], key[K_LDC], 1, dnnl_f32));
  dnnl_matmul_desc_t md;
  MPT_DNNL_OK(dnnl_matmul_desc_init(&md, &a_md, &b_md, NULL, &c_md));
  dnnl_primitive_attr_t attr = NULL;
  dnnl_post_ops_t po = NULL;
  MPT_DNNL_OK(dnnl_primitive_attr_create(&attr));
  dnnl_status_t st = dnnl_success;
  if (alpha != 1.0f) st = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha);
  if (st == dnnl_success && beta != 0.0f) {
    st = dnnl_post_ops_create(&po);
    if (st == dnnl_success) st = dnnl_post_ops_append_sum(po, beta);
    if (st == dnnl_success) st = dnnl_primitive_attr_set_post_ops(attr, po);
  }
  dnnl_primitive_desc_t pd = NULL;
  if (st == dnnl_success) st = dnnl_primitive_desc_create(&pd, &md, attr, engine, NULL);
  if (po) dnnl_post_ops_destroy(po);
  dnnl_primitive_attr_destroy(attr);
  MPT_DNNL_OK(st);
  st = dnnl_primitive_create(&p->prim, pd);
  dnnl_primitive_desc_destroy(pd);
  MPT_DNNL_OK(st);
  MPT_DNNL_OK(dnnl_memory_create(&p->a, &a_md, engine, DNNL_MEMORY_NONE));
  MPT_DNNL_OK(dnnl_memory_create(&p->b, &b_md, engine, DNNL_MEMORY_NONE));
  MPT_DNNL_OK(dnnl_memory_create(&p->c, &c_md, engine, DNNL_MEMORY_NONE));
  MPT_DNNL_OK(dnnl_stream_create(&p->stream, engine, dnnl_stream_default_flags));
  return MPT_OK;
}

static mpt_status thread_state(gthread **out) {
  gthread *t = pthread_getspecific(thread_key);
  if (!t) {
    t = calloc(1, sizeof *t);
    if (!t) return MPT_FAIL(MPT_ENOMEM, "gemm_bf16: cannot allocate this thread's state");
    if (pthread_setspecific(thread_key, t) != 0) {
      free(t);
      return MPT_FAIL(MPT_ENOMEM, "gemm_bf16: cannot keep this thread's state");
    }
  }
  *out = t;
  return MPT_OK;
}

static mpt_status plan_get(gthread *t, const int64_t *key, float alpha, float beta,
                           gplan **out) {
  for (gplan *p = t->plans, *prev = NULL; p; prev = p, p = p->next)
    if (memcmp(p->key, key, sizeof p->key) == 0) {
      if (prev) { /* to the front: the most used stay, the eviction drops the least recent */
        prev->next = p->next;
        p->next = t->plans;
        t->plans = p;
      }
      *out = p;
      return MPT_OK;
    }
  gplan *p = calloc(1, sizeof *p);
  if (!p) return MPT_FAIL(MPT_ENOMEM, "gemm_bf16: cannot allocate a plan");
  memcpy(p->key, key, sizeof p->key);
  mpt_status rc = gplan_build(p, key, alpha, beta);
  if (rc != MPT_OK) {
    gplan_free(p);
    return rc;
  }
  /* Newest first; beyond PLANS_PER_THREAD the oldest goes. */
  int kept = 1;
  gplan *last = NULL;
  for (gplan *q = t->plans; q; q = q->next) {
    if (++kept == PLANS_PER_THREAD) last = q;
  }
  if (last) {
    for (gplan *q = last->next, *next; q; q = next) {
      next = q->next;
      gplan_free(q);
    }
    last->next = NULL;
  }
  p->next = t->plans;
  t->plans = p;
  *out = p;
  return MPT_OK;
}

/* The OpenMP threads of this call: OpenBLAS's count, so a bf16 op uses as many threads as an
 * f32 one. */
static int call_threads(void) {
  int threads = openblas_get_num_threads();
  if (threads < 1) threads = 1;
  omp_set_num_threads(threads);
  return threads;
}

/* Rounds the rows x cols matrix at src (row stride ld) into dst (tight), to nearest even, on
 * the calling thread: memory-bound, and measured here on a shared 2-core machine, a oneDNN
 * reorder over 2 OpenMP threads was slower (0.7-5 ms against 0.85 ms for 3 M values) since
 * a parallel region waits for its slowest thread. */
static void round_matrix(const float *src, int64_t rows, int64_t cols, int64_t ld,
                         uint16_t *dst) {
  if (ld == cols)
    mpt_bf16_round_array(src, dst, rows * cols);
  else
    for (int64_t r = 0; r < rows; r++) mpt_bf16_round_array(src + r * ld, dst + r * cols, cols);
}

/* Rounds the rows x cols matrix at src (row stride ld) into t's packing buffer `which`, tight. */
static mpt_status pack(gthread *t, int which, const float *src, int64_t rows,
                       int64_t cols, int64_t ld, uint16_t **out) {
  const size_t need = (size_t)rows * (size_t)cols;
  if (t->cap[which] < need) {
    free(t->pack[which]);
    t->pack[which] = aligned_alloc(64, (need * sizeof(uint16_t) + 63) & ~(size_t)63);
    t->cap[which] = t->pack[which] ? need : 0;
    if (!t->pack[which])
      return MPT_FAIL(MPT_ENOMEM, "gemm_bf16: cannot allocate %zu bytes for a bf16 copy",
                      need * sizeof(uint16_t));
  }
  round_matrix(src, rows, cols, ld, t->pack[which]);
  *out = t->pack[which];
  return MPT_OK;
}

/* The matmul of plan `key` on bf16 operands a, b into c. */
static mpt_status run_gemm(gthread *t, const int64_t *key, float alpha, float beta,
                           const uint16_t *a, const uint16_t *b, float *c) {
  gplan *p = NULL;
  MPT_RETURN_IF(plan_get(t, key, alpha, beta, &p));
  MPT_DNNL_OK(dnnl_memory_set_data_handle(p->a, (void *)a));
  MPT_DNNL_OK(dnnl_memory_set_data_handle(p->b, (void *)b));
  MPT_DNNL_OK(dnnl_memory_set_data_handle(p->c, c));
  dnnl_exec_arg_t args[3] = {{DNNL_ARG_SRC, p->a}, {DNNL_ARG_WEIGHTS, p->b},
                             {DNNL_ARG_DST, p->c}};
  sigset_t old; /* no signal inside oneDNN's kernels (core/threads.h) */
  mpt__signals_block(&old);
  dnnl_status_t st = dnnl_primitive_execute(p->prim, p->stream, 3, args);
  if (st == dnnl_success) st = dnnl_stream_wait(p->stream);
  mpt__signals_restore(&old);
  MPT_DNNL_OK(st);
  return MPT_OK;
}

static int32_t float_bits(float x) {
  int32_t bits;
  memcpy(&bits, &x, sizeof bits);
  return bits;
}

mpt_status mpt__cpu_gemm_bf16(mpt_stream *s, int trans_a, int trans_b, int64_t m, int64_t n,
                              int64_t k, float alpha, const float *a, int64_t lda,
                              const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  MPT_RETURN_IF(mpt__cpu_bf16_check(s));
  if (k == 0) return mpt__cpu_gemm(s, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                                   ldc);
  const int threads = call_threads();
  /* the packed copies are tight: lda = m or k, ldb = k or n */
  const int64_t key[KEY_LEN] = {KIND_GEMM, 1, m, n, k, trans_a != 0, trans_b != 0,
                                trans_a ? m : k, trans_b ? k : n, ldc, 0, 0, 0,
                                float_bits(alpha), float_bits(beta), threads};
  gthread *t = NULL;
  uint16_t *ha = NULL, *hb = NULL;
  MPT_RETURN_IF(thread_state(&t));
  MPT_RETURN_IF(pack(t, 0, a, trans_a ? k : m, trans_a ? m : k, lda, &ha));
  MPT_RETURN_IF(pack(t, 1, b, trans_b ? n : k, trans_b ? k : n, ldb, &hb));
  return run_gemm(t, key, alpha, beta, ha, hb, c);
}

mpt_status mpt__cpu_bf16_round(mpt_stream *s, const float *x, uint16_t *y, int64_t count) {
  MPT_RETURN_IF(mpt__cpu_bf16_check(s));
  mpt_bf16_round_array(x, y, count);
  return MPT_OK;
}

mpt_status mpt__cpu_gemm_bf16_batched(mpt_stream *s, int trans_a, int trans_b, int64_t batch,
                                      int64_t m, int64_t n, int64_t k, float alpha,
                                      const uint16_t *a, int64_t lda, int64_t stride_a,
                                      const uint16_t *b, int64_t ldb, int64_t stride_b,
                                      float beta, float *c, int64_t ldc, int64_t stride_c) {
  MPT_RETURN_IF(mpt__cpu_bf16_check(s));
  const int threads = call_threads();
  const int64_t key[KEY_LEN] = {KIND_GEMM, batch, m, n, k, trans_a != 0, trans_b != 0, lda, ldb,
                                ldc, batch > 1 ? stride_a : 0, batch > 1 ? stride_b : 0,
                                batch > 1 ? stride_c : 0, float_bits(alpha), float_bits(beta),
                                threads};
  gthread *t = NULL;
  MPT_RETURN_IF(thread_state(&t));
  return run_gemm(t, key, alpha, beta, a, b, c);
}

/* The head-major layouts of the bf16 attention: oneDNN's AMX/AVX-512 BF16 batched kernels
 * (brgemm) take only dense operands, so the heads interleaved in a row ([B, T, parts, H, hs])
 * are moved into planes ([parts, B, H, T, hs]) while being rounded, and the float32 results
 * moved back. Row by row on the calling thread (memory-bound, hs contiguous values at a time). */
mpt_status mpt__cpu_heads_split_bf16(mpt_stream *s, const float *x, int64_t nb, int64_t nt,
                                     int64_t parts, int64_t nh, int64_t hs, uint16_t *y) {
  (void)s;
  const int64_t c = nh * hs;
  for (int64_t b = 0; b < nb; b++)
    for (int64_t t = 0; t < nt; t++)
      for (int64_t p = 0; p < parts; p++)
        for (int64_t h = 0; h < nh; h++)
          mpt_bf16_round_array(x + ((b * nt + t) * parts + p) * c + h * hs,
                               y + (((p * nb + b) * nh + h) * nt + t) * hs, hs);
  return MPT_OK;
}

mpt_status mpt__cpu_heads_merge(mpt_stream *s, const float *x, int64_t nb, int64_t nt,
                                int64_t parts, int64_t nh, int64_t hs, float beta, float *y) {
  (void)s;
  const int64_t c = nh * hs;
  for (int64_t b = 0; b < nb; b++)
    for (int64_t t = 0; t < nt; t++)
      for (int64_t p = 0; p < parts; p++)
        for (int64_t h = 0; h < nh; h++) {
          const float *src = x + (((p * nb + b) * nh + h) * nt + t) * hs;
          float *dst = y + ((b * nt + t) * parts + p) * c + h * hs;
          if (beta == 0.0f)
            memcpy(dst, src, (size_t)hs * sizeof *dst);
          else
            for (int64_t i = 0; i < hs; i++) dst[i] = beta * dst[i] + src[i];
        }
  return MPT_OK;
}
