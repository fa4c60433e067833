/* The CPU's fused causal self-attention (include/mpitrain/ops_gpt.h mpt_op_causal_attention and
 * its backward): the same products, softmax and order of operations as the reference of
 * src/nn/attention.c, one (sequence, head) pair at a time, but the attention matrix lives only
 * in a per-thread scratch and is never stored. Forward keeps each row's softmax maximum and
 * 1 / sum (`stats`, 8 bytes a row instead of 4 T); backward recomputes the scores with the same
 * GEMM call and the probabilities with the same float operations, so it sees exactly the bits
 * that forward used.
 *
 * Per pair (q, k, v: strided views into qkv [B, T, 3C], leading dimension 3C):
 *   forward, for each block of BLOCK rows [r0, r0 + rows), cols = r0 + rows:
 *     S = scale Q[r0, +rows) K[0, cols)^T;  row i: P = exp(S - max) / sum over columns <= i,
 *     0 after (within the block);  Y[r0, +rows) = P V[0, cols).
 *   backward: P (recomputed) and dA = dY V^T for every block, then, as the reference,
 *     dV[r0, +rows) = beta dV + P[r0.., r0, +rows)^T dY[r0..];  dS = P * (dA - rowsum(P * dA));
 *     dQ[r0, +rows) = beta dQ + scale dS[rows, cols] K[0, cols);
 *     dK[r0, +rows) = beta dK + scale dS[r0.., r0, +rows)^T Q[r0..].
 * Only the lower block triangle is computed (as the reference); what lies above the diagonal
 * inside a diagonal block is written as 0, as the products read it.
 *
 * Every GEMM has the reference's shape, operands, leading dimensions and beta, and the row
 * kernels do the reference's float operations in its order (vmath.h's exp, lane-wise sums in
 * double), so the results are the reference's bit for bit (tests/test_attention_fused.c checks
 * it; the products are oneDNN's sgemm on one thread, as the reference's blocks of at most
 * 2^22 multiply-adds are, src/core/cpu/sgemm_dnnl.c).
 *
 * Threads: the pairs are split over an OpenMP team of mpt_cpu_threads() threads, the team that
 * oneDNN's GEMMs of the other layers use unless MPT_GEMM_THREADS caps theirs (ops.h; this file
 * is built with -fopenmp, src/core/local.mk),
 * one pair at a time per thread, each pair's GEMMs on the thread that runs it (oneDNN runs a
 * GEMM called inside a parallel region on the calling thread). Not the CPU ops' pool (pool.h):
 * its workers would compete for the cores with the OpenMP threads that libgomp keeps spinning
 * after each GEMM (measured: up to 1.6x the CPU time of a gpt-mini step at 2 threads with
 * OMP_WAIT_POLICY unset). Each output element is computed by one thread in a fixed order, so
 * the results do not depend on the thread count or the schedule. Scratch: one slot (forward
 * 64 T floats, backward 2 T^2) per thread, malloc'd per call (glibc then keeps blocks of that
 * size for reuse). Without oneDNN the pairs run on the calling thread through mpt__cpu_gemm
 * (OpenBLAS, its own threads). */
#include "config.h"

#include <cblas.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu/cpu.h"
#include "core/cpu/isa.h"
#include "core/cpu/vmath.h"
#include "mpitrain/core.h"
#include "core/threads.h"

#ifdef MPT_HAVE_ONEDNN
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#endif

/* Rows per block of the triangular products: src/nn/attention.c's BLOCK (the same products). */
#define BLOCK 64

typedef struct attn_job {
  const float *qkv, *dy;
  float *y, *dqkv;
  float *stats;     /* [B, H, T, 2]: max, 1 / sum (forward writes, backward reads) */
  int64_t t, c, nh; /* T, C, heads */
  float scale, beta;
  float *scratch;   /* [threads, slot]: forward BLOCK T floats a slot, backward 2 T T */
  int64_t slot;
  atomic_int failed; /* the first failing GEMM's status (oneDNN), 0 while none */
} attn_job;

/* C = alpha op(A) op(B) + beta C on the calling thread alone (row-major, as cblas_sgemm),
 * routed as mpt__cpu_gemm routes it (the same library, so the same bits): oneDNN's sgemm,
 * except a product with m or n of 1, which goes to OpenBLAS (too small to be threaded there). */
static int gemm1(int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                 int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
#ifdef MPT_HAVE_ONEDNN
  if (!mpt__cpu_gemm_route(ta, tb, m, n, k))
    return mpt__cpu_gemm(NULL, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) == MPT_OK
               ? 0
               : -1;
  if (omp_get_max_threads() != 1) omp_set_num_threads(1);
  const dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, alpha, a, lda, b,
                                      ldb, beta, c, ldc);
  return st == dnnl_success ? 0 : (int)st;
#else
  return mpt__cpu_gemm(NULL, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc) == MPT_OK
             ? 0
             : -1;
#endif
}

