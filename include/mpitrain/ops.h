/* mpitrain core ops: the numerical kernels the layers and optimizers need, dispatched through
 * the device backend table of the stream they are given (a NULL stream means the CPU, now).
 *
 * Conventions:
 * - All arrays are float32, row-major, contiguous, on the stream's device. Counts are elements.
 * - Forward ops overwrite their outputs. Backward ops ACCUMULATE into their gradient outputs
 *   (dx += ...), so a tensor used twice in a forward pass gets the sum of both contributions.
 * - Every wrapper checks its arguments (MPT_EINVAL on a NULL pointer with a non-zero count, a
 *   negative extent, or extents whose product overflows int64) and returns MPT_OK at once when
 *   there is nothing to do.
 * - Errors common to every op: MPT_EINVAL as above; MPT_ENOTSUP when the stream's backend lacks
 *   the op (or was not built); CUDA: MPT_EDEVICE (MPT_ENOMEM for an allocation) when a launch
 *   or library call fails, and a stream that already failed returns its sticky error. A fault
 *   inside a CUDA kernel shows at the next synchronize. Ops that write a host value
 *   (count_correct, check_finite) wait for the stream (deadline 10 minutes, MPT_ETIMEOUT).
 * - On the CPU the work runs on the calling thread before the call returns. On CUDA it is
 *   enqueued on the stream. Ops are reentrant: several threads may issue ops on their own
 *   streams at once.
 * - Edge cases: sum with count 0 writes 0; check_finite with count 0 reports 0; gemm with k = 0
 *   sets C = beta * C (A and B may then be NULL; beta = 0 overwrites NaN); relu and maxpool
 *   pass NaN through (as PyTorch); batchnorm_train refuses one value per channel (n*inner == 1);
 *   count_correct rejects labels outside [0, k); sgd/adamw reject what PyTorch rejects (negative
 *   lr, momentum or weight decay; nesterov without momentum > 0 and dampening 0; betas outside
 *   [0, 1); step < 1); maxpool_backward rejects an argmax outside the plane.
 * - Batch layouts: images are NCHW; "rows x cols x inner" means a tensor viewed as
 *   [rows, cols, inner] where cols is the channel (feature) dimension. */
#ifndef MPITRAIN_OPS_H
#define MPITRAIN_OPS_H

#include "mpitrain/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Copies nbytes bytes between two buffers, each on its own device (CPU <-> CPU is memcpy;
 * CUDA: cudaMemcpyAsync on the stream with cudaMemcpyDefault; the host side may be pageable).
 * The ranges must not overlap. nbytes 0 is a no-op. */
MPT_API mpt_status mpt_op_memcpy(mpt_stream *stream, mpt_device dst_device, void *dst,
                                 mpt_device src_device, const void *src, size_t nbytes);

/* C (M x N) = alpha * op(A) * op(B) + beta * C; op(A) is M x K, op(B) is K x N.
 * trans_a != 0 means A is stored K x M (lda >= M), else M x K (lda >= K); same for B.
 * CPU, row-major: oneDNN's sgemm when the library was built with oneDNN (faster than OpenBLAS on
 * these machines; results equal OpenBLAS's to fp32 rounding, not bit for bit), OpenBLAS's
 * cblas_sgemm without it and for dot products (M = N = 1). CUDA: cublasSgemm. Errors also:
 * MPT_EINVAL (lda / ldb below the minimum above, ldc < N), MPT_ENOTSUP (CUDA: extents beyond
 * cuBLAS's int). */
