/* The CPU backend's transformer ops (include/mpitrain/ops_gpt.h): the reference every other
 * backend is tested against. Loops on the calling thread written for the vectorizer, with
 * AVX-512 and AVX2 clones (vmath.h; the matrix products of the layers are GEMMs elsewhere);
 * exp is vmath.h's (within 2 ulp); sums over a row that feed a division go in double, as
 * lane-wise partial sums whose order does not depend on the vector width; every accumulation
 * over rows runs in increasing row order, so results are bit-reproducible. Index
 * arrays are range-checked here, before anything is written. src/core/ops_gpt.c has checked
 * the other arguments.
 *
 * Threads (pool.h): large calls split over rows (whose results are independent); LayerNorm's
 * dweight / dbias are sums of fixed blocks of rows added in block order, the embedding's
 * gradients split over columns, each column keeping the one-thread row order: the same bits at
 * every thread count. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/cpu/cpu.h"
#include "core/cpu/pool.h"
#include "core/cpu/isa.h"
#include "core/cpu/vmath.h"
#include "mpitrain/core.h"

/* Chunks (pool.h) from an item's cost in picoseconds, measured here (one AVX-512 core): rows
 * and elements balanced over the threads; columns of a sum over rows one wide chunk per thread
 * (a narrow column chunk strides through every row for little work). */
static int64_t chunk_of(int64_t n, double item_ps, int64_t align) {
  return mpt__cpu_parallel_chunk_ps(n, item_ps, align, 0);
}

static int64_t column_chunk(int64_t c, double column_ps) {
  return mpt__cpu_parallel_chunk_ps(c, column_ps, 16, 1);
}

static mpt_status indices_check(const char *op, const char *what, const int32_t *idx,
                                int64_t n, int64_t limit) {
  for (int64_t i = 0; i < n; i++)
    if (idx[i] < 0 || idx[i] >= limit)
      return MPT_FAIL(MPT_EINVAL, "%s: %s[%lld] = %d is outside [0, %lld)", op, what,
                      (long long)i, (int)idx[i], (long long)limit);
  return MPT_OK;
}

typedef struct embed_job {
  const int32_t *tokens;
  int64_t t, c, rows;
  const float *wte, *wpe, *dy;
  float *y, *dwte, *dwpe;
} embed_job;

static void embed_rows(void *arg, int64_t r0, int64_t r1) {
  const embed_job *j = arg;
  const int64_t c = j->c;
  for (int64_t r = r0; r < r1; r++) {
    const float *e = j->wte + (int64_t)j->tokens[r] * c, *p = j->wpe + (r % j->t) * c;
    float *o = j->y + r * c;
    for (int64_t i = 0; i < c; i++) o[i] = e[i] + p[i];
  }
}

mpt_status mpt__cpu_embedding_gpt(mpt_stream *s, const int32_t *tokens, int64_t b, int64_t t,
                                  int64_t c, int64_t vocab, const float *wte, const float *wpe,
                                  float *y) {
  (void)s;
  MPT_RETURN_IF(indices_check("embedding_gpt", "tokens", tokens, b * t, vocab));
  embed_job j = {.tokens = tokens, .t = t, .c = c, .wte = wte, .wpe = wpe, .y = y};
  mpt__cpu_parallel_for(b * t, chunk_of(b * t, 300.0 * c, 1), embed_rows, &j);
  return MPT_OK;
}

/* Columns [i0, i1) of the gradients, every row in order (the one-thread order per column). */
static void embed_back_cols(void *arg, int64_t i0, int64_t i1) {
  const embed_job *j = arg;
  const int64_t c = j->c;
  for (int64_t r = 0; r < j->rows; r++) {
    const float *g = j->dy + r * c;
    if (j->dwte) {
      float *row = j->dwte + (int64_t)j->tokens[r] * c;
      for (int64_t i = i0; i < i1; i++) row[i] += g[i];
    }
    if (j->dwpe) {
      float *row = j->dwpe + (r % j->t) * c;
      for (int64_t i = i0; i < i1; i++) row[i] += g[i];
    }
  }
}

