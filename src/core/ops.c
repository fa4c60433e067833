/* The public op wrappers of include/mpitrain/ops.h (DESIGN.md "Backends are tables of
 * functions"): each checks its arguments (MPT_EINVAL naming the op and the bad value), returns
 * MPT_OK at once when there is no work, then dispatches to the backend of the stream (NULL
 * stream: the CPU). A backend slot left NULL gives MPT_ENOTSUP.
 *
 * Invariant: a backend kernel is only ever called with non-negative extents, non-NULL pointers
 * for everything it must touch, a resolved geometry, and at least one element of work (except
 * gemm with k == 0, where C = beta * C, and sum, whose empty result 0 must still be written).
 * Runs on the calling thread; the wrappers keep no state. */
#include <stdatomic.h>
#include <string.h>

#include "core/backend.h"
#include "mpitrain/core.h"

/* Returns MPT_EINVAL from the enclosing op when cond is false; the message starts with the op's
 * name (__func__ of the wrapper). */
#define REQUIRE(cond, fmt, ...)                                                       \
  do {                                                                                \
    if (!(cond)) return MPT_FAIL(MPT_EINVAL, "%s: " fmt, __func__, __VA_ARGS__);      \
  } while (0)
#define REQUIRE_PTR(p) REQUIRE((p) != NULL, "%s is NULL", #p)
#define REQUIRE_NONNEG(v) REQUIRE((v) >= 0, "%s = %lld is negative", #v, (long long)(v))

/* The leading dimensions of a GEMM's A and B (row-major, op(A) m x k, op(B) k x n), with the
 * calling op's name in the message: the checks every GEMM entry point shares. */
static mpt_status check_lds(const char *op, int trans_a, int trans_b, int64_t m, int64_t n,
                            int64_t k, int64_t lda, int64_t ldb) {
  const int64_t min_lda = trans_a ? m : k, min_ldb = trans_b ? k : n;
  if (lda < min_lda)
    return MPT_FAIL(MPT_EINVAL, "%s: lda = %lld < %lld (trans_a = %d)", op, (long long)lda,
                    (long long)min_lda, trans_a);
  if (ldb < min_ldb)
    return MPT_FAIL(MPT_EINVAL, "%s: ldb = %lld < %lld (trans_b = %d)", op, (long long)ldb,
                    (long long)min_ldb, trans_b);
  return MPT_OK;
}

/* Dispatches to the stream's backend, or MPT_ENOTSUP when it lacks the op. */
#define DISPATCH(slot, ...)                                                                \
  do {                                                                                     \
    const mpt__device_backend *b_ = mpt__backend_of_stream(stream);                        \
    if (!b_ || !b_->slot)                                                                  \
      return MPT_FAIL(MPT_ENOTSUP, "%s: not available on the %s backend", __func__,        \
                      b_ ? b_->name : "unbuilt");                                          \
    return b_->slot(stream, __VA_ARGS__);                                                  \
  } while (0)

/* *count = a * b * c for non-negative extents, or MPT_EINVAL when the product overflows. */
static mpt_status extent_product(const char *op, int64_t a, int64_t b, int64_t c,
                                 int64_t *count) {
  int64_t ab;
  if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, count))
    return MPT_FAIL(MPT_EINVAL, "%s: %lld x %lld x %lld elements overflow int64", op,
                    (long long)a, (long long)b, (long long)c);
  return MPT_OK;
}

/* Resolves g in place; `op` names the caller in messages. */
static mpt_status geom_resolve(const char *op, mpt_conv_geom *g) {
  if (!g) return MPT_FAIL(MPT_EINVAL, "%s: geometry is NULL", op);
  const struct { const char *name; int64_t v; } pos[] = {
      {"channels", g->channels}, {"height", g->height},     {"width", g->width},
      {"kernel_h", g->kernel_h}, {"kernel_w", g->kernel_w}, {"stride", g->stride}};
  /* Below 2^31, so that the sums and products below cannot overflow. */
  for (size_t i = 0; i < sizeof pos / sizeof pos[0]; i++)
    if (pos[i].v <= 0 || pos[i].v > INT32_MAX)
      return MPT_FAIL(MPT_EINVAL, "%s: %s = %lld must be in [1, 2^31)", op, pos[i].name,
                      (long long)pos[i].v);
  if (g->pad < 0 || g->pad > INT32_MAX)
    return MPT_FAIL(MPT_EINVAL, "%s: pad = %lld must be in [0, 2^31)", op, (long long)g->pad);
  if (g->height + 2 * g->pad < g->kernel_h || g->width + 2 * g->pad < g->kernel_w)
    return MPT_FAIL(MPT_EINVAL, "%s: a %lldx%lld window does not fit a %lldx%lld image "
                    "with pad %lld", op, (long long)g->kernel_h, (long long)g->kernel_w,
                    (long long)g->height, (long long)g->width, (long long)g->pad);
  g->out_h = (g->height + 2 * g->pad - g->kernel_h) / g->stride + 1;
  g->out_w = (g->width + 2 * g->pad - g->kernel_w) / g->stride + 1;
  return MPT_OK;
}