#define GEMM(...)                                                      \
  do {                                                                 \
    const int st_ = gemm1(__VA_ARGS__);                                \
    if (st_ != 0) {                                                    \
      int zero_ = 0;                                                   \
      atomic_compare_exchange_strong(&j->failed, &zero_, st_);         \
      return;                                                          \
    }                                                                  \
  } while (0)

/* Rows [r0, r0 + rows) of one pair's scores s (leading dimension t) become the causal softmax
 * (src/core/cpu/gpt_cpu.c's causal_softmax_kernel, the same operations), 0 from column i + 1
 * to the end of the block; each row's max and 1 / sum go to stats. */
MPT_ISA_KERNEL_VOID(softmax_block, (float *s, int64_t r0, int64_t rows, int64_t t, float *stats),
                    (s, r0, rows, t, stats)) {
  const int64_t cols = r0 + rows;
  for (int64_t r = 0; r < rows; r++) {
    const int64_t i = r0 + r;
    float inv;
    stats[2 * i] = mpt__softmax_row(s + r * t, i, cols, &inv);
    stats[2 * i + 1] = inv;
  }
}

/* Rows [r0, r0 + rows) of the scores s (leading dimension t, the rows at s) become the
 * probabilities forward computed, from its stats: exp(s - max) * (1 / sum), bit for bit. */
MPT_ISA_KERNEL_VOID(probs_block,
                    (float *s, int64_t r0, int64_t rows, int64_t t, const float *stats),
                    (s, r0, rows, t, stats)) {
  const int64_t cols = r0 + rows;
  for (int64_t r = 0; r < rows; r++) {
    const int64_t i = r0 + r;
    float *restrict row = s + r * t;
    const float mx = stats[2 * i], inv = stats[2 * i + 1];
    for (int64_t j = 0; j <= i; j++) row[j] = mpt__vexpf(row[j] - mx) * inv;
    for (int64_t j = i + 1; j < cols; j++) row[j] = 0.0f;
  }
}

/* d = a * (d - rowsum(a * d)) on rows [r0, r0 + rows) (leading dimension t), columns [0, i],
 * 0 after to the end of the block (mpt__softmax_backward_row, as the reference). */
MPT_ISA_KERNEL_VOID(softmax_backward_block,
                    (const float *a, float *d, int64_t r0, int64_t rows, int64_t t),
                    (a, d, r0, rows, t)) {
  const int64_t cols = r0 + rows;
  for (int64_t r = 0; r < rows; r++) mpt__softmax_backward_row(a + r * t, d + r * t, r0 + r, cols);
}

static void forward_pair(attn_job *j, int64_t pair, float *p) {
  const int64_t t = j->t, c = j->c, c3 = 3 * c, hs = c / j->nh;
  const int64_t b = pair / j->nh, h = pair % j->nh;
  const float *q = j->qkv + b * t * c3 + h * hs, *k = q + c, *v = q + 2 * c;
  float *stats = j->stats + pair * 2 * t;
  for (int64_t r0 = 0; r0 < t; r0 += BLOCK) {
    const int64_t rows = t - r0 < BLOCK ? t - r0 : BLOCK, cols = r0 + rows;
    GEMM(0, 1, rows, cols, hs, j->scale, q + r0 * c3, c3, k, c3, 0.0f, p, t);
    softmax_block(p, r0, rows, t, stats);
    GEMM(0, 0, rows, hs, cols, 1.0f, p, t, v, c3, 0.0f, j->y + (b * t + r0) * c + h * hs, c);
  }
}

static void backward_pair(attn_job *j, int64_t pair, float *p) {
  const int64_t t = j->t, c = j->c, c3 = 3 * c, hs = c / j->nh;
  const int64_t b = pair / j->nh, h = pair % j->nh;
  const float *q = j->qkv + b * t * c3 + h * hs, *k = q + c, *v = q + 2 * c;
  const float *g = j->dy + b * t * c + h * hs, *stats = j->stats + pair * 2 * t;
  float *dq = j->dqkv + b * t * c3 + h * hs, *dk = dq + c, *dv = dq + 2 * c;
  float *ds = p + t * t;
  const float beta = j->beta;
  /* P (recomputed) and dA [rows, cols] = dY V^T, every block: dV reads P's rows below it */
  for (int64_t r0 = 0; r0 < t; r0 += BLOCK) {
    const int64_t rows = t - r0 < BLOCK ? t - r0 : BLOCK, cols = r0 + rows;
    GEMM(0, 1, rows, cols, hs, j->scale, q + r0 * c3, c3, k, c3, 0.0f, p + r0 * t, t);
    probs_block(p + r0 * t, r0, rows, t, stats);
    GEMM(0, 1, rows, cols, hs, 1.0f, g + r0 * c, c, v, c3, 0.0f, ds + r0 * t, t);
  }
  for (int64_t r0 = 0; r0 < t; r0 += BLOCK) {
    const int64_t rows = t - r0 < BLOCK ? t - r0 : BLOCK;
    GEMM(1, 0, rows, hs, t - r0, 1.0f, p + r0 * t + r0, t, g + r0 * c, c, beta, dv + r0 * c3,
         c3);
    softmax_backward_block(p + r0 * t, ds + r0 * t, r0, rows, t);
  }
  for (int64_t r0 = 0; r0 < t; r0 += BLOCK) {
    const int64_t rows = t - r0 < BLOCK ? t - r0 : BLOCK, cols = r0 + rows;
    GEMM(0, 0, rows, hs, cols, j->scale, ds + r0 * t, t, k, c3, beta, dq + r0 * c3, c3);
    GEMM(1, 0, rows, hs, t - r0, j->scale, ds + r0 * t + r0, t, q + r0 * c3, c3, beta,
         dk + r0 * c3, c3);
  }
}

