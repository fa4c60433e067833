/* CUDA streams and events behind the opaque handles of include/mpitrain/core.h.
 *
 * A stream is a cudaStream_t: MPT_STREAM_INLINE gives a compute stream (cudaStreamDefault,
 * ordered with the legacy default stream), MPT_STREAM_WORKER a cudaStreamNonBlocking stream
 * (communication). On CUDA both kinds ENQUEUE: ops and host functions return before they run.
 * An event is a cudaEvent_t with timing enabled (mpt_event_elapsed_ms).
 *
 * Host functions go through cudaLaunchHostFunc: they run in stream order on a CUDA driver
 * thread and, as CUDA requires there, must not call CUDA (or NCCL); nor should they allocate or
 * free CUDA memory (the allocator may be waiting for their stream). That thread may serve the
 * host functions of every stream, so one that blocks (a wait on a CPU event) delays the others'
 * host functions too, never their kernels. A host function that fails marks the stream failed
 * (sticky, first error wins, with its error text); later host functions on it are skipped and
 * later ops and waits return the status. Kernels already queued when a
 * host function fails still run: the failure is seen when the host next enqueues or waits.
 * Asynchronous CUDA errors found by a wait also mark the stream failed.
 *
 * Every host-side wait polls cudaEventQuery with a deadline (mpt__cuda_poll_event), so nothing
 * here blocks without a bound unless the caller asks for no deadline. A device-side wait
 * (mpt_stream_wait_event on a CUDA event) cannot expire on the device: its deadline is enforced
 * by the host waits that follow it. A wait on a CPU event is a host function that blocks, with
 * the deadline, for the event's record captured when the wait was ENQUEUED (not a later
 * re-record: a host a step ahead would otherwise make the stream wait for the next step).
 * Conversely a CPU worker's wait on a CUDA event captures its current record: a snapshot event
 * recorded on a helper stream of its own after a cudaStreamWaitEvent on it (which binds to the
 * record current at the call, as any CUDA stream wait does). Thread-safe: the sticky status
 * lives in a locked cell shared with the events. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cuda/cuda_internal.h"
#include "mpitrain/core.h"

/* How long mpt_stream_free waits for queued work before giving up (and leaking the stream, so
 * that work still queued never touches freed memory). */
#define STREAM_FREE_TIMEOUT_MS 60000.0
/* Pinned host scratch of a stream, bytes. */
#define HOST_SCRATCH_NBYTES 64

/* ---- the shared sticky status ---- */

static mpt__cuda_cell *cell_new(void) {
  mpt__cuda_cell *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  pthread_mutex_init(&c->mutex, NULL);
  c->refs = 1;
  return c;
}

static void cell_ref(mpt__cuda_cell *c) {
  pthread_mutex_lock(&c->mutex);
  c->refs++;
  pthread_mutex_unlock(&c->mutex);
}

static void cell_unref(mpt__cuda_cell *c) {
  if (!c) return;
  pthread_mutex_lock(&c->mutex);
  const int left = --c->refs;
  pthread_mutex_unlock(&c->mutex);
  if (left == 0) {
    pthread_mutex_destroy(&c->mutex);
    free(c);
  }
}

/* The cell's status; when failed, its detail is re-raised on the calling thread. */
static mpt_status cell_raise(mpt__cuda_cell *c) {
  char detail[sizeof c->detail];
  pthread_mutex_lock(&c->mutex);
  const mpt_status st = c->status;
  if (st != MPT_OK) memcpy(detail, c->detail, sizeof detail);
  pthread_mutex_unlock(&c->mutex);
  if (st != MPT_OK) mpt_error_set(st, "%s", detail);
  return st;
}

static void stream_fail(mpt_stream *s, mpt_status st, const char *detail) {
  pthread_mutex_lock(&s->cell->mutex);
  if (s->cell->status == MPT_OK) {
    s->cell->status = st;
    snprintf(s->cell->detail, sizeof s->cell->detail, "%s", detail ? detail : "");
  }
  pthread_mutex_unlock(&s->cell->mutex);
  atomic_store(&s->failed, 1);
}

static mpt_status stream_raise(mpt_stream *s) {
  return atomic_load(&s->failed) ? cell_raise(s->cell) : MPT_OK;
}

mpt_status mpt__cuda_stream_enter(mpt_stream *s) {
  MPT_RETURN_IF(stream_raise(s));
  return mpt__cuda_use(s->h.device.index);
}

/* ---- host functions ---- */