mpt_status mpt__cpu_embedding_gpt_backward(mpt_stream *s, const int32_t *tokens, int64_t b,
                                           int64_t t, int64_t c, int64_t vocab, const float *dy,
                                           float *dwte, float *dwpe) {
  (void)s;
  MPT_RETURN_IF(indices_check("embedding_gpt_backward", "tokens", tokens, b * t, vocab));
  embed_job j = {.tokens = tokens, .t = t, .c = c, .rows = b * t, .dy = dy, .dwte = dwte,
                 .dwpe = dwpe};
  mpt__cpu_parallel_for(c, column_chunk(c, 600.0 * b * t), embed_back_cols, &j);
  return MPT_OK;
}

/* One row's LayerNorm; row statistics in double: the lane-wise sums of vmath.h (the same bits
 * at every width). Inlined into each clone of its callers. */
MPT_VINLINE void layernorm_row(const float *restrict xr, int64_t c, const float *restrict w,
                               const float *restrict bias, float eps, float *restrict yr,
                               float *restrict mean, float *restrict rstd) {
  const float m = (float)(mpt__vsum_d(xr, c) / (double)c);
  double acc[MPT_VLANES] = {0};
  int64_t i = 0;
  for (; i + MPT_VLANES <= c; i += MPT_VLANES)
    for (int j = 0; j < MPT_VLANES; j++) {
      const double d = (double)(xr[i + j] - m);
      acc[j] += d * d;
    }
  for (int j = 0; i < c; i++, j++) acc[j] += (double)(xr[i] - m) * (double)(xr[i] - m);
  double var = 0.0;
  for (int j = 0; j < MPT_VLANES; j++) var += acc[j];
  const float rs = mpt__ln_rstd(var, c, eps);
  for (i = 0; i < c; i++) yr[i] = (xr[i] - m) * rs * w[i] + bias[i];
  *mean = m;
  *rstd = rs;
}

MPT_ISA_KERNEL_VOID(layernorm_kernel,
                    (const float *restrict x, int64_t rows, int64_t c, const float *restrict w,
                     const float *restrict bias, float eps, float *restrict y, float *restrict mean,
                     float *restrict rstd),
                    (x, rows, c, w, bias, eps, y, mean, rstd)) {
  for (int64_t r = 0; r < rows; r++)
    layernorm_row(x + r * c, c, w, bias, eps, y + r * c, mean + r, rstd + r);
}

/* The residual add then LayerNorm, row by row: the sum row is normalised while in cache. a, b
 * and sum may alias (not restrict); y does not. */
MPT_ISA_KERNEL_VOID(add_layernorm_kernel,
                    (const float *a, const float *b, int64_t rows, int64_t c,
                     const float *restrict w, const float *restrict bias, float eps, float *sum,
                     float *restrict y, float *restrict mean, float *restrict rstd),
                    (a, b, rows, c, w, bias, eps, sum, y, mean, rstd)) {
  for (int64_t r = 0; r < rows; r++) {
    const float *ar = a + r * c, *br = b + r * c;
    float *sr = sum + r * c;
    for (int64_t i = 0; i < c; i++) sr[i] = ar[i] + br[i];
    layernorm_row(sr, c, w, bias, eps, y + r * c, mean + r, rstd + r);
  }
}

typedef struct ln_job {
  const float *x, *dy, *w, *bias, *mean_in, *rstd_in, *b; /* b: add_layernorm's second term */
  float *sum;
  int64_t rows, c;
  float eps;
  float *y, *mean, *rstd, *dx, *dw, *dbias;
  float *part; /* [blocks, 2, c] the blocks' dw and dbias (backward) */
} ln_job;

static void ln_rows(void *arg, int64_t r0, int64_t r1) {
  const ln_job *j = arg;
  layernorm_kernel(j->x + r0 * j->c, r1 - r0, j->c, j->w, j->bias, j->eps, j->y + r0 * j->c,
                   j->mean + r0, j->rstd + r0);
}

