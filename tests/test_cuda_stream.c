/* Tests of the CUDA backend's streams, events, host functions, copies and caching allocator
 * (src/core/cuda/cuda_stream.c, cuda_alloc.c, ops_cuda.c's memcpy): in-order host functions,
 * sticky failures that spread through events, cross-stream ordering through events, deadlines
 * that expire with MPT_ETIMEOUT, CUDA streams waiting on CPU events, copies in every direction,
 * and no cudaMalloc after warm-up. Work that must not finish yet is held by a gate (a host
 * function blocked on a condition variable that the test opens), so no test depends on timing:
 * the short deadlines below only ever expire on work that cannot complete. Exits 77 (automake's
 * SKIP) and prints "SKIP: no CUDA device" when no GPU is present.
 *
 * Check runs the tests without forking (CK_NOFORK): a CUDA context does not survive fork(). */
#include <check.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/cuda/cuda.h"
#include "mpitrain/core.h"
#include "mpitrain/ops.h"
#include "check_util.h"

#define TIMEOUT_MS 60000.0

static const mpt_device GPU = {MPT_DEVICE_CUDA, 0};
static mpt_stream *S; /* a compute stream on cuda:0, fresh for every test */

static void setup(void) { OK(mpt_stream_init(&S, GPU, MPT_STREAM_INLINE)); }
static void teardown(void) {
  mpt_stream_free(S);
  S = NULL;
}

static void *halloc(size_t nbytes) {
  void *p = calloc(1, nbytes ? nbytes : 1);
  ck_assert_ptr_nonnull(p);
  return p;
}
static float *hrand(int64_t n, uint64_t seed, float lo, float hi) {
  float *x = halloc((size_t)n * sizeof *x);
  mpt_rng r;
  mpt_rng_seed(&r, seed);
  mpt_rng_fill_uniform(&r, x, n, lo, hi);
  return x;
}
static float *upf(const float *h, int64_t n) {
  void *d = NULL;
  OK(mpt_device_alloc(GPU, (size_t)n * sizeof *h, &d));
  OK(mpt_op_memcpy(S, GPU, d, mpt_device_cpu(), h, (size_t)n * sizeof *h));
  return d;
}
static void down(void *h, const void *d, size_t nbytes) {
  OK(mpt_op_memcpy(S, mpt_device_cpu(), h, GPU, d, nbytes));
  OK(mpt_stream_synchronize(S, TIMEOUT_MS));
}
static void dfree(void *d) { mpt_device_free(GPU, d); }

/* ---- copies ---- */

START_TEST(test_memcpy_moves_bytes_between_host_and_device) {
  enum { N = 100003 };
  float *a = hrand(N, 1, -1, 1), *b = halloc(N * sizeof *b), *c = halloc(N * sizeof *c);
  float *d1 = upf(a, N), *d2 = NULL;
  OK(mpt_device_alloc(GPU, N * sizeof *a, (void **)&d2));
  OK(mpt_op_memcpy(S, GPU, d2, GPU, d1, N * sizeof *a)); /* device -> device */
  down(b, d2, N * sizeof *b);
  ck_assert(memcmp(a, b, N * sizeof *a) == 0);
  OK(mpt_op_memcpy(S, mpt_device_cpu(), c, mpt_device_cpu(), a, N * sizeof *a)); /* host */
  OK(mpt_stream_synchronize(S, TIMEOUT_MS));
  ck_assert(memcmp(a, c, N * sizeof *a) == 0);
  float *pinned = NULL; /* the asynchronous DMA path */
  OK(mpt__cuda_host_alloc(N * sizeof *a, (void **)&pinned));
  OK(mpt_op_memcpy(S, mpt_device_cpu(), pinned, GPU, d1, N * sizeof *a));
  OK(mpt_stream_synchronize(S, TIMEOUT_MS));
  ck_assert(memcmp(a, pinned, N * sizeof *a) == 0);
  mpt__cuda_host_free(pinned);
  ck_assert_ptr_nonnull(mpt__cuda_stream_handle(S));
  ck_assert_ptr_null(mpt__cuda_stream_handle(NULL));
  ck_assert_int_eq(mpt_stream_device(S).type, MPT_DEVICE_CUDA);
  dfree(d1);
  dfree(d2);
  free(a);
  free(b);
  free(c);
}
END_TEST