static mpt__cuda_host_work *work_get(mpt_stream *s) {
  pthread_mutex_lock(&s->work_mutex);
  mpt__cuda_host_work *w = s->work_free;
  if (w) s->work_free = w->next;
  pthread_mutex_unlock(&s->work_mutex);
  return w ? w : malloc(sizeof *w);
}

static void work_put(mpt_stream *s, mpt__cuda_host_work *w) {
  pthread_mutex_lock(&s->work_mutex);
  w->next = s->work_free;
  s->work_free = w;
  pthread_mutex_unlock(&s->work_mutex);
}

/* Runs on a CUDA driver thread, in stream order. Makes no CUDA call. */
static void CUDART_CB host_trampoline(void *p) {
  mpt__cuda_host_work *w = p;
  mpt_stream *s = w->stream;
  if (!atomic_load(&s->failed)) {
    mpt_error_clear();
    const mpt_status st = w->fn ? w->fn(w->arg)
                                : mpt__event_wait_captured(w->cpu_event, w->token, w->timeout_ms);
    if (st != MPT_OK) stream_fail(s, st, mpt_last_error());
  }
  work_put(s, w);
}

static mpt_status launch_work(mpt_stream *s, mpt_host_fn fn, void *arg, mpt_event *cpu_event,
                              double timeout_ms) {
  mpt__cuda_host_work *w = work_get(s);
  if (!w) return MPT_FAIL(MPT_ENOMEM, "cannot queue a host function on cuda:%d",
                          s->h.device.index);
  *w = (mpt__cuda_host_work){s, fn, arg, cpu_event, 0, timeout_ms, NULL};
  if (cpu_event) {
    const mpt_status st = mpt__event_capture(cpu_event, &w->token);
    if (st != MPT_OK) {
      work_put(s, w);
      return st;
    }
  }
  const cudaError_t e = cudaLaunchHostFunc(s->cs, host_trampoline, w);
  if (e != cudaSuccess) {
    work_put(s, w);
    return mpt__cuda_fail(e, "cudaLaunchHostFunc(s->cs, host_trampoline, w)", __FILE__,
                          __LINE__, s->h.device.index);
  }
  return MPT_OK;
}

mpt_status mpt__cuda_stream_launch_host(mpt_stream *s, mpt_host_fn fn, void *arg) {
  MPT_RETURN_IF(mpt__cuda_stream_enter(s));
  return launch_work(s, fn, arg, NULL, 0);
}

/* ---- streams ---- */

/* Frees what stream_init created (any of it may be missing). The device is current. */
static void stream_destroy(mpt_stream *s) {
  mpt__cudnn_stream_free(s);
  if (s->blas) (void)cublasDestroy(s->blas);
  if (s->cs) (void)cudaStreamDestroy(s->cs);
  if (s->sync_event) (void)cudaEventDestroy(s->sync_event);
  mpt__cuda_free(s->h.device.index, s->scratch);
  if (s->host_scratch) (void)cudaFreeHost(s->host_scratch);
  for (mpt__cuda_host_work *w = s->work_free, *next; w; w = next) {
    next = w->next;
    free(w);
  }
  cell_unref(s->cell);
  pthread_mutex_destroy(&s->work_mutex);
  free(s);
}

mpt_status mpt__cuda_stream_init(mpt_stream **stream, mpt_device device, mpt_stream_kind kind) {
  const int dev = device.index;
  MPT_RETURN_IF(mpt__cuda_use(dev));
  mpt_status st = MPT_OK;
  mpt_stream *s = calloc(1, sizeof *s);
  if (!s) return MPT_FAIL(MPT_ENOMEM, "cannot allocate a stream for cuda:%d", dev);
  s->h.device = device;
  s->h.kind = kind;
  atomic_init(&s->failed, 0);
  pthread_mutex_init(&s->work_mutex, NULL);
  if (!(s->cell = cell_new())) {
    st = MPT_FAIL(MPT_ENOMEM, "cannot allocate a stream for cuda:%d", dev);
    goto fail;
  }
  const unsigned flags = kind == MPT_STREAM_WORKER ? cudaStreamNonBlocking : cudaStreamDefault;
  MPT_CUDA_CHECK(cudaStreamCreateWithFlags(&s->cs, flags), dev, fail);
  MPT_CUDA_CHECK(cudaEventCreateWithFlags(&s->sync_event, cudaEventDisableTiming), dev, fail);
  MPT_CHECK(mpt__cuda_alloc(dev, MPT__CUDA_SCRATCH_NBYTES, &s->scratch), fail);
  MPT_CUDA_CHECK(cudaMallocHost(&s->host_scratch, HOST_SCRATCH_NBYTES), dev, fail);
  mpt__cuda_alloc_add_stream(dev, s);
  *stream = s;
  return MPT_OK;
fail:
  stream_destroy(s);
  return st;
}