mpt_status mpt__cpu_layernorm(mpt_stream *s, const float *x, int64_t rows, int64_t c,
                              const float *w, const float *bias, float eps, float *y,
                              float *mean, float *rstd) {
  (void)s;
  ln_job j = {.x = x, .w = w, .bias = bias, .rows = rows, .c = c, .eps = eps, .y = y,
              .mean = mean, .rstd = rstd};
  mpt__cpu_parallel_for(rows, chunk_of(rows, 520.0 * c, 1), ln_rows, &j);
  return MPT_OK;
}

static void add_ln_rows(void *arg, int64_t r0, int64_t r1) {
  const ln_job *j = arg;
  const int64_t c = j->c;
  add_layernorm_kernel(j->x + r0 * c, j->b + r0 * c, r1 - r0, c, j->w, j->bias, j->eps,
                       j->sum + r0 * c, j->y + r0 * c, j->mean + r0, j->rstd + r0);
}

mpt_status mpt__cpu_add_layernorm(mpt_stream *s, const float *a, const float *b, int64_t rows,
                                  int64_t c, const float *w, const float *bias, float eps,
                                  float *sum, float *y, float *mean, float *rstd) {
  (void)s;
  ln_job j = {.x = a, .b = b, .w = w, .bias = bias, .rows = rows, .c = c, .eps = eps,
              .sum = sum, .y = y, .mean = mean, .rstd = rstd};
  mpt__cpu_parallel_for(rows, chunk_of(rows, 620.0 * c, 1), add_ln_rows, &j);
  return MPT_OK;
}

/* One row's dw += dy xhat and dbias += dy (either may be NULL), and the row sums of dy w and
 * dy w xhat (lane-wise, in double) into sums[0], sums[1]. */
MPT_VINLINE void ln_back_row(const float *restrict xr, const float *restrict g, int64_t c,
                             const float *restrict w, float m, float rs, float *restrict dw,
                             float *restrict dbias, double *sums) {
  double a0[MPT_VLANES] = {0}, a1[MPT_VLANES] = {0};
  int64_t i = 0;
  for (; i + MPT_VLANES <= c; i += MPT_VLANES)
    for (int j = 0; j < MPT_VLANES; j++) {
      const float xhat = (xr[i + j] - m) * rs, gw = g[i + j] * w[i + j];
      a0[j] += gw;
      a1[j] += (double)gw * xhat;
    }
  for (int j = 0; i < c; i++, j++) {
    const float xhat = (xr[i] - m) * rs, gw = g[i] * w[i];
    a0[j] += gw;
    a1[j] += (double)gw * xhat;
  }
  sums[0] = sums[1] = 0.0;
  for (int j = 0; j < MPT_VLANES; j++) {
    sums[0] += a0[j];
    sums[1] += a1[j];
  }
  if (dw)
    for (i = 0; i < c; i++) dw[i] += g[i] * ((xr[i] - m) * rs);
  if (dbias)
    for (i = 0; i < c; i++) dbias[i] += g[i];
}

MPT_ISA_KERNEL_VOID(layernorm_backward_kernel,
                    (const float *restrict dy, const float *restrict x, int64_t rows, int64_t c,
                     const float *restrict w, const float *restrict mean,
                     const float *restrict rstd, float *restrict dx, float *restrict dw,
                     float *restrict dbias),
                    (dy, x, rows, c, w, mean, rstd, dx, dw, dbias)) {
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * c, *g = dy + r * c;
    const float m = mean[r], rs = rstd[r];
    double sums[2]; /* sums over c of dy * w and dy * w * xhat */
    ln_back_row(xr, g, c, w, m, rs, dw, dbias, sums);
    if (!dx) continue;
    const float gm = (float)(sums[0] / (double)c), gxm = (float)(sums[1] / (double)c);
    float *dxr = dx + r * c;
    for (int64_t i = 0; i < c; i++) {
      const float xhat = (xr[i] - m) * rs;
      dxr[i] += mpt__ln_dx(rs, g[i] * w[i], gm, xhat, gxm);
    }
  }
}

/* Rows [r0, r1) of dx alone. */
static void ln_back_rows(void *arg, int64_t r0, int64_t r1) {
  const ln_job *j = arg;
  const int64_t c = j->c;
  layernorm_backward_kernel(j->dy + r0 * c, j->x + r0 * c, r1 - r0, c, j->w, j->mean_in + r0,
                            j->rstd_in + r0, j->dx + r0 * c, NULL, NULL);
}