/* ---- streams, events, host functions ---- */

/* A gate: gate_wait (a host function) blocks until gate_open. */
typedef struct gate {
  pthread_mutex_t mutex;
  pthread_cond_t cond;
  int open;
} gate;
static gate G = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
static mpt_status gate_wait(void *arg) {
  gate *g = arg;
  pthread_mutex_lock(&g->mutex);
  while (!g->open) pthread_cond_wait(&g->cond, &g->mutex);
  pthread_mutex_unlock(&g->mutex);
  return MPT_OK;
}
static void gate_set(gate *g, int open) {
  pthread_mutex_lock(&g->mutex);
  g->open = open;
  pthread_cond_broadcast(&g->cond);
  pthread_mutex_unlock(&g->mutex);
}

static int order_log[100], order_len;
static mpt_status append(void *arg) {
  order_log[order_len++] = (int)(intptr_t)arg;
  return MPT_OK;
}
static mpt_status fail_io(void *arg) {
  (void)arg;
  return mpt_error_set(MPT_EIO, "host function failed on purpose");
}

START_TEST(test_host_functions_run_in_order_and_failures_stick) {
  order_len = 0;
  for (int i = 0; i < 100; i++) OK(mpt_stream_launch_host(S, append, (void *)(intptr_t)i));
  OK(mpt_stream_synchronize(S, TIMEOUT_MS));
  ck_assert_int_eq(order_len, 100);
  for (int i = 0; i < 100; i++) ck_assert_int_eq(order_log[i], i);
  mpt_event *ev;
  OK(mpt_event_init(&ev, GPU));
  OK(mpt_stream_launch_host(S, fail_io, NULL));
  OK(mpt_event_record(ev, S));
  ck_assert_int_eq(mpt_stream_synchronize(S, TIMEOUT_MS), MPT_EIO);
  ck_assert_msg(strstr(mpt_last_error(), "on purpose"), "%s", mpt_last_error());
  ck_assert_int_eq(mpt_stream_error(S), MPT_EIO);
  ck_assert_int_eq(mpt_event_synchronize(ev, TIMEOUT_MS), MPT_EIO);
  ck_assert_int_eq(mpt_stream_launch_host(S, append, NULL), MPT_EIO);
  float *d = NULL;
  OK(mpt_device_alloc(GPU, 64, (void **)&d));
  ck_assert_int_eq(mpt_op_fill(S, d, 16, 1.0f), MPT_EIO); /* ops are refused too */
  mpt_stream *w;
  OK(mpt_stream_init(&w, GPU, MPT_STREAM_WORKER));
  ck_assert_int_eq(mpt_stream_wait_event(w, ev, TIMEOUT_MS), MPT_EIO); /* failure spreads */
  ck_assert_int_eq(mpt_stream_error(w), MPT_EIO);
  mpt_stream_free(w);
  mpt_event_free(ev);
  dfree(d);
}
END_TEST

/* S: gate, fill x = 3, record ev. W waits on ev, then copies x to pinned host memory. While the
 * gate is closed ev cannot complete: a short deadline must expire (and only then). */
START_TEST(test_events_order_streams_and_waits_have_deadlines) {
  mpt_stream *w;
  mpt_event *ev, *t0, *t1;
  OK(mpt_stream_init(&w, GPU, MPT_STREAM_WORKER));
  OK(mpt_event_init(&ev, GPU));
  OK(mpt_event_init(&t0, GPU));
  OK(mpt_event_init(&t1, GPU));
  ck_assert_int_eq(mpt_event_query(ev), 1); /* initially complete */
  double ms = -1;
  ck_assert_int_eq(mpt_event_elapsed_ms(t0, t1, &ms), MPT_ESTATE); /* never recorded */
  float *d = NULL, *host = NULL;
  OK(mpt_device_alloc(GPU, 4096 * sizeof *d, (void **)&d));
  OK(mpt__cuda_host_alloc(sizeof *host, (void **)&host));
  *host = 0;
  gate_set(&G, 0);
  OK(mpt_event_record(t0, S));
  OK(mpt_stream_launch_host(S, gate_wait, &G));
  OK(mpt_op_fill(S, d, 4096, 3.0f));
  OK(mpt_event_record(ev, S));
  OK(mpt_event_record(t1, S));
  OK(mpt_stream_wait_event(w, ev, TIMEOUT_MS));
  OK(mpt_op_memcpy(w, mpt_device_cpu(), host, GPU, d + 4095, sizeof *host));
  ck_assert_int_eq(mpt_event_query(ev), 0);
  ck_assert_int_eq(mpt_event_synchronize(ev, 50), MPT_ETIMEOUT);
  ck_assert_int_eq(mpt_stream_synchronize(w, 50), MPT_ETIMEOUT);
  ck_assert(*host == 0.0f);
  gate_set(&G, 1);
  OK(mpt_stream_synchronize(w, TIMEOUT_MS));
  ck_assert(*host == 3.0f);
  OK(mpt_event_synchronize(t1, TIMEOUT_MS));
  OK(mpt_event_elapsed_ms(t0, t1, &ms));
  ck_assert(ms >= 0);
  mpt__cuda_host_free(host);
  dfree(d);
  mpt_event_free(ev), mpt_event_free(t0), mpt_event_free(t1);
  mpt_stream_free(w);
}
END_TEST

