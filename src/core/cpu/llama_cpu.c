/* The CPU backend's Llama ops (include/mpitrain/ops_llama.h): plain loops on the calling
 * thread; row sums in double in index order, sums over rows in increasing row order, so the
 * results are bit-reproducible. src/core/ops_llama.c has checked the arguments. */
#include <math.h>
#include <stdlib.h>

#include "core/cpu/cpu.h"

mpt_status mpt__cpu_rmsnorm(mpt_stream *s, const float *x, int64_t rows, int64_t c,
                            const float *w, float eps, float *y, float *rstd) {
  (void)s;
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * c;
    double ss = 0.0;
    for (int64_t j = 0; j < c; j++) ss += (double)xr[j] * xr[j];
    const float rs = (float)(1.0 / sqrt(ss / (double)c + (double)eps));
    rstd[r] = rs;
    float *yr = y + r * c;
    for (int64_t j = 0; j < c; j++) yr[j] = xr[j] * rs * w[j];
  }
  return MPT_OK;
}

mpt_status mpt__cpu_rmsnorm_backward(mpt_stream *s, const float *dy, const float *x,
                                     int64_t rows, int64_t c, const float *w, const float *rstd,
                                     float *dx, float *dw) {
  (void)s;
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * c, *dyr = dy + r * c;
    const float rs = rstd[r];
    if (dw)
      for (int64_t j = 0; j < c; j++) dw[j] += dyr[j] * (xr[j] * rs);
    if (!dx) continue;
    double dot = 0.0; /* sum_c g xhat */
    for (int64_t j = 0; j < c; j++) dot += (double)(dyr[j] * w[j]) * (double)(xr[j] * rs);
    const float m = (float)(dot / (double)c);
    float *dxr = dx + r * c;
    for (int64_t j = 0; j < c; j++) dxr[j] += rs * (dyr[j] * w[j] - (xr[j] * rs) * m);
  }
  return MPT_OK;
}

mpt_status mpt__cpu_rope(mpt_stream *s, float *x, int64_t b, int64_t t, int64_t heads,
                         int64_t d, float theta, const float *inv_freq, int inverse) {
  (void)s;
  const int64_t half = d / 2;
  float *cs = malloc((size_t)(2 * half) * sizeof *cs);
  if (!cs) return MPT_FAIL(MPT_ENOMEM, "rope: %lld floats", (long long)(2 * half));
  const float sign = inverse ? -1.0f : 1.0f;
  for (int64_t p = 0; p < t; p++) {
    for (int64_t i = 0; i < half; i++) {
      /* the table's angle is the float product, as Hugging Face's */
      const double a = inv_freq ? (double)((float)p * inv_freq[i])
                                : (double)p * pow((double)theta, -2.0 * (double)i / (double)d);
      cs[i] = (float)cos(a);
      cs[half + i] = sign * (float)sin(a);
    }
    for (int64_t n = 0; n < b; n++)
      for (int64_t h = 0; h < heads; h++) {
        float *v = x + ((n * t + p) * heads + h) * d;
        for (int64_t i = 0; i < half; i++) {
          const float x1 = v[i], x2 = v[half + i], co = cs[i], si = cs[half + i];
          v[i] = x1 * co - x2 * si;
          v[half + i] = x2 * co + x1 * si;
        }
      }
  }
  free(cs);
  return MPT_OK;
}

static inline float sigmoidf_(float a) { return 1.0f / (1.0f + expf(-a)); }

mpt_status mpt__cpu_swiglu(mpt_stream *s, float *y, const float *gate, const float *up,
                           int64_t count) {
  (void)s;
  for (int64_t k = 0; k < count; k++) {
    const float a = gate[k], u = up[k];
    y[k] = a * sigmoidf_(a) * u;
  }
  return MPT_OK;
}

mpt_status mpt__cpu_swiglu_backward(mpt_stream *s, const float *dy, const float *gate,
                                    const float *up, int64_t count, float *dgate, float *dup) {
  (void)s;
  for (int64_t k = 0; k < count; k++) {
    const float a = gate[k], sg = sigmoidf_(a);
    if (dgate) dgate[k] += dy[k] * up[k] * (sg * (1.0f + a * (1.0f - sg)));
    if (dup) dup[k] += dy[k] * (a * sg);
  }
  return MPT_OK;
}