/* Blocks [k0, k1) of MPT__CPU_SUM_ROWS rows: their dx, and each block's dw and dbias summed
 * from 0 into its own partials (part: [blocks, 2, c]), added in block order afterwards. */
static void ln_back_blocks(void *arg, int64_t k0, int64_t k1) {
  const ln_job *j = arg;
  const int64_t c = j->c;
  for (int64_t k = k0; k < k1; k++) {
    const int64_t r0 = k * MPT__CPU_SUM_ROWS;
    const int64_t r1 = r0 + MPT__CPU_SUM_ROWS < j->rows ? r0 + MPT__CPU_SUM_ROWS : j->rows;
    float *pw = j->dw ? j->part + 2 * k * c : NULL;
    float *pb = j->dbias ? j->part + (2 * k + 1) * c : NULL;
    if (pw) memset(pw, 0, (size_t)c * sizeof *pw);
    if (pb) memset(pb, 0, (size_t)c * sizeof *pb);
    layernorm_backward_kernel(j->dy + r0 * c, j->x + r0 * c, r1 - r0, c, j->w, j->mean_in + r0,
                              j->rstd_in + r0, j->dx ? j->dx + r0 * c : NULL, pw, pb);
  }
}

/* dx by rows; dw and dbias as sums of blocks of MPT__CPU_SUM_ROWS rows (pool.h), so every
 * thread count adds the same numbers in the same order. Up to one block: the one-pass kernel. */
mpt_status mpt__cpu_layernorm_backward(mpt_stream *s, const float *dy, const float *x,
                                       int64_t rows, int64_t c, const float *w,
                                       const float *mean, const float *rstd, float *dx,
                                       float *dw, float *dbias) {
  (void)s;
  ln_job j = {.x = x, .dy = dy, .w = w, .mean_in = mean, .rstd_in = rstd, .rows = rows, .c = c,
              .dx = dx, .dw = dw, .dbias = dbias};
  const int64_t blocks = (rows + MPT__CPU_SUM_ROWS - 1) / MPT__CPU_SUM_ROWS;
  if (!dw && !dbias) {
    mpt__cpu_parallel_for(rows, chunk_of(rows, 1600.0 * c, 1), ln_back_rows, &j);
    return MPT_OK;
  }
  if (blocks <= 1) {
    layernorm_backward_kernel(dy, x, rows, c, w, mean, rstd, dx, dw, dbias);
    return MPT_OK;
  }
  if (!(j.part = malloc((size_t)(2 * blocks * c) * sizeof *j.part)))
    return MPT_FAIL(MPT_ENOMEM, "layernorm_backward: %lld floats of partial sums",
                    (long long)(2 * blocks * c));
  const int64_t per_block = chunk_of(rows, 1600.0 * c, 1) < rows ? 1 : blocks;
  mpt__cpu_parallel_for(blocks, per_block, ln_back_blocks, &j);
  for (int64_t k = 0; k < blocks; k++) {
    const float *pw = j.part + 2 * k * c, *pb = pw + c;
    if (dw)
      for (int64_t i = 0; i < c; i++) dw[i] += pw[i];
    if (dbias)
      for (int64_t i = 0; i < c; i++) dbias[i] += pb[i];
  }
  free(j.part);
  return MPT_OK;
}

/* 0.5 (1 + tanh(u)) = sigmoid(2u) exactly, so gelu(x) = x * sigmoid(2u): one exp instead of
 * a tanh and no cancellation where 1 + tanh(u) is tiny. And 0.5 (1 - tanh(u)^2) = 2 s (1 - s)
 * with s = sigmoid(2u), so gelu'(x) = s + 2 x s (1 - s) u', where 1 - s = e s with
 * e = exp(-2u) (exact, and no cancellation where s is near 1). The exp is vmath.h's (2 ulp),
 * so the loops vectorize. */
