/* The public wrappers of include/mpitrain/ops_llama.h, as src/core/ops_gpt.c does for
 * ops_gpt.h: each checks its arguments (MPT_EINVAL naming the op and the bad value), returns
 * MPT_OK at once when there is no work, then dispatches to the stream's backend (NULL stream:
 * the CPU); a backend without the slot (CUDA, now) gives MPT_ENOTSUP. No state. */
#include <math.h>

#include "core/backend.h"
#include "mpitrain/core.h"
#include "mpitrain/ops_llama.h"

#define REQUIRE(cond, fmt, ...)                                                       \
  do {                                                                                \
    if (!(cond)) return MPT_FAIL(MPT_EINVAL, "%s: " fmt, __func__, __VA_ARGS__);      \
  } while (0)
#define REQUIRE_PTR(p) REQUIRE((p) != NULL, "%s is NULL", #p)
#define REQUIRE_EXTENT(v) REQUIRE((v) >= 0 && (v) <= INT32_MAX, "%s = %lld outside [0, 2^31)", \
                                  #v, (long long)(v))
#define REQUIRE_NONNEG(v) REQUIRE((v) >= 0, "%s = %lld is negative", #v, (long long)(v))

#define DISPATCH(slot, ...)                                                                \
  do {                                                                                     \
    const mpt__device_backend *b_ = mpt__backend_of_stream(stream);                        \
    if (!b_ || !b_->slot)                                                                  \
      return MPT_FAIL(MPT_ENOTSUP, "%s: not available on the %s backend", __func__,        \
                      b_ ? b_->name : "unbuilt");                                          \
    return b_->slot(stream, __VA_ARGS__);                                                  \
  } while (0)

mpt_status mpt_op_rmsnorm(mpt_stream *stream, const float *x, int64_t rows, int64_t c,
                          const float *w, float eps, float *y, float *rstd) {
  REQUIRE_EXTENT(rows);
  REQUIRE(c >= 1 && c <= INT32_MAX, "c = %lld outside [1, 2^31)", (long long)c);
  REQUIRE(isfinite(eps) && eps >= 0.0f, "eps = %g must be finite and >= 0", (double)eps);
  if (rows == 0) return MPT_OK;
  REQUIRE_PTR(x);
  REQUIRE_PTR(w);
  REQUIRE_PTR(y);
  REQUIRE_PTR(rstd);
  DISPATCH(rmsnorm, x, rows, c, w, eps, y, rstd);
}

mpt_status mpt_op_rmsnorm_backward(mpt_stream *stream, const float *dy, const float *x,
                                   int64_t rows, int64_t c, const float *w, const float *rstd,
                                   float *dx, float *dw) {
  REQUIRE_EXTENT(rows);
  REQUIRE(c >= 1 && c <= INT32_MAX, "c = %lld outside [1, 2^31)", (long long)c);
  if (rows == 0 || (!dx && !dw)) return MPT_OK;
  REQUIRE_PTR(dy);
  REQUIRE_PTR(x);
  REQUIRE_PTR(w);
  REQUIRE_PTR(rstd);
  DISPATCH(rmsnorm_backward, dy, x, rows, c, w, rstd, dx, dw);
}

/* The checks rope and its backward share. */
#define REQUIRE_ROPE()                                                                     \
  do {                                                                                     \
    REQUIRE_EXTENT(b);                                                                     \
    REQUIRE_EXTENT(t);                                                                     \
    REQUIRE_EXTENT(heads);                                                                 \
    REQUIRE(d >= 2 && d <= INT32_MAX && d % 2 == 0, "d = %lld must be even and >= 2",      \
            (long long)d);                                                                 \
    REQUIRE(isfinite(theta) && theta > 1.0f, "theta = %g must be finite and > 1",          \
            (double)theta);                                                                \
  } while (0)

mpt_status mpt_op_rope(mpt_stream *stream, float *x, int64_t b, int64_t t, int64_t heads,
                       int64_t d, float theta) {
  REQUIRE_ROPE();
  if (b == 0 || t == 0 || heads == 0) return MPT_OK;
  REQUIRE_PTR(x);
  DISPATCH(rope, x, b, t, heads, d, theta, NULL, 0);
}

mpt_status mpt_op_rope_backward(mpt_stream *stream, float *dx, int64_t b, int64_t t,
                                int64_t heads, int64_t d, float theta) {
  REQUIRE_ROPE();
  if (b == 0 || t == 0 || heads == 0) return MPT_OK;
  REQUIRE_PTR(dx);
  DISPATCH(rope, dx, b, t, heads, d, theta, NULL, 1);
}

mpt_status mpt_rope_scaling_check(const mpt_rope_scaling *scaling) {
  if (!scaling || scaling->type == MPT_ROPE_DEFAULT) return MPT_OK;
  REQUIRE(scaling->type == MPT_ROPE_LLAMA3, "scaling type %d unknown (0 default, 1 llama3)",
          (int)scaling->type);
  const mpt_rope_scaling *s = scaling;
  REQUIRE(isfinite(s->factor) && s->factor >= 1.0f, "llama3 factor %g must be finite and >= 1",
          (double)s->factor);
  REQUIRE(isfinite(s->low_freq_factor) && s->low_freq_factor > 0.0f,
          "llama3 low_freq_factor %g must be finite and > 0", (double)s->low_freq_factor);
  REQUIRE(isfinite(s->high_freq_factor) && s->high_freq_factor > s->low_freq_factor,
          "llama3 high_freq_factor %g must be finite and > low_freq_factor %g",
          (double)s->high_freq_factor, (double)s->low_freq_factor);
  REQUIRE(s->original_max_position_embeddings >= 1,
          "llama3 original_max_position_embeddings %d must be >= 1",
          s->original_max_position_embeddings);
  return MPT_OK;
}

