/* The CPU backend's transformer ops (include/mpitrain/ops_gpt.h): the reference every other
 * backend is tested against. Plain loops on the calling thread (the matrix products of the
 * layers are GEMMs elsewhere); sums over a row that feed a division go in double; every
 * accumulation over rows runs in increasing row order, so results are bit-reproducible. Index
 * arrays are range-checked here, before anything is written. src/core/ops_gpt.c has checked
 * the other arguments. */
#include <math.h>

#include "core/cpu/cpu.h"
#include "core/error.h"

static mpt_status indices_check(const char *op, const char *what, const int32_t *idx,
                                int64_t n, int64_t limit) {
  for (int64_t i = 0; i < n; i++)
    if (idx[i] < 0 || idx[i] >= limit)
      return MPT_FAIL(MPT_EINVAL, "%s: %s[%lld] = %d is outside [0, %lld)", op, what,
                      (long long)i, (int)idx[i], (long long)limit);
  return MPT_OK;
}

mpt_status mpt__cpu_embedding_gpt(mpt_stream *s, const int32_t *tokens, int64_t b, int64_t t,
                                  int64_t c, int64_t vocab, const float *wte, const float *wpe,
                                  float *y) {
  (void)s;
  MPT_RETURN_IF(indices_check("embedding_gpt", "tokens", tokens, b * t, vocab));
  for (int64_t r = 0; r < b * t; r++) {
    const float *e = wte + (int64_t)tokens[r] * c, *p = wpe + (r % t) * c;
    float *o = y + r * c;
    for (int64_t i = 0; i < c; i++) o[i] = e[i] + p[i];
  }
  return MPT_OK;
}

mpt_status mpt__cpu_embedding_gpt_backward(mpt_stream *s, const int32_t *tokens, int64_t b,
                                           int64_t t, int64_t c, int64_t vocab, const float *dy,
                                           float *dwte, float *dwpe) {
  (void)s;
  MPT_RETURN_IF(indices_check("embedding_gpt_backward", "tokens", tokens, b * t, vocab));
  for (int64_t r = 0; r < b * t; r++) {
    const float *g = dy + r * c;
    if (dwte) {
      float *row = dwte + (int64_t)tokens[r] * c;
      for (int64_t i = 0; i < c; i++) row[i] += g[i];
    }
    if (dwpe) {
      float *row = dwpe + (r % t) * c;
      for (int64_t i = 0; i < c; i++) row[i] += g[i];
    }
  }
  return MPT_OK;
}

mpt_status mpt__cpu_layernorm(mpt_stream *s, const float *x, int64_t rows, int64_t c,
                              const float *w, const float *bias, float eps, float *y,
                              float *mean, float *rstd) {
  (void)s;
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * c;
    float *yr = y + r * c;
    double sum = 0.0;
    for (int64_t i = 0; i < c; i++) sum += xr[i];
    const float m = (float)(sum / (double)c);
    double var = 0.0;
    for (int64_t i = 0; i < c; i++) var += (double)(xr[i] - m) * (double)(xr[i] - m);
    const float rs = (float)(1.0 / sqrt(var / (double)c + (double)eps));
    for (int64_t i = 0; i < c; i++) yr[i] = (xr[i] - m) * rs * w[i] + bias[i];
    mean[r] = m;
    rstd[r] = rs;
  }
  return MPT_OK;
}

mpt_status mpt__cpu_layernorm_backward(mpt_stream *s, const float *dy, const float *x,
                                       int64_t rows, int64_t c, const float *w,
                                       const float *mean, const float *rstd, float *dx,
                                       float *dw, float *dbias) {
  (void)s;
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * c, *g = dy + r * c;
    const float m = mean[r], rs = rstd[r];
    double gmean = 0.0, gxmean = 0.0; /* sums over c of dy * w and dy * w * xhat */
    for (int64_t i = 0; i < c; i++) {
      const float xhat = (xr[i] - m) * rs, gw = g[i] * w[i];
      gmean += gw;
      gxmean += (double)gw * xhat;
      if (dw) dw[i] += g[i] * xhat;
      if (dbias) dbias[i] += g[i];
    }
    if (!dx) continue;
    const float gm = (float)(gmean / (double)c), gxm = (float)(gxmean / (double)c);
    float *dxr = dx + r * c;
    for (int64_t i = 0; i < c; i++) {
      const float xhat = (xr[i] - m) * rs;
      dxr[i] += rs * (g[i] * w[i] - gm - xhat * gxm);
    }
  }
  return MPT_OK;
}

#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_CUBE 0.044715f