static inline float gelu_sig(float v, float *one_minus, float *du) {
  const float u = mpt__gelu_u(v), e = mpt__vexpf(-2.0f * u);
  const float sg = 1.0f / (1.0f + e);
  *one_minus = mpt__vselect(sg > 0.0f, e * sg, 1.0f); /* e = inf: s = 0 */
  *du = mpt__gelu_du(v);
  return sg;
}

MPT_ISA_KERNEL_VOID(gelu_kernel, (float *y, const float *x, int64_t count), (y, x, count)) {
  for (int64_t i = 0; i < count; i++) {
    float om, du;
    const float v = x[i];
    y[i] = v * gelu_sig(v, &om, &du);
  }
}

typedef struct gelu_job {
  float *y;
  const float *x, *dy;
  int write;
} gelu_job;

static void gelu_range(void *arg, int64_t i0, int64_t i1) {
  const gelu_job *j = arg;
  gelu_kernel(j->y + i0, j->x + i0, i1 - i0);
}

mpt_status mpt__cpu_gelu(mpt_stream *s, float *y, const float *x, int64_t count) {
  (void)s;
  gelu_job j = {.y = y, .x = x};
  mpt__cpu_parallel_for(count, chunk_of(count, 1100.0, 64), gelu_range, &j);
  return MPT_OK;
}

/* dx += dy gelu'(x), or dx = dy gelu'(x) when `write` (dx not read). */
MPT_ISA_KERNEL_VOID(gelu_backward_kernel,
                    (float *restrict dx, const float *restrict dy, const float *restrict x,
                     int64_t count, int write),
                    (dx, dy, x, count, write)) {
  if (write) {
    for (int64_t i = 0; i < count; i++) {
      float om, du;
      const float v = x[i], sg = gelu_sig(v, &om, &du);
      dx[i] = dy[i] * mpt__gelu_grad(v, sg, om, du);
    }
    return;
  }
  for (int64_t i = 0; i < count; i++) {
    float om, du;
    const float v = x[i], sg = gelu_sig(v, &om, &du);
    dx[i] += dy[i] * mpt__gelu_grad(v, sg, om, du);
  }
}

static void gelu_backward_range(void *arg, int64_t i0, int64_t i1) {
  const gelu_job *j = arg;
  gelu_backward_kernel(j->y + i0, j->dy + i0, j->x + i0, i1 - i0, j->write);
}

static void gelu_backward_par(float *dx, const float *dy, const float *x, int64_t count,
                              int write) {
  gelu_job j = {.y = dx, .x = x, .dy = dy, .write = write};
  mpt__cpu_parallel_for(count, chunk_of(count, 1300.0, 64), gelu_backward_range, &j);
}

mpt_status mpt__cpu_gelu_backward(mpt_stream *s, float *dx, const float *dy, const float *x,
                                  int64_t count) {
  (void)s;
  gelu_backward_par(dx, dy, x, count, 0);
  return MPT_OK;
}

mpt_status mpt__cpu_gelu_backward_write(mpt_stream *s, float *dx, const float *dy,
                                        const float *x, int64_t count) {
  (void)s;
  gelu_backward_par(dx, dy, x, count, 1);
  return MPT_OK;
}

/* y = gelu(x + bias) over rows [r0, r1) of [rows, cols]; y may equal x. */
MPT_ISA_KERNEL_VOID(bias_gelu_kernel,
                    (float *y, const float *x, const float *restrict bias, int64_t rows,
                     int64_t cols),
                    (y, x, bias, rows, cols)) {
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols;
    float *yr = y + r * cols;
    for (int64_t i = 0; i < cols; i++) {
      float om, du;
      const float v = xr[i] + bias[i];
      yr[i] = v * gelu_sig(v, &om, &du);
    }
  }
}

/* dx = dy gelu'(x + bias) over `rows` rows, and (part not NULL) part[j] += dx[r, j] row by
 * row: mpt__cpu_bias_backward's additions in its order. */
