/* The CUDA caching allocator: mpt_device_alloc / mpt_device_free on a CUDA device. cudaMalloc
 * and cudaFree synchronise the device and cost tens of microseconds, so blocks are kept and
 * reused: after warm-up a training step makes no cudaMalloc or cudaFree call.
 *
 * Per device: a mutex; every block ever allocated in a hash map keyed by its pointer (free
 * gets no size); size classes, four per power of two from 512 bytes (a request is rounded up to
 * its class, wasting at most 25%), each with a list of ready blocks; and a list of pending
 * blocks.
 *
 * Stream safety. The allocator is not told which stream uses a block, and a block freed by the
 * host may still be read or written by work queued on any stream. So a freed block goes to the
 * pending list first. When an allocation finds no ready block of its class and blocks are
 * pending, the allocator records a fence event on every live CUDA stream of the device (the
 * backend registers them) and on the legacy default stream, waits for the fences with a
 * deadline, and then moves every pending block to the ready lists: work enqueued before the
 * free has finished. (Work enqueued after the free on a freed block is a use after free.) If
 * the fences miss the deadline the blocks stay pending and a fresh block is allocated instead.
 * When cudaMalloc runs out of memory, the cached blocks are returned to the driver and the
 * allocation is tried once more.
 *
 * Invariants: a block is in exactly one state: in use (owned by the caller), pending, or ready
 * (on the list of its class); stats.in_use_nbytes sums the in-use blocks' class sizes and
 * stats.reserved_nbytes every block's. Thread-safe; the fence wait holds the device's mutex. */
#include <stdlib.h>

#include "core/cuda/cuda_internal.h"
#include "core/error.h"

#define MIN_SHIFT 9                          /* smallest class: 512 bytes */
#define NCLASSES (1 + (64 - MIN_SHIFT) * 4)
#define MAX_NBYTES ((size_t)1 << 60)
#define FENCE_TIMEOUT_MS 10000.0

enum { BLOCK_IN_USE, BLOCK_PENDING, BLOCK_READY };

typedef struct block {
  void *ptr;
  size_t nbytes; /* the class size */
  int cls;
  int state;
  struct block *map_next;  /* hash chain */
  struct block *list_next; /* ready list of its class, or the pending list */
} block;

typedef struct dev_alloc {
  pthread_mutex_t mutex;
  int index;
  block **map; /* map_cap chains (a power of two) */
  size_t map_cap, map_count;
  block *ready[NCLASSES];
  block *pending;
  mpt_stream *live;         /* live streams of this device (next_live) */
  cudaEvent_t legacy_fence; /* NULL until the first reclaim */
  mpt__cuda_alloc_stats stats;
} dev_alloc;

static pthread_once_t devs_once = PTHREAD_ONCE_INIT;
static dev_alloc *devs;
static int ndevs;

static void devs_init(void) {
  const int n = mpt__cuda_count();
  if (n <= 0 || !(devs = calloc((size_t)n, sizeof *devs))) return;
  for (int i = 0; i < n; i++) {
    pthread_mutex_init(&devs[i].mutex, NULL);
    devs[i].index = i;
  }
  ndevs = n;
}

static dev_alloc *dev_get(int index) {
  pthread_once(&devs_once, devs_init);
  return index >= 0 && index < ndevs ? &devs[index] : NULL;
}

/* Rounds nbytes up to its class: 512, then 2^e + q * 2^(e-2) for q = 1..4. */
static size_t class_of(size_t nbytes, int *cls) {
  if (nbytes <= ((size_t)1 << MIN_SHIFT)) {
    *cls = 0;
    return (size_t)1 << MIN_SHIFT;
  }
  const int e = 63 - __builtin_clzll((unsigned long long)(nbytes - 1)); /* 2^e < nbytes */
  const size_t step = (size_t)1 << (e - 2);
  const size_t q = (nbytes - 1 - ((size_t)1 << e)) / step + 1; /* 1..4 */
  *cls = 1 + (e - MIN_SHIFT) * 4 + (int)(q - 1);
  return ((size_t)1 << e) + q * step;
}

