/* The CUDA caching allocator: mpt_device_alloc / mpt_device_free on a CUDA device. cudaMalloc
 * and cudaFree synchronise the device and cost tens of microseconds, so blocks are kept and
 * reused: after warm-up a training step makes no cudaMalloc or cudaFree call.
 *
 * The cache itself (size classes, block map, fencing of freed blocks) is alloc_cache.c; this
 * file is its CUDA backend, one per device: cudaMalloc / cudaFree, and fences. A fence is one
 * event recorded on every live CUDA stream of the device (the backend registers them) and on
 * the legacy default stream, plus a ticket of every host source registered for the device:
 * workers that issue copies into device memory LATER than the caller enqueued them (the staged
 * MPI backend's stage_in / stage_out, comm_stage.c), whose queued copies no CUDA stream shows
 * yet. A fence completes when every event has and every source has finished the work it had
 * queued at the fence. Fences are queried on the allocation path, and waited for (with a
 * deadline, without the cache's mutex) only when cudaMalloc runs out of memory and by
 * mpt__cuda_alloc_empty_cache. (Work enqueued after the free on a freed block is a use after
 * free.)
 *
 * Locks: the cache's mutex, then the device's `mutex` (live streams, host sources, the fence
 * pool). Thread-safe. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "core/cuda/alloc_cache.h"
#include "core/cuda/cuda_internal.h"
#include "mpitrain/core.h"

#define EMPTY_TIMEOUT_MS 20000.0

/* Never freed: a fence may still point at a removed source, which then counts as done (its
 * owner is gone, and with it every copy it could issue). */
typedef struct host_source {
  mpt__cuda_host_source src;
  int gone;
  struct host_source *next;
} host_source;

typedef struct fence {
  int nev, cap;
  cudaEvent_t *ev; /* [cap], created on demand, reused */
  int nsrc, src_cap;
  host_source **src; /* [src_cap] */
  uint64_t *ticket;  /* [src_cap] */
  struct fence *next_free;
} fence;

typedef struct dev_alloc {
  int index;
  pthread_mutex_t mutex;
  mpt_stream *live; /* live streams of this device (next_live) */
  host_source *sources; /* every one ever added (removed ones are marked gone) */
  fence *fence_free;
  mpt__alloc_cache *cache;
} dev_alloc;

static pthread_once_t devs_once = PTHREAD_ONCE_INIT;
static dev_alloc *devs;
static int ndevs;

/* ---- the backend of alloc_cache.c ---- */

static mpt_status op_malloc(void *ctx, size_t nbytes, void **ptr) {
  dev_alloc *d = ctx;
  const cudaError_t e = cudaMalloc(ptr, nbytes);
  if (e == cudaSuccess) return MPT_OK;
  (void)cudaGetLastError();
  *ptr = NULL;
  return MPT_FAIL(e == cudaErrorMemoryAllocation ? MPT_ENOMEM : MPT_EDEVICE,
                  "cudaMalloc of %zu bytes failed on cuda:%d: %s (%s)", nbytes, d->index,
                  cudaGetErrorName(e), cudaGetErrorString(e));
}

static void op_free(void *ctx, void *ptr) {
  dev_alloc *d = ctx;
  const cudaError_t e = cudaFree(ptr);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    mpt_log(MPT_LOG_ERROR, "cudaFree failed on cuda:%d: %s", d->index, cudaGetErrorString(e));
  }
}

static int grow(void **a, int *cap, int need, size_t elem) {
  if (need <= *cap) return 1;
  const int n = need > 2 * *cap ? need : 2 * *cap;
  void *p = realloc(*a, (size_t)n * elem);
  if (!p) return 0;
  *a = p;
  *cap = n;
  return 1;
}