/* A CUDA stream waiting on a CPU event: it runs after the CPU worker's gate opens, and a wait
 * that cannot complete fails the stream with MPT_ETIMEOUT at its deadline. */
START_TEST(test_cuda_stream_waits_on_a_cpu_event) {
  mpt_stream *cpu;
  mpt_event *ev;
  OK(mpt_stream_init(&cpu, mpt_device_cpu(), MPT_STREAM_WORKER));
  OK(mpt_event_init(&ev, mpt_device_cpu()));
  gate_set(&G, 0);
  OK(mpt_stream_launch_host(cpu, gate_wait, &G));
  OK(mpt_event_record(ev, cpu));
  order_len = 0;
  OK(mpt_stream_wait_event(S, ev, TIMEOUT_MS));
  OK(mpt_stream_launch_host(S, append, (void *)(intptr_t)7));
  ck_assert_int_eq(mpt_stream_synchronize(S, 50), MPT_ETIMEOUT);
  ck_assert_int_eq(order_len, 0);
  gate_set(&G, 1);
  OK(mpt_stream_synchronize(S, TIMEOUT_MS));
  ck_assert_int_eq(order_len, 1);
  gate_set(&G, 0); /* now a wait that expires */
  OK(mpt_stream_launch_host(cpu, gate_wait, &G));
  OK(mpt_event_record(ev, cpu));
  OK(mpt_stream_wait_event(S, ev, 50));
  ck_assert_int_eq(mpt_stream_synchronize(S, TIMEOUT_MS), MPT_ETIMEOUT);
  ck_assert_int_eq(mpt_stream_error(S), MPT_ETIMEOUT); /* sticky */
  gate_set(&G, 1);
  OK(mpt_stream_synchronize(cpu, TIMEOUT_MS));
  mpt_event_free(ev);
  mpt_stream_free(cpu);
}
END_TEST

/* Cross-backend waits bind to the record current when they are ENQUEUED.
 * A CUDA stream's wait on a CPU event, then the host re-records the event behind a closed gate
 * (a step ahead): the wait ends with the first record. And a CPU worker's wait on a CUDA event
 * re-recorded behind a blocked CUDA stream ends with the first record too. */
