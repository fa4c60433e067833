/* The caching allocator's logic (alloc_cache.h), without CUDA: cuda_alloc.c fills the backend
 * table for a CUDA device; tests/test_alloc_cache.c drives it with a fake one.
 *
 * Blocks. Every block ever taken from the backend is in a hash map keyed by its pointer (free
 * gets no size). Size classes, four per power of two from 512 bytes (a request is rounded up to
 * its class, wasting at most 25%), each with a list of ready blocks.
 *
 * Fencing. The cache is not told which stream uses a block, and a freed block may still be read
 * or written by work queued on any stream. A freed block is first "unfenced"; at the next miss
 * the unfenced blocks are grouped under ONE fence recorded then (after all work queued so far,
 * so after every use before the free); a group whose fence has completed is retired into the
 * ready lists. Fences are only QUERIED on the allocation path, never waited for, and never by a
 * thread holding the mutex: a miss whose fences are not done yet takes a fresh block from the
 * backend instead. Only when the backend is out of memory does the allocating thread wait for
 * the groups' fences, with a deadline, after taking them out of the lists and releasing the
 * mutex (other threads allocate and free meanwhile), then give the cache back to the backend
 * and try once more. A group whose fence failed keeps its blocks forever (never reused).
 *
 * Invariants: a block is in exactly one place: in use (owned by the caller), unfenced, in one
 * fence group (possibly taken out by a waiter), or ready (on its class's list);
 * stats.in_use_nbytes sums the in-use blocks' class sizes and stats.reserved_nbytes every
 * block's. Thread-safe. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/cuda/alloc_cache.h"
#include "mpitrain/core.h"

#define MIN_SHIFT 9                          /* smallest class: 512 bytes */
#define NCLASSES (1 + (64 - MIN_SHIFT) * 4)
#define MAX_NBYTES ((size_t)1 << 60)
#define OOM_FENCE_TIMEOUT_MS 10000.0

enum { BLOCK_IN_USE, BLOCK_PENDING, BLOCK_READY };

typedef struct block {
  void *ptr;
  size_t nbytes; /* the class size */
  int cls;
  int state;
  struct block *map_next;  /* hash chain */
  struct block *list_next; /* ready list of its class, the unfenced list, or its group's */
} block;

typedef struct group {
  void *fence;
  block *blocks;
  int failed; /* its fence failed: the blocks are never reused */
  struct group *next;
} group;

struct mpt__alloc_cache {
  pthread_mutex_t mutex;
  mpt__alloc_ops ops;
  block **map; /* map_cap chains (a power of two) */
  size_t map_cap, map_count;
  block *ready[NCLASSES];
  block *unfenced; /* freed since the last fence */
  group *groups;   /* fenced, not retired yet (newest first) */
  mpt__alloc_stats stats;
};

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

static block *map_find(mpt__alloc_cache *c, const void *p) {
  if (!c->map) return NULL;
  for (block *b = c->map[hash_ptr(p, c->map_cap)]; b; b = b->map_next)
    if (b->ptr == p) return b;
  return NULL;
}

/* Inserts b, doubling the table at load 1. Errors: MPT_ENOMEM. */
static mpt_status map_insert(mpt__alloc_cache *c, block *b) {
  if (c->map_count + 1 > c->map_cap) {
    const size_t cap = c->map_cap ? c->map_cap * 2 : 256;
    block **map = calloc(cap, sizeof *map);
    if (!map) return MPT_FAIL(MPT_ENOMEM, "device allocator: no host memory for its block map");
    for (size_t i = 0; i < c->map_cap; i++)
      for (block *x = c->map[i], *next; x; x = next) {
        next = x->map_next;
        const size_t h = hash_ptr(x->ptr, cap);
        x->map_next = map[h];
        map[h] = x;
      }
    free(c->map);
    c->map = map;
    c->map_cap = cap;
  }
  const size_t h = hash_ptr(b->ptr, c->map_cap);
  b->map_next = c->map[h];
  c->map[h] = b;
  c->map_count++;
  return MPT_OK;
}

static void map_remove(mpt__alloc_cache *c, block *b) {
  block **pp = &c->map[hash_ptr(b->ptr, c->map_cap)];
  while (*pp && *pp != b) pp = &(*pp)->map_next;
  if (*pp) {
    *pp = b->map_next;
    c->map_count--;
  }
}

