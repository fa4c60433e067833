/* mpitrain core: status codes and the thread-local error detail, the rank-aware logger,
 * devices, streams and events, tensors, and the seeded RNG.
 *
 * Every fallible call returns mpt_status (0 = MPT_OK, negative = error). The detail of the most
 * recent error on the calling thread (failing statement, file:line, rank, device) is kept in a
 * thread-local string read with mpt_last_error(). The library never exits or aborts.
 *
 * Streams and events (docs/comm.md for the comm stream): work on a stream runs in submission
 * order; ordering between streams is an event record on one plus a wait on the other; every
 * host-side wait takes a deadline in milliseconds. On the CPU there are two kinds of stream: the
 * inline stream runs work immediately on the calling thread (its events are complete when
 * recorded), and a worker stream owns a thread with an in-order queue (used for communication, so
 * that an all-reduce runs while the caller goes on computing). */
#ifndef MPITRAIN_CORE_H
#define MPITRAIN_CORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define MPT_API __attribute__((visibility("default")))
#define MPT_PRINTF(f, a) __attribute__((format(printf, f, a)))
#else
#define MPT_API
#define MPT_PRINTF(f, a)
#endif

/* ------------------------------------------------------------------------------------------ */
/* Status codes                                                                               */

/* X-macro: name, value, message. One table gives the enum, the names and the messages. */
#define MPT_STATUS_MAP(X)                                                              \
  X(OK, 0, "success")                                                                  \
  X(EINVAL, -1, "invalid argument")                                                    \
  X(ENOMEM, -2, "out of memory")                                                       \
  X(EIO, -3, "input/output error")                                                     \
  X(EFORMAT, -4, "malformed input")                                                    \
  X(ESHAPE, -5, "shape mismatch")                                                      \
  X(EDEVICE, -6, "device error")                                                       \
  X(ECOMM, -7, "communication error")                                                  \
  X(ETIMEOUT, -8, "deadline exceeded")                                                 \
  X(EMISMATCH, -9, "ranks disagree")                                                   \
  X(ENOTSUP, -10, "not supported")                                                     \
  X(ESTATE, -11, "invalid state")                                                      \
  X(ENONFINITE, -12, "non-finite value")                                               \
  X(ENOENT, -13, "no such file")                                                       \
  X(EUNUSED, -14, "parameters received no gradient")                                   \
  X(EINTERRUPTED, -15, "interrupted")

/* The status codes of the table above: MPT_OK (0), MPT_EINVAL (-1), ... */
typedef enum {
#define MPT__STATUS_ENUM(name, value, msg) MPT_##name = value,
  MPT_STATUS_MAP(MPT__STATUS_ENUM)
#undef MPT__STATUS_ENUM
} mpt_status;

/* "MPT_EINVAL" etc.; "MPT_UNKNOWN" for a value outside the table. Never NULL. */
MPT_API const char *mpt_status_name(mpt_status status);
/* A short message ("invalid argument"). Never NULL. */
MPT_API const char *mpt_status_message(mpt_status status);
/* The detail of the last error set on the calling thread ("" if none). Valid until the next
 * error on this thread. */
MPT_API const char *mpt_last_error(void);
/* Clears the calling thread's last-error detail. */
MPT_API void mpt_error_clear(void);
/* Records an error detail on the calling thread and returns `status` (for programs and tests
 * that want to report through the same channel). */
MPT_API mpt_status mpt_error_set(mpt_status status, const char *fmt, ...) MPT_PRINTF(2, 3);
/* The same, recording where it happened: the detail reads "message (at file:line, rank R)"
 * with the file's base name. Used through MPT_FAIL. */
MPT_API mpt_status mpt_error_set_at(mpt_status status, const char *file, int line,
                                    const char *fmt, ...) MPT_PRINTF(4, 5);

/* Check and propagate macros, for the library and for a user's ops and programs alike.
 * MPT_FAIL(status, fmt, ...) records "message (at file:line, rank R)" as the calling thread's
 * last error and evaluates to `status`:
 *     if (n < 1) return MPT_FAIL(MPT_EINVAL, "my_op: n = %d must be >= 1", n);
 * MPT_RETURN_IF(expr) returns expr's status from the current function when it is not MPT_OK
 * (the callee recorded the detail). MPT_CHECK(expr, label) stores expr's status in the local
 * variable `st` (declare `mpt_status st = MPT_OK;`) and jumps to `label` on failure: the one
 * exit path of a function that acquires resources. */