static size_t hash_ptr(const void *p, size_t cap) {
  return (size_t)((((uintptr_t)p >> MIN_SHIFT) * 0x9e3779b97f4a7c15ULL) >> 20) & (cap - 1);
}

static block *map_find(dev_alloc *d, const void *p) {
  if (!d->map) return NULL;
  for (block *b = d->map[hash_ptr(p, d->map_cap)]; b; b = b->map_next)
    if (b->ptr == p) return b;
  return NULL;
}

/* Inserts b, doubling the table at load 1. Errors: MPT_ENOMEM. */
static mpt_status map_insert(dev_alloc *d, block *b) {
  if (d->map_count + 1 > d->map_cap) {
    const size_t cap = d->map_cap ? d->map_cap * 2 : 256;
    block **map = calloc(cap, sizeof *map);
    if (!map) return MPT_FAIL(MPT_ENOMEM, "cuda allocator: no host memory for its block map");
    for (size_t i = 0; i < d->map_cap; i++)
      for (block *x = d->map[i], *next; x; x = next) {
        next = x->map_next;
        const size_t h = hash_ptr(x->ptr, cap);
        x->map_next = map[h];
        map[h] = x;
      }
    free(d->map);
    d->map = map;
    d->map_cap = cap;
  }
  const size_t h = hash_ptr(b->ptr, d->map_cap);
  b->map_next = d->map[h];
  d->map[h] = b;
  d->map_count++;
  return MPT_OK;
}

static void map_remove(dev_alloc *d, block *b) {
  block **pp = &d->map[hash_ptr(b->ptr, d->map_cap)];
  while (*pp && *pp != b) pp = &(*pp)->map_next;
  if (*pp) {
    *pp = b->map_next;
    d->map_count--;
  }
}

/* Waits until the work enqueued so far on every stream of the device has run, then makes the
 * pending blocks ready. Called with d->mutex held and the device current. */
static mpt_status reclaim(dev_alloc *d) {
  const int dev = d->index;
  for (mpt_stream *s = d->live; s; s = s->next_live)
    MPT_CUDA_RETURN_IF(cudaEventRecord(s->fence_event, s->cs), dev);
  if (!d->legacy_fence)
    MPT_CUDA_RETURN_IF(cudaEventCreateWithFlags(&d->legacy_fence, cudaEventDisableTiming), dev);
  MPT_CUDA_RETURN_IF(cudaEventRecord(d->legacy_fence, cudaStreamLegacy), dev);
  const double start = mpt_time_ms();
  for (mpt_stream *s = d->live; s; s = s->next_live) {
    const double left = FENCE_TIMEOUT_MS - (mpt_time_ms() - start);
    MPT_RETURN_IF(mpt__cuda_poll_event(s->fence_event, dev, left > 0 ? left : 0,
                                       "allocator fence (a stream's work before a free)"));
  }
  MPT_RETURN_IF(mpt__cuda_poll_event(d->legacy_fence, dev, FENCE_TIMEOUT_MS,
                                     "allocator fence (the legacy stream)"));
  for (block *b = d->pending, *next; b; b = next) {
    next = b->list_next;
    b->state = BLOCK_READY;
    b->list_next = d->ready[b->cls];
    d->ready[b->cls] = b;
  }
  d->pending = NULL;
  d->stats.fence_waits++;
  return MPT_OK;
}

/* Returns the ready blocks (after reclaiming the pending ones, if their fences complete) to the
 * driver. Called with d->mutex held and the device current. */
static mpt_status release_cached(dev_alloc *d) {
  mpt_status st = d->pending ? reclaim(d) : MPT_OK;
  for (int c = 0; c < NCLASSES; c++)
    while (d->ready[c]) {
      block *b = d->ready[c];
      d->ready[c] = b->list_next;
      const cudaError_t e = cudaFree(b->ptr);
      if (e != cudaSuccess && st == MPT_OK)
        st = mpt__cuda_fail(e, "cudaFree(b->ptr)", __FILE__, __LINE__, d->index);
      d->stats.reserved_nbytes -= b->nbytes;
      map_remove(d, b);
      free(b);
    }
  return st;
}