START_TEST(test_cross_backend_waits_bind_to_the_record_at_enqueue) {
  mpt_stream *cpu, *inl, *other;
  mpt_event *cev, *gev;
  OK(mpt_stream_init(&cpu, mpt_device_cpu(), MPT_STREAM_WORKER));
  OK(mpt_stream_init(&inl, mpt_device_cpu(), MPT_STREAM_INLINE));
  OK(mpt_stream_init(&other, GPU, MPT_STREAM_WORKER));
  OK(mpt_event_init(&cev, mpt_device_cpu()));
  OK(mpt_event_init(&gev, GPU));
  /* CUDA waits on CPU */
  OK(mpt_event_record(cev, inl)); /* complete */
  OK(mpt_stream_wait_event(S, cev, TIMEOUT_MS));
  gate_set(&G, 0);
  OK(mpt_stream_launch_host(cpu, gate_wait, &G));
  OK(mpt_event_record(cev, cpu)); /* the next step's record, pending */
  OK(mpt_stream_synchronize(S, 5000)); /* bound to the first record: no wait for the gate */
  /* CPU waits on CUDA */
  OK(mpt_event_record(gev, other)); /* complete soon */
  OK(mpt_stream_synchronize(other, TIMEOUT_MS));
  mpt_stream *cpu2;
  OK(mpt_stream_init(&cpu2, mpt_device_cpu(), MPT_STREAM_WORKER));
  OK(mpt_stream_wait_event(cpu2, gev, TIMEOUT_MS));
  OK(mpt_stream_wait_event(other, cev, TIMEOUT_MS)); /* blocks `other` behind the gate */
  OK(mpt_event_record(gev, other));                 /* the next record, pending */
  OK(mpt_stream_synchronize(cpu2, 5000));
  gate_set(&G, 1);
  OK(mpt_stream_synchronize(other, TIMEOUT_MS));
  OK(mpt_stream_synchronize(cpu, TIMEOUT_MS));
  mpt_stream_free(cpu2);
  mpt_event_free(gev);
  mpt_event_free(cev);
  mpt_stream_free(other);
  mpt_stream_free(inl);
  mpt_stream_free(cpu);
}
END_TEST

/* ---- the caching allocator ---- */

START_TEST(test_allocator_reuses_blocks_after_warm_up) {
  mpt__cuda_alloc_stats a, b;
  const size_t sizes[] = {100, 4096, 1 << 20, 3 * (1 << 20) + 5, 512};
  void *p[5];
  for (int step = 0; step < 20; step++) { /* a "training step": the same sizes each time */
    for (int i = 0; i < 5; i++) OK(mpt_device_alloc(GPU, sizes[i], &p[i]));
    OK(mpt_op_fill(S, p[3], (int64_t)(sizes[3] / sizeof(float)), 1.0f)); /* in use on S */
    for (int i = 0; i < 5; i++) mpt_device_free(GPU, p[i]);
    /* Warm-up: blocks freed in one step may still be fenced (work in flight on S) at the next;
     * the allocator then takes fresh blocks rather than wait, so the pool settles within a few
     * steps. */
    if (step == 3) OK(mpt__cuda_alloc_get_stats(0, &a));
    OK(mpt_stream_synchronize(S, TIMEOUT_MS)); /* the step's end (a loss read back) */
  }
  OK(mpt__cuda_alloc_get_stats(0, &b));
  ck_assert_int_eq(b.malloc_count, a.malloc_count); /* no cudaMalloc after warm-up */
  ck_assert_int_ge(b.cache_hits, a.cache_hits + 16 * 5);
  ck_assert_int_eq(b.fence_waits, a.fence_waits); /* memory to spare: never waited */
  ck_assert_uint_eq(b.in_use_nbytes, a.in_use_nbytes);
  ck_assert_uint_ge(b.reserved_nbytes, sizes[3]);
  void *q = NULL;
  OK(mpt_device_alloc(GPU, 0, &q));
  ck_assert_ptr_null(q);
  mpt_device_free(GPU, NULL);
  OK(mpt__cuda_alloc_empty_cache(0));
  OK(mpt__cuda_alloc_get_stats(0, &b));
  ck_assert_uint_lt(b.reserved_nbytes, a.reserved_nbytes);
}
END_TEST

int main(void) {
  /* Decide before Check starts: no suite (and no CUDA work) without a GPU. */
  if (mpt_device_count(MPT_DEVICE_CUDA) == 0) {
    printf("SKIP: no CUDA device\n");
    return 77;
  }
  Suite *suite = suite_create("cuda_stream");
  TCase *tc = tcase_create("cuda");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, test_memcpy_moves_bytes_between_host_and_device);
  tcase_add_test(tc, test_host_functions_run_in_order_and_failures_stick);
  tcase_add_test(tc, test_events_order_streams_and_waits_have_deadlines);
  tcase_add_test(tc, test_cuda_stream_waits_on_a_cpu_event);
  tcase_add_test(tc, test_cross_backend_waits_bind_to_the_record_at_enqueue);
  tcase_add_test(tc, test_allocator_reuses_blocks_after_warm_up);
  suite_add_tcase(suite, tc);
  SRunner *sr = srunner_create(suite);
  srunner_set_fork_status(sr, CK_NOFORK); /* a CUDA context does not survive fork() */
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