mpt_status mpt_conv_geom_resolve(mpt_conv_geom *g) { return geom_resolve(__func__, g); }

/* Checks that g is valid and already resolved (out_h/out_w as mpt_conv_geom_resolve gives). */
static mpt_status geom_check(const char *op, const mpt_conv_geom *g, int ignore_channels) {
  if (!g) return MPT_FAIL(MPT_EINVAL, "%s: geometry is NULL", op);
  mpt_conv_geom r = *g;
  if (ignore_channels) r.channels = 1;
  MPT_RETURN_IF(geom_resolve(op, &r));
  if (r.out_h != g->out_h || r.out_w != g->out_w)
    return MPT_FAIL(MPT_EINVAL, "%s: geometry says output %lldx%lld, expected %lldx%lld "
                    "(call mpt_conv_geom_resolve)", op, (long long)g->out_h,
                    (long long)g->out_w, (long long)r.out_h, (long long)r.out_w);
  return MPT_OK;
}

mpt_status mpt_op_memcpy(mpt_stream *stream, mpt_device dst_device, void *dst,
                         mpt_device src_device, const void *src, size_t nbytes) {
  if (nbytes == 0) return MPT_OK;
  REQUIRE(dst && src, "NULL %s with nbytes = %zu", dst ? "src" : "dst", nbytes);
  DISPATCH(memcpy, dst_device, dst, src_device, src, nbytes);
}

/* mpt_op_gemm_counting's totals: nanoseconds and FLOPs as integers (atomic adds). */
static atomic_int gemm_counting;
static atomic_int_fast64_t gemm_calls, gemm_ns, gemm_flop;

void mpt_op_gemm_counting(int on) {
  atomic_store(&gemm_counting, 0);
  if (!on) return;
  atomic_store(&gemm_calls, 0);
  atomic_store(&gemm_ns, 0);
  atomic_store(&gemm_flop, 0);
  atomic_store(&gemm_counting, 1);
}

void mpt_op_gemm_counted(int64_t *calls, double *ms, double *flop) {
  if (calls) *calls = (int64_t)atomic_load(&gemm_calls);
  if (ms) *ms = 1e-6 * (double)atomic_load(&gemm_ns);
  if (flop) *flop = (double)atomic_load(&gemm_flop);
}