/* Runs every pair on `threads` threads (an OpenMP team with oneDNN; else the calling thread),
 * each with its scratch slot. */
static mpt_status run(attn_job *j, int64_t b, int backward) {
  MPT_RETURN_IF(mpt_cpu_isa_init()); /* caps oneDNN before its first call (isa.c) */
  const int64_t pairs = b * j->nh;
  int threads = 1;
#ifdef MPT_HAVE_ONEDNN
  /* a pair is >= ~10 us of work at T >= 64 (hs >= 16); below that, one thread */
  if (j->t * j->t * (j->c / j->nh) >= 64 * 64 * 16 && !omp_in_parallel())
    threads = mpt_cpu_threads();
  if (threads > pairs) threads = (int)pairs;
  if (threads < 1) threads = 1;
#endif
  j->slot = backward ? 2 * j->t * j->t : (j->t < BLOCK ? j->t : BLOCK) * j->t;
  const size_t nbytes = (size_t)threads * (size_t)j->slot * sizeof(float);
  if (!(j->scratch = malloc(nbytes)))
    return MPT_FAIL(MPT_ENOMEM, "causal_attention: %zu bytes of scratch", nbytes);
  atomic_init(&j->failed, 0);
  /* oneDNN's GEMMs with the asynchronous signals blocked (core/threads.h), here and on the team
   * (which inherits the mask when libgomp starts it from here): once per call, not per GEMM */
  sigset_t old;
  mpt__signals_block(&old);
  /* The block products that route to OpenBLAS (under AVX2 all of them: gemm_choice.c) must run
   * on OpenBLAS's calling thread alone while the team runs: a threaded OpenBLAS called from two
   * threads at once serialises them and spins its own threads against the team (gpt-mini at
   * 2 threads, AVX2: the attention took 68 % of a step, 4x the 2-rank step). OpenBLAS gives the
   * same bits at any thread count (it splits the rows and columns, never k). */
  const int blas_threads = openblas_get_num_threads();
  const int blas_one = threads > 1 && blas_threads > 1;
  if (blas_one) openblas_set_num_threads(1);
#ifdef MPT_HAVE_ONEDNN
#pragma omp parallel for num_threads(threads) schedule(dynamic, 1)
#endif
  for (int64_t pair = 0; pair < pairs; pair++) {
    if (atomic_load(&j->failed)) continue;
#ifdef MPT_HAVE_ONEDNN
    float *slot = j->scratch + (int64_t)omp_get_thread_num() * j->slot;
#else
    float *slot = j->scratch;
#endif
    if (backward)
      backward_pair(j, pair, slot);
    else
      forward_pair(j, pair, slot);
  }
  if (blas_one) openblas_set_num_threads(blas_threads);
  mpt__signals_restore(&old);
  free(j->scratch);
  const int failed = atomic_load(&j->failed);
  if (failed != 0)
    return MPT_FAIL(MPT_EDEVICE, "causal_attention%s: a block GEMM failed (status %d)",
                    backward ? "_backward" : "", failed);
  return MPT_OK;
}

mpt_status mpt__cpu_causal_attention(mpt_stream *s, const float *qkv, int64_t b, int64_t t,
                                     int64_t c, int64_t nh, float *y, float *stats) {
  (void)s;
  attn_job j = {.qkv = qkv, .y = y, .stats = stats, .t = t, .c = c, .nh = nh,
                .scale = (float)(1.0 / sqrt((double)(c / nh)))};
  return run(&j, b, 0);
}

mpt_status mpt__cpu_causal_attention_backward(mpt_stream *s, const float *qkv,
                                              const float *stats, const float *dy, int64_t b,
                                              int64_t t, int64_t c, int64_t nh, float beta,
                                              float *dqkv) {
  (void)s;
  attn_job j = {.qkv = qkv, .dy = dy, .dqkv = dqkv, .stats = (float *)stats, .t = t, .c = c,
                .nh = nh, .scale = (float)(1.0 / sqrt((double)(c / nh))), .beta = beta};
  return run(&j, b, 1);
}
