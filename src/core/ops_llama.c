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
  DISPATCH(rope, x, b, t, heads, d, theta, 0);
}

mpt_status mpt_op_rope_backward(mpt_stream *stream, float *dx, int64_t b, int64_t t,
                                int64_t heads, int64_t d, float theta) {
  REQUIRE_ROPE();
  if (b == 0 || t == 0 || heads == 0) return MPT_OK;
  REQUIRE_PTR(dx);
  DISPATCH(rope, dx, b, t, heads, d, theta, 1);
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