MPT_API mpt_status mpt_op_gemm(mpt_stream *stream, int trans_a, int trans_b, int64_t m,
                               int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                               const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/* GEMM accounting, for profiles: while counting is on, every mpt_op_gemm on the CPU adds its
 * wall time (mpt_time_ms) and its 2 m n k FLOPs to process-wide totals. Any thread may call
 * (atomic totals; calls running at once on several threads each add their own time). Not
 * counted: GEMMs on CUDA streams (asynchronous: host time would be the launch), and products
 * the fused ops make inside (mpt_op_causal_attention's). mpt_op_gemm_counting(1) zeroes the
 * totals and starts counting, (0) stops; mpt_op_gemm_counted reads them (any pointer may be
 * NULL). Cost while on: two clock reads per call. */
MPT_API void mpt_op_gemm_counting(int on);
/* Reads the totals: calls, wall time in ms, FLOPs. */
MPT_API void mpt_op_gemm_counted(int64_t *calls, double *ms, double *flop);

/* x[i] = value. */
MPT_API mpt_status mpt_op_fill(mpt_stream *stream, float *x, int64_t count, float value);
/* dst[i] = src[i] (same device; the ranges must not overlap). */
MPT_API mpt_status mpt_op_copy(mpt_stream *stream, float *dst, const float *src, int64_t count);
/* y[i] += alpha * x[i]. */
MPT_API mpt_status mpt_op_axpy(mpt_stream *stream, int64_t count, float alpha, const float *x,
                               float *y);
/* x[i] *= alpha. */
MPT_API mpt_status mpt_op_scale(mpt_stream *stream, float *x, int64_t count, float alpha);
/* y[i] = a[i] * b[i]. */
MPT_API mpt_status mpt_op_mul(mpt_stream *stream, float *y, const float *a, const float *b,
                              int64_t count);
/* da[i] += dy[i] * b[i]  (backward of mul with respect to a). */
MPT_API mpt_status mpt_op_mul_backward(mpt_stream *stream, float *da, const float *dy,
                                       const float *b, int64_t count);
/* *out = sum_i x[i] (one float on the stream's device, not synchronized; accumulated in double
 * on the CPU). */
MPT_API mpt_status mpt_op_sum(mpt_stream *stream, const float *x, int64_t count, float *out);
/* dx[i] += scale * (*dy)  (backward of sum with a scalar upstream gradient on the device). */
MPT_API mpt_status mpt_op_sum_backward(mpt_stream *stream, float *dx, int64_t count,
                                       const float *dy, float scale);

/* y viewed as [rows, cols, inner]: y[r, c, i] += bias[c]. Linear: inner = 1; conv: inner = H*W. */
MPT_API mpt_status mpt_op_bias_add(mpt_stream *stream, float *y, const float *bias, int64_t rows,
                                   int64_t cols, int64_t inner);
/* dbias[c] += sum over r, i of dy[r, c, i]. */
MPT_API mpt_status mpt_op_bias_backward(mpt_stream *stream, float *dbias, const float *dy,
                                        int64_t rows, int64_t cols, int64_t inner);

/* y[i] = max(x[i], 0). y may equal x. */
MPT_API mpt_status mpt_op_relu(mpt_stream *stream, float *y, const float *x, int64_t count);
/* dx[i] += y[i] > 0 ? dy[i] : 0, where y is the forward output. */
MPT_API mpt_status mpt_op_relu_backward(mpt_stream *stream, float *dx, const float *dy,
                                        const float *y, int64_t count);

/* Geometry of a 2-D convolution or pooling window over one image. out_h = (h + 2*pad - kh) /
 * stride + 1, likewise out_w. */
typedef struct mpt_conv_geom {
  int64_t channels, height, width; /* input C, H, W */
  int64_t kernel_h, kernel_w;
  int64_t stride, pad;
  int64_t out_h, out_w;
} mpt_conv_geom;

/* Fills out_h/out_w from the other fields. Errors: MPT_EINVAL when the window does not fit or
 * a field is not positive (pad >= 0), or an extent is 2^31 or more; NULL g. */
MPT_API mpt_status mpt_conv_geom_resolve(mpt_conv_geom *g);

/* One image x [C, H, W] -> col [C*kh*kw, out_h*out_w]; row (c, i, j) holds x[c, oy*stride - pad
 * + i, ox*stride - pad + j] (0 outside the image), the layout of Caffe's im2col (Jia et al.,
 * 2014), so that conv forward is W [O, C*kh*kw] x col. */
MPT_API mpt_status mpt_op_im2col(mpt_stream *stream, const mpt_conv_geom *g, const float *x,
                                 float *col);
/* The adjoint of im2col: dx [C, H, W] += scatter of col (overlapping windows add up). g must
 * be resolved. */
MPT_API mpt_status mpt_op_col2im(mpt_stream *stream, const mpt_conv_geom *g, const float *col,
                                 float *dx);

/* Whole-batch convolution through the backend's convolution library: on the CPU oneDNN 2.x
 * (Intel's oneAPI Deep Neural Network Library, the one PyTorch uses on CPUs; JIT kernels for the
 * CPU's vector width, blocked layouts, the reorders to and from them done here), when mpitrain
 * was built with it; no other backend has them yet. Shapes: x [n, C, H, W], w [o, C, kh, kw],
 * b [o], y and dy [n, o, out_h, out_w] (row-major, the layout of every mpitrain tensor); g must
 * be resolved (mpt_conv_geom_resolve), as for im2col.
 *   forward:          y = conv(x, w) + b (b may be NULL); y is overwritten.
 *   backward_data:    dx [n, C, H, W] += the gradient of the input.
 *   backward_weights: dw [o, C, kh, kw] += the weight gradient summed over the batch, and
 *                     db [o] += dy summed over n and positions (db may be NULL).
 * Results equal im2col + GEMM up to float rounding (a different summation order). Threads: the
 * calling thread's OpenMP thread count is set to openblas_get_num_threads() at each call, so the
 * convolutions use as many threads as the GEMMs (oneDNN fixes a primitive's thread count when
 * it is created: the count is part of the cache key). The primitives, their layouts and their work
 * buffers are cached per calling thread and per shape (created on first use, a few ms; reused
 * after), so concurrent calls from several threads (DataParallel replicas) are safe. Errors:
 * MPT_EINVAL (geometry, NULL, n or o < 1), MPT_ENOTSUP (no library convolution on this backend),
 * MPT_ENOMEM, MPT_EDEVICE (a oneDNN call failed: the message names it and its status).
 * mpt_op_conv2d_available: 1 when the stream's backend has these convolutions, else 0. */
MPT_API int mpt_op_conv2d_available(mpt_stream *stream);
MPT_API mpt_status mpt_op_conv2d_forward(mpt_stream *stream, const mpt_conv_geom *g, int64_t n,
                                         int64_t o, const float *x, const float *w,
                                         const float *b, float *y);
MPT_API mpt_status mpt_op_conv2d_backward_data(mpt_stream *stream, const mpt_conv_geom *g,
                                               int64_t n, int64_t o, const float *w,
                                               const float *dy, float *dx);
MPT_API mpt_status mpt_op_conv2d_backward_weights(mpt_stream *stream, const mpt_conv_geom *g,
                                                  int64_t n, int64_t o, const float *x,
                                                  const float *dy, float *dw, float *db);

/* Max pooling (as PyTorch's MaxPool2d without padding or dilation) over planes = N*C images of
 * [H, W] (g->channels is ignored; pad must be 0):
 * y [planes, out_h, out_w], argmax [planes, out_h, out_w] = index within the plane (h*W + w) of
 * the first maximum (NaN wins, as in PyTorch). Errors also: MPT_EINVAL (pad != 0, planes < 0,
 * a plane too large for the int32 argmax). */
MPT_API mpt_status mpt_op_maxpool(mpt_stream *stream, const mpt_conv_geom *g, int64_t planes,
                                  const float *x, float *y, int32_t *argmax);
/* dx[plane, argmax] += dy[plane, o]. Errors also: MPT_EINVAL (an argmax outside the plane). */
MPT_API mpt_status mpt_op_maxpool_backward(mpt_stream *stream, const mpt_conv_geom *g,
                                           int64_t planes, const float *dy, const int32_t *argmax,
                                           float *dx);

/* Batch normalisation (Ioffe & Szegedy, 2015) over x viewed as [n, c, inner]; statistics per
 * channel c over n*inner values. Training: mean and biased variance of the batch normalise x;
 * save_mean[c] and save_invstd[c] = 1/sqrt(var + eps) are kept for backward; running statistics
 * are updated as PyTorch does: running = (1 - momentum) * running + momentum * batch, with the
 * unbiased variance (n*inner/(n*inner-1)) for running_var. running_* may be NULL. gamma, beta,
 * running_*, save_* are [c]; x, y [n, c, inner]. Errors also: MPT_EINVAL (eps < 0,
 * n*inner == 1). */
MPT_API mpt_status mpt_op_batchnorm_train(mpt_stream *stream, const float *x, int64_t n,
                                          int64_t c, int64_t inner, const float *gamma,
                                          const float *beta, float eps, float momentum,
                                          float *running_mean, float *running_var, float *y,
                                          float *save_mean, float *save_invstd);
/* Evaluation: y = gamma * (x - running_mean) / sqrt(running_var + eps) + beta (all [c]). */
MPT_API mpt_status mpt_op_batchnorm_eval(mpt_stream *stream, const float *x, int64_t n,
                                         int64_t c, int64_t inner, const float *gamma,
                                         const float *beta, float eps, const float *running_mean,
                                         const float *running_var, float *y);
/* Backward of the training forward: dx += ..., dgamma += sum(dy * xhat), dbeta += sum(dy).
 * dx, dgamma, dbeta may each be NULL (not needed). The formula of Ioffe & Szegedy (2015), in
 * the per-channel closed form PyTorch uses. */
MPT_API mpt_status mpt_op_batchnorm_backward(mpt_stream *stream, const float *dy, const float *x,
                                             int64_t n, int64_t c, int64_t inner,
                                             const float *gamma, const float *save_mean,
                                             const float *save_invstd, float *dx, float *dgamma,
                                             float *dbeta);

/* Softmax cross-entropy (as PyTorch's cross_entropy, mean reduction) over logits [n, k] with
 * integer labels [n] in [0, k):
 * probs[n, k] = softmax(logits) (max-subtracted), *loss = mean_i -log probs[i, label_i] (one
 * float on the device). Errors: MPT_EINVAL (n or k < 1, k beyond int32; CPU: a label outside
 * [0, k)). CUDA does not synchronize to check labels: a bad label gives a NaN loss. */
MPT_API mpt_status mpt_op_softmax_xent(mpt_stream *stream, const float *logits,
                                       const int32_t *labels, int64_t n, int64_t k, float *probs,
                                       float *loss);
/* dlogits[i, j] += (*dloss) * (probs[i, j] - [j == label_i]) / n. */
MPT_API mpt_status mpt_op_softmax_xent_backward(mpt_stream *stream, const float *probs,
                                                const int32_t *labels, int64_t n, int64_t k,
                                                const float *dloss, float *dlogits);
/* *correct += number of rows whose argmax (first maximum) equals the label; host int64, so on
 * CUDA it waits for the stream. Errors also: MPT_EINVAL (a label outside [0, k), naming the
 * row). */
MPT_API mpt_status mpt_op_count_correct(mpt_stream *stream, const float *logits,
                                        const int32_t *labels, int64_t n, int64_t k,
                                        int64_t *correct);

/* Inverted dropout (Srivastava et al., 2014; scaled at training time as PyTorch):
 * mask[i] = (u(seed, i) >= p) / (1 - p), y = x * mask, where u is a counter-based uniform in
 * [0,1) (splitmix64 of seed and i), so CPU and CUDA draw the same mask.
 * 0 <= p < 1 (else MPT_EINVAL). mask has count floats. */
MPT_API mpt_status mpt_op_dropout(mpt_stream *stream, const float *x, float *y, float *mask,
                                  int64_t count, float p, uint64_t seed);

/* SGD step over a flat buffer, PyTorch's torch.optim.SGD semantics:
 *   g = grad + weight_decay * param
 *   buf = first ? g : momentum * buf + (1 - dampening) * g      (when momentum != 0)
 *   g = nesterov ? g + momentum * buf : buf
 *   param -= lr * g
 * All buffers hold count floats; momentum_buf may be NULL when momentum is 0. Errors also:
 * MPT_EINVAL for the arguments PyTorch rejects (see Conventions). */
MPT_API mpt_status mpt_op_sgd_step(mpt_stream *stream, float *param, const float *grad,
                                   float *momentum_buf, int64_t count, float lr, float momentum,
                                   float dampening, float weight_decay, int nesterov, int first);
/* AdamW step (Loshchilov & Hutter, 2019), PyTorch's torch.optim.AdamW semantics, step >= 1:
 *   param *= 1 - lr * weight_decay
 *   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
 *   param -= lr * (m / (1 - beta1^step)) / (sqrt(v / (1 - beta2^step)) + eps)
 * All buffers hold count floats. Errors also: MPT_EINVAL for the arguments PyTorch rejects. */
MPT_API mpt_status mpt_op_adamw_step(mpt_stream *stream, float *param, const float *grad,
                                     float *m, float *v, int64_t count, float lr, float beta1,
                                     float beta2, float eps, float weight_decay, int64_t step);
/* *nonfinite (host int) = 1 if any x[i] is NaN or infinite, else 0 (on CUDA it waits for the
 * stream). */
MPT_API mpt_status mpt_op_check_finite(mpt_stream *stream, const float *x, int64_t count,
                                       int *nonfinite);

/* ---- CPU threads ----
 * How many threads the CPU ops of this process use: OpenBLAS's GEMMs, oneDNN's GEMMs and the
 * library convolutions (oneDNN), which follow OpenBLAS's count at each call, and the other large
 * CPU ops (fill, copy, axpy, scale, bias, AdamW, the transformer ops of ops_gpt.h), which split
 * their work over a pool of the library's own threads (src/core/cpu/pool.h). Process-wide. With
 * several ranks (or DataParallel devices) on one host, give each its share of the cores, or they
 * fight over them: mpt_cpu_set_threads(mpt_cpu_threads_per_rank(mpt_comm_local_size(comm), 1)).
 * Without a call: OpenBLAS's default (OPENBLAS_NUM_THREADS, else all cores).
 *
 * Reproducibility, as in PyTorch: the same inputs, machine and count give the same bits, run
 * after run. Across counts, the library's own ops give the same bits by construction (their
 * work splits and sums do not depend on the count), the GEMMs and convolutions do not: a
 * library may sum in another order at another count (oneDNN's AVX2 sgemm gives other bits at
 * 2 threads than at 1 for 64 x 64 outputs of 65536 terms each), so their results, and a run's,
 * may differ in the last bits from one count to another (each within fp32 rounding of the
 * exact result).
 * MPT_GEMM_THREADS=K in the environment (a testing and debugging switch, read by each call)
 * caps the libraries' count at K while the library's own ops use n: with K = 1 every result is
 * the same at every n (tests/test_train_gpt_threads.sh checks this of a whole run).
 * Signals: every thread the library starts (these pools, the OpenMP team of oneDNN, streams,
 * loaders, DataParallel replicas) blocks the asynchronous signals, so a signal sent to the
 * process (SIGTERM, SIGINT, SIGUSR1, a profiler's) is handled on one of the program's own
 * threads; and the oneDNN calls run with them blocked on the calling thread too (a handler run
 * inside oneDNN's fp32 GEMM kernels corrupts the heap: src/core/threads.h), so such a signal
 * waits for the end of the GEMM. The synchronous ones (SIGSEGV, SIGBUS, SIGFPE...) are never
 * blocked.
 * Errors: MPT_EINVAL (n < 1; MPT_GEMM_THREADS set to something other than an integer >= 1). */
MPT_API mpt_status mpt_cpu_set_threads(int n);
/* The count of the library's own ops: n of the last mpt_cpu_set_threads, else OpenBLAS's. */
MPT_API int mpt_cpu_threads(void);
/* The count of the GEMM and convolution libraries (openblas_get_num_threads): the count above,
 * capped by MPT_GEMM_THREADS when it was set at the last mpt_cpu_set_threads. */
MPT_API int mpt_cpu_gemm_threads(void);
/* The online cores of this host (sysconf) divided by local_ranks x devices (each taken as at
 * least 1), at least 1. */
MPT_API int mpt_cpu_threads_per_rank(int local_ranks, int devices);
/* The BLAS kernel in use ("Haswell", "SkylakeX"...): OpenBLAS's core name, a static string. */
MPT_API const char *mpt_cpu_blas_name(void);

/* ---- CPU GEMM library ----
 * Which library computes an fp32 CPU product of mpt_op_gemm (and the attention's block
 * products), process-wide. MPT_CPU_GEMM_AUTO (the default) decides per product from the shape
 * and oneDNN's instruction set, by a fixed rule measured with mpt_gemm_bench (bench/README.md
 * "mpt_gemm_bench"; bench/results/gemm_mlp.txt, gemm_mlp_avx2.txt): oneDNN's sgemm when oneDNN
 * runs AVX-512 kernels; with AVX2 kernels (an AVX2-only CPU, or MPT_CPU_ISA=avx2) OpenBLAS below
 * 2^27 multiply-adds (the mlp's 64 x 512 x 784 products, where OpenBLAS is faster) and oneDNN
 * from there (gpt-mini's Linears, where oneDNN is level or ahead). A matrix-vector product (m or
 * n = 1) always goes to OpenBLAS. The rule depends on nothing measured at run time, so a run's
 * bits stay the same run after run. Without oneDNN in the build every product goes to OpenBLAS,
 * and asking for MPT_CPU_GEMM_ONEDNN fails. The libraries sum in different orders: results agree
 * to fp32 rounding, not bit for bit.
 *
 * MPT_CPU_GEMM_TUNE (opt-in, like torch.backends.cudnn.benchmark) answers per shape from a table
 * timed on this machine (mpt_cpu_gemm_table_set; the trainer fills it, trainer.h "GEMM tuning"),
 * and by the rule above for a shape the table lacks. It is not the default because a timed
 * choice depends on the load of the moment: two runs may choose differently and then differ in
 * the last bits, where AUTO gives the same bits run after run. */
typedef enum {
  MPT_CPU_GEMM_AUTO = 0,     /* the rule above */
  MPT_CPU_GEMM_OPENBLAS = 1, /* every product on OpenBLAS's cblas_sgemm */
  MPT_CPU_GEMM_ONEDNN = 2,   /* every product with m, n > 1 on oneDNN's dnnl_sgemm */
  MPT_CPU_GEMM_TUNE = 3,     /* the per-shape table, the rule above outside it */
} mpt_cpu_gemm;

/* Sets the GEMM library of this process. Call while no CPU op runs (a product already running
 * finishes where it started). Any thread. Errors: MPT_EINVAL (not an mpt_cpu_gemm),
 * MPT_ENOTSUP (MPT_CPU_GEMM_ONEDNN in a build without oneDNN). */
MPT_API mpt_status mpt_cpu_set_gemm(mpt_cpu_gemm gemm);
/* The setting of mpt_cpu_set_gemm (MPT_CPU_GEMM_AUTO before any call). */
MPT_API mpt_cpu_gemm mpt_cpu_gemm_setting(void);
/* The library that computes an m x n x k product now: MPT_CPU_GEMM_OPENBLAS or
 * MPT_CPU_GEMM_ONEDNN, never AUTO or TUNE (the rule applied; under TUNE the table's entry for
 * m x n x k when it has one). Calls mpt_cpu_isa_init (oneDNN's cap). */
MPT_API mpt_cpu_gemm mpt_cpu_gemm_for(int64_t m, int64_t n, int64_t k);
/* "auto", "openblas", "onednn", "tune" (the --gemm spellings); "unknown" outside the enum. */
MPT_API const char *mpt_cpu_gemm_name(mpt_cpu_gemm gemm);

/* ---- CPU GEMM tuning (MPT_CPU_GEMM_TUNE) ----
 * One product shape and its library: m x n x k (C is m x n, k the summed extent, as
 * mpt_op_gemm), the transposes the step used it with (bit 2 trans_a + trans_b set for each),
 * the library, and the median milliseconds of each library on it (0 when not timed). The sum
 * of the times over the transposes seen is what is compared. */
typedef struct mpt_cpu_gemm_tuned {
  int64_t m, n, k;
  unsigned trans;     /* bits 0-3: (N,N), (N,T), (T,N), (T,T) seen */
  mpt_cpu_gemm gemm;  /* MPT_CPU_GEMM_OPENBLAS or MPT_CPU_GEMM_ONEDNN */
  double openblas_ms; /* median of the timed calls, summed over the transposes; 0: not timed */
  double onednn_ms;
} mpt_cpu_gemm_tuned;
/* The most shapes a table, a recording or a cache file holds. */
#define MPT_CPU_GEMM_TABLE_MAX 512

/* Starts (on != 0: the list is emptied first) or stops noting the shape and transposes of every
 * fp32 CPU product mpt_op_gemm and the attention's block products compute (m, n > 1, k > 0),
 * whatever the setting. Any thread; the noting takes a mutex, so leave it off in the steps that
 * are timed. Shapes beyond MPT_CPU_GEMM_TABLE_MAX are dropped. */
MPT_API void mpt_cpu_gemm_record(int on);
/* Copies up to cap noted shapes (in first-use order) to shapes (NULL: none), each with gemm set
 * to the fixed rule's answer and no times; returns how many were noted. */
MPT_API int mpt_cpu_gemm_recorded(mpt_cpu_gemm_tuned *shapes, int cap);
/* Times OpenBLAS and oneDNN on each of the count shapes (m, n, k, trans read; at least the
 * (N,N) case when trans is 0), with the GEMM thread count in use, and writes each shape's
 * openblas_ms, onednn_ms (the median of `reps` alternating calls per library and transpose,
 * after one untimed call of each) and gemm: the fixed rule's library, unless the other is at
 * least 5 % faster (near ties flip with the load from run to run). Shapes are timed
 * smallest first; once budget_ms of wall time is spent, or a shape's untimed calls show it
 * would overrun, the rest keep the fixed rule's answer and times of 0. Without oneDNN in the
 * build every shape gets OpenBLAS, untimed. Call while no other CPU op runs in the process.
 * Errors: MPT_EINVAL (count outside 0..MPT_CPU_GEMM_TABLE_MAX, shapes NULL, reps < 1, a size
 * < 1 or above INT_MAX), MPT_ENOMEM, a library's error. */
MPT_API mpt_status mpt_cpu_gemm_time_shapes(mpt_cpu_gemm_tuned *shapes, int count, int reps,
                                            double budget_ms);
/* Installs the table MPT_CPU_GEMM_TUNE answers from (copied; count 0 empties it). Call while no
 * CPU op runs. Errors: MPT_EINVAL (count outside 0..MPT_CPU_GEMM_TABLE_MAX, entries NULL with
 * count > 0, a size < 1, a library other than openblas or onednn, one shape twice),
 * MPT_ENOTSUP (onednn in a build without oneDNN); the table is unchanged then. */
MPT_API mpt_status mpt_cpu_gemm_table_set(const mpt_cpu_gemm_tuned *entries, int count);
/* Copies up to cap entries of the installed table to entries (NULL: none); returns its size. */
MPT_API int mpt_cpu_gemm_table(mpt_cpu_gemm_tuned *entries, int cap);

/* The tuning cache: a text file per host that keeps a table between runs,
 *
 *   mpitrain-gemm-cache 1
 *   host node17                        (the key: the lines up to "shapes")
 *   cpu AMD EPYC 7B12
 *   isa avx2 onednn-isa avx2 blas Haswell
 *   versions openblas 0.3.21 onednn 2.6.3
 *   threads 1
 *   shapes 2
 *   64 512 784 1 openblas 0.4100 0.5230     (m n k trans library openblas_ms onednn_ms)
 *   512 784 64 4 onednn 0.3900 0.3700
 *   end
 *
 * The key says what the times hold for: the host name, the CPU's model string
 * (/proc/cpuinfo), the instruction sets in use (the library's kernels, oneDNN's cap, OpenBLAS's
 * kernel), the two libraries' versions and the GEMM thread count. */

/* Writes this process's key (the lines above between the first and "shapes", each ending in a
 * newline) to buf. Calls mpt_cpu_isa_init. Errors: MPT_EINVAL (buf NULL, or nbytes too small). */
MPT_API mpt_status mpt_cpu_gemm_cache_key(char *buf, size_t nbytes);
/* The default cache file of this key: $MPT_GEMM_CACHE when set and not empty, else
 * $XDG_CACHE_HOME/mpitrain/gemm-HOST-HASH.txt (XDG_CACHE_HOME unset or empty: ~/.cache, from
 * $HOME), HASH 16 hex digits of FNV-1a over the key: one file per key, so hosts that share a
 * home folder, or one host at two thread counts, keep their own. Errors: MPT_EINVAL (NULL, or
 * nbytes too small), MPT_ENOENT (neither XDG_CACHE_HOME nor HOME is set). */
MPT_API mpt_status mpt_cpu_gemm_cache_path(const char *key, char *buf, size_t nbytes);
/* Writes count entries under key to path, atomically (a temporary file renamed over it; the
 * folders above it are created). Errors: MPT_EINVAL (NULL path or key, count outside
 * 0..MPT_CPU_GEMM_TABLE_MAX, a bad entry as mpt_cpu_gemm_table_set), MPT_EIO naming the path. */
MPT_API mpt_status mpt_cpu_gemm_cache_write(const char *path, const char *key,
                                            const mpt_cpu_gemm_tuned *entries, int count);
/* Reads path into entries (up to cap) and *count, checked whole before anything is trusted:
 * MPT_ENOENT (no such file), MPT_EIO (unreadable), MPT_EFORMAT (not this format, a malformed or
 * duplicate line, sizes < 1 or above INT_MAX, a library name other than openblas or onednn,
 * negative or non-finite times, more entries than cap or MPT_CPU_GEMM_TABLE_MAX, the count
 * line disagreeing, no end line: a cut file), MPT_EMISMATCH (a well-formed file of another key:
 * the message names the first line that differs). *count is 0 on error. */
MPT_API mpt_status mpt_cpu_gemm_cache_read(const char *path, const char *key,
                                           mpt_cpu_gemm_tuned *entries, int cap, int *count);

/* ---- CPU instruction sets ----
 * The library's own CPU kernels (the transformer ops of ops_gpt.h, the fused attention, the
 * bf16 conversions, AdamW, mpt_cpu_sum_squares) are compiled three times, for AVX-512F, AVX2
 * and the x86-64 baseline (SSE2), and one of them runs, chosen once per process: the best the
 * CPU has, or the one the environment variable MPT_CPU_ISA names (avx512, avx2 or baseline),
 * so that a machine with AVX-512 also runs (and tests) the paths of older CPUs. These kernels
 * give the same bits on every path (tests/test_backend_ops.c compares them); oneDNN's kernels
 * differ by rounding from one ISA to another. MPT_CPU_ISA also caps oneDNN
 * (dnnl_set_max_cpu_isa: avx2 -> AVX2, baseline -> SSE4.1, oneDNN's lowest; avx512 leaves it
 * uncapped, AVX-512 BF16 and AMX included), applied before oneDNN's first use by the library.
 * It does not cap OpenBLAS, which picks its kernels when it is loaded: set OPENBLAS_CORETYPE
 * (Haswell for AVX2, Prescott for the baseline) in the process's environment for that
 * (mpt_cpu_blas_name says which it took). Outside x86-64 (or built without GCC-style target
 * attributes) there is one path, the baseline. */
typedef enum {
  MPT_CPU_ISA_BASELINE = 0, /* x86-64 SSE2: every x86-64 CPU */
  MPT_CPU_ISA_AVX2 = 1,     /* AVX2 (AMD Zen and later, Intel Haswell and later) */
  MPT_CPU_ISA_AVX512 = 2,   /* AVX-512F (Intel Skylake-SP and later, AMD Zen 4 and later) */
} mpt_cpu_isa;

/* Reads MPT_CPU_ISA (once per process; later calls return the first answer) and checks it:
 * MPT_EINVAL for a value other than avx512, avx2, baseline (or empty: the default), MPT_ENOTSUP
 * for an instruction set this CPU lacks, naming the ones it offers (the kernels then never run
 * it: they fall back to the best the CPU has), MPT_EDEVICE if oneDNN refused the cap (it was
 * used before the library's first CPU call). The library calls it itself in its first CPU
 * allocation, stream, thread setting and oneDNN call (GEMM, convolution, attention), which
 * return its error; a program may call it first to report a bad setting early. Any thread. */
MPT_API mpt_status mpt_cpu_isa_init(void);
/* The path the library's kernels take (after mpt_cpu_isa_init; it calls it). */
MPT_API mpt_cpu_isa mpt_cpu_isa_active(void);
/* The best path this CPU can run (cpuid, with the OS's support for the wider registers). */
MPT_API mpt_cpu_isa mpt_cpu_isa_best(void);
/* "avx512", "avx2", "baseline" (the MPT_CPU_ISA spellings); "unknown" outside the enum. */
MPT_API const char *mpt_cpu_isa_name(mpt_cpu_isa isa);
/* The sum of x[i]^2 over i in [0, count), in double, for x in host memory, on the calling
 * thread. The order is fixed: lane j (of 16) adds the x[i] with i mod 16 = j in increasing i,
 * then the 16 lanes are added in lane order; so the result has the same bits on every CPU,
 * vector width and thread count (the AVX-512 and AVX2 builds do not reassociate). count <= 0
 * gives 0 (x may then be NULL). Used by gradient clipping (mpt_clip_grad_norm) and ZeRO-1's
 * per-shard norms, which must agree bit for bit. */
MPT_API double mpt_cpu_sum_squares(const float *x, int64_t count);

#ifdef __cplusplus
}
#endif

#endif /* MPITRAIN_OPS_H */