#define MPT_FAIL(status, ...) mpt_error_set_at((status), __FILE__, __LINE__, __VA_ARGS__)
#define MPT_RETURN_IF(expr)                 \
  do {                                      \
    mpt_status mpt_rs_ = (expr);            \
    if (mpt_rs_ != MPT_OK) return mpt_rs_;  \
  } while (0)
#define MPT_CHECK(expr, label)    \
  do {                            \
    st = (expr);                  \
    if (st != MPT_OK) goto label; \
  } while (0)

/* ------------------------------------------------------------------------------------------ */
/* Logging                                                                                    */

/* Log levels, most severe first (the configured level prints itself and those above it). */
typedef enum {
  MPT_LOG_ERROR = 0,
  MPT_LOG_WARN = 1,
  MPT_LOG_INFO = 2,
  MPT_LOG_DEBUG = 3,
} mpt_log_level;

/* Sets the process's rank and world size for the logger, and the most verbose level printed.
 * Errors and warnings print on every rank, prefixed "[rank R/W]"; info and debug print on rank
 * 0 only unless `all_ranks` is non-zero. Thread-safe to call mpt_log afterwards. */
MPT_API void mpt_log_configure(int rank, int world_size, mpt_log_level level, int all_ranks);
/* Prints one line to stderr (a newline is added). */
MPT_API void mpt_log(mpt_log_level level, const char *fmt, ...) MPT_PRINTF(2, 3);
/* The rank set by mpt_log_configure (0 before). */
MPT_API int mpt_log_rank(void);

/* ------------------------------------------------------------------------------------------ */
/* Time                                                                                       */

/* Monotonic clock in milliseconds (CLOCK_MONOTONIC, arbitrary origin: use differences). Any
 * thread. */
MPT_API double mpt_time_ms(void);

/* ------------------------------------------------------------------------------------------ */
/* Devices                                                                                    */

/* The kinds of device a build may have (mpt_device_available says which are present). */
typedef enum {
  MPT_DEVICE_CPU = 0,
  MPT_DEVICE_CUDA = 1,
} mpt_device_type;

/* A device: its kind and index. A plain value, compared field by field. */
typedef struct mpt_device {
  mpt_device_type type;
  int index; /* CUDA ordinal; for CPU "devices" (DP mode) a replica number, memory is shared */
} mpt_device;

/* The device {MPT_DEVICE_CPU, 0}. */
MPT_API mpt_device mpt_device_cpu(void);
/* 1 if the device type was built and at least one device of it is present at run time. */
MPT_API int mpt_device_available(mpt_device_type type);
/* Number of devices of a type present at run time (CPU: 1). 0 when not built or none. */
MPT_API int mpt_device_count(mpt_device_type type);
/* Parses "cpu", "cpu:N", "cuda", "cuda:N" (no index: 0). Does not check that the device is
 * present (mpt_device_count). Errors: MPT_EINVAL naming the text (also for NULL text or
 * device). */
MPT_API mpt_status mpt_device_parse(const char *text, mpt_device *device);
/* Writes "cpu:0" / "cuda:1" into buf (always NUL-terminated). Returns buf. */
MPT_API const char *mpt_device_str(mpt_device device, char *buf, size_t nbytes);
/* Makes `device` the calling thread's current device (CUDA: cudaSetDevice), so that work the
 * library does without naming a device (pinned host allocations, the CUDA context a library
 * creates at start-up) lands on it rather than on device 0. Every stream, event and op already
 * makes its own device current; this is for the process's start-up, after binding a rank to its
 * GPU (mpt_comm_bind_device). CPU: nothing to do, MPT_OK. Errors: MPT_EINVAL (CUDA ordinal
 * not present), MPT_ENOTSUP (type not built), MPT_EDEVICE (no CUDA device at all, or
 * cudaSetDevice failed). */
MPT_API mpt_status mpt_device_set_current(mpt_device device);

/* Memory: `nbytes` bytes on `device`, contents undefined. `nbytes == 0` gives *ptr = NULL and
 * MPT_OK. *ptr is NULL on error. Errors: MPT_EINVAL (ptr NULL; CUDA: ordinal not present),
 * MPT_ENOTSUP (device type not built), MPT_ENOMEM, MPT_EDEVICE. CPU memory is 64-byte aligned
 * (aligned_alloc); CUDA memory comes from the backend's caching allocator. Any thread. */
MPT_API mpt_status mpt_device_alloc(mpt_device device, size_t nbytes, void **ptr);
/* Frees memory from mpt_device_alloc on the same device; NULL is a no-op. CUDA: the block
 * returns to the cache and is reused only once the work queued on the device's streams when it
 * was freed has completed, so a buffer may be freed with work on it still queued. */