MPT_ISA_KERNEL_VOID(bias_gelu_backward_kernel,
                    (float *restrict dx, const float *restrict dy, const float *restrict x,
                     const float *restrict bias, int64_t rows, int64_t cols, float *restrict part),
                    (dx, dy, x, bias, rows, cols, part)) {
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * cols, *gr = dy + r * cols;
    float *dr = dx + r * cols;
    for (int64_t i = 0; i < cols; i++) {
      float om, du;
      const float v = xr[i] + bias[i], sg = gelu_sig(v, &om, &du);
      dr[i] = gr[i] * mpt__gelu_grad(v, sg, om, du);
    }
    if (part)
      for (int64_t i = 0; i < cols; i++) part[i] += dr[i];
  }
}

typedef struct bias_gelu_job {
  float *y, *part; /* part: [blocks, cols] the blocks' bias gradients (backward) */
  const float *x, *dy, *bias;
  int64_t rows, cols;
} bias_gelu_job;

static void bias_gelu_rows(void *arg, int64_t r0, int64_t r1) {
  const bias_gelu_job *j = arg;
  bias_gelu_kernel(j->y + r0 * j->cols, j->x + r0 * j->cols, j->bias, r1 - r0, j->cols);
}

mpt_status mpt__cpu_bias_gelu(mpt_stream *s, float *y, const float *x, const float *bias,
                              int64_t rows, int64_t cols) {
  (void)s;
  bias_gelu_job j = {.y = y, .x = x, .bias = bias, .rows = rows, .cols = cols};
  mpt__cpu_parallel_for(rows, chunk_of(rows, 1200.0 * cols, 1), bias_gelu_rows, &j);
  return MPT_OK;
}

/* Blocks [k0, k1) of MPT__CPU_SUM_ROWS rows: their dx, and each block's bias gradient summed
 * from 0 into its own partial (or none when part is NULL). */
static void bias_gelu_back_blocks(void *arg, int64_t k0, int64_t k1) {
  const bias_gelu_job *j = arg;
  const int64_t cols = j->cols;
  for (int64_t k = k0; k < k1; k++) {
    const int64_t r0 = k * MPT__CPU_SUM_ROWS;
    const int64_t r1 = r0 + MPT__CPU_SUM_ROWS < j->rows ? r0 + MPT__CPU_SUM_ROWS : j->rows;
    float *p = j->part ? j->part + k * cols : NULL;
    if (p) memset(p, 0, (size_t)cols * sizeof *p);
    bias_gelu_backward_kernel(j->y + r0 * cols, j->dy + r0 * cols, j->x + r0 * cols, j->bias,
                              r1 - r0, cols, p);
  }
}

/* As mpt__cpu_layernorm_backward's dw: up to one block, the one-pass kernel straight into
 * dbias; more, blocks summed apart (on the threads), then added to dbias in block order. */
mpt_status mpt__cpu_bias_gelu_backward(mpt_stream *s, float *dx, const float *dy,
                                       const float *x, const float *bias, int64_t rows,
                                       int64_t cols, float *dbias) {
  (void)s;
  const int64_t blocks = (rows + MPT__CPU_SUM_ROWS - 1) / MPT__CPU_SUM_ROWS;
  bias_gelu_job j = {.y = dx, .dy = dy, .x = x, .bias = bias, .rows = rows, .cols = cols};
  if (dbias && blocks <= 1) {
    bias_gelu_backward_kernel(dx, dy, x, bias, rows, cols, dbias);
    return MPT_OK;
  }
  if (dbias && !(j.part = malloc((size_t)(blocks * cols) * sizeof *j.part)))
    return MPT_FAIL(MPT_ENOMEM, "bias_gelu_backward: %lld floats of partial sums",
                    (long long)(blocks * cols));
  const int64_t per_block = chunk_of(rows, 1500.0 * cols, 1) < rows ? 1 : blocks;
  mpt__cpu_parallel_for(blocks, per_block, bias_gelu_back_blocks, &j);
  if (dbias) {
    for (int64_t k = 0; k < blocks; k++) {
      const float *restrict p = j.part + k * cols;
      for (int64_t i = 0; i < cols; i++) dbias[i] += p[i];
    }
    free(j.part);
  }
  return MPT_OK;
}

