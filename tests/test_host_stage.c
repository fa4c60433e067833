/* Tests of the protocol of collectives on host buffers staged through a device
 * (src/comm/host_stage.c, used by the NCCL backend for host buffers), with a stubbed collective
 * in place of NCCL: the wait keeps its deadline when the collective never completes (a peer
 * that never arrives), it never holds the backend's lock (another thread, standing for the
 * watchdog, takes it during the wait), a failed check or device error ends the wait, and the
 * result is copied out only after completion. No device, no MPI. */
#include <check.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "comm/comm_impl.h"

typedef struct stub {
  pthread_mutex_t *lock;
  int complete_after; /* queries answered "not ready" before "done"; < 0: never completes */
  int queries, checks, expired, copied, enqueued;
  int locked_queries; /* queries made while the lock was held (must stay 0) */
  mpt_status check_status; /* returned by the check from the check_fail_at'th call */
  int check_fail_at;
  int device_error_at; /* the query that reports a device error (0: none) */
  float bounce[4], out[4];
} stub;

static mpt_status stub_enqueue(void *ctx) {
  stub *s = ctx;
  s->enqueued++;
  for (int i = 0; i < 4; i++) s->bounce[i] = (float)(i + 1) * 0.5f; /* the "collective" */
  return MPT_OK;
}

static int stub_query(void *ctx, mpt_status *err) {
  stub *s = ctx;
  s->queries++;
  if (pthread_mutex_trylock(s->lock) == 0) {
    pthread_mutex_unlock(s->lock);
  } else {
    s->locked_queries++;
  }
  if (s->device_error_at && s->queries == s->device_error_at) {
    *err = MPT_FAIL(MPT_EDEVICE, "stub device fault");
    return -1;
  }
  return s->complete_after >= 0 && s->queries > s->complete_after;
}

static mpt_status stub_check(void *ctx) {
  stub *s = ctx;
  s->checks++;
  if (s->check_fail_at && s->checks >= s->check_fail_at)
    return MPT_FAIL(s->check_status, "stub check: asynchronous error");
  return MPT_OK;
}

static mpt_status stub_expire(void *ctx) {
  stub *s = ctx;
  s->expired++;
  return MPT_FAIL(MPT_ETIMEOUT, "stub all-reduce did not complete");
}

static void stub_copy_out(void *ctx) {
  stub *s = ctx;
  s->copied++;
  memcpy(s->out, s->bounce, sizeof s->out);
}

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;

static void stub_init(stub *s, int complete_after) {
  memset(s, 0, sizeof *s);
  s->lock = &g_lock;
  s->complete_after = complete_after;
}

static mpt_status run(stub *s, double timeout_ms) {
  const mpt__host_stage_ops ops = {s, stub_enqueue, stub_query, stub_check, stub_expire,
                                   stub_copy_out};
  return mpt__host_stage_run(&g_lock, &ops, mpt_time_ms() + timeout_ms);
}

START_TEST(test_host_stage_copies_out_after_completion) {
  stub s;
  stub_init(&s, 5);
  ck_assert_int_eq(run(&s, 10000), MPT_OK);
  ck_assert_int_eq(s.enqueued, 1);
  ck_assert_int_eq(s.queries, 6);
  ck_assert_int_eq(s.copied, 1);
  ck_assert_int_eq(s.expired, 0);
  for (int i = 0; i < 4; i++) ck_assert_float_eq(s.out[i], (float)(i + 1) * 0.5f);
}
END_TEST

/* A peer that never arrives: the wait ends at its deadline with MPT_ETIMEOUT, the backend is
 * failed once (expire), nothing is copied into the caller's buffer. */
START_TEST(test_host_stage_keeps_its_deadline_when_the_collective_never_completes) {
  stub s;
  stub_init(&s, -1);
  const double t0 = mpt_time_ms();
  ck_assert_int_eq(run(&s, 300), MPT_ETIMEOUT);
  const double took = mpt_time_ms() - t0;
  ck_assert_msg(took >= 300 && took < 3000, "took %g ms", took);
  ck_assert_int_eq(s.expired, 1);
  ck_assert_int_eq(s.copied, 0);
  ck_assert_int_gt(s.checks, 0);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "did not complete"));
}
END_TEST

/* The watchdog's part: while a host collective waits, another thread takes the lock (it would
 * run the failure checks and abort the communicator); the wait never polls under the lock. */
typedef struct taker {
  int taken;
  double held_ms;
} taker;

static void *take_lock(void *arg) {
  taker *t = arg;
  struct timespec ts = {0, 100 * 1000 * 1000}; /* the wait is under way by then */
  nanosleep(&ts, NULL);
  const double t0 = mpt_time_ms();
  pthread_mutex_lock(&g_lock);
  t->held_ms = mpt_time_ms() - t0;
  t->taken = 1;
  pthread_mutex_unlock(&g_lock);
  return NULL;
}

START_TEST(test_host_stage_waits_without_the_lock) {
  stub s;
  stub_init(&s, -1);
  taker t = {0, 0};
  pthread_t th;
  const mpt__host_stage_ops ops = {&s, stub_enqueue, stub_query, stub_check, stub_expire,
                                   stub_copy_out};
  ck_assert_int_eq(pthread_create(&th, NULL, take_lock, &t), 0);
  ck_assert_int_eq(mpt__host_stage_run(&g_lock, &ops, mpt_time_ms() + 1000), MPT_ETIMEOUT);
  pthread_join(th, NULL);
  ck_assert_int_eq(t.taken, 1);
  ck_assert_msg(t.held_ms < 500, "the other thread waited %g ms for the lock", t.held_ms);
  ck_assert_int_eq(s.locked_queries, 0);
}
END_TEST

START_TEST(test_host_stage_stops_at_a_failed_check_or_device_error) {
  stub s;
  stub_init(&s, -1);
  s.check_fail_at = 3;
  s.check_status = MPT_ECOMM;
  ck_assert_int_eq(run(&s, 10000), MPT_ECOMM);
  ck_assert_int_eq(s.checks, 3);
  ck_assert_int_eq(s.copied, 0);
  ck_assert_int_eq(s.expired, 0);
  stub_init(&s, -1);
  s.device_error_at = 2;
  ck_assert_int_eq(run(&s, 10000), MPT_EDEVICE);
  ck_assert_int_eq(s.queries, 2);
  ck_assert_int_eq(s.copied, 0);
}
END_TEST

int main(void) {
  Suite *su = suite_create("host_stage");
  TCase *tc = tcase_create("host_stage");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_host_stage_copies_out_after_completion);
  tcase_add_test(tc, test_host_stage_keeps_its_deadline_when_the_collective_never_completes);
  tcase_add_test(tc, test_host_stage_waits_without_the_lock);
  tcase_add_test(tc, test_host_stage_stops_at_a_failed_check_or_device_error);
  suite_add_tcase(su, tc);
  SRunner *sr = srunner_create(su);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}
