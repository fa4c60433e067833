/* CPU op kernels: memcpy, GEMM (OpenBLAS cblas_sgemm, row-major; with oneDNN most products go
 * to its sgemm instead, sgemm_dnnl.c), the elementwise ops, bias,
 * ReLU, softmax cross-entropy, accuracy, dropout and the finiteness check. Meanings are those
 * of include/mpitrain/ops.h; the wrappers in ops.c have already checked the arguments (non-NULL
 * pointers, non-negative extents, at least one element of work).
 *
 * Runs on the calling thread; the stream argument is ignored. Each thread's first GEMM first
 * secures OpenBLAS's per-thread buffer (see blas_thread_prepare). Hot loops are plain, contiguous,
 * over restrict pointers and shaped by MPT_VEC_FOR (vec.h) so that GCC vectorises them at -O2;
 * reductions keep several partial sums. Forward ops overwrite, backward ops accumulate.
 *
 * Threads (pool.h): fill, copy, axpy, scale and the linear layer's bias add and bias gradient
 * split large calls over the CPU threads by elements or rows; the bias gradient (column sums)
 * as sums of fixed blocks of rows added in block order: the same bits at every thread count. */
#include "config.h"

#include <cblas.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "core/cpu/cpu.h"
#include "core/cpu/pool.h"
#include "core/cpu/vec.h"
#include "mpitrain/core.h"

mpt_status mpt__cpu_memcpy(mpt_stream *s, mpt_device dst_device, void *dst,
                           mpt_device src_device, const void *src, size_t nbytes) {
  (void)s;
  if (dst_device.type != MPT_DEVICE_CPU || src_device.type != MPT_DEVICE_CPU)
    return MPT_FAIL(MPT_ENOTSUP, "the CPU backend cannot copy %s -> %s memory",
                    src_device.type == MPT_DEVICE_CPU ? "cpu" : "cuda",
                    dst_device.type == MPT_DEVICE_CPU ? "cpu" : "cuda");
  if (dst != src) memmove(dst, src, nbytes);
  return MPT_OK;
}

/* ---- OpenBLAS's per-thread buffer ---------------------------------------------------------
 * OpenBLAS maps a work buffer for each thread on that thread's first GEMM above its small-matrix
 * path (Debian 12, OpenBLAS 0.3.21: 128 MiB by mmap, then 128 MiB + 4 KiB by malloc as the
 * fallback; measured here, a new thread's first 256^3 SGEMM grows VmSize by 129 MiB) and, when
 * that fails, retries in a loop for ever: a DataParallel replica thread under an address-space
 * limit (ulimit -v) then spins, and its step waited for --timeout. So each thread's first GEMM
 * here checks first that the buffer can be mapped (an mmap of that size, released at once),
 * failing with MPT_ENOMEM if not, and then makes OpenBLAS take its buffer with a 256^3 SGEMM on
 * static scratch memory, all under one process-wide lock so that two threads' checks cannot
 * both count the same free memory. Later GEMMs of the thread reuse the buffer (OpenBLAS keeps it
 * for the thread's life) and cannot enter that loop. One lock and one thread-local flag: state
 * that mirrors OpenBLAS's own per-thread state. A smaller buffer (other architectures) is
 * covered, since the check asks for the largest. Residual race: memory taken by another thread
 * between the check and OpenBLAS's own mmap (not one of ours: they wait on the lock). */
#define OPENBLAS_BUFFER_NBYTES ((size_t)128 << 20 | 4096)
enum { WARMUP_N = 256 };

static pthread_mutex_t blas_first_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local int blas_thread_ready;

