/* CPU kernels for convolution and pooling windows: im2col and its adjoint col2im (Caffe's
 * layout, Jia et al., 2014), and max pooling forward and backward. The geometry was checked and
 * resolved by ops.c (positive extents, out_h/out_w consistent; pooling: pad == 0).
 *
 * For each kernel tap (ki, kj) the output columns whose input pixel lies inside the image form
 * one contiguous range [lo, hi) of ox (clip_range), so the inner loops carry no bounds test: a
 * copy (stride 1: contiguous) between two zero fills. Runs on the calling thread. */
#include "core/cpu/cpu.h"
#include "core/cpu/vec.h"
#include "core/error.h"

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

mpt_status mpt__cpu_im2col(mpt_stream *s, const mpt_conv_geom *g, const float *restrict x,
                           float *restrict col) {
  (void)s;
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

mpt_status mpt__cpu_col2im(mpt_stream *s, const mpt_conv_geom *g, const float *restrict col,
                           float *restrict dx) {
  (void)s;
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

/* Each output row is initialised from window tap (0, 0); the later taps follow in row-major
 * order. */
mpt_status mpt__cpu_maxpool(mpt_stream *s, const mpt_conv_geom *g, int64_t planes,
                            const float *restrict x, float *restrict y,
                            int32_t *restrict argmax) {
  (void)s;
  const int64_t H = g->height, W = g->width, kh = g->kernel_h, kw = g->kernel_w;
  const int64_t st = g->stride, oh = g->out_h, ow = g->out_w;
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
