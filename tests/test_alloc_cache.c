/* Tests of the caching allocator's logic (src/core/cuda/alloc_cache.c) against a fake backend
 * table: a fake device memory with a limit, and fences that complete only when the test says
 * so. What the CUDA allocator must do on a GPU: a freed block is never reused
 * before a fence recorded after its free has completed; an allocation never WAITS for a fence
 * while memory lasts (it takes a fresh block); only out of memory does it wait, without holding
 * the cache's lock; a failed fence keeps its blocks out of use for good. No device. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/cuda/alloc_cache.h"
#include "mpitrain/core.h"
#include "check_util.h"


enum { MAX_FENCES = 256 };

typedef struct fake {
  mpt__alloc_cache *cache;
  size_t limit, used; /* bytes the fake device has and hands out */
  uintptr_t next_addr;
  int nfences;
  int state[MAX_FENCES];  /* 0 pending, 1 done, -1 failed */
  int complete_in_wait;   /* fence_wait completes the fence (else it times out) */
  int waits, waits_unlocked, mallocs, frees;
  size_t sizes[4096];
} fake;

static mpt_status f_malloc(void *ctx, size_t nbytes, void **ptr) {
  fake *f = ctx;
  if (f->used + nbytes > f->limit) return MPT_FAIL(MPT_ENOMEM, "fake device out of memory");
  f->used += nbytes;
  f->next_addr += 1 << 20;
  *ptr = (void *)f->next_addr;
  f->sizes[(f->next_addr >> 20) % 4096] = nbytes;
  f->mallocs++;
  return MPT_OK;
}

static void f_free(void *ctx, void *ptr) {
  fake *f = ctx;
  f->used -= f->sizes[((uintptr_t)ptr >> 20) % 4096];
  f->frees++;
}

static mpt_status f_fence_record(void *ctx, void **fence) {
  fake *f = ctx;
  ck_assert_int_lt(f->nfences, MAX_FENCES);
  f->state[f->nfences] = 0;
  *fence = (void *)(uintptr_t)(f->nfences + 1);
  f->nfences++;
  return MPT_OK;
}

static int f_fence_query(void *ctx, void *fence) {
  fake *f = ctx;
  return f->state[(uintptr_t)fence - 1];
}

static mpt_status f_fence_wait(void *ctx, void *fence, double timeout_ms) {
  fake *f = ctx;
  f->waits++;
  f->waits_unlocked += mpt__alloc_cache_unlocked(f->cache);
  const int k = (int)((uintptr_t)fence - 1);
  if (f->state[k] == 1) return MPT_OK;
  if (f->state[k] < 0) return MPT_FAIL(MPT_EDEVICE, "fake fence failed");
  if (f->complete_in_wait) {
    f->state[k] = 1;
    return MPT_OK;
  }
  struct timespec ts = {0, (long)(timeout_ms * 1e6) % 1000000000L};
  nanosleep(&ts, NULL);
  return MPT_FAIL(MPT_ETIMEOUT, "fake fence not done");
}

static void f_fence_release(void *ctx, void *fence) {
  (void)ctx;
  (void)fence;
}

static fake *fake_make(size_t limit) {
  fake *f = calloc(1, sizeof *f);
  ck_assert_ptr_nonnull(f);
  f->limit = limit;
  const mpt__alloc_ops ops = {f, f_malloc, f_free, f_fence_record, f_fence_query, f_fence_wait,
                              f_fence_release};
  OK(mpt__alloc_cache_init(&f->cache, &ops));
  return f;
}

static void fake_free(fake *f) {
  mpt__alloc_cache_free_all(f->cache);
  free(f);
}

static void complete_all(fake *f) {
  for (int k = 0; k < f->nfences; k++)
    if (f->state[k] == 0) f->state[k] = 1;
}

static mpt__alloc_stats stats(fake *f) {
  mpt__alloc_stats s;
  mpt__alloc_cache_get_stats(f->cache, &s);
  return s;
}

START_TEST(test_freed_block_is_not_reused_before_its_fence_completes) {
  fake *f = fake_make((size_t)1 << 30);
  void *a, *b, *c;
  OK(mpt__alloc_cache_alloc(f->cache, 1000, &a));
  OK(mpt__alloc_cache_release(f->cache, a));
  OK(mpt__alloc_cache_alloc(f->cache, 1000, &b)); /* a's fence is pending: a fresh block */
  ck_assert_ptr_ne(a, b);
  ck_assert_int_eq(f->mallocs, 2);
  ck_assert_int_eq(f->nfences, 1);
  complete_all(f);
  OK(mpt__alloc_cache_release(f->cache, b));
  OK(mpt__alloc_cache_alloc(f->cache, 900, &c)); /* 900 and 1000 share the class of 1024 */
  ck_assert_ptr_eq(c, a);
  ck_assert_int_eq(f->mallocs, 2);
  const mpt__alloc_stats s = stats(f);
  ck_assert_int_eq(s.cache_hits, 1);
  ck_assert_int_eq(s.fence_waits, 0);
  ck_assert_int_eq(f->waits, 0);
  ck_assert_uint_eq(s.in_use_nbytes, 1024);
  ck_assert_uint_eq(s.reserved_nbytes, 2048);
  fake_free(f);
}
END_TEST