static mpt_status op_fence_record(void *ctx, void **out) {
  dev_alloc *d = ctx;
  mpt_status st = MPT_OK;
  pthread_mutex_lock(&d->mutex);
  fence *f = d->fence_free;
  if (f) {
    d->fence_free = f->next_free;
  } else if (!(f = calloc(1, sizeof *f))) {
    st = MPT_FAIL(MPT_ENOMEM, "cuda allocator: no host memory for a fence");
    goto done;
  }
  int nev = 1, nsrc = 0;
  for (mpt_stream *s = d->live; s; s = s->next_live) nev++;
  for (host_source *h = d->sources; h; h = h->next) nsrc += !h->gone;
  const int old_cap = f->cap;
  if (!grow((void **)&f->ev, &f->cap, nev, sizeof *f->ev) ||
      !grow((void **)&f->src, &f->src_cap, nsrc, sizeof *f->src) ||
      (f->src_cap && !(f->ticket = realloc(f->ticket, (size_t)f->src_cap * sizeof *f->ticket)))) {
    st = MPT_FAIL(MPT_ENOMEM, "cuda allocator: no host memory for a fence");
    goto give_back;
  }
  for (int k = old_cap; k < f->cap; k++) f->ev[k] = NULL;
  f->nev = f->nsrc = 0;
  for (int k = 0; k < nev; k++)
    if (!f->ev[k] && cudaEventCreateWithFlags(&f->ev[k], cudaEventDisableTiming) != cudaSuccess) {
      f->ev[k] = NULL;
      st = mpt__cuda_fail(cudaGetLastError(), "cudaEventCreateWithFlags (allocator fence)",
                          __FILE__, __LINE__, d->index);
      goto give_back;
    }
  cudaError_t e = cudaEventRecord(f->ev[f->nev++], cudaStreamLegacy);
  for (mpt_stream *s = d->live; s && e == cudaSuccess; s = s->next_live)
    e = cudaEventRecord(f->ev[f->nev++], s->cs);
  if (e != cudaSuccess) {
    st = mpt__cuda_fail(e, "cudaEventRecord (allocator fence)", __FILE__, __LINE__, d->index);
    goto give_back;
  }
  for (host_source *h = d->sources; h; h = h->next) {
    if (h->gone) continue;
    f->src[f->nsrc] = h;
    f->ticket[f->nsrc++] = h->src.ticket(h->src.ctx);
  }
  *out = f;
  goto done;
give_back:
  f->next_free = d->fence_free;
  d->fence_free = f;
done:
  pthread_mutex_unlock(&d->mutex);
  return st;
}

/* 1 when the source finished the work queued at the ticket (or is gone). Takes d->mutex, so a
 * source is never asked after its removal returned. */
static int source_done(dev_alloc *d, host_source *h, uint64_t ticket) {
  pthread_mutex_lock(&d->mutex);
  const int done = h->gone || h->src.done(h->src.ctx, ticket);
  pthread_mutex_unlock(&d->mutex);
  return done;
}

static int op_fence_query(void *ctx, void *fp) {
  dev_alloc *d = ctx;
  fence *f = fp;
  for (int k = 0; k < f->nev; k++) {
    const cudaError_t e = cudaEventQuery(f->ev[k]);
    if (e == cudaSuccess) continue;
    if (e == cudaErrorNotReady) {
      mpt__cuda_clear_not_ready();
      return 0;
    }
    (void)cudaGetLastError();
    mpt_log(MPT_LOG_ERROR, "allocator fence on cuda:%d failed: %s; its blocks are not reused",
            d->index, cudaGetErrorString(e));
    return -1;
  }
  for (int k = 0; k < f->nsrc; k++)
    if (!source_done(d, f->src[k], f->ticket[k])) return 0;
  return 1;
}

static mpt_status op_fence_wait(void *ctx, void *fp, double timeout_ms) {
  dev_alloc *d = ctx;
  fence *f = fp;
  const double start = mpt_time_ms();
  MPT_RETURN_IF(mpt__cuda_use(d->index));
  for (int k = 0; k < f->nev; k++) {
    const double left = timeout_ms - (mpt_time_ms() - start);
    MPT_RETURN_IF(mpt__cuda_poll_event(f->ev[k], d->index, left > 0 ? left : 0,
                                       "allocator fence (a stream's work before a free)"));
  }
  for (int k = 0; k < f->nsrc; k++) {
    long sleep_ns = 20000;
    while (!source_done(d, f->src[k], f->ticket[k])) {
      if (mpt_time_ms() - start > timeout_ms)
        return MPT_FAIL(MPT_ETIMEOUT, "allocator fence on cuda:%d: a host worker's queued copies "
                        "did not finish within %.0f ms", d->index, timeout_ms);
      const struct timespec ts = {0, sleep_ns};
      nanosleep(&ts, NULL);
      if (sleep_ns < 1000000) sleep_ns *= 2;
    }
  }
  return MPT_OK;
}

static void op_fence_release(void *ctx, void *fp) {
  dev_alloc *d = ctx;
  fence *f = fp;
  pthread_mutex_lock(&d->mutex);
  f->next_free = d->fence_free;
  d->fence_free = f;
  pthread_mutex_unlock(&d->mutex);
}

/* ---- devices ---- */