/* Records the stream's sync event and polls it: MPT_ETIMEOUT when the deadline passed (the
 * stream is not marked: the work may still finish); a device error found here marks the stream
 * failed. Does not look at the sticky status. */
static mpt_status stream_poll(mpt_stream *s, double timeout_ms, const char *what) {
  const int dev = s->h.device.index;
  MPT_RETURN_IF(mpt__cuda_use(dev));
  MPT_CUDA_RETURN_IF(cudaEventRecord(s->sync_event, s->cs), dev);
  const mpt_status st = mpt__cuda_poll_event(s->sync_event, dev, timeout_ms, what);
  if (st != MPT_OK && st != MPT_ETIMEOUT) stream_fail(s, st, mpt_last_error());
  return st;
}

/* Drains the stream, then returns its sticky status. */
static mpt_status stream_wait_all(mpt_stream *s, double timeout_ms, const char *what) {
  MPT_RETURN_IF(stream_poll(s, timeout_ms, what));
  return stream_raise(s);
}

void mpt__cuda_stream_free(mpt_stream *s) {
  if (!s) return;
  const int dev = s->h.device.index;
  /* Only the drain's own deadline counts here: a stream that failed earlier (even with
   * MPT_ETIMEOUT, sticky) and has drained is freed. */
  const mpt_status st = stream_poll(s, STREAM_FREE_TIMEOUT_MS, "stream drain before free");
  mpt__cuda_alloc_remove_stream(dev, s);
  if (st == MPT_ETIMEOUT) {
    mpt_log(MPT_LOG_ERROR,
            "mpt_stream_free: a cuda:%d stream still has work after %.0f ms; leaking it "
            "so that the work never touches freed memory", dev, STREAM_FREE_TIMEOUT_MS);
    return;
  }
  (void)cudaSetDevice(dev);
  stream_destroy(s);
}

mpt_status mpt__cuda_stream_synchronize(mpt_stream *s, double timeout_ms) {
  return stream_wait_all(s, timeout_ms, "stream synchronize");
}

mpt_status mpt__cuda_stream_drain(mpt_stream *s, double timeout_ms, const char *what) {
  return stream_wait_all(s, timeout_ms, what);
}

mpt_status mpt__cuda_stream_error(const mpt_stream *cs) {
  mpt_stream *s = (mpt_stream *)cs;
  if (atomic_load(&s->failed)) {
    pthread_mutex_lock(&s->cell->mutex);
    const mpt_status st = s->cell->status;
    pthread_mutex_unlock(&s->cell->mutex);
    return st;
  }
  /* An asynchronous device error (a faulting kernel) shows in cudaStreamQuery. */
  if (cudaSetDevice(s->h.device.index) != cudaSuccess) return MPT_EDEVICE;
  const cudaError_t e = cudaStreamQuery(s->cs);
  if (e == cudaErrorNotReady) mpt__cuda_clear_not_ready();
  if (e == cudaSuccess || e == cudaErrorNotReady) return MPT_OK;
  const mpt_status st = mpt__cuda_fail(e, "cudaStreamQuery(s->cs)", __FILE__, __LINE__,
                                       s->h.device.index);
  stream_fail(s, st, mpt_last_error());
  return st;
}

mpt_status mpt__cuda_stream_wait_event(mpt_stream *s, mpt_event *ev, double timeout_ms) {
  MPT_RETURN_IF(mpt__cuda_stream_enter(s));
  if (((const mpt__event_header *)ev)->device.type != MPT_DEVICE_CUDA)
    return launch_work(s, NULL, NULL, ev, timeout_ms);
  pthread_mutex_lock(&ev->mutex);
  mpt__cuda_cell *cell = ev->cell;
  if (cell) cell_ref(cell);
  pthread_mutex_unlock(&ev->mutex);
  if (cell) { /* the recording stream failed: so does every stream that waits on it */
    const mpt_status st = cell_raise(cell);
    cell_unref(cell);
    if (st != MPT_OK) {
      stream_fail(s, st, mpt_last_error());
      return st;
    }
  }
  MPT_CUDA_RETURN_IF(cudaStreamWaitEvent(s->cs, ev->ev, 0), s->h.device.index);
  return MPT_OK;
}

void *mpt__cuda_stream_handle(mpt_stream *s) {
  if (!s || ((const mpt__stream_header *)s)->device.type != MPT_DEVICE_CUDA) return NULL;
  return (void *)s->cs;
}

