/* CPU kernels for convolution and pooling windows: im2col and its adjoint col2im (Caffe's
 * layout, Jia et al., 2014), and max pooling forward and backward. The geometry was checked and
 * resolved by ops.c (positive extents, out_h/out_w consistent; pooling: pad == 0).
 *
 * For each kernel tap (ki, kj) the output columns whose input pixel lies inside the image form
 * one contiguous range [lo, hi) of ox (clip_range), so the inner loops carry no bounds test: a
 * copy (stride 1: contiguous) between two zero fills. Runs on the calling thread.
 *
 * Fast path, "same" width (stride 1 and out_w == W, i.e. kernel_w == 2 pad + 1, as in the cnn
 * model's 5x5 pad 2 layers): row (c, ki, kj) of col is then the image plane shifted by one
 * constant, col[oy*W + ox] = x[c][oy*W + ox + shift] with shift = (ki - pad)*W + (kj - pad),
 * except in the rows of padding and in the |kj - pad| columns that wrap around. One copy of the
 * valid rows and a few stores of zeros replace a copy per output row (14 floats in the cnn's
 * second layer), and col2im adds the same shifted range under a column mask. 2x2 pooling with
 * stride 2 has its own one-pass loop. Both give bit-identical results to the general loops. */
#include <string.h>

#include "core/cpu/cpu.h"
#include "core/cpu/vec.h"
#include "mpitrain/core.h"

/* The range [*lo, *hi) of ox in [0, out) for which ox * stride + off lies in [0, size). */
static void clip_range(int64_t off, int64_t stride, int64_t size, int64_t out, int64_t *lo,
                       int64_t *hi) {
  int64_t l = off >= 0 ? 0 : (-off + stride - 1) / stride;
  int64_t h = size - off <= 0 ? 0 : (size - off + stride - 1) / stride;
  if (l > out) l = out;
  if (h > out) h = out;
  if (h < l) h = l;
  *lo = l;
  *hi = h;
}

/* The same-width geometry of one tap row: the valid output rows [*oy_lo, *oy_hi), the valid
 * columns [*lo, *hi) of each, the contiguous range [*start, *end) of col indices (oy*W + ox)
 * that covers them, and the shift from a col index to its x index within the plane. */
typedef struct same_tap {
  int64_t oy_lo, oy_hi, lo, hi, start, end, shift;
} same_tap;

static int same_width(const mpt_conv_geom *g) {
  return g->stride == 1 && g->out_w == g->width;
}

static same_tap same_tap_of(const mpt_conv_geom *g, int64_t ki, int64_t kj) {
  const int64_t W = g->width, pad = g->pad, off = kj - pad;
  same_tap t;
  t.oy_lo = pad - ki > 0 ? pad - ki : 0;
  t.oy_hi = g->height + pad - ki < g->out_h ? g->height + pad - ki : g->out_h;
  if (t.oy_hi < t.oy_lo) t.oy_hi = t.oy_lo;
  clip_range(off, 1, W, W, &t.lo, &t.hi);
  t.shift = (ki - pad) * W + off;
  /* From the first valid column of the first valid row to the last of the last one. */
  t.start = t.oy_lo * W + t.lo;
  t.end = t.oy_hi > t.oy_lo && t.hi > t.lo ? (t.oy_hi - 1) * W + t.hi : t.start;
  return t;
}

/* Short zero fills as plain loops (see MPT_SHORT_LOOPS); the long copy stays a memcpy. */
MPT_SHORT_LOOPS static void zero_floats(float *restrict p, int64_t n) {
  MPT_VEC_FOR(i, n, p[i] = 0.0f);
}