mpt_status mpt_op_gemm(mpt_stream *stream, int trans_a, int trans_b, int64_t m, int64_t n,
                       int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                       int64_t ldb, float beta, float *c, int64_t ldc) {
  REQUIRE_NONNEG(m);
  REQUIRE_NONNEG(n);
  REQUIRE_NONNEG(k);
  if (m == 0 || n == 0) return MPT_OK;
  REQUIRE_PTR(c);
  REQUIRE(ldc >= n, "ldc = %lld < n = %lld", (long long)ldc, (long long)n);
  if (k > 0) { /* with k == 0, C = beta * C and A, B are not read */
    REQUIRE_PTR(a);
    REQUIRE_PTR(b);
    MPT_RETURN_IF(check_lds(__func__, trans_a, trans_b, m, n, k, lda, ldb));
  }
  if (atomic_load_explicit(&gemm_counting, memory_order_relaxed) &&
      mpt__backend_of_stream(stream) == &mpt__cpu_backend) { /* synchronous: timed here */
    const double t0 = mpt_time_ms();
    const mpt_status st = mpt__cpu_backend.gemm(stream, trans_a, trans_b, m, n, k, alpha, a, lda,
                                                b, ldb, beta, c, ldc);
    atomic_fetch_add(&gemm_ns, (int_fast64_t)(1e6 * (mpt_time_ms() - t0)));
    atomic_fetch_add(&gemm_flop, (int_fast64_t)2 * m * n * k);
    atomic_fetch_add(&gemm_calls, 1);
    return st;
  }
  DISPATCH(gemm, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

/* MPT_EINVAL naming the first NULL among ptrs[0..n), whose names are the comma-separated
 * `names` (the stringized argument list of NONNULL_CHECK). */
static mpt_status null_check(const char *op, int64_t count, const char *names, size_t n,
                             const void *const *ptrs) {
  for (size_t i = 0; i < n; i++) {
    if (ptrs[i]) continue;
    const char *s = names;
    for (size_t j = 0; j < i; j++) {
      s = strchr(s, ',') + 1;
      while (*s == ' ') s++;
    }
    return MPT_FAIL(MPT_EINVAL, "%s: %.*s is NULL with %lld elements of work", op,
                    (int)strcspn(s, ","), s, (long long)count);
  }
  return MPT_OK;
}

/* Non-negative count; MPT_OK at once when it is 0; else every listed pointer must be set. */
#define NONNULL_CHECK(count, ...)                                                        \
  do {                                                                                   \
    REQUIRE_NONNEG(count);                                                               \
    if ((count) == 0) return MPT_OK;                                                     \
    const void *const ptrs_[] = {__VA_ARGS__};                                           \
    MPT_RETURN_IF(null_check(__func__, (count), #__VA_ARGS__, sizeof ptrs_ / sizeof *ptrs_, \
                             ptrs_));                                                    \
  } while (0)

mpt_status mpt_op_fill(mpt_stream *stream, float *x, int64_t count, float value) {
  NONNULL_CHECK(count, x);
  DISPATCH(fill, x, count, value);
}

mpt_status mpt_op_copy(mpt_stream *stream, float *dst, const float *src, int64_t count) {
  NONNULL_CHECK(count, dst, src);
  DISPATCH(copy, dst, src, count);
}

mpt_status mpt_op_axpy(mpt_stream *stream, int64_t count, float alpha, const float *x,
                       float *y) {
  NONNULL_CHECK(count, x, y);
  DISPATCH(axpy, count, alpha, x, y);
}

mpt_status mpt_op_scale(mpt_stream *stream, float *x, int64_t count, float alpha) {
  NONNULL_CHECK(count, x);
  DISPATCH(scale, x, count, alpha);
}

mpt_status mpt_op_mul(mpt_stream *stream, float *y, const float *a, const float *b,
                      int64_t count) {
  NONNULL_CHECK(count, y, a, b);
  DISPATCH(mul, y, a, b, count);
}

mpt_status mpt_op_mul_backward(mpt_stream *stream, float *da, const float *dy, const float *b,
                               int64_t count) {
  NONNULL_CHECK(count, da, dy, b);
  DISPATCH(mul_backward, da, dy, b, count);
}

mpt_status mpt_op_sum(mpt_stream *stream, const float *x, int64_t count, float *out) {
  REQUIRE_NONNEG(count);
  REQUIRE_PTR(out); /* written even for count == 0: the empty sum is 0 */
  REQUIRE(count == 0 || x, "x is NULL with count = %lld", (long long)count);
  DISPATCH(sum, x, count, out);
}

mpt_status mpt_op_sum_backward(mpt_stream *stream, float *dx, int64_t count, const float *dy,
                               float scale) {
  NONNULL_CHECK(count, dx, dy);
  DISPATCH(sum_backward, dx, count, dy, scale);
}

mpt_status mpt_op_bias_add(mpt_stream *stream, float *y, const float *bias, int64_t rows,
                           int64_t cols, int64_t inner) {
  REQUIRE_NONNEG(rows);
  REQUIRE_NONNEG(cols);
  REQUIRE_NONNEG(inner);
  int64_t count = 0;
  MPT_RETURN_IF(extent_product(__func__, rows, cols, inner, &count));
  NONNULL_CHECK(count, y, bias);
  DISPATCH(bias_add, y, bias, rows, cols, inner);
}

mpt_status mpt_op_bias_backward(mpt_stream *stream, float *dbias, const float *dy, int64_t rows,
                                int64_t cols, int64_t inner) {
  REQUIRE_NONNEG(rows);
  REQUIRE_NONNEG(cols);
  REQUIRE_NONNEG(inner);
  int64_t count = 0;
  MPT_RETURN_IF(extent_product(__func__, rows, cols, inner, &count));
  NONNULL_CHECK(count, dbias, dy);
  DISPATCH(bias_backward, dbias, dy, rows, cols, inner);
}

mpt_status mpt_op_relu(mpt_stream *stream, float *y, const float *x, int64_t count) {
  NONNULL_CHECK(count, y, x);
  DISPATCH(relu, y, x, count);
}

mpt_status mpt_op_relu_backward(mpt_stream *stream, float *dx, const float *dy, const float *y,
                                int64_t count) {
  NONNULL_CHECK(count, dx, dy, y);
  DISPATCH(relu_backward, dx, dy, y, count);
}

mpt_status mpt_op_im2col(mpt_stream *stream, const mpt_conv_geom *g, const float *x,
                         float *col) {
  MPT_RETURN_IF(geom_check(__func__, g, 0));
  REQUIRE_PTR(x);
  REQUIRE_PTR(col);
  DISPATCH(im2col, g, x, col);
}

mpt_status mpt_op_col2im(mpt_stream *stream, const mpt_conv_geom *g, const float *col,
                         float *dx) {
  MPT_RETURN_IF(geom_check(__func__, g, 0));
  REQUIRE_PTR(col);
  REQUIRE_PTR(dx);
  DISPATCH(col2im, g, col, dx);
}

int mpt_op_conv2d_available(mpt_stream *stream) {
  const mpt__device_backend *b = mpt__backend_of_stream(stream);
  return b && b->conv2d_forward && b->conv2d_backward_data && b->conv2d_backward_weights;
}

/* n and o in [1, 2^31), and every tensor's element count fits int64. */
static mpt_status conv_batch_check(const char *op, const mpt_conv_geom *g, int64_t n,
                                   int64_t o) {
  MPT_RETURN_IF(geom_check(op, g, 0));
  if (n < 1 || n > INT32_MAX || o < 1 || o > INT32_MAX)
    return MPT_FAIL(MPT_EINVAL, "%s: batch %lld and output channels %lld must be in [1, 2^31)",
                    op, (long long)n, (long long)o);
  int64_t count;
  MPT_RETURN_IF(extent_product(op, n, g->channels, g->height * g->width, &count));
  MPT_RETURN_IF(extent_product(op, n, o, g->out_h * g->out_w, &count));
  return extent_product(op, o, g->channels, g->kernel_h * g->kernel_w, &count);
}

mpt_status mpt_op_conv2d_forward(mpt_stream *stream, const mpt_conv_geom *g, int64_t n,
                                 int64_t o, const float *x, const float *w, const float *b,
                                 float *y) {
  MPT_RETURN_IF(conv_batch_check(__func__, g, n, o));
  REQUIRE_PTR(x);
  REQUIRE_PTR(w);
  REQUIRE_PTR(y);
  DISPATCH(conv2d_forward, g, n, o, x, w, b, y);
}

mpt_status mpt_op_conv2d_backward_data(mpt_stream *stream, const mpt_conv_geom *g, int64_t n,
                                       int64_t o, const float *w, const float *dy, float *dx) {
  MPT_RETURN_IF(conv_batch_check(__func__, g, n, o));
  REQUIRE_PTR(w);
  REQUIRE_PTR(dy);
  REQUIRE_PTR(dx);
  DISPATCH(conv2d_backward_data, g, n, o, w, dy, dx);
}

mpt_status mpt_op_conv2d_backward_weights(mpt_stream *stream, const mpt_conv_geom *g, int64_t n,
                                          int64_t o, const float *x, const float *dy, float *dw,
                                          float *db) {
  MPT_RETURN_IF(conv_batch_check(__func__, g, n, o));
  REQUIRE_PTR(x);
  REQUIRE_PTR(dy);
  REQUIRE_PTR(dw);
  DISPATCH(conv2d_backward_weights, g, n, o, x, dy, dw, db);
}

/* Pooling geometry: channels ignored, no padding, a plane's index fits argmax's int32. */
static mpt_status pool_check(const char *op, const mpt_conv_geom *g, int64_t planes) {
  MPT_RETURN_IF(geom_check(op, g, 1));
  if (g->pad != 0)
    return MPT_FAIL(MPT_EINVAL, "%s: pad = %lld, must be 0", op, (long long)g->pad);
  if (g->height > INT32_MAX / g->width)
    return MPT_FAIL(MPT_EINVAL, "%s: a %lldx%lld plane overflows the int32 argmax", op,
                    (long long)g->height, (long long)g->width);
  if (planes < 0)
    return MPT_FAIL(MPT_EINVAL, "%s: planes = %lld is negative", op, (long long)planes);
  return MPT_OK;
}

mpt_status mpt_op_maxpool(mpt_stream *stream, const mpt_conv_geom *g, int64_t planes,
                          const float *x, float *y, int32_t *argmax) {
  MPT_RETURN_IF(pool_check(__func__, g, planes));
  NONNULL_CHECK(planes, x, y, argmax);
  DISPATCH(maxpool, g, planes, x, y, argmax);
}

mpt_status mpt_op_maxpool_backward(mpt_stream *stream, const mpt_conv_geom *g, int64_t planes,
                                   const float *dy, const int32_t *argmax, float *dx) {
  MPT_RETURN_IF(pool_check(__func__, g, planes));
  NONNULL_CHECK(planes, dy, argmax, dx);
  DISPATCH(maxpool_backward, g, planes, dy, argmax, dx);
}

/* Batchnorm shapes: non-negative extents, *count = n * c * inner, eps >= 0. */
static mpt_status norm_check(const char *op, int64_t n, int64_t c, int64_t inner, float eps,
                             int64_t *count) {
  if (n < 0 || c < 0 || inner < 0)
    return MPT_FAIL(MPT_EINVAL, "%s: negative extent (n = %lld, c = %lld, inner = %lld)", op,
                    (long long)n, (long long)c, (long long)inner);
  if (!(eps >= 0)) return MPT_FAIL(MPT_EINVAL, "%s: eps = %g must be >= 0", op, (double)eps);
  return extent_product(op, n, c, inner, count);
}

mpt_status mpt_op_batchnorm_train(mpt_stream *stream, const float *x, int64_t n, int64_t c,
                                  int64_t inner, const float *gamma, const float *beta,
                                  float eps, float momentum, float *running_mean,
                                  float *running_var, float *y, float *save_mean,
                                  float *save_invstd) {
  int64_t count = 0;
  MPT_RETURN_IF(norm_check(__func__, n, c, inner, eps, &count));
  /* As PyTorch: the batch variance needs more than one value per channel. */
  REQUIRE(c == 0 || n * inner != 1, "one value per channel (n = %lld, inner = %lld)",
          (long long)n, (long long)inner);
  NONNULL_CHECK(count, x, gamma, beta, y, save_mean, save_invstd);
  DISPATCH(batchnorm_train, x, n, c, inner, gamma, beta, eps, momentum, running_mean,
           running_var, y, save_mean, save_invstd);
}

mpt_status mpt_op_batchnorm_eval(mpt_stream *stream, const float *x, int64_t n, int64_t c,
                                 int64_t inner, const float *gamma, const float *beta,
                                 float eps, const float *running_mean,
                                 const float *running_var, float *y) {
  int64_t count = 0;
  MPT_RETURN_IF(norm_check(__func__, n, c, inner, eps, &count));
  NONNULL_CHECK(count, x, gamma, beta, running_mean, running_var, y);
  DISPATCH(batchnorm_eval, x, n, c, inner, gamma, beta, eps, running_mean, running_var, y);
}

mpt_status mpt_op_batchnorm_backward(mpt_stream *stream, const float *dy, const float *x,
                                     int64_t n, int64_t c, int64_t inner, const float *gamma,
                                     const float *save_mean, const float *save_invstd,
                                     float *dx, float *dgamma, float *dbeta) {
  int64_t count = 0;
  MPT_RETURN_IF(norm_check(__func__, n, c, inner, 0.0f, &count));
  if (!dx && !dgamma && !dbeta) return MPT_OK; /* no gradient wanted */
  NONNULL_CHECK(count, dy, x, gamma, save_mean, save_invstd);
  DISPATCH(batchnorm_backward, dy, x, n, c, inner, gamma, save_mean, save_invstd, dx, dgamma,
           dbeta);
}

/* Classification shapes: n >= 0 rows of k > 0 classes (k may be 0 only when n is). */
static mpt_status class_check(const char *op, int64_t n, int64_t k) {
  if (n < 0 || k < 0 || (n > 0 && k == 0))
    return MPT_FAIL(MPT_EINVAL, "%s: bad shape n = %lld rows x k = %lld classes", op,
                    (long long)n, (long long)k);
  if (k > INT32_MAX)
    return MPT_FAIL(MPT_EINVAL, "%s: k = %lld classes exceed the int32 labels", op, (long long)k);
  return MPT_OK;
}

mpt_status mpt_op_softmax_xent(mpt_stream *stream, const float *logits, const int32_t *labels,
                               int64_t n, int64_t k, float *probs, float *loss) {
  MPT_RETURN_IF(class_check(__func__, n, k));
  NONNULL_CHECK(n, logits, labels, probs, loss);
  DISPATCH(softmax_xent, logits, labels, n, k, probs, loss);
}

mpt_status mpt_op_softmax_xent_backward(mpt_stream *stream, const float *probs,
                                        const int32_t *labels, int64_t n, int64_t k,
                                        const float *dloss, float *dlogits) {
  MPT_RETURN_IF(class_check(__func__, n, k));
  NONNULL_CHECK(n, probs, labels, dloss, dlogits);
  DISPATCH(softmax_xent_backward, probs, labels, n, k, dloss, dlogits);
}

mpt_status mpt_op_count_correct(mpt_stream *stream, const float *logits, const int32_t *labels,
                                int64_t n, int64_t k, int64_t *correct) {
  MPT_RETURN_IF(class_check(__func__, n, k));
  NONNULL_CHECK(n, logits, labels, correct);
  DISPATCH(count_correct, logits, labels, n, k, correct);
}

mpt_status mpt_op_dropout(mpt_stream *stream, const float *x, float *y, float *mask,
                          int64_t count, float p, uint64_t seed) {
  REQUIRE(p >= 0 && p < 1, "p = %g must be in [0, 1)", (double)p);
  NONNULL_CHECK(count, x, y, mask);
  DISPATCH(dropout, x, y, mask, count, p, seed);
}

mpt_status mpt_op_sgd_step(mpt_stream *stream, float *param, const float *grad,
                           float *momentum_buf, int64_t count, float lr, float momentum,
                           float dampening, float weight_decay, int nesterov, int first) {
  /* The checks torch.optim.SGD makes in its constructor. */
  REQUIRE(lr >= 0, "lr = %g must be >= 0", (double)lr);
  REQUIRE(momentum >= 0, "momentum = %g must be >= 0", (double)momentum);
  REQUIRE(weight_decay >= 0, "weight_decay = %g must be >= 0", (double)weight_decay);
  REQUIRE(!nesterov || (momentum > 0 && dampening == 0),
          "nesterov needs momentum > 0 and dampening 0 (momentum = %g, dampening = %g)",
          (double)momentum, (double)dampening);
  NONNULL_CHECK(count, param, grad);
  REQUIRE(momentum == 0 || momentum_buf, "momentum_buf is NULL with momentum = %g",
          (double)momentum);
  DISPATCH(sgd_step, param, grad, momentum_buf, count, lr, momentum, dampening, weight_decay,
           nesterov, first);
}

mpt_status mpt_op_adamw_step(mpt_stream *stream, float *param, const float *grad, float *m,
                             float *v, int64_t count, float lr, float beta1, float beta2,
                             float eps, float weight_decay, int64_t step) {
  /* The checks torch.optim.AdamW makes, plus step >= 1 for the bias corrections. */
  REQUIRE(lr >= 0, "lr = %g must be >= 0", (double)lr);
  REQUIRE(eps >= 0, "eps = %g must be >= 0", (double)eps);
  REQUIRE(beta1 >= 0 && beta1 < 1, "beta1 = %g must be in [0, 1)", (double)beta1);
  REQUIRE(beta2 >= 0 && beta2 < 1, "beta2 = %g must be in [0, 1)", (double)beta2);
  REQUIRE(weight_decay >= 0, "weight_decay = %g must be >= 0", (double)weight_decay);
  REQUIRE(step >= 1, "step = %lld must be >= 1", (long long)step);
  NONNULL_CHECK(count, param, grad, m, v);
  DISPATCH(adamw_step, param, grad, m, v, count, lr, beta1, beta2, eps, weight_decay, step);
}

mpt_status mpt_op_check_finite(mpt_stream *stream, const float *x, int64_t count,
                               int *nonfinite) {
  REQUIRE_PTR(nonfinite);
  REQUIRE_NONNEG(count);
  *nonfinite = 0; /* a host int: the empty buffer is finite without asking the device */
  NONNULL_CHECK(count, x);
  DISPATCH(check_finite, x, count, nonfinite);
}

/* ---- bf16 compute (include/mpitrain/ops_bf16.h): the same checks as the float32 ops, then the
 * backend's bf16 slots; a backend without them (or without a BF16 CPU) says why. ---- */

const char *mpt_precision_name(mpt_precision p) {
  return p == MPT_PRECISION_FP32 ? "fp32" : p == MPT_PRECISION_BF16 ? "bf16" : "unknown";
}

mpt_status mpt_precision_parse(const char *text, mpt_precision *p) {
  if (!text || !p) return MPT_FAIL(MPT_EINVAL, "precision_parse: NULL argument");
  if (strcmp(text, "fp32") == 0) *p = MPT_PRECISION_FP32;
  else if (strcmp(text, "bf16") == 0) *p = MPT_PRECISION_BF16;
  else return MPT_FAIL(MPT_EINVAL, "precision '%s': want fp32 or bf16", text);
  return MPT_OK;
}

mpt_status mpt_op_bf16_check(mpt_stream *stream) {
  const mpt__device_backend *b = mpt__backend_of_stream(stream);
  if (!b || !b->bf16_check || !b->gemm_bf16)
    return MPT_FAIL(MPT_ENOTSUP, "bf16 compute is not available on the %s backend of this build%s",
                    b ? b->name : "unbuilt",
                    b && strcmp(b->name, "cpu") == 0
                        ? " (the CPU's bf16 GEMMs and convolutions need oneDNN 2.x, which "
                          "configure did not find: apt-get install libdnnl-dev, then "
                          "reconfigure); use --precision fp32"
                        : "");
  return b->bf16_check(stream);
}

mpt_status mpt_op_gemm_bf16(mpt_stream *stream, int trans_a, int trans_b, int64_t m, int64_t n,
                            int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                            int64_t ldb, float beta, float *c, int64_t ldc) {
  REQUIRE_NONNEG(m);
  REQUIRE_NONNEG(n);
  REQUIRE_NONNEG(k);
  MPT_RETURN_IF(mpt_op_bf16_check(stream));
  if (m == 0 || n == 0) return MPT_OK;
  /* k == 0: C = beta * C, nothing to round: the float32 op does it (and checks C, ldc) */
  if (k == 0) return mpt_op_gemm(stream, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta,
                                 c, ldc);
  REQUIRE_PTR(c);
  REQUIRE_PTR(a);
  REQUIRE_PTR(b);
  REQUIRE(ldc >= n, "ldc = %lld < n = %lld", (long long)ldc, (long long)n);
  MPT_RETURN_IF(check_lds(__func__, trans_a, trans_b, m, n, k, lda, ldb));
  DISPATCH(gemm_bf16, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

mpt_status mpt_op_gemm_ex(mpt_stream *stream, mpt_precision precision, int trans_a,
                          int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                          const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                          float *c, int64_t ldc) {
  if (precision == MPT_PRECISION_FP32)
    return mpt_op_gemm(stream, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (precision == MPT_PRECISION_BF16)
    return mpt_op_gemm_bf16(stream, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                            ldc);
  return MPT_FAIL(MPT_EINVAL, "%s: precision %d is neither fp32 nor bf16", __func__,
                  (int)precision);
}

int mpt_op_bf16_rounded_available(mpt_stream *stream) {
  const mpt__device_backend *b = mpt__backend_of_stream(stream);
  return b && b->bf16_round && b->gemm_bf16_batched && b->heads_split_bf16 && b->heads_merge &&
         mpt_op_bf16_check(stream) == MPT_OK;
}

static mpt_status heads_check(const char *op, int64_t nb, int64_t nt, int64_t parts, int64_t nh,
                              int64_t hs, const void *x, const void *y) {
  if (nb < 0 || nt < 0 || parts < 0 || nh < 0 || hs < 0)
    return MPT_FAIL(MPT_EINVAL, "%s: negative extent (B %lld, T %lld, parts %lld, H %lld, hs "
                    "%lld)", op, (long long)nb, (long long)nt, (long long)parts, (long long)nh,
                    (long long)hs);
  int64_t count = 0;
  MPT_RETURN_IF(extent_product(op, nb, nt, parts, &count));
  MPT_RETURN_IF(extent_product(op, count, nh, hs, &count));
  if (count > 0 && (!x || !y)) return MPT_FAIL(MPT_EINVAL, "%s: NULL x or y", op);
  return MPT_OK;
}

mpt_status mpt_op_heads_split_bf16(mpt_stream *stream, const float *x, int64_t nb, int64_t nt,
                                   int64_t parts, int64_t nh, int64_t hs, uint16_t *y) {
  MPT_RETURN_IF(heads_check(__func__, nb, nt, parts, nh, hs, x, y));
  MPT_RETURN_IF(mpt_op_bf16_check(stream));
  DISPATCH(heads_split_bf16, x, nb, nt, parts, nh, hs, y);
}

mpt_status mpt_op_heads_merge(mpt_stream *stream, const float *x, int64_t nb, int64_t nt,
                              int64_t parts, int64_t nh, int64_t hs, float beta, float *y) {
  MPT_RETURN_IF(heads_check(__func__, nb, nt, parts, nh, hs, x, y));
  DISPATCH(heads_merge, x, nb, nt, parts, nh, hs, beta, y);
}

mpt_status mpt_op_bf16_round(mpt_stream *stream, const float *x, uint16_t *y, int64_t count) {
  REQUIRE_NONNEG(count);
  MPT_RETURN_IF(mpt_op_bf16_check(stream));
  if (count == 0) return MPT_OK;
  REQUIRE_PTR(x);
  REQUIRE_PTR(y);
  DISPATCH(bf16_round, x, y, count);
}

mpt_status mpt_op_gemm_bf16_batched(mpt_stream *stream, int trans_a, int trans_b, int64_t batch,
                                    int64_t m, int64_t n, int64_t k, float alpha,
                                    const uint16_t *a, int64_t lda, int64_t stride_a,
                                    const uint16_t *b, int64_t ldb, int64_t stride_b, float beta,
                                    float *c, int64_t ldc, int64_t stride_c) {
  REQUIRE_NONNEG(batch);
  REQUIRE_NONNEG(m);
  REQUIRE_NONNEG(n);
  REQUIRE_NONNEG(k);
  REQUIRE_NONNEG(stride_a);
  REQUIRE_NONNEG(stride_b);
  REQUIRE_NONNEG(stride_c);
  MPT_RETURN_IF(mpt_op_bf16_check(stream));
  if (batch == 0 || m == 0 || n == 0) return MPT_OK;
  REQUIRE_PTR(c);
  REQUIRE(ldc >= n, "ldc = %lld < n = %lld", (long long)ldc, (long long)n);
  if (k == 0) { /* C[i] = beta C[i]: nothing to round, the float32 op does it */
    for (int64_t i = 0; i < batch; i++)
      MPT_RETURN_IF(mpt_op_gemm(stream, trans_a, trans_b, m, n, 0, alpha, NULL, 1, NULL, 1, beta,
                                c + i * stride_c, ldc));
    return MPT_OK;
  }
  REQUIRE_PTR(a);
  REQUIRE_PTR(b);
  MPT_RETURN_IF(check_lds(__func__, trans_a, trans_b, m, n, k, lda, ldb));
  DISPATCH(gemm_bf16_batched, trans_a, trans_b, batch, m, n, k, alpha, a, lda, stride_a, b, ldb,
           stride_b, beta, c, ldc, stride_c);
}

int mpt_op_conv2d_bf16_available(mpt_stream *stream) {
  const mpt__device_backend *b = mpt__backend_of_stream(stream);
  return b && b->conv2d_forward_bf16 && b->conv2d_backward_data_bf16 &&
         b->conv2d_backward_weights_bf16;
}

mpt_status mpt_op_conv2d_forward_bf16(mpt_stream *stream, const mpt_conv_geom *g, int64_t n,
                                      int64_t o, const float *x, const float *w, const float *b,
                                      float *y) {
  MPT_RETURN_IF(conv_batch_check(__func__, g, n, o));
  REQUIRE_PTR(x);
  REQUIRE_PTR(w);
  REQUIRE_PTR(y);
  MPT_RETURN_IF(mpt_op_bf16_check(stream));
  DISPATCH(conv2d_forward_bf16, g, n, o, x, w, b, y);
}

mpt_status mpt_op_conv2d_backward_data_bf16(mpt_stream *stream, const mpt_conv_geom *g,
                                            int64_t n, int64_t o, const float *w,
                                            const float *dy, float *dx) {
  MPT_RETURN_IF(conv_batch_check(__func__, g, n, o));
  REQUIRE_PTR(w);
  REQUIRE_PTR(dy);
  REQUIRE_PTR(dx);
  MPT_RETURN_IF(mpt_op_bf16_check(stream));
  DISPATCH(conv2d_backward_data_bf16, g, n, o, w, dy, dx);
}

mpt_status mpt_op_conv2d_backward_weights_bf16(mpt_stream *stream, const mpt_conv_geom *g,
                                               int64_t n, int64_t o, const float *x,
                                               const float *dy, float *dw, float *db) {
  MPT_RETURN_IF(conv_batch_check(__func__, g, n, o));
  REQUIRE_PTR(x);
  REQUIRE_PTR(dy);
  REQUIRE_PTR(dw);
  MPT_RETURN_IF(mpt_op_bf16_check(stream));
  DISPATCH(conv2d_backward_weights_bf16, g, n, o, x, dy, dw, db);
}