static block *pop_ready(dev_alloc *d, int cls) {
  block *b = d->ready[cls];
  if (b) {
    d->ready[cls] = b->list_next;
    d->stats.cache_hits++;
  }
  return b;
}

mpt_status mpt__cuda_alloc(int index, size_t nbytes, void **ptr) {
  *ptr = NULL;
  MPT_RETURN_IF(mpt__cuda_use(index));
  dev_alloc *d = dev_get(index);
  if (!d) return MPT_FAIL(MPT_ENOMEM, "cuda allocator: no host memory for its state");
  if (nbytes > MAX_NBYTES)
    return MPT_FAIL(MPT_ENOMEM, "cannot allocate %zu bytes on cuda:%d", nbytes, index);
  int cls;
  const size_t size = class_of(nbytes, &cls);
  mpt_status st = MPT_OK;
  pthread_mutex_lock(&d->mutex);
  block *b = pop_ready(d, cls);
  if (!b && d->pending && reclaim(d) == MPT_OK) b = pop_ready(d, cls);
  if (!b) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) { /* give the cache back and try once more */
      (void)cudaGetLastError();
      (void)release_cached(d);
      e = cudaMalloc(&p, size);
    }
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      st = MPT_FAIL(e == cudaErrorMemoryAllocation ? MPT_ENOMEM : MPT_EDEVICE,
                    "cudaMalloc of %zu bytes (class %zu) failed on cuda:%d with %zu bytes "
                    "reserved: %s (%s)", nbytes, size, index, d->stats.reserved_nbytes,
                    cudaGetErrorName(e), cudaGetErrorString(e));
      goto done;
    }
    if (!(b = malloc(sizeof *b))) {
      (void)cudaFree(p);
      st = MPT_FAIL(MPT_ENOMEM, "cuda allocator: no host memory for a block record");
      goto done;
    }
    *b = (block){.ptr = p, .nbytes = size, .cls = cls};
    if ((st = map_insert(d, b)) != MPT_OK) {
      (void)cudaFree(p);
      free(b);
      goto done;
    }
    d->stats.malloc_count++;
    d->stats.reserved_nbytes += size;
  }
  b->state = BLOCK_IN_USE;
  b->list_next = NULL;
  d->stats.in_use_nbytes += b->nbytes;
  *ptr = b->ptr;
done:
  pthread_mutex_unlock(&d->mutex);
  return st;
}

void mpt__cuda_free(int index, void *ptr) {
  dev_alloc *d = dev_get(index);
  if (!ptr || !d) return;
  pthread_mutex_lock(&d->mutex);
  block *b = map_find(d, ptr);
  const int ok = b && b->state == BLOCK_IN_USE;
  if (ok) {
    b->state = BLOCK_PENDING;
    b->list_next = d->pending;
    d->pending = b;
    d->stats.in_use_nbytes -= b->nbytes;
  }
  pthread_mutex_unlock(&d->mutex);
  if (!ok) /* cannot return an error: say it loudly */
    MPT_LOG_ERR("mpt_device_free: %p was not allocated on cuda:%d or was freed twice", ptr,
                index);
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

mpt_status mpt__cuda_alloc_get_stats(int index, mpt__cuda_alloc_stats *stats) {
  dev_alloc *d = dev_get(index);
  if (!d || !stats)
    return MPT_FAIL(MPT_EINVAL, "cuda allocator stats: cuda:%d is not present", index);
  pthread_mutex_lock(&d->mutex);
  *stats = d->stats;
  pthread_mutex_unlock(&d->mutex);
  return MPT_OK;
}

mpt_status mpt__cuda_alloc_empty_cache(int index) {
  dev_alloc *d = dev_get(index);
  if (!d) return MPT_FAIL(MPT_EINVAL, "cuda allocator: cuda:%d is not present", index);
  MPT_RETURN_IF(mpt__cuda_use(index));
  pthread_mutex_lock(&d->mutex);
  const mpt_status st = release_cached(d);
  pthread_mutex_unlock(&d->mutex);
  return st;
}