mpt_status mpt__alloc_cache_init(mpt__alloc_cache **cache, const mpt__alloc_ops *ops) {
  *cache = NULL;
  mpt__alloc_cache *c = calloc(1, sizeof *c);
  if (!c) return MPT_FAIL(MPT_ENOMEM, "device allocator: no host memory for its state");
  pthread_mutex_init(&c->mutex, NULL);
  c->ops = *ops;
  *cache = c;
  return MPT_OK;
}

/* Locked: blocks of a list to the ready lists. */
static void make_ready(mpt__alloc_cache *c, block *list) {
  for (block *b = list, *next; b; b = next) {
    next = b->list_next;
    b->state = BLOCK_READY;
    b->list_next = c->ready[b->cls];
    c->ready[b->cls] = b;
  }
}

/* Locked: retires every group whose fence has completed (queried, not waited for). */
static void retire_completed(mpt__alloc_cache *c) {
  for (group **pp = &c->groups; *pp;) {
    group *g = *pp;
    const int q = g->failed ? -1 : c->ops.fence_query(c->ops.ctx, g->fence);
    if (q < 0) g->failed = 1;
    if (q <= 0) {
      pp = &g->next;
      continue;
    }
    *pp = g->next;
    make_ready(c, g->blocks);
    c->ops.fence_release(c->ops.ctx, g->fence);
    free(g);
  }
}

/* Locked: puts the unfenced blocks under one new fence. */
static mpt_status fence_unfenced(mpt__alloc_cache *c) {
  if (!c->unfenced) return MPT_OK;
  group *g = calloc(1, sizeof *g);
  if (!g) return MPT_FAIL(MPT_ENOMEM, "device allocator: no host memory for a fence");
  const mpt_status st = c->ops.fence_record(c->ops.ctx, &g->fence);
  if (st != MPT_OK) {
    free(g);
    return st;
  }
  g->blocks = c->unfenced;
  c->unfenced = NULL;
  g->next = c->groups;
  c->groups = g;
  c->stats.fences++;
  return MPT_OK;
}

/* Locked on entry and exit; WAITS WITHOUT THE MUTEX: fences the unfenced blocks, takes every
 * group out of the list, waits for their fences (deadline), and retires those that completed;
 * the others go back. Returns the first error. */
static mpt_status wait_pending_unlocked(mpt__alloc_cache *c, double timeout_ms) {
  mpt_status st = fence_unfenced(c);
  group *mine = c->groups;
  c->groups = NULL;
  if (!mine) return st;
  c->stats.fence_waits++;
  pthread_mutex_unlock(&c->mutex);
  const double start = mpt_time_ms();
  char detail[1024] = "";
  for (group *g = mine; g; g = g->next) { /* failed: 1 = for ever, 2 = not in time */
    if (g->failed) {
      if (st == MPT_OK) {
        st = MPT_EDEVICE;
        snprintf(detail, sizeof detail, "a fence of the device allocator failed earlier: its "
                 "blocks are kept out of use");
      }
      continue;
    }
    const double left = timeout_ms - (mpt_time_ms() - start);
    const mpt_status w = c->ops.fence_wait(c->ops.ctx, g->fence, left > 0 ? left : 0);
    if (w == MPT_OK) continue;
    g->failed = w == MPT_ETIMEOUT ? 2 : 1;
    if (st == MPT_OK) {
      st = w;
      snprintf(detail, sizeof detail, "%s", mpt_last_error());
    }
  }
  pthread_mutex_lock(&c->mutex);
  for (group *g = mine, *next; g; g = next) {
    next = g->next;
    if (g->failed) { /* back into the list: still pending (2), or never reused (1) */
      if (g->failed == 2) g->failed = 0;
      g->next = c->groups;
      c->groups = g;
      continue;
    }
    make_ready(c, g->blocks);
    c->ops.fence_release(c->ops.ctx, g->fence);
    free(g);
  }
  if (st != MPT_OK && detail[0]) mpt_error_set(st, "%s", detail);
  return st;
}

/* Locked: the ready blocks back to the backend. */
static void release_ready(mpt__alloc_cache *c) {
  for (int k = 0; k < NCLASSES; k++)
    while (c->ready[k]) {
      block *b = c->ready[k];
      c->ready[k] = b->list_next;
      c->ops.free(c->ops.ctx, b->ptr);
      c->stats.reserved_nbytes -= b->nbytes;
      map_remove(c, b);
      free(b);
    }
}

static block *pop_ready(mpt__alloc_cache *c, int cls) {
  block *b = c->ready[cls];
  if (b) {
    c->ready[cls] = b->list_next;
    c->stats.cache_hits++;
  }
  return b;
}