void mpt__cuda_stream_set_error(mpt_stream *s, mpt_status status, const char *detail) {
  if (!s || status == MPT_OK || ((const mpt__stream_header *)s)->device.type != MPT_DEVICE_CUDA)
    return;
  stream_fail(s, status, detail);
}

/* ---- events ---- */

mpt_status mpt__cuda_event_init(mpt_event **event, mpt_device device) {
  MPT_RETURN_IF(mpt__cuda_use(device.index));
  mpt_event *ev = calloc(1, sizeof *ev);
  if (!ev) return MPT_FAIL(MPT_ENOMEM, "cannot allocate an event for cuda:%d", device.index);
  ev->h.device = device;
  const cudaError_t e = cudaEventCreate(&ev->ev);
  if (e != cudaSuccess) {
    free(ev);
    return mpt__cuda_fail(e, "cudaEventCreate(&ev->ev)", __FILE__, __LINE__, device.index);
  }
  pthread_mutex_init(&ev->mutex, NULL);
  *event = ev;
  return MPT_OK;
}

void mpt__cuda_event_free(mpt_event *ev) {
  if (!ev) return;
  (void)cudaSetDevice(ev->h.device.index);
  (void)cudaEventDestroy(ev->ev);
  cell_unref(ev->cell);
  pthread_mutex_destroy(&ev->mutex);
  free(ev);
}

mpt_status mpt__cuda_event_record(mpt_event *ev, mpt_stream *s) {
  const mpt_device sd = ((const mpt__stream_header *)s)->device;
  const int dev = ev->h.device.index;
  if (sd.type != MPT_DEVICE_CUDA || sd.index != dev)
    return MPT_FAIL(MPT_EINVAL, "event_record: a cuda:%d event cannot be recorded on a %s:%d "
                    "stream", dev, sd.type == MPT_DEVICE_CUDA ? "cuda" : "cpu", sd.index);
  MPT_RETURN_IF(mpt__cuda_use(dev));
  MPT_CUDA_RETURN_IF(cudaEventRecord(ev->ev, s->cs), dev);
  cell_ref(s->cell);
  pthread_mutex_lock(&ev->mutex);
  mpt__cuda_cell *old = ev->cell;
  ev->cell = s->cell;
  pthread_mutex_unlock(&ev->mutex);
  cell_unref(old);
  return MPT_OK;
}

/* The status of the recording stream, observed when the event completes. */
mpt_status mpt__cuda_event_synchronize(mpt_event *ev, double timeout_ms) {
  const int dev = ev->h.device.index;
  MPT_RETURN_IF(mpt__cuda_use(dev));
  MPT_RETURN_IF(mpt__cuda_poll_event(ev->ev, dev, timeout_ms, "event synchronize"));
  pthread_mutex_lock(&ev->mutex);
  mpt__cuda_cell *cell = ev->cell;
  if (cell) cell_ref(cell);
  pthread_mutex_unlock(&ev->mutex);
  if (!cell) return MPT_OK;
  const mpt_status st = cell_raise(cell);
  cell_unref(cell);
  return st;
}

/* 1 when complete; also 1 when the query itself fails, so that a caller polling it goes on to
 * mpt_event_synchronize, which reports the error. */
int mpt__cuda_event_query(mpt_event *ev) {
  (void)cudaSetDevice(ev->h.device.index);
  const cudaError_t e = cudaEventQuery(ev->ev);
  if (e == cudaErrorNotReady) {
    mpt__cuda_clear_not_ready();
    return 0;
  }
  if (e != cudaSuccess) (void)cudaGetLastError();
  return 1;
}

mpt_status mpt__cuda_event_elapsed_ms(mpt_event *start, mpt_event *end, double *ms) {
  const int dev = start->h.device.index;
  if (((const mpt__event_header *)end)->device.type != MPT_DEVICE_CUDA)
    return MPT_FAIL(MPT_EINVAL, "event_elapsed_ms: a cuda:%d event and a cpu event", dev);
  MPT_RETURN_IF(mpt__cuda_use(dev));
  float f = 0;
  const cudaError_t e = cudaEventElapsedTime(&f, start->ev, end->ev);
  if (e == cudaErrorNotReady || e == cudaErrorInvalidResourceHandle) {
    (void)cudaGetLastError();
    return MPT_FAIL(MPT_ESTATE, "elapsed time asked of a cuda:%d event that has not completed "
                    "(or was never recorded): %s", dev, cudaGetErrorName(e));
  }
  if (e != cudaSuccess)
    return mpt__cuda_fail(e, "cudaEventElapsedTime(&f, start->ev, end->ev)", __FILE__,
                          __LINE__, dev);
  *ms = f;
  return MPT_OK;
}

