/* The caching allocator's logic without CUDA (alloc_cache.c): size classes, the block map, and
 * the fencing of freed blocks, driven through a table of functions that cuda_alloc.c fills for
 * a CUDA device and tests/test_alloc_cache.c with a fake backend. Plain C; compiled in every
 * build. */
#ifndef MPT_CORE_CUDA_ALLOC_CACHE_H
#define MPT_CORE_CUDA_ALLOC_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "mpitrain/core.h"

/* The backend of one device. Every slot is called with the cache's mutex held except
 * fence_wait, which is called WITHOUT it (it may block). */
typedef struct mpt__alloc_ops {
  void *ctx;
  /* Device memory: MPT_OK, MPT_ENOMEM (out of memory: the cache then returns what it holds
   * and tries once more), or another error (with its detail recorded). */
  mpt_status (*malloc)(void *ctx, size_t nbytes, void **ptr);
  void (*free)(void *ctx, void *ptr);
  /* A fence after the work queued so far on every stream that may use the device's memory
   * (the CUDA streams of the device, the legacy stream, host workers that issue copies later).
   * Must not wait. */
  mpt_status (*fence_record)(void *ctx, void **fence);
  /* 1: every part of the fence completed; 0: not yet; -1: failed (the blocks it guards are
   * never reused). Must not wait. */
  int (*fence_query)(void *ctx, void *fence);
  /* Waits for the fence, at most timeout_ms. MPT_OK, MPT_ETIMEOUT, or the device's error. */
  mpt_status (*fence_wait)(void *ctx, void *fence, double timeout_ms);
  void (*fence_release)(void *ctx, void *fence);
} mpt__alloc_ops;

typedef struct mpt__alloc_stats {
  size_t reserved_nbytes; /* held from the backend: in use + cached + pending */
  size_t in_use_nbytes;   /* handed out (rounded to the size class) */
  int64_t malloc_count;   /* backend allocations so far (flat after warm-up) */
  int64_t cache_hits;     /* allocations served from the cache */
  int64_t fence_waits;    /* times the cache WAITED for fences (only when memory ran out) */
  int64_t fences;         /* fences recorded */
} mpt__alloc_stats;

typedef struct mpt__alloc_cache mpt__alloc_cache;

/* Errors: MPT_ENOMEM. `ops` is copied. */
mpt_status mpt__alloc_cache_init(mpt__alloc_cache **cache, const mpt__alloc_ops *ops);
/* Returns every block to the backend (in use ones too: the device is going away). */
void mpt__alloc_cache_free_all(mpt__alloc_cache *cache);

/* A block of at least nbytes (nbytes 0: NULL, MPT_OK). A miss first retires the pending blocks
 * whose fences completed (queried, never waited for), fences the blocks freed since the last
 * fence, then asks the backend; only when the backend is out of memory does it wait for the
 * fences, without the lock, with a deadline (then returns the cache and tries once more).
 * Errors: MPT_ENOMEM, the backend's. */
mpt_status mpt__alloc_cache_alloc(mpt__alloc_cache *cache, size_t nbytes, void **ptr);
/* Frees a block: it becomes pending (work queued on any stream may still use it) until a fence
 * recorded after the free completes. Errors: MPT_EINVAL (not from this cache, or freed twice).
 * NULL is a no-op. */
mpt_status mpt__alloc_cache_release(mpt__alloc_cache *cache, void *ptr);
/* Waits (without the lock, deadline timeout_ms) for the pending blocks' fences, then returns
 * every cached block to the backend. Blocks in use are untouched. Errors: MPT_ETIMEOUT (the
 * blocks whose fences did not complete stay pending), the backend's. */
mpt_status mpt__alloc_cache_empty(mpt__alloc_cache *cache, double timeout_ms);
void mpt__alloc_cache_get_stats(mpt__alloc_cache *cache, mpt__alloc_stats *stats);
/* For tests: 1 when the cache's mutex is free now (a trylock that succeeded), else 0. */
int mpt__alloc_cache_unlocked(mpt__alloc_cache *cache);

#endif