static mpt_status blas_thread_prepare(void) {
  /* under the lock; static, not malloc: a thread's first malloc reserves a 64 MiB arena */
  static float scratch[3 * WARMUP_N * WARMUP_N];
  mpt_status st = MPT_OK;
  pthread_mutex_lock(&blas_first_lock);
  void *probe = mmap(NULL, OPENBLAS_BUFFER_NBYTES, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (probe == MAP_FAILED) {
    int err = errno;
    struct rlimit rl;
    char limit[64] = "unlimited";
    if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
      snprintf(limit, sizeof limit, "%llu MiB", (unsigned long long)(rl.rlim_cur >> 20));
    st = MPT_FAIL(MPT_ENOMEM, "gemm: this thread's first GEMM needs the %zu MiB work buffer that "
                  "OpenBLAS maps for each thread, and it cannot be mapped (%s; address-space "
                  "limit, ulimit -v: %s): OpenBLAS would retry for ever. Free memory, raise the "
                  "limit, or use fewer threads or DataParallel devices",
                  OPENBLAS_BUFFER_NBYTES >> 20, strerror(err), limit);
    goto done;
  }
  munmap(probe, OPENBLAS_BUFFER_NBYTES);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, WARMUP_N, WARMUP_N, WARMUP_N, 1.0f,
              scratch, WARMUP_N, scratch + WARMUP_N * WARMUP_N, WARMUP_N, 0.0f,
              scratch + 2 * WARMUP_N * WARMUP_N, WARMUP_N);
  blas_thread_ready = 1;
done:
  pthread_mutex_unlock(&blas_first_lock);
  return st;
}

mpt_status mpt__cpu_gemm(mpt_stream *s, int trans_a, int trans_b, int64_t m, int64_t n,
                         int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                         int64_t ldb, float beta, float *c, int64_t ldc) {
  (void)s;
  if (m > INT_MAX || n > INT_MAX || k > INT_MAX || lda > INT_MAX || ldb > INT_MAX ||
      ldc > INT_MAX)
    return MPT_FAIL(MPT_ENOTSUP, "gemm: m=%lld n=%lld k=%lld (ld %lld/%lld/%lld) exceed "
                    "OpenBLAS's 32-bit int", (long long)m, (long long)n, (long long)k,
                    (long long)lda, (long long)ldb, (long long)ldc);
  if (k == 0) {
    /* C = beta * C by hand: BLAS implementations differ on k == 0, and A, B may be NULL. As
     * in BLAS, beta == 0 overwrites (NaN in C does not survive). */
    for (int64_t i = 0; i < m; i++) {
      float *ci = c + i * ldc;
      if (beta == 0.0f)
        for (int64_t j = 0; j < n; j++) ci[j] = 0.0f;
      else
        for (int64_t j = 0; j < n; j++) ci[j] *= beta;
    }
    return MPT_OK;
  }
  const int dnnl = mpt__cpu_gemm_route(trans_a, trans_b, m, n, k); /* gemm_choice.c */
#ifdef MPT_HAVE_ONEDNN
  if (dnnl)
    return mpt__cpu_sgemm_dnnl(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#else
  (void)dnnl;
#endif
  return mpt__cpu_sgemm_openblas(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                                 ldc);
}

mpt_status mpt__cpu_sgemm_openblas(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                                   float alpha, const float *a, int64_t lda, const float *b,
                                   int64_t ldb, float beta, float *c, int64_t ldc) {
  if (!blas_thread_ready) MPT_RETURN_IF(blas_thread_prepare());
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, (int)m, (int)n, (int)k, alpha, a, (int)lda,
              b, (int)ldb, beta, c, (int)ldc);
  return MPT_OK;
}

/* A chunk (pool.h) of n items costing item_ps picoseconds each (measured here), a multiple of
 * `align` items; even: one per thread (the column split of the bias gradient). */
static int64_t par_chunk(int64_t n, double item_ps, int64_t align, int even) {
  return mpt__cpu_parallel_chunk_ps(n, item_ps, align, even);
}

/* The memory-bound elementwise ops (fill, copy, axpy, scale) split only from this many
 * elements (4 MiB, GPT's activations and gradients): measured at 2 threads, splitting the
 * 0.67 M-float gradient zero-fill of the default MLP made its step 0.98x (6 runs each way). */
#define MEM_SPLIT_MIN (1 << 20)

static int64_t mem_chunk(int64_t count) {
  return count < MEM_SPLIT_MIN ? count : par_chunk(count, 400.0, 64, 0);
}

typedef struct elem_job {
  float *y;
  const float *x;
  float alpha;
  int64_t rows, cols;
} elem_job;

static void fill_range(void *arg, int64_t i0, int64_t i1) {
  const elem_job *j = arg;
  float *restrict x = j->y + i0;
  const float value = j->alpha;
  MPT_VEC_FOR(i, i1 - i0, x[i] = value);
}