/* Rows [r0, r1) of the planes' rows (row r is row r % t of plane r / t). */
MPT_ISA_KERNEL_VOID(causal_softmax_kernel, (float *a, int64_t r0, int64_t r1, int64_t t),
                    (a, r0, r1, t)) {
  float inv;
  for (int64_t r = r0; r < r1; r++) /* row r % t of its plane: columns [0, r % t] take part */
    mpt__softmax_row(a + r * t, r % t, t, &inv);
}

typedef struct softmax_job {
  float *a, *d;
  const float *ca;
  int64_t t;
} softmax_job;

static void causal_softmax_rows(void *arg, int64_t r0, int64_t r1) {
  const softmax_job *j = arg;
  causal_softmax_kernel(j->a, r0, r1, j->t);
}

mpt_status mpt__cpu_causal_softmax(mpt_stream *s, float *a, int64_t planes, int64_t t) {
  (void)s;
  softmax_job j = {.a = a, .t = t};
  const int64_t rows = planes * t;
  mpt__cpu_parallel_for(rows, chunk_of(rows, 700.0 * t, 1), causal_softmax_rows, &j);
  return MPT_OK;
}

MPT_ISA_KERNEL_VOID(causal_softmax_backward_kernel,
                    (const float *a, float *d, int64_t r0, int64_t r1, int64_t t),
                    (a, d, r0, r1, t)) {
  for (int64_t r = r0; r < r1; r++) mpt__softmax_backward_row(a + r * t, d + r * t, r % t, t);
}

static void causal_softmax_backward_rows(void *arg, int64_t r0, int64_t r1) {
  const softmax_job *j = arg;
  causal_softmax_backward_kernel(j->ca, j->d, r0, r1, j->t);
}

mpt_status mpt__cpu_causal_softmax_backward(mpt_stream *s, const float *a, float *d,
                                            int64_t planes, int64_t t) {
  (void)s;
  softmax_job j = {.ca = a, .d = d, .t = t};
  const int64_t rows = planes * t;
  mpt__cpu_parallel_for(rows, chunk_of(rows, 360.0 * t, 1), causal_softmax_backward_rows, &j);
  return MPT_OK;
}

/* The sum over j < v of exp(l[j] - mx), in double: blocks of exps (a loop that vectorizes)
 * summed lane-wise (vmath.h), the blocks in order. */
MPT_ISA_KERNEL(double, sum_exp_kernel, (const float *restrict l, int64_t v, float mx), (l, v, mx)) {
  enum { BLK = 256 };
  float e[BLK];
  double sum = 0.0;
  for (int64_t j0 = 0; j0 < v; j0 += BLK) {
    const int64_t nb = v - j0 < BLK ? v - j0 : BLK;
    for (int64_t k = 0; k < nb; k++) e[k] = mpt__vexpf(l[j0 + k] - mx);
    sum += mpt__vsum_d(e, nb);
  }
  return sum;
}

MPT_ISA_KERNEL(float, vmax_kernel, (const float *x, int64_t n), (x, n)) { return mpt__vmax(x, n); }

typedef struct xent_job {
  const float *logits, *stats_in;
  const int32_t *targets;
  int64_t vp, v;
  float *stats, *dlogits, g;
  double *terms; /* [n] each row's loss, summed in order afterwards */
  int write;
} xent_job;

/* Row r's logsumexp over the v real columns (in double); its maximum and 1 / (the sum of
 * exp(l - max)) into st[0], st[1] for backward. Not the logsumexp itself as a float: rounded at
 * |logit| = s it is off by up to s 2^-24, and exp(l - lse) would carry that error into every
 * probability (the row would no longer sum to 1: 3e-5 off at s = 1e3). The maximum is one of
 * the logits, so l - max is exact where l is near it, and the sum lies in [1, v]. */
static double xent_row(const float *lr, int64_t v, float *st) {
  const float mx = vmax_kernel(lr, v);
  const double sum = sum_exp_kernel(lr, v, mx);
  st[0] = mx;
  st[1] = mpt__softmax_inv(sum);
  return mpt__softmax_lse(mx, sum);
}