MPT_SHORT_LOOPS static void im2col_same_width(const mpt_conv_geom *g, const float *restrict x,
                                              float *restrict col) {
  const int64_t H = g->height, W = g->width, kh = g->kernel_h, kw = g->kernel_w;
  const int64_t L = g->out_h * W;
  for (int64_t c = 0; c < g->channels; c++)
    for (int64_t ki = 0; ki < kh; ki++)
      for (int64_t kj = 0; kj < kw; kj++) {
        float *row = col + ((c * kh + ki) * kw + kj) * L;
        const float *xp = x + c * H * W;
        const same_tap t = same_tap_of(g, ki, kj);
        zero_floats(row, t.start);
        if (t.end > t.start)
          memcpy(row + t.start, xp + t.start + t.shift, (size_t)(t.end - t.start) * sizeof *row);
        zero_floats(row + t.end, L - t.end);
        /* the columns that wrapped around into the neighbouring image row */
        for (int64_t oy = t.oy_lo; oy < t.oy_hi; oy++) {
          float *r = row + oy * W;
          for (int64_t ox = 0; ox < t.lo; ox++) r[ox] = 0.0f;
          for (int64_t ox = t.hi; ox < W; ox++) r[ox] = 0.0f;
        }
      }
}

mpt_status mpt__cpu_im2col(mpt_stream *s, const mpt_conv_geom *g, const float *restrict x,
                           float *restrict col) {
  (void)s;
  if (same_width(g)) {
    im2col_same_width(g, x, col);
    return MPT_OK;
  }
  const int64_t H = g->height, W = g->width, kh = g->kernel_h, kw = g->kernel_w;
  const int64_t st = g->stride, pad = g->pad, oh = g->out_h, ow = g->out_w;
  for (int64_t c = 0; c < g->channels; c++)
    for (int64_t ki = 0; ki < kh; ki++)
      for (int64_t kj = 0; kj < kw; kj++) {
        float *row = col + ((c * kh + ki) * kw + kj) * oh * ow; /* [oh, ow] */
        const int64_t off = kj - pad;                             /* ix = ox * st + off */
        int64_t lo, hi;
        clip_range(off, st, W, ow, &lo, &hi);
        for (int64_t oy = 0; oy < oh; oy++) {
          float *dst = row + oy * ow;
          const int64_t iy = oy * st - pad + ki;
          if (iy < 0 || iy >= H) {
            for (int64_t ox = 0; ox < ow; ox++) dst[ox] = 0.0f;
            continue;
          }
          const float *xr = x + (c * H + iy) * W; /* [W] */
          for (int64_t ox = 0; ox < lo; ox++) dst[ox] = 0.0f;
          if (st == 1)
            for (int64_t ox = lo; ox < hi; ox++) dst[ox] = xr[ox + off];
          else
            for (int64_t ox = lo; ox < hi; ox++) dst[ox] = xr[ox * st + off];
          for (int64_t ox = hi; ox < ow; ox++) dst[ox] = 0.0f;
        }
      }
  return MPT_OK;
}

/* Column masks of the same-width col2im: mask[kj * L + j] is all ones when col index j
 * (= oy*W + ox) of tap column kj reads inside the image row, 0 in the columns that wrap around.
 * Up to this many entries live on the stack; larger layers take the general loop. */
enum { SAME_MASK_MAX = 8192 };

/* The bits of c where m is all ones, else -0.0f (which leaves any sum unchanged, -0 included):
 * integer operations, so that the loop has no branch and vectorises. */
static inline float masked_or_neg_zero(float c, uint32_t m) {
  uint32_t b;
  memcpy(&b, &c, sizeof b);
  b = (b & m) | (~m & 0x80000000u);
  float v;
  memcpy(&v, &b, sizeof v);
  return v;
}