/* With fences that never complete and memory to spare, no allocation ever waits. */
START_TEST(test_allocation_never_waits_while_memory_lasts) {
  fake *f = fake_make((size_t)1 << 30);
  for (int i = 0; i < 50; i++) {
    void *p;
    OK(mpt__alloc_cache_alloc(f->cache, 4096, &p));
    OK(mpt__alloc_cache_release(f->cache, p));
  }
  ck_assert_int_eq(f->waits, 0);
  ck_assert_int_eq(stats(f).fence_waits, 0);
  ck_assert_int_eq(f->mallocs, 50);
  /* Once the fences complete, the blocks come back: no more backend allocations. */
  complete_all(f);
  for (int i = 0; i < 10; i++) {
    void *p;
    OK(mpt__alloc_cache_alloc(f->cache, 4096, &p));
    complete_all(f);
    OK(mpt__alloc_cache_release(f->cache, p));
  }
  ck_assert_int_eq(f->mallocs, 50);
  fake_free(f);
}
END_TEST

/* Out of memory: the allocation waits for the pending fences, WITHOUT the cache's lock, then
 * reuses a block; if the fences do not complete in time it fails with MPT_ENOMEM, never
 * handing out a block whose fence is pending. */
START_TEST(test_out_of_memory_waits_for_fences_without_the_lock) {
  fake *f = fake_make(2 * 4096);
  void *a, *b, *c;
  OK(mpt__alloc_cache_alloc(f->cache, 4096, &a));
  OK(mpt__alloc_cache_alloc(f->cache, 4096, &b));
  OK(mpt__alloc_cache_release(f->cache, a));
  OK(mpt__alloc_cache_release(f->cache, b));
  f->complete_in_wait = 0;
  ck_assert_int_eq(mpt__alloc_cache_alloc(f->cache, 8192, &c), MPT_ENOMEM);
  ck_assert_int_ge(f->waits, 1);
  ck_assert_int_eq(f->waits_unlocked, f->waits);
  f->complete_in_wait = 1;
  OK(mpt__alloc_cache_alloc(f->cache, 4096, &c));
  ck_assert_msg(c == a || c == b, "a fresh block with the device full?");
  ck_assert_int_eq(f->waits_unlocked, f->waits);
  ck_assert_int_ge(stats(f).fence_waits, 2);
  /* A larger class: the cache gives its blocks back to the backend, then allocates. */
  void *d;
  OK(mpt__alloc_cache_release(f->cache, c));
  OK(mpt__alloc_cache_alloc(f->cache, 8000, &d));
  ck_assert_int_eq(f->frees, 2);
  ck_assert_uint_eq(stats(f).reserved_nbytes, 8192);
  fake_free(f);
}
END_TEST

START_TEST(test_a_failed_fence_keeps_its_blocks_out_of_use) {
  fake *f = fake_make((size_t)1 << 30);
  void *a, *b, *c;
  OK(mpt__alloc_cache_alloc(f->cache, 1000, &a));
  OK(mpt__alloc_cache_release(f->cache, a));
  OK(mpt__alloc_cache_alloc(f->cache, 1000, &b)); /* fences a */
  f->state[0] = -1;
  OK(mpt__alloc_cache_release(f->cache, b));
  for (int i = 0; i < 5; i++) {
    OK(mpt__alloc_cache_alloc(f->cache, 1000, &c));
    ck_assert_ptr_ne(c, a);
    complete_all(f);
    OK(mpt__alloc_cache_release(f->cache, c));
  }
  f->complete_in_wait = 1;
  ck_assert_int_eq(mpt__alloc_cache_empty(f->cache, 100), MPT_EDEVICE);
  ck_assert_uint_eq(stats(f).reserved_nbytes, 1024); /* a, never returned nor reused */
  fake_free(f);
}
END_TEST

START_TEST(test_double_free_and_foreign_pointers_are_refused) {
  fake *f = fake_make((size_t)1 << 30);
  void *a, *z;
  OK(mpt__alloc_cache_alloc(f->cache, 0, &z));
  ck_assert_ptr_null(z);
  OK(mpt__alloc_cache_release(f->cache, NULL));
  OK(mpt__alloc_cache_alloc(f->cache, 100, &a));
  OK(mpt__alloc_cache_release(f->cache, a));
  ck_assert_int_eq(mpt__alloc_cache_release(f->cache, a), MPT_EINVAL);
  ck_assert_int_eq(mpt__alloc_cache_release(f->cache, (void *)(uintptr_t)0x1234), MPT_EINVAL);
  f->complete_in_wait = 1;
  OK(mpt__alloc_cache_empty(f->cache, 1000));
  ck_assert_uint_eq(stats(f).reserved_nbytes, 0);
  ck_assert_int_eq(f->frees, 1);
  fake_free(f);
}
END_TEST

int main(void) {
  Suite *su = suite_create("alloc_cache");
  TCase *tc = tcase_create("alloc_cache");
  tcase_add_test(tc, test_freed_block_is_not_reused_before_its_fence_completes);
  tcase_add_test(tc, test_allocation_never_waits_while_memory_lasts);
  tcase_add_test(tc, test_out_of_memory_waits_for_fences_without_the_lock);
  tcase_add_test(tc, test_a_failed_fence_keeps_its_blocks_out_of_use);
  tcase_add_test(tc, test_double_free_and_foreign_pointers_are_refused);
  suite_add_tcase(su, tc);
  SRunner *sr = srunner_create(su);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
