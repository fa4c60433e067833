/* CUDA kernels for convolution and pooling windows, with their extern "C" launchers
 * (kernels.h): im2col and its adjoint col2im in Caffe's layout (Jia et al., 2014), max pooling
 * forward and backward; the same results as src/core/cpu/conv_cpu.c.
 *
 * The adjoints (col2im, maxpool_backward) are written as gathers, one thread per input pixel,
 * instead of scatters with atomics: each pixel adds its contributions in the order the CPU
 * adds them (ascending kernel tap, ascending output position), starting from dx, so the
 * results are deterministic and bit-identical to the CPU's. Enqueued on the caller's stream. */
#include "core/cuda/kernels_common.cuh"

/* col [C*kh*kw, oh*ow]: element (row = (c*kh + ki)*kw + kj, o = oy*ow + ox) takes
 * x[c, oy*stride - pad + ki, ox*stride - pad + kj], 0 outside the image. */
__global__ void k_im2col(mpt_conv_geom g, const float *x, float *col, int64_t total) {
  const int64_t outs = g.out_h * g.out_w;
  MPT_CUK_FOR(idx, total) {
    const int64_t row = idx / outs, o = idx - row * outs;
    const int64_t kj = row % g.kernel_w, t = row / g.kernel_w;
    const int64_t ki = t % g.kernel_h, c = t / g.kernel_h;
    const int64_t oy = o / g.out_w, ox = o - oy * g.out_w;
    const int64_t iy = oy * g.stride - g.pad + ki, ix = ox * g.stride - g.pad + kj;
    col[idx] = (iy >= 0 && iy < g.height && ix >= 0 && ix < g.width)
                   ? x[(c * g.height + iy) * g.width + ix]
                   : 0.0f;
  }
}

/* dx[c, iy, ix] += every col element that im2col read from it: taps (ki, kj) with
 * oy = (iy + pad - ki) / stride and ox = (ix + pad - kj) / stride exact and inside the output. */
__global__ void k_col2im(mpt_conv_geom g, const float *col, float *dx, int64_t total) {
  const int64_t plane = g.height * g.width, outs = g.out_h * g.out_w;
  MPT_CUK_FOR(idx, total) {
    const int64_t c = idx / plane, rem = idx - c * plane;
    const int64_t iy = rem / g.width, ix = rem - iy * g.width;
    float acc = dx[idx];
    for (int64_t ki = 0; ki < g.kernel_h; ki++) {
      const int64_t ty = iy + g.pad - ki;
      if (ty < 0) break; /* smaller still for the later taps */
      if (ty % g.stride != 0) continue;
      const int64_t oy = ty / g.stride;
      if (oy >= g.out_h) continue;
      for (int64_t kj = 0; kj < g.kernel_w; kj++) {
        const int64_t tx = ix + g.pad - kj;
        if (tx < 0) break;
        if (tx % g.stride != 0) continue;
        const int64_t ox = tx / g.stride;
        if (ox >= g.out_w) continue;
        acc += col[((c * g.kernel_h + ki) * g.kernel_w + kj) * outs + oy * g.out_w + ox];
      }
    }
    dx[idx] = acc;
  }
}

/* One thread per output (p, oy, ox): the window's taps in row-major order, starting from tap
 * (0, 0); a later tap wins when strictly greater (the first maximum) or NaN (NaN propagates),
 * as POOL_TAKE in the CPU kernel. pad is 0 (checked by ops.c). */