/* Every step in float32 as transformers' torch code does it (a Python number meeting a float32
 * tensor is rounded to float first); volatile keeps each rounding where the reference has it. */
mpt_status mpt_rope_inv_freq(int64_t d, float theta, const mpt_rope_scaling *scaling,
                             float *inv_freq) {
  REQUIRE(d >= 2 && d <= INT32_MAX && d % 2 == 0, "d = %lld must be even and >= 2",
          (long long)d);
  REQUIRE(isfinite(theta) && theta > 1.0f, "theta = %g must be finite and > 1", (double)theta);
  REQUIRE_PTR(inv_freq);
  MPT_RETURN_IF(mpt_rope_scaling_check(scaling));
  const int llama3 = scaling && scaling->type == MPT_ROPE_LLAMA3;
  const double old_ctx = llama3 ? (double)scaling->original_max_position_embeddings : 0.0;
  const float lo = llama3 ? (float)(old_ctx / (double)scaling->low_freq_factor) : 0.0f;
  const float hi = llama3 ? (float)(old_ctx / (double)scaling->high_freq_factor) : 0.0f;
  const float two_pi = (float)(2.0 * 3.14159265358979323846);
  for (int64_t i = 0; i < d / 2; i++) {
    volatile float e = (float)(2 * i) / (float)d;
    volatile float pw = (float)pow((double)theta, (double)e);
    volatile float f = 1.0f / pw;
    if (llama3) {
      const mpt_rope_scaling *s = scaling;
      volatile float w = two_pi / f;
      if (w > lo) {
        f = f / s->factor;
      } else if (!(w < hi)) {
        volatile float r = (float)old_ctx / w;
        volatile float num = r - s->low_freq_factor;
        volatile float den = (float)((double)s->high_freq_factor - (double)s->low_freq_factor);
        volatile float sm = num / den;
        volatile float a = (1.0f - sm) * f;
        volatile float a2 = a / s->factor;
        volatile float b2 = sm * f;
        f = a2 + b2;
      }
    }
    inv_freq[i] = f;
  }
  return MPT_OK;
}

/* The checks rope_freqs and its backward share. */
#define REQUIRE_ROPE_FREQS()                                                               \
  do {                                                                                     \
    REQUIRE_EXTENT(b);                                                                     \
    REQUIRE_EXTENT(t);                                                                     \
    REQUIRE_EXTENT(heads);                                                                 \
    REQUIRE(d >= 2 && d <= INT32_MAX && d % 2 == 0, "d = %lld must be even and >= 2",      \
            (long long)d);                                                                 \
    REQUIRE_PTR(inv_freq);                                                                 \
    for (int64_t i_ = 0; i_ < d / 2; i_++)                                                 \
      REQUIRE(isfinite(inv_freq[i_]), "inv_freq[%lld] = %g is not finite", (long long)i_,  \
              (double)inv_freq[i_]);                                                       \
  } while (0)

mpt_status mpt_op_rope_freqs(mpt_stream *stream, float *x, int64_t b, int64_t t,
                             int64_t heads, int64_t d, const float *inv_freq) {
  REQUIRE_ROPE_FREQS();
  if (b == 0 || t == 0 || heads == 0) return MPT_OK;
  REQUIRE_PTR(x);
  DISPATCH(rope, x, b, t, heads, d, 0.0f, inv_freq, 0);
}

mpt_status mpt_op_rope_freqs_backward(mpt_stream *stream, float *dx, int64_t b, int64_t t,
                                      int64_t heads, int64_t d, const float *inv_freq) {
  REQUIRE_ROPE_FREQS();
  if (b == 0 || t == 0 || heads == 0) return MPT_OK;
  REQUIRE_PTR(dx);
  DISPATCH(rope, dx, b, t, heads, d, 0.0f, inv_freq, 1);
}

mpt_status mpt_op_swiglu(mpt_stream *stream, float *y, const float *gate, const float *up,
                         int64_t count) {
  REQUIRE_NONNEG(count);
  if (count == 0) return MPT_OK;
  REQUIRE_PTR(y);
  REQUIRE_PTR(gate);
  REQUIRE_PTR(up);
  DISPATCH(swiglu, y, gate, up, count);
}

mpt_status mpt_op_swiglu_backward(mpt_stream *stream, const float *dy, const float *gate,
                                  const float *up, int64_t count, float *dgate, float *dup) {
  REQUIRE_NONNEG(count);
  if (count == 0 || (!dgate && !dup)) return MPT_OK;
  REQUIRE_PTR(dy);
  REQUIRE_PTR(gate);
  REQUIRE_PTR(up);
  DISPATCH(swiglu_backward, dy, gate, up, count, dgate, dup);
}