static void xent_rows(void *arg, int64_t r0, int64_t r1) {
  const xent_job *j = arg;
  for (int64_t r = r0; r < r1; r++) {
    const float *lr = j->logits + r * j->vp;
    j->terms[r] = xent_row(lr, j->v, j->stats + 2 * r) - (double)lr[j->targets[r]];
  }
}

/* Split: each row's term goes to a scratch array, added in row order afterwards, as the
 * one-thread loop adds them. */
mpt_status mpt__cpu_xent_vocab(mpt_stream *s, const float *logits, const int32_t *targets,
                               int64_t n, int64_t vp, int64_t v, float *stats, float *loss) {
  (void)s;
  MPT_RETURN_IF(indices_check("xent_vocab", "targets", targets, n, v));
  const int64_t chunk = chunk_of(n, 900.0 * v, 1);
  double total = 0.0, *terms = NULL;
  if (mpt__cpu_parallel_would_split(n, chunk) && (terms = malloc((size_t)n * sizeof *terms))) {
    xent_job j = {.logits = logits, .targets = targets, .vp = vp, .v = v, .stats = stats,
                  .terms = terms};
    mpt__cpu_parallel_for(n, chunk, xent_rows, &j);
    for (int64_t r = 0; r < n; r++) total += terms[r];
    free(terms);
  } else {
    for (int64_t r = 0; r < n; r++) {
      const float *lr = logits + r * vp;
      total += xent_row(lr, v, stats + 2 * r) - (double)lr[targets[r]];
    }
  }
  *loss = (float)(total / (double)n);
  return MPT_OK;
}

/* dr[j] += g p[j] for j < v, p[j] = exp(lr[j] - mx) inv (the softmax, as the attention's
 * backward recomputes it); when `write`, dr[j] = that and 0 for v <= j < vp. */
MPT_ISA_KERNEL_VOID(xent_backward_row,
                    (const float *restrict lr, float *restrict dr, int64_t v, int64_t vp, float g,
                     float mx, float inv, int write),
                    (lr, dr, v, vp, g, mx, inv, write)) {
  if (write) {
    for (int64_t j = 0; j < v; j++) dr[j] = g * (mpt__vexpf(lr[j] - mx) * inv);
    for (int64_t j = v; j < vp; j++) dr[j] = 0.0f;
    return;
  }
  for (int64_t j = 0; j < v; j++) dr[j] += g * (mpt__vexpf(lr[j] - mx) * inv);
}

static void xent_backward_rows(void *arg, int64_t r0, int64_t r1) {
  const xent_job *j = arg;
  for (int64_t r = r0; r < r1; r++) {
    float *dr = j->dlogits + r * j->vp;
    const float *st = j->stats_in + 2 * r;
    xent_backward_row(j->logits + r * j->vp, dr, j->v, j->vp, j->g, st[0], st[1], j->write);
    dr[j->targets[r]] -= j->g;
  }
}

static mpt_status xent_backward(const float *logits, const int32_t *targets, int64_t n,
                                int64_t vp, int64_t v, const float *stats, const float *dloss,
                                float *dlogits, int write) {
  MPT_RETURN_IF(indices_check("xent_vocab_backward", "targets", targets, n, v));
  xent_job j = {.logits = logits, .stats_in = stats, .targets = targets, .vp = vp, .v = v,
               .dlogits = dlogits, .g = *dloss / (float)n, .write = write};
  mpt__cpu_parallel_for(n, chunk_of(n, 800.0 * v, 1), xent_backward_rows, &j);
  return MPT_OK;
}

mpt_status mpt__cpu_xent_vocab_backward(mpt_stream *s, const float *logits,
                                        const int32_t *targets, int64_t n, int64_t vp, int64_t v,
                                        const float *stats, const float *dloss,
                                        float *dlogits) {
  (void)s;
  return xent_backward(logits, targets, n, vp, v, stats, dloss, dlogits, 0);
}

mpt_status mpt__cpu_xent_vocab_backward_write(mpt_stream *s, const float *logits,
                                              const int32_t *targets, int64_t n, int64_t vp,
                                              int64_t v, const float *stats,
                                              const float *dloss, float *dlogits) {
  (void)s;
  return xent_backward(logits, targets, n, vp, v, stats, dloss, dlogits, 1);
}