static void devs_init(void) {
  const int n = mpt__cuda_count();
  if (n <= 0 || !(devs = calloc((size_t)n, sizeof *devs))) return;
  for (int i = 0; i < n; i++) {
    dev_alloc *d = &devs[i];
    pthread_mutex_init(&d->mutex, NULL);
    d->index = i;
    const mpt__alloc_ops ops = {d, op_malloc, op_free, op_fence_record, op_fence_query,
                                op_fence_wait, op_fence_release};
    if (mpt__alloc_cache_init(&d->cache, &ops) != MPT_OK) return; /* ndevs stays 0 */
  }
  ndevs = n;
}

static dev_alloc *dev_get(int index) {
  pthread_once(&devs_once, devs_init);
  return index >= 0 && index < ndevs ? &devs[index] : NULL;
}

mpt_status mpt__cuda_alloc(int index, size_t nbytes, void **ptr) {
  *ptr = NULL;
  MPT_RETURN_IF(mpt__cuda_use(index));
  dev_alloc *d = dev_get(index);
  if (!d) return MPT_FAIL(MPT_ENOMEM, "cuda allocator: no host memory for its state");
  const mpt_status st = mpt__alloc_cache_alloc(d->cache, nbytes, ptr);
  if (st == MPT_OK) return MPT_OK;
  char detail[768];
  snprintf(detail, sizeof detail, "%s", mpt_last_error());
  mpt__alloc_stats s;
  mpt__alloc_cache_get_stats(d->cache, &s);
  return mpt_error_set(st, "%s (cuda:%d, %zu bytes asked, %zu bytes reserved)", detail, index,
                       nbytes, s.reserved_nbytes);
}

void mpt__cuda_free(int index, void *ptr) {
  dev_alloc *d = dev_get(index);
  if (!ptr || !d) return;
  if (mpt__alloc_cache_release(d->cache, ptr) != MPT_OK) /* cannot return an error: say it */
    mpt_log(MPT_LOG_ERROR, "mpt_device_free on cuda:%d: %s", index, mpt_last_error());
}

void mpt__cuda_alloc_add_stream(int index, mpt_stream *s) {
  dev_alloc *d = dev_get(index);
  if (!d) return;
  pthread_mutex_lock(&d->mutex);
  s->next_live = d->live;
  d->live = s;
  pthread_mutex_unlock(&d->mutex);
}

void mpt__cuda_alloc_remove_stream(int index, mpt_stream *s) {
  dev_alloc *d = dev_get(index);
  if (!d) return;
  pthread_mutex_lock(&d->mutex);
  mpt_stream **pp = &d->live;
  while (*pp && *pp != s) pp = &(*pp)->next_live;
  if (*pp) *pp = s->next_live;
  pthread_mutex_unlock(&d->mutex);
}

mpt_status mpt__cuda_alloc_add_host_source(int index, const mpt__cuda_host_source *src) {
  dev_alloc *d = dev_get(index);
  if (!d || !src) return MPT_FAIL(MPT_EINVAL, "cuda allocator: cuda:%d is not present", index);
  host_source *h = calloc(1, sizeof *h);
  if (!h) return MPT_FAIL(MPT_ENOMEM, "cuda allocator: no host memory for a host source");
  h->src = *src;
  pthread_mutex_lock(&d->mutex);
  h->next = d->sources;
  d->sources = h;
  pthread_mutex_unlock(&d->mutex);
  return MPT_OK;
}

void mpt__cuda_alloc_remove_host_source(int index, void *ctx) {
  dev_alloc *d = dev_get(index);
  if (!d) return;
  pthread_mutex_lock(&d->mutex);
  for (host_source *h = d->sources; h; h = h->next)
    if (h->src.ctx == ctx) h->gone = 1;
  pthread_mutex_unlock(&d->mutex);
}

mpt_status mpt__cuda_alloc_get_stats(int index, mpt__cuda_alloc_stats *stats) {
  dev_alloc *d = dev_get(index);
  if (!d || !stats)
    return MPT_FAIL(MPT_EINVAL, "cuda allocator stats: cuda:%d is not present", index);
  mpt__alloc_stats s;
  mpt__alloc_cache_get_stats(d->cache, &s);
  *stats = (mpt__cuda_alloc_stats){s.reserved_nbytes, s.in_use_nbytes, s.malloc_count,
                                   s.cache_hits, s.fence_waits};
  return MPT_OK;
}

mpt_status mpt__cuda_alloc_empty_cache(int index) {
  dev_alloc *d = dev_get(index);
  if (!d) return MPT_FAIL(MPT_EINVAL, "cuda allocator: cuda:%d is not present", index);
  MPT_RETURN_IF(mpt__cuda_use(index));
  return mpt__alloc_cache_empty(d->cache, EMPTY_TIMEOUT_MS);
}