static void col2im_same_width(const mpt_conv_geom *g, const float *restrict col,
                              float *restrict dx) {
  const int64_t H = g->height, W = g->width, kh = g->kernel_h, kw = g->kernel_w;
  const int64_t L = g->out_h * W;
  uint32_t mask[SAME_MASK_MAX];
  for (int64_t kj = 0; kj < kw; kj++) {
    const same_tap t = same_tap_of(g, 0, kj);
    for (int64_t j = 0; j < L; j++)
      mask[kj * L + j] = j % W >= t.lo && j % W < t.hi ? 0xffffffffu : 0u;
  }
  for (int64_t c = 0; c < g->channels; c++)
    for (int64_t ki = 0; ki < kh; ki++)
      for (int64_t kj = 0; kj < kw; kj++) {
        const same_tap t = same_tap_of(g, ki, kj);
        const int64_t n = t.end - t.start;
        /* col index j adds to x index j + shift: one vector loop over the valid rows; a
         * masked column adds nothing (its col entry may hold anything, even inf or NaN). */
        float *restrict d = dx + c * H * W + t.shift + t.start;
        const float *restrict cr = col + ((c * kh + ki) * kw + kj) * L + t.start;
        const uint32_t *restrict mr = mask + kj * L + t.start;
        MPT_VEC_FOR(q, n, d[q] += masked_or_neg_zero(cr[q], mr[q]));
      }
}

mpt_status mpt__cpu_col2im(mpt_stream *s, const mpt_conv_geom *g, const float *restrict col,
                           float *restrict dx) {
  (void)s;
  if (same_width(g) && g->kernel_w * g->out_h * g->width <= SAME_MASK_MAX) {
    col2im_same_width(g, col, dx);
    return MPT_OK;
  }
  const int64_t H = g->height, W = g->width, kh = g->kernel_h, kw = g->kernel_w;
  const int64_t st = g->stride, pad = g->pad, oh = g->out_h, ow = g->out_w;
  for (int64_t c = 0; c < g->channels; c++)
    for (int64_t ki = 0; ki < kh; ki++)
      for (int64_t kj = 0; kj < kw; kj++) {
        const float *row = col + ((c * kh + ki) * kw + kj) * oh * ow;
        const int64_t off = kj - pad;
        int64_t lo, hi;
        clip_range(off, st, W, ow, &lo, &hi);
        for (int64_t oy = 0; oy < oh; oy++) {
          const int64_t iy = oy * st - pad + ki;
          if (iy < 0 || iy >= H) continue; /* padding: its gradient is dropped */
          const float *src = row + oy * ow;
          float *dr = dx + (c * H + iy) * W;
          if (st == 1) {
            float *d = dr + lo + off;
            const float *cs = src + lo;
            MPT_VEC_FOR(q, hi - lo, d[q] += cs[q]);
          } else
            for (int64_t ox = lo; ox < hi; ox++) dr[ox * st + off] += src[ox];
        }
      }
  return MPT_OK;
}

/* One window tap over an output row: yr[ox] and ar[ox] take xr[ox * S] (at index base + ox * S)
 * when it is strictly greater (so the first maximum wins) or NaN (NaN propagates, as in
 * PyTorch). Written as selects so that it vectorises across ox. */
#define POOL_TAKE(ox, S)                                          \
  const float v_ = xr[(ox) * (S)];                                \
  const int take_ = (v_ > yr[ox]) | (v_ != v_);                   \
  yr[ox] = take_ ? v_ : yr[ox];                                   \
  ar[ox] = take_ ? base + (int32_t)((ox) * (S)) : ar[ox]

static void pool_tap(float *restrict yr, int32_t *restrict ar, const float *restrict xr,
                     int32_t base, int64_t ow, int64_t st) {
  if (st == 1)
    MPT_VEC_FOR(ox, ow, POOL_TAKE(ox, 1));
  else if (st == 2) /* the common 2x2 / stride 2 pooling: a constant stride */
    MPT_VEC_FOR(ox, ow, POOL_TAKE(ox, 2));
  else
    for (int64_t ox = 0; ox < ow; ox++) {
      POOL_TAKE(ox, st);
    }
}

/* 2x2 windows with stride 2, in one pass: the four taps of each window in row-major order, each
 * taken by the rule of POOL_TAKE, so that the result equals the general loop's. */