mpt_status mpt__cpu_fill(mpt_stream *s, float *x, int64_t count, float value) {
  (void)s;
  elem_job j = {.y = x, .alpha = value};
  mpt__cpu_parallel_for(count, mem_chunk(count), fill_range, &j);
  return MPT_OK;
}

static void copy_range(void *arg, int64_t i0, int64_t i1) {
  const elem_job *j = arg;
  memcpy(j->y + i0, j->x + i0, (size_t)(i1 - i0) * sizeof *j->y);
}

mpt_status mpt__cpu_copy(mpt_stream *s, float *dst, const float *src, int64_t count) {
  (void)s;
  elem_job j = {.y = dst, .x = src};
  if (dst != src) mpt__cpu_parallel_for(count, mem_chunk(count), copy_range, &j);
  return MPT_OK;
}

static void axpy_range(void *arg, int64_t i0, int64_t i1) {
  const elem_job *j = arg;
  const float *restrict x = j->x + i0;
  float *restrict y = j->y + i0;
  const float alpha = j->alpha;
  MPT_VEC_FOR(i, i1 - i0, y[i] += alpha * x[i]);
}

mpt_status mpt__cpu_axpy(mpt_stream *s, int64_t count, float alpha, const float *restrict x,
                         float *restrict y) {
  (void)s;
  elem_job j = {.y = y, .x = x, .alpha = alpha};
  mpt__cpu_parallel_for(count, mem_chunk(count), axpy_range, &j);
  return MPT_OK;
}

static void scale_range(void *arg, int64_t i0, int64_t i1) {
  const elem_job *j = arg;
  float *restrict x = j->y + i0;
  const float alpha = j->alpha;
  MPT_VEC_FOR(i, i1 - i0, x[i] *= alpha);
}

mpt_status mpt__cpu_scale(mpt_stream *s, float *x, int64_t count, float alpha) {
  (void)s;
  elem_job j = {.y = x, .alpha = alpha};
  mpt__cpu_parallel_for(count, mem_chunk(count), scale_range, &j);
  return MPT_OK;
}

/* y may alias a or b (an in-place product), so no restrict here (not a hot loop). */
mpt_status mpt__cpu_mul(mpt_stream *s, float *y, const float *a, const float *b, int64_t count) {
  (void)s;
  for (int64_t i = 0; i < count; i++) y[i] = a[i] * b[i];
  return MPT_OK;
}

mpt_status mpt__cpu_mul_backward(mpt_stream *s, float *restrict da, const float *restrict dy,
                                 const float *restrict b, int64_t count) {
  (void)s;
  MPT_VEC_FOR(i, count, da[i] += dy[i] * b[i]);
  return MPT_OK;
}

/* Sum of p[0..count) in double (ops.h promises double accumulation for sum): 8 partial sums,
 * a shape GCC vectorises (float -> double conversion and packed adds). */
static double sum_f32(const float *p, int64_t count) {
  double acc[8] = {0};
  int64_t i = 0;
  for (; i + 8 <= count; i += 8)
    for (int j = 0; j < 8; j++) acc[j] += p[i + j];
  double total = 0;
  for (int j = 0; j < 8; j++) total += acc[j];
  for (; i < count; i++) total += p[i];
  return total;
}

mpt_status mpt__cpu_sum(mpt_stream *s, const float *x, int64_t count, float *out) {
  (void)s;
  *out = (float)sum_f32(x, count);
  return MPT_OK;
}

mpt_status mpt__cpu_sum_backward(mpt_stream *s, float *dx, int64_t count, const float *dy,
                                 float scale) {
  (void)s;
  const float g = scale * *dy;
  MPT_VEC_FOR(i, count, dx[i] += g);
  return MPT_OK;
}

static void bias_add_rows(void *arg, int64_t r0, int64_t r1) {
  const elem_job *j = arg;
  const float *restrict bias = j->x;
  for (int64_t r = r0; r < r1; r++) {
    float *restrict yr = j->y + r * j->cols;
    MPT_VEC_FOR(c, j->cols, yr[c] += bias[c]);
  }
}