MPT_API void mpt_device_free(mpt_device device, void *ptr);

/* ------------------------------------------------------------------------------------------ */
/* Streams and events                                                                         */

/* A stream (an in-order queue of device work) and an event (a position in a stream), both
 * opaque and owned by the device that made them (see the top of this file). */
typedef struct mpt_stream mpt_stream;
typedef struct mpt_event mpt_event;

/* What mpt_stream_init makes. */
typedef enum {
  MPT_STREAM_INLINE = 0, /* CPU: runs work on the calling thread; CUDA: a compute stream */
  MPT_STREAM_WORKER = 1, /* CPU: a thread with an in-order queue; CUDA: a non-blocking stream */
} mpt_stream_kind;

/* Creates a stream on `device` (*stream NULL on error). Errors: MPT_EINVAL (stream NULL;
 * CUDA: ordinal not present), MPT_ENOTSUP (device type not built), MPT_ENOMEM, MPT_EDEVICE (a
 * worker thread or CUDA stream could not be created). A NULL mpt_stream * passed to the
 * library elsewhere means the CPU, inline. */
MPT_API mpt_status mpt_stream_init(mpt_stream **stream, mpt_device device, mpt_stream_kind kind);
/* Drains the stream then frees it. NULL is a no-op. CPU worker: the worker runs every queued
 * item (skipping host functions after a failure) and is joined, with no deadline (so work
 * that may never return calls for mpt_stream_abandon instead). CUDA: waits at most 60 s for the
 * device; past that the stream is logged and leaked, never freed under running work. */
MPT_API void mpt_stream_free(mpt_stream *stream);
/* Gives up on a stream whose worker may never return: only for after a deadline expired on
 * work that cannot be interrupted (a blocking MPI collective whose peer never came, comm.h),
 * on the way to aborting the process. The worker thread is detached, not joined; work queued
 * behind the running item is dropped (its events never complete); the stream's memory is
 * leaked on purpose, because the worker may still wake up and touch it (it then exits without
 * running anything else). The handle must not be used afterwards. Inline streams and streams
 * of backends without a worker thread are leaked the same way. NULL is a no-op. Any thread,
 * but not concurrently with other calls on the same stream. */
MPT_API void mpt_stream_abandon(mpt_stream *stream);
/* The stream's device (cpu:0 for NULL). */
MPT_API mpt_device mpt_stream_device(const mpt_stream *stream);

/* A host function run on a stream: in order with the stream's other work, on the stream's
 * thread (worker) or the caller's (inline). A non-zero return marks the stream failed: later
 * work on it is skipped and every later wait on it or on its events returns that status. */
typedef mpt_status (*mpt_host_fn)(void *arg);

/* Enqueues fn(arg) on the stream. Inline streams (and NULL) run it now and return its status.
 * For worker streams `arg` must stay valid until the work has run (record an event after it
 * and wait); fn's failure then shows in later waits, not here. Errors: MPT_EINVAL (fn NULL),
 * MPT_ENOMEM; the stream's sticky error if it already failed. */
MPT_API mpt_status mpt_stream_launch_host(mpt_stream *stream, mpt_host_fn fn, void *arg);
/* Blocks until everything enqueued so far has run, at most `timeout_ms` (negative: no deadline;
 * a comm's collectives on the stream still end the wait by their own deadline, comm.h).
 * Returns the stream's sticky error, or MPT_ETIMEOUT (the stream is not marked failed: the work
 * may still finish). NULL: MPT_OK at once. Not from a host function running on the same stream:
 * it would wait for itself (until the deadline, if any). */
MPT_API mpt_status mpt_stream_synchronize(mpt_stream *stream, double timeout_ms);
/* The stream's sticky error (MPT_OK if none, and for NULL). Does not wait. */
MPT_API mpt_status mpt_stream_error(const mpt_stream *stream);

/* Creates an event on `device` (initially complete). Errors: as mpt_stream_init. */
MPT_API mpt_status mpt_event_init(mpt_event **event, mpt_device device);
/* Frees an event; NULL is a no-op. No stream may still wait on it or record it. */
MPT_API void mpt_event_free(mpt_event *event);
/* Captures the stream's current position: the event completes when all work enqueued before
 * this call has run. Re-recording resets it. Errors: MPT_EINVAL (NULL, or a stream of another
 * device type: record on the event's own backend and wait across with mpt_stream_wait_event);
 * the stream's sticky error. */