mpt_status mpt__alloc_cache_alloc(mpt__alloc_cache *c, size_t nbytes, void **ptr) {
  *ptr = NULL;
  if (nbytes == 0) return MPT_OK;
  if (nbytes > MAX_NBYTES) return MPT_FAIL(MPT_ENOMEM, "cannot allocate %zu bytes", nbytes);
  int cls;
  const size_t size = class_of(nbytes, &cls);
  mpt_status st = MPT_OK;
  pthread_mutex_lock(&c->mutex);
  block *b = pop_ready(c, cls);
  if (!b && (c->groups || c->unfenced)) {
    retire_completed(c);
    b = pop_ready(c, cls);
    if (!b && c->unfenced && fence_unfenced(c) == MPT_OK) { /* idle streams: done at once */
      retire_completed(c);
      b = pop_ready(c, cls);
    }
  }
  if (!b) {
    void *p = NULL;
    st = c->ops.malloc(c->ops.ctx, size, &p);
    if (st == MPT_ENOMEM) { /* give the cache back (after its fences) and try once more */
      release_ready(c);
      (void)wait_pending_unlocked(c, OOM_FENCE_TIMEOUT_MS);
      b = pop_ready(c, cls);
      if (!b) {
        release_ready(c);
        st = c->ops.malloc(c->ops.ctx, size, &p);
      } else {
        st = MPT_OK;
      }
    }
    if (st != MPT_OK) goto done;
    if (!b) {
      if (!(b = malloc(sizeof *b))) {
        c->ops.free(c->ops.ctx, p);
        st = MPT_FAIL(MPT_ENOMEM, "device allocator: no host memory for a block record");
        goto done;
      }
      *b = (block){.ptr = p, .nbytes = size, .cls = cls};
      if ((st = map_insert(c, b)) != MPT_OK) {
        c->ops.free(c->ops.ctx, p);
        free(b);
        goto done;
      }
      c->stats.malloc_count++;
      c->stats.reserved_nbytes += size;
    }
  }
  b->state = BLOCK_IN_USE;
  b->list_next = NULL;
  c->stats.in_use_nbytes += b->nbytes;
  *ptr = b->ptr;
done:
  pthread_mutex_unlock(&c->mutex);
  return st;
}

mpt_status mpt__alloc_cache_release(mpt__alloc_cache *c, void *ptr) {
  if (!ptr) return MPT_OK;
  pthread_mutex_lock(&c->mutex);
  block *b = map_find(c, ptr);
  const int ok = b && b->state == BLOCK_IN_USE;
  if (ok) {
    b->state = BLOCK_PENDING;
    b->list_next = c->unfenced;
    c->unfenced = b;
    c->stats.in_use_nbytes -= b->nbytes;
  }
  pthread_mutex_unlock(&c->mutex);
  if (!ok)
    return MPT_FAIL(MPT_EINVAL, "%p was not allocated by this device's allocator or was freed "
                    "twice", ptr);
  return MPT_OK;
}

mpt_status mpt__alloc_cache_empty(mpt__alloc_cache *c, double timeout_ms) {
  pthread_mutex_lock(&c->mutex);
  retire_completed(c);
  const mpt_status st = wait_pending_unlocked(c, timeout_ms);
  release_ready(c);
  pthread_mutex_unlock(&c->mutex);
  return st;
}

void mpt__alloc_cache_free_all(mpt__alloc_cache *c) {
  if (!c) return;
  for (group *g = c->groups, *next; g; g = next) {
    next = g->next;
    c->ops.fence_release(c->ops.ctx, g->fence);
    free(g);
  }
  for (size_t i = 0; i < c->map_cap; i++)
    for (block *b = c->map[i], *next; b; b = next) {
      next = b->map_next;
      c->ops.free(c->ops.ctx, b->ptr);
      free(b);
    }
  free(c->map);
  pthread_mutex_destroy(&c->mutex);
  free(c);
}

void mpt__alloc_cache_get_stats(mpt__alloc_cache *c, mpt__alloc_stats *stats) {
  pthread_mutex_lock(&c->mutex);
  *stats = c->stats;
  pthread_mutex_unlock(&c->mutex);
}

int mpt__alloc_cache_unlocked(mpt__alloc_cache *c) {
  if (pthread_mutex_trylock(&c->mutex) != 0) return 0;
  pthread_mutex_unlock(&c->mutex);
  return 1;
}