mpt_status mpt__cpu_bias_add(mpt_stream *s, float *restrict y, const float *restrict bias,
                             int64_t rows, int64_t cols, int64_t inner) {
  (void)s;
  if (inner == 1) { /* linear layer: the bias row is added to each row */
    elem_job j = {.y = y, .x = bias, .rows = rows, .cols = cols};
    mpt__cpu_parallel_for(rows, par_chunk(rows, 250.0 * cols, 1, 0), bias_add_rows, &j);
    return MPT_OK;
  }
  for (int64_t r = 0; r < rows; r++)
    for (int64_t c = 0; c < cols; c++) {
      float *yp = y + (r * cols + c) * inner;
      const float b = bias[c];
      MPT_VEC_FOR(i, inner, yp[i] += b);
    }
  return MPT_OK;
}

/* Blocks [k0, k1) of MPT__CPU_SUM_ROWS rows (pool.h): each block's column sums, row by row from
 * 0, into its own partial sums (part: [blocks, cols]). */
static void bias_backward_blocks(void *arg, int64_t k0, int64_t k1) {
  const elem_job *j = arg;
  const int64_t cols = j->cols;
  for (int64_t k = k0; k < k1; k++) {
    const int64_t r0 = k * MPT__CPU_SUM_ROWS;
    const int64_t r1 = r0 + MPT__CPU_SUM_ROWS < j->rows ? r0 + MPT__CPU_SUM_ROWS : j->rows;
    float *restrict p = j->y + k * cols;
    memset(p, 0, (size_t)cols * sizeof *p);
    for (int64_t r = r0; r < r1; r++) {
      const float *restrict dr = j->x + r * cols;
      MPT_VEC_FOR(c, cols, p[c] += dr[c]);
    }
  }
}

mpt_status mpt__cpu_bias_backward(mpt_stream *s, float *restrict dbias,
                                  const float *restrict dy, int64_t rows, int64_t cols,
                                  int64_t inner) {
  (void)s;
  const int64_t blocks = (rows + MPT__CPU_SUM_ROWS - 1) / MPT__CPU_SUM_ROWS;
  if (inner == 1 && blocks <= 1) { /* column sums, accumulated row by row into dbias */
    for (int64_t r = 0; r < rows; r++) {
      const float *dr = dy + r * cols;
      MPT_VEC_FOR(c, cols, dbias[c] += dr[c]);
    }
    return MPT_OK;
  }
  if (inner == 1) { /* blocks of rows summed apart (on the threads), then added in order */
    elem_job j = {.x = dy, .rows = rows, .cols = cols};
    if (!(j.y = malloc((size_t)(blocks * cols) * sizeof *j.y)))
      return MPT_FAIL(MPT_ENOMEM, "bias_backward: %lld floats of partial sums",
                      (long long)(blocks * cols));
    const int64_t per_block = par_chunk(rows, 250.0 * cols, 1, 0) < rows ? 1 : blocks;
    mpt__cpu_parallel_for(blocks, per_block, bias_backward_blocks, &j);
    for (int64_t k = 0; k < blocks; k++) {
      const float *restrict p = j.y + k * cols;
      MPT_VEC_FOR(c, cols, dbias[c] += p[c]);
    }
    free(j.y);
    return MPT_OK;
  }
  for (int64_t c = 0; c < cols; c++) {
    double total = 0;
    for (int64_t r = 0; r < rows; r++) total += sum_f32(dy + (r * cols + c) * inner, inner);
    dbias[c] += (float)total;
  }
  return MPT_OK;
}

/* x < 0 ? 0 : x keeps NaN (as torch.relu does), so non-finite values reach the loss check. */
static void relu_out(float *restrict y, const float *restrict x, int64_t count) {
  MPT_VEC_FOR(i, count, y[i] = x[i] < 0.0f ? 0.0f : x[i]);
}

/* y may equal x: the in-place loop has one pointer, so it vectorises without restrict. */
mpt_status mpt__cpu_relu(mpt_stream *s, float *y, const float *x, int64_t count) {
  (void)s;
  if (y == x)
    MPT_VEC_FOR(i, count, y[i] = y[i] < 0.0f ? 0.0f : y[i]);
  else
    relu_out(y, x, count);
  return MPT_OK;
}