/* 0.5 (1 + tanh(u)) = sigmoid(2u) exactly, so gelu(x) = x * sigmoid(2u): one expf instead of
 * a tanhf (measured 3-4x faster here) and no cancellation where 1 + tanh(u) is tiny. And
 * 0.5 (1 - tanh(u)^2) = 2 s (1 - s) with s = sigmoid(2u), so gelu'(x) = s + 2 x s (1 - s) u',
 * where 1 - s = e s with e = exp(-2u) (exact, and no cancellation where s is near 1). */
static inline float gelu_sig(float v, float *one_minus, float *du) {
  const float u = GELU_SCALE * (v + GELU_CUBE * v * v * v), e = expf(-2.0f * u);
  const float sg = 1.0f / (1.0f + e);
  *one_minus = sg > 0.0f ? e * sg : 1.0f; /* e = inf: s = 0 */
  *du = GELU_SCALE * (1.0f + 3.0f * GELU_CUBE * v * v);
  return sg;
}

mpt_status mpt__cpu_gelu(mpt_stream *s, float *y, const float *x, int64_t count) {
  (void)s;
  for (int64_t i = 0; i < count; i++) {
    float om, du;
    y[i] = x[i] * gelu_sig(x[i], &om, &du);
  }
  return MPT_OK;
}

mpt_status mpt__cpu_gelu_backward(mpt_stream *s, float *dx, const float *dy, const float *x,
                                  int64_t count) {
  (void)s;
  for (int64_t i = 0; i < count; i++) {
    float om, du;
    const float v = x[i], sg = gelu_sig(v, &om, &du);
    dx[i] += dy[i] * (sg + 2.0f * v * sg * om * du);
  }
  return MPT_OK;
}

mpt_status mpt__cpu_causal_softmax(mpt_stream *s, float *a, int64_t planes, int64_t t) {
  (void)s;
  for (int64_t r = 0; r < planes * t; r++) {
    const int64_t i = r % t; /* the row within its plane: columns [0, i] take part */
    float *row = a + r * t;
    float mx = row[0];
    for (int64_t j = 1; j <= i; j++) mx = row[j] > mx ? row[j] : mx;
    double sum = 0.0;
    for (int64_t j = 0; j <= i; j++) {
      row[j] = expf(row[j] - mx);
      sum += row[j];
    }
    const float inv = (float)(1.0 / sum);
    for (int64_t j = 0; j <= i; j++) row[j] *= inv;
    for (int64_t j = i + 1; j < t; j++) row[j] = 0.0f;
  }
  return MPT_OK;
}

mpt_status mpt__cpu_causal_softmax_backward(mpt_stream *s, const float *a, float *d,
                                            int64_t planes, int64_t t) {
  (void)s;
  for (int64_t r = 0; r < planes * t; r++) {
    const int64_t i = r % t;
    const float *ar = a + r * t;
    float *dr = d + r * t;
    double dot = 0.0;
    for (int64_t j = 0; j <= i; j++) dot += (double)ar[j] * dr[j];
    for (int64_t j = 0; j <= i; j++) dr[j] = ar[j] * (dr[j] - (float)dot);
    for (int64_t j = i + 1; j < t; j++) dr[j] = 0.0f;
  }
  return MPT_OK;
}

mpt_status mpt__cpu_xent_vocab(mpt_stream *s, const float *logits, const int32_t *targets,
                               int64_t n, int64_t vp, int64_t v, float *lse, float *loss) {
  (void)s;
  MPT_RETURN_IF(indices_check("xent_vocab", "targets", targets, n, v));
  double total = 0.0;
  for (int64_t r = 0; r < n; r++) {
    const float *lr = logits + r * vp;
    float mx = lr[0];
    for (int64_t j = 1; j < v; j++) mx = lr[j] > mx ? lr[j] : mx;
    double sum = 0.0;
    for (int64_t j = 0; j < v; j++) sum += expf(lr[j] - mx);
    const double l = (double)mx + log(sum);
    lse[r] = (float)l;
    total += l - (double)lr[targets[r]];
  }
  *loss = (float)(total / (double)n);
  return MPT_OK;
}

mpt_status mpt__cpu_xent_vocab_backward(mpt_stream *s, const float *logits,
                                        const int32_t *targets, int64_t n, int64_t vp, int64_t v,
                                        const float *lse, const float *dloss, float *dlogits) {
  (void)s;
  MPT_RETURN_IF(indices_check("xent_vocab_backward", "targets", targets, n, v));
  const float g = *dloss / (float)n;
  for (int64_t r = 0; r < n; r++) {
    const float *lr = logits + r * vp;
    float *dr = dlogits + r * vp;
    for (int64_t j = 0; j < v; j++) dr[j] += g * expf(lr[j] - lse[r]);
    dr[targets[r]] -= g;
  }
  return MPT_OK;
}