MPT_API mpt_status mpt_event_record(mpt_event *event, mpt_stream *stream);
/* Makes later work on `stream` wait for `event`. On an inline stream this blocks the caller
 * (at most timeout_ms); on a worker stream the worker blocks (at most timeout_ms from when it
 * reaches the wait; on expiry the stream fails with MPT_ETIMEOUT). An event of another device
 * type may be waited on (CPU worker waiting on a CUDA event, and the reverse). Errors:
 * MPT_EINVAL (NULL); inline: MPT_ETIMEOUT or the recording stream's error; worker: the
 * stream's sticky error, MPT_ENOMEM. */
MPT_API mpt_status mpt_stream_wait_event(mpt_stream *stream, mpt_event *event, double timeout_ms);
/* Blocks the host until the event completes, at most `timeout_ms` (negative: no deadline; an
 * event behind a comm's collective still ends the wait by the collective's deadline, comm.h).
 * Returns the status of the recording stream at completion, or MPT_ETIMEOUT (or the comm's
 * timeout naming the collective); MPT_EINVAL for NULL. */
MPT_API mpt_status mpt_event_synchronize(mpt_event *event, double timeout_ms);
/* 1 if complete (or NULL), 0 if not. Does not wait. */
MPT_API int mpt_event_query(mpt_event *event);
/* Milliseconds between the completion of two recorded events of one device type (host clock on
 * CPU, cudaEventElapsedTime on CUDA). Errors: MPT_EINVAL (NULL, or devices of two types),
 * MPT_ESTATE (an event has not completed), MPT_EDEVICE. */
MPT_API mpt_status mpt_event_elapsed_ms(mpt_event *start, mpt_event *end, double *ms);

/* ------------------------------------------------------------------------------------------ */
/* Tensors                                                                                    */

/* Element types of tensors and collectives (mpt_dtype_size gives the bytes). */
typedef enum {
  MPT_F32 = 0,
  MPT_I32 = 1,
  MPT_U8 = 2,
  /* bfloat16: the top 16 bits of a float32 (1 sign, 8 exponent, 7 stored mantissa bits), held
   * as uint16_t. Used for communication (comm.h) and its conversions below. */
  MPT_BF16 = 3,
} mpt_dtype;

/* Size of one element in bytes (MPT_F32: 4). 0 for an unknown dtype. */
MPT_API size_t mpt_dtype_size(mpt_dtype dtype);
/* "float32", "int32", "uint8", "bfloat16"; "unknown" otherwise. A static string. */
MPT_API const char *mpt_dtype_name(mpt_dtype dtype);

/* bfloat16 conversions (host memory). Rounding float32 to bfloat16 is round to nearest, ties to
 * even, on the 16 dropped bits: the relative error of a finite, normal result is at most
 * u = 2^-8 (half an ulp of an 8-bit significand). Infinities stay infinities, a finite value
 * beyond the largest bfloat16 rounds to an infinity of its sign (as the IEEE rule says), and a
 * NaN stays a NaN (quiet, sign kept; never turned into an infinity by the rounding carry).
 * Widening bfloat16 to float32 is exact. The array forms convert `n` elements; src and dst
 * must not overlap. Pure; any thread. */
MPT_API uint16_t mpt_bf16_from_f32(float x);
MPT_API float mpt_bf16_to_f32(uint16_t h);
MPT_API void mpt_bf16_round_array(const float *src, uint16_t *dst, int64_t n);
MPT_API void mpt_bf16_widen_array(const uint16_t *src, float *dst, int64_t n);
/* b[i] = bfloat16(float32(a[i]) + float32(b[i])), rounded as mpt_bf16_from_f32, for i < n: one
 * step of a bfloat16 sum (the comm layer's MPI reduction). a and b must not overlap. */
MPT_API void mpt_bf16_add_array(const uint16_t *a, uint16_t *b, int64_t n);

#define MPT_MAX_DIMS 6

/* A dense, row-major, contiguous tensor: a plain value, copied freely. `data` is owned when
 * `owns_data` is set (mpt_tensor_init) and borrowed otherwise (a view). */
typedef struct mpt_tensor {
  void *data;
  mpt_dtype dtype;
  mpt_device device;
  int ndim;
  int64_t shape[MPT_MAX_DIMS];
  int64_t count; /* product of shape (1 for ndim 0) */
  int owns_data;
} mpt_tensor;

/* Allocates a tensor of shape[0..ndim) (contents undefined, row-major); free with
 * mpt_tensor_free. *t is zeroed first. Errors: MPT_EINVAL (t NULL, ndim outside
 * [0, MPT_MAX_DIMS], unknown dtype, negative extent, a size that overflows), then those of
 * mpt_device_alloc (MPT_ENOMEM, MPT_ENOTSUP, MPT_EDEVICE). */