static void maxpool_2x2_s2(const mpt_conv_geom *g, int64_t planes, const float *restrict x,
                           float *restrict y, int32_t *restrict argmax) {
  const int64_t H = g->height, W = g->width, oh = g->out_h, ow = g->out_w;
  for (int64_t p = 0; p < planes; p++)
    for (int64_t oy = 0; oy < oh; oy++) {
      const float *restrict r0 = x + (p * H + 2 * oy) * W, *restrict r1 = r0 + W;
      float *restrict yr = y + (p * oh + oy) * ow;
      int32_t *restrict ar = argmax + (p * oh + oy) * ow;
      const int32_t base = (int32_t)(2 * oy * W), below = (int32_t)W;
      MPT_VEC_FOR(ox, ow, {
        const int32_t i0 = base + 2 * (int32_t)ox;
        float best = r0[2 * ox];
        int32_t at = i0;
        const float v1 = r0[2 * ox + 1], v2 = r1[2 * ox], v3 = r1[2 * ox + 1];
        const int t1 = (v1 > best) | (v1 != v1);
        best = t1 ? v1 : best;
        at = t1 ? i0 + 1 : at;
        const int t2 = (v2 > best) | (v2 != v2);
        best = t2 ? v2 : best;
        at = t2 ? i0 + below : at;
        const int t3 = (v3 > best) | (v3 != v3);
        best = t3 ? v3 : best;
        at = t3 ? i0 + below + 1 : at;
        yr[ox] = best;
        ar[ox] = at;
      });
    }
}

/* Each output row is initialised from window tap (0, 0); the later taps follow in row-major
 * order. */
mpt_status mpt__cpu_maxpool(mpt_stream *s, const mpt_conv_geom *g, int64_t planes,
                            const float *restrict x, float *restrict y,
                            int32_t *restrict argmax) {
  (void)s;
  const int64_t H = g->height, W = g->width, kh = g->kernel_h, kw = g->kernel_w;
  const int64_t st = g->stride, oh = g->out_h, ow = g->out_w;
  if (kh == 2 && kw == 2 && st == 2) {
    maxpool_2x2_s2(g, planes, x, y, argmax);
    return MPT_OK;
  }
  for (int64_t p = 0; p < planes; p++) {
    const float *xp = x + p * H * W;
    for (int64_t oy = 0; oy < oh; oy++) {
      float *yr = y + (p * oh + oy) * ow;
      int32_t *ar = argmax + (p * oh + oy) * ow;
      const int64_t iy0 = oy * st;
      for (int64_t ox = 0; ox < ow; ox++) {
        yr[ox] = xp[iy0 * W + ox * st];
        ar[ox] = (int32_t)(iy0 * W + ox * st);
      }
      for (int64_t ki = 0; ki < kh; ki++)
        for (int64_t kj = ki == 0 ? 1 : 0; kj < kw; kj++) {
          const int32_t base = (int32_t)((iy0 + ki) * W + kj);
          pool_tap(yr, ar, xp + base, base, ow, st);
        }
    }
  }
  return MPT_OK;
}

mpt_status mpt__cpu_maxpool_backward(mpt_stream *s, const mpt_conv_geom *g, int64_t planes,
                                     const float *restrict dy, const int32_t *restrict argmax,
                                     float *restrict dx) {
  (void)s;
  const int64_t plane = g->height * g->width, outs = g->out_h * g->out_w;
  for (int64_t p = 0; p < planes; p++) {
    const float *dyp = dy + p * outs;
    const int32_t *ap = argmax + p * outs;
    float *dxp = dx + p * plane;
    for (int64_t o = 0; o < outs; o++) {
      /* A bad index would write outside dx: refuse it (one predictable branch). */
      if ((uint32_t)ap[o] >= (uint64_t)plane)
        return MPT_FAIL(MPT_EINVAL, "maxpool_backward: plane %lld output %lld has argmax %d "
                        "outside [0, %lld)", (long long)p, (long long)o, (int)ap[o],
                        (long long)plane);
      dxp[ap[o]] += dyp[o];
    }
  }
  return MPT_OK;
}