mpt_status mpt__cpu_relu_backward(mpt_stream *s, float *restrict dx, const float *restrict dy,
                                  const float *restrict y, int64_t count) {
  (void)s;
  /* dy is loaded unconditionally, so the select vectorises */
  MPT_VEC_FOR(i, count, const float d = dy[i]; dx[i] += y[i] > 0.0f ? d : 0.0f);
  return MPT_OK;
}

/* MPT_EINVAL naming the first label outside [0, k). */
static mpt_status labels_check(const char *op, const int32_t *labels, int64_t n, int64_t k) {
  for (int64_t i = 0; i < n; i++)
    if (labels[i] < 0 || labels[i] >= k)
      return MPT_FAIL(MPT_EINVAL, "%s: row %lld has label %d outside [0, %lld)", op,
                      (long long)i, (int)labels[i], (long long)k);
  return MPT_OK;
}

mpt_status mpt__cpu_softmax_xent(mpt_stream *s, const float *restrict logits,
                                 const int32_t *restrict labels, int64_t n, int64_t k,
                                 float *restrict probs, float *loss) {
  (void)s;
  MPT_RETURN_IF(labels_check("softmax_xent", labels, n, k));
  double total = 0;
  for (int64_t i = 0; i < n; i++) {
    const float *x = logits + i * k;
    float *p = probs + i * k;
    float max = x[0];
    for (int64_t j = 1; j < k; j++) max = x[j] > max ? x[j] : max;
    double z = 0;
    for (int64_t j = 0; j < k; j++) {
      p[j] = expf(x[j] - max);
      z += p[j];
    }
    const float inv = mpt__softmax_inv(z);
    MPT_VEC_FOR(j, k, p[j] *= inv);
    total += mpt__softmax_xent_row_loss(z, x[labels[i]], max); /* kernel_math.h */
  }
  *loss = (float)(total / (double)n);
  return MPT_OK;
}

mpt_status mpt__cpu_softmax_xent_backward(mpt_stream *s, const float *restrict probs,
                                          const int32_t *restrict labels, int64_t n, int64_t k,
                                          const float *dloss, float *restrict dlogits) {
  (void)s;
  MPT_RETURN_IF(labels_check("softmax_xent_backward", labels, n, k));
  const float g = *dloss / (float)n;
  for (int64_t i = 0; i < n; i++) {
    const float *p = probs + i * k;
    float *d = dlogits + i * k;
    MPT_VEC_FOR(j, k, d[j] += g * p[j]);
    d[labels[i]] -= g;
  }
  return MPT_OK;
}

mpt_status mpt__cpu_count_correct(mpt_stream *s, const float *logits, const int32_t *labels,
                                  int64_t n, int64_t k, int64_t *correct) {
  (void)s;
  MPT_RETURN_IF(labels_check("count_correct", labels, n, k));
  int64_t hits = 0;
  for (int64_t i = 0; i < n; i++) {
    const float *x = logits + i * k;
    int64_t best = 0;
    for (int64_t j = 1; j < k; j++)
      if (x[j] > x[best]) best = j; /* strict: the first maximum wins */
    hits += best == labels[i];
  }
  *correct += hits;
  return MPT_OK;
}

mpt_status mpt__cpu_dropout(mpt_stream *s, const float *x, float *y, float *restrict mask,
                            int64_t count, float p, uint64_t seed) {
  (void)s;
  const float keep = mpt__dropout_keep(p);
  for (int64_t i = 0; i < count; i++) {
    mask[i] = mpt__dropout_mask(seed, (uint64_t)i, p, keep);
    y[i] = x[i] * mask[i];
  }
  return MPT_OK;
}

mpt_status mpt__cpu_check_finite(mpt_stream *s, const float *x, int64_t count, int *nonfinite) {
  (void)s;
  /* Blocks so that a NaN early in a large buffer stops the scan; inside a block no branch. */
  int bad = 0;
  for (int64_t i0 = 0; i0 < count && !bad; i0 += 4096) {
    const float *xb = x + i0;
    MPT_VEC_FOR(i, count - i0 < 4096 ? count - i0 : 4096, bad |= !isfinite(xb[i]));
  }
  *nonfinite = bad;
  return MPT_OK;
}