MPT_API mpt_status mpt_tensor_init(mpt_tensor *t, mpt_device device, mpt_dtype dtype, int ndim,
                                   const int64_t *shape);
/* A view of existing memory; nothing is allocated and the view never frees `data`. A bad
 * shape or dtype (as mpt_tensor_init rejects) gives a zeroed shape (ndim 0, count 0). */
MPT_API mpt_tensor mpt_tensor_view(void *data, mpt_device device, mpt_dtype dtype, int ndim,
                                   const int64_t *shape);
/* Frees owned data and zeroes the struct; a view or a zeroed tensor is a no-op. */
MPT_API void mpt_tensor_free(mpt_tensor *t);
/* count x mpt_dtype_size(dtype), in bytes. */
MPT_API size_t mpt_tensor_nbytes(const mpt_tensor *t);
/* 1 if both have the same ndim and extents. */
MPT_API int mpt_tensor_same_shape(const mpt_tensor *a, const mpt_tensor *b);
/* Writes "[64, 1, 28, 28]" into buf (nbytes >= 1 long; truncated, always NUL-terminated). Returns
 * buf. */
MPT_API const char *mpt_shape_str(int ndim, const int64_t *shape, char *buf, size_t nbytes);

/* ------------------------------------------------------------------------------------------ */
/* Random numbers                                                                              */

/* xoshiro256** (Blackman & Vigna, "Scrambled linear pseudorandom number generators", 2021),
 * seeded through splitmix64. A plain value: copy it to fork a stream, store it in checkpoints. */
typedef struct mpt_rng {
  uint64_t s[4];
} mpt_rng;

/* Seeds the state from `seed` through splitmix64 (any seed, 0 included, gives a valid state). */
MPT_API void mpt_rng_seed(mpt_rng *rng, uint64_t seed);
/* The next 64 random bits. Not thread-safe: one mpt_rng per thread. */
MPT_API uint64_t mpt_rng_next(mpt_rng *rng);
/* Uniform in [0, 1) with 24 random bits. */
MPT_API float mpt_rng_uniform(mpt_rng *rng);
/* Uniform integer in [0, n), n > 0, without modulo bias. */
MPT_API uint64_t mpt_rng_below(mpt_rng *rng, uint64_t n);
/* Fills x[0..count) with uniform values in [lo, hi), lo < hi: lo + (hi - lo) mpt_rng_uniform, and
 * the largest float below hi where that sum rounds up to hi. */
MPT_API void mpt_rng_fill_uniform(mpt_rng *rng, float *x, int64_t count, float lo, float hi);

/* ------------------------------------------------------------------------------------------ */
/* Trace (Chrome trace event format, "X" complete events; opens in Perfetto / chrome://tracing) */

/* A bounded, thread-safe list of trace events of this process (opaque). */
typedef struct mpt_trace mpt_trace;

/* A trace of this process, shown as process `rank`. Holds at most `capacity` events (later ones
 * are counted and dropped). Timestamps are mpt_time_ms values as they are (one clock for every
 * rank of a host). Errors: MPT_EINVAL (trace NULL, capacity < 1), MPT_ENOMEM. */
MPT_API mpt_status mpt_trace_init(mpt_trace **trace, int rank, int64_t capacity);
/* Frees the trace; NULL is a no-op. Nothing may still add to it. */
MPT_API void mpt_trace_free(mpt_trace *trace);
/* Records an event that started at `start_ms` (mpt_time_ms clock) and lasted `dur_ms`, on
 * thread lane `tid` (0 compute, 1 communication). `name` must be a string literal or outlive
 * the trace; `arg` is shown as args.n (e.g. a bucket index; negative: none). Thread-safe;
 * NULL trace: nothing. */
MPT_API void mpt_trace_add(mpt_trace *trace, const char *name, int tid, double start_ms,
                           double dur_ms, int64_t arg);
/* Appends this rank's events to `path` as JSON array elements. `first` starts the file (writes
 * "[" after truncating); `last` closes it with "]". Ranks append in turn (the caller orders them
 * with barriers), so one file holds every rank. Errors: MPT_EIO naming the path. */
MPT_API mpt_status mpt_trace_append(mpt_trace *trace, const char *path, int first, int last);
/* Events recorded so far (0 for NULL). Read without the lock: call it once adding has
 * stopped. */
MPT_API int64_t mpt_trace_count(const mpt_trace *trace);
/* Events not recorded because the trace was full (0 for NULL). Thread-safe. */
MPT_API int64_t mpt_trace_dropped(mpt_trace *trace);

#ifdef __cplusplus
}
#endif

#endif /* MPITRAIN_CORE_H */