__global__ void k_maxpool(mpt_conv_geom g, const float *x, float *y, int32_t *argmax,
                          int64_t total) {
  const int64_t outs = g.out_h * g.out_w, plane = g.height * g.width;
  MPT_CUK_FOR(idx, total) {
    const int64_t p = idx / outs, o = idx - p * outs;
    const int64_t oy = o / g.out_w, ox = o - oy * g.out_w;
    const float *xp = x + p * plane;
    const int64_t iy0 = oy * g.stride, ix0 = ox * g.stride;
    int64_t best_at = iy0 * g.width + ix0;
    float best = xp[best_at];
    for (int64_t ki = 0; ki < g.kernel_h; ki++)
      for (int64_t kj = ki == 0 ? 1 : 0; kj < g.kernel_w; kj++) {
        const int64_t at = (iy0 + ki) * g.width + ix0 + kj;
        const float v = xp[at];
        if (v > best || isnan(v)) {
          best = v;
          best_at = at;
        }
      }
    y[idx] = best;
    argmax[idx] = (int32_t)best_at;
  }
}

/* dx[p, iy, ix] += dy[p, o] for every output o whose window covers (iy, ix) and whose argmax is
 * this pixel, in ascending o. An argmax that is not a pixel of its own window (never produced
 * by maxpool) is ignored: no thread can match it, so nothing is written out of bounds. */
__global__ void k_maxpool_backward(mpt_conv_geom g, const float *dy, const int32_t *argmax,
                                   float *dx, int64_t total) {
  const int64_t outs = g.out_h * g.out_w, plane = g.height * g.width, st = g.stride;
  MPT_CUK_FOR(idx, total) {
    const int64_t p = idx / plane, pix = idx - p * plane;
    const int64_t iy = pix / g.width, ix = pix - iy * g.width;
    /* oy * st <= iy <= oy * st + kh - 1, likewise ox */
    const int64_t oy_lo = iy - g.kernel_h + 1 <= 0 ? 0 : (iy - g.kernel_h + 1 + st - 1) / st;
    const int64_t ox_lo = ix - g.kernel_w + 1 <= 0 ? 0 : (ix - g.kernel_w + 1 + st - 1) / st;
    const int64_t oy_hi = iy / st < g.out_h - 1 ? iy / st : g.out_h - 1;
    const int64_t ox_hi = ix / st < g.out_w - 1 ? ix / st : g.out_w - 1;
    const int32_t *ap = argmax + p * outs;
    const float *dyp = dy + p * outs;
    float acc = dx[idx];
    for (int64_t oy = oy_lo; oy <= oy_hi; oy++)
      for (int64_t ox = ox_lo; ox <= ox_hi; ox++) {
        const int64_t o = oy * g.out_w + ox;
        if (ap[o] == pix) acc += dyp[o];
      }
    dx[idx] = acc;
  }
}

static unsigned grid_of(int64_t n) { return mpt_cuk_grid(n, MPT_CUK_BLOCK, MPT_CUK_MAX_GRID); }

extern "C" {

cudaError_t mpt__cuk_im2col(cudaStream_t s, mpt_conv_geom g, const float *x, float *col) {
  const int64_t total = g.channels * g.kernel_h * g.kernel_w * g.out_h * g.out_w;
  k_im2col<<<grid_of(total), MPT_CUK_BLOCK, 0, s>>>(g, x, col, total);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_col2im(cudaStream_t s, mpt_conv_geom g, const float *col, float *dx) {
  const int64_t total = g.channels * g.height * g.width;
  k_col2im<<<grid_of(total), MPT_CUK_BLOCK, 0, s>>>(g, col, dx, total);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_maxpool(cudaStream_t s, mpt_conv_geom g, int64_t planes, const float *x,
                             float *y, int32_t *argmax) {
  const int64_t total = planes * g.out_h * g.out_w;
  k_maxpool<<<grid_of(total), MPT_CUK_BLOCK, 0, s>>>(g, x, y, argmax, total);
  return cudaGetLastError();
}

cudaError_t mpt__cuk_maxpool_backward(cudaStream_t s, mpt_conv_geom g, int64_t planes,
                                      const float *dy, const int32_t *argmax, float *dx) {
  const int64_t total = planes * g.height * g.width;
  k_maxpool_backward<<<grid_of(total), MPT_CUK_BLOCK, 0, s>>>(g, dy, argmax, dx, total);
  return cudaGetLastError();
}

} /* extern "C" */