/* ---- captured records (a CPU worker's wait on a CUDA event, core/backend.h) ---- */

/* A snapshot of one record of an event: completes when that record does. Each snapshot has its
 * own helper stream (one shared stream would chain unrelated captures, in order, into one
 * another); a snapshot and its stream are reused only after its wait completed. */
typedef struct snapshot {
  cudaEvent_t ev;
  cudaStream_t helper;
  int dev;
  mpt__cuda_cell *cell; /* the recording stream's status cell at capture (may be NULL) */
  struct snapshot *next;
} snapshot;

static pthread_mutex_t snap_mutex = PTHREAD_MUTEX_INITIALIZER;
static snapshot *snap_free; /* released snapshots, any device */

static mpt_status capture_on(mpt_event *ev, int dev, uint64_t *token);

mpt_status mpt__cuda_event_capture(mpt_event *ev, uint64_t *token) {
  *token = 0;
  const int dev = ev->h.device.index;
  int saved = -1; /* the caller's current device is left as it was */
  (void)cudaGetDevice(&saved);
  const mpt_status st = capture_on(ev, dev, token);
  if (saved >= 0 && saved != dev) (void)cudaSetDevice(saved);
  return st;
}

static mpt_status capture_on(mpt_event *ev, int dev, uint64_t *token) {
  MPT_RETURN_IF(mpt__cuda_use(dev));
  pthread_mutex_lock(&snap_mutex);
  snapshot *sn = NULL, **pp = &snap_free;
  while (*pp && (*pp)->dev != dev) pp = &(*pp)->next;
  if (*pp) {
    sn = *pp;
    *pp = sn->next;
  }
  pthread_mutex_unlock(&snap_mutex);
  cudaError_t e = cudaSuccess;
  if (!sn) {
    if (!(sn = calloc(1, sizeof *sn)))
      return MPT_FAIL(MPT_ENOMEM, "cannot allocate an event snapshot on cuda:%d", dev);
    sn->dev = dev;
    e = cudaEventCreateWithFlags(&sn->ev, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&sn->helper, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
      if (sn->ev) (void)cudaEventDestroy(sn->ev);
      free(sn);
      return mpt__cuda_fail(e, "creating an event snapshot", __FILE__, __LINE__, dev);
    }
  }
  const cudaStream_t helper = sn->helper;
  pthread_mutex_lock(&ev->mutex); /* the record and its stream's cell, together */
  sn->cell = ev->cell;
  if (sn->cell) cell_ref(sn->cell);
  e = cudaStreamWaitEvent(helper, ev->ev, 0); /* binds to the record current now */
  pthread_mutex_unlock(&ev->mutex);
  if (e == cudaSuccess) e = cudaEventRecord(sn->ev, helper);
  if (e != cudaSuccess) {
    cell_unref(sn->cell);
    sn->cell = NULL;
    (void)cudaEventDestroy(sn->ev);
    (void)cudaStreamDestroy(sn->helper);
    free(sn);
    return mpt__cuda_fail(e, "capturing an event's record", __FILE__, __LINE__, dev);
  }
  *token = (uint64_t)(uintptr_t)sn;
  return MPT_OK;
}

mpt_status mpt__cuda_event_wait_captured(mpt_event *ev, uint64_t token, double timeout_ms) {
  snapshot *sn = (snapshot *)(uintptr_t)token;
  if (!sn) return mpt__cuda_event_synchronize(ev, timeout_ms);
  mpt_status st = mpt__cuda_use(sn->dev);
  if (st == MPT_OK)
    st = mpt__cuda_poll_event(sn->ev, sn->dev, timeout_ms, "wait for a captured event record");
  if (st == MPT_OK && sn->cell) st = cell_raise(sn->cell);
  char detail[1024] = "";
  if (st != MPT_OK) snprintf(detail, sizeof detail, "%s", mpt_last_error());
  if (st == MPT_ETIMEOUT && timeout_ms > 0) { /* still pending on the device: never reuse it */
    cell_unref(sn->cell);
    return mpt_error_set(st, "%s", detail);
  }
  if (st == MPT_ETIMEOUT) { /* a release (timeout 0) of a pending snapshot: leak it too */
    cell_unref(sn->cell);
    return st;
  }
  cell_unref(sn->cell);
  sn->cell = NULL;
  pthread_mutex_lock(&snap_mutex);
  sn->next = snap_free;
  snap_free = sn;
  pthread_mutex_unlock(&snap_mutex);
  return st == MPT_OK ? MPT_OK : mpt_error_set(st, "%s", detail);
}
