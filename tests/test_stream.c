/* Tests of the CPU streams and events (include/mpitrain/core.h, src/core/cpu/stream_cpu.c):
 * in-order execution on a worker thread, cross-stream ordering through events, deadlines that
 * expire with MPT_ETIMEOUT, and sticky failure. Work that must not finish yet is held by a
 * gate (a host function blocked on a condition variable that the test opens), so no test
 * depends on timing: the short deadlines below only ever expire on work that cannot complete. */
#include <check.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "core/backend.h"
#include "core/keeper.h"
#include "mpitrain/core.h"
#include "check_util.h"


/* A gate: gate_wait (a host function) blocks until gate_open. */
typedef struct gate {
  pthread_mutex_t mutex;
  pthread_cond_t cond;
  int open, passed;
} gate;

static void gate_init(gate *g) {
  pthread_mutex_init(&g->mutex, NULL);
  pthread_cond_init(&g->cond, NULL);
  g->open = g->passed = 0;
}

static mpt_status gate_wait(void *arg) {
  gate *g = arg;
  pthread_mutex_lock(&g->mutex);
  while (!g->open) pthread_cond_wait(&g->cond, &g->mutex);
  g->passed = 1;
  pthread_mutex_unlock(&g->mutex);
  return MPT_OK;
}

static void gate_open(gate *g) {
  pthread_mutex_lock(&g->mutex);
  g->open = 1;
  pthread_cond_broadcast(&g->cond);
  pthread_mutex_unlock(&g->mutex);
}

/* Appends its index to a log (only the stream's thread writes it). */
typedef struct entry {
  int index;
  int *log, *len;
  pthread_t *thread;
} entry;

static mpt_status append(void *arg) {
  entry *e = arg;
  e->log[(*e->len)++] = e->index;
  *e->thread = pthread_self();
  return MPT_OK;
}

START_TEST(test_worker_stream_runs_host_functions_in_order) {
  enum { N = 200 };
  mpt_stream *s;
  OK(mpt_stream_init(&s, mpt_device_cpu(), MPT_STREAM_WORKER));
  int log[N], len = 0;
  pthread_t ran_on;
  entry e[N];
  for (int i = 0; i < N; i++) {
    e[i] = (entry){i, log, &len, &ran_on};
    OK(mpt_stream_launch_host(s, append, &e[i]));
  }
  OK(mpt_stream_synchronize(s, -1));
  ck_assert_int_eq(len, N);
  for (int i = 0; i < N; i++) ck_assert_int_eq(log[i], i);
  ck_assert(!pthread_equal(ran_on, pthread_self())); /* on the worker, not the caller */
  mpt_stream_free(s);
}
END_TEST

START_TEST(test_inline_stream_runs_now_and_its_events_complete_at_once) {
  mpt_stream *s;
  mpt_event *ev;
  OK(mpt_stream_init(&s, mpt_device_cpu(), MPT_STREAM_INLINE));
  OK(mpt_event_init(&ev, mpt_device_cpu()));
  int log[1], len = 0;
  pthread_t ran_on;
  entry e = {7, log, &len, &ran_on};
  OK(mpt_stream_launch_host(s, append, &e));
  ck_assert_int_eq(len, 1); /* already ran, on this thread */
  ck_assert(pthread_equal(ran_on, pthread_self()));
  OK(mpt_event_record(ev, s));
  ck_assert_int_eq(mpt_event_query(ev), 1);
  mpt_event_free(ev);
  mpt_stream_free(s);
}
END_TEST

START_TEST(test_event_synchronize_times_out_when_never_completed) {
  mpt_stream *s;
  mpt_event *ev;
  gate g;
  gate_init(&g);
  OK(mpt_stream_init(&s, mpt_device_cpu(), MPT_STREAM_WORKER));
  OK(mpt_event_init(&ev, mpt_device_cpu()));
  OK(mpt_stream_launch_host(s, gate_wait, &g)); /* holds the stream */
  OK(mpt_event_record(ev, s));
  ck_assert_int_eq(mpt_event_query(ev), 0);
  ck_assert_int_eq(mpt_event_synchronize(ev, 20), MPT_ETIMEOUT);
  ck_assert_int_eq(mpt_stream_synchronize(s, 20), MPT_ETIMEOUT);
  gate_open(&g);
  OK(mpt_event_synchronize(ev, -1)); /* a timeout did not break the stream */
  ck_assert_int_eq(g.passed, 1);
  OK(mpt_stream_error(s));
  mpt_event_free(ev);
  mpt_stream_free(s);
}
END_TEST

static mpt_status read_flag(void *arg) {
  int *pair = arg; /* pair[1] = what pair[0] was when this ran */
  pair[1] = __atomic_load_n(&pair[0], __ATOMIC_SEQ_CST);
  return MPT_OK;
}

static mpt_status set_flag(void *arg) {
  __atomic_store_n((int *)arg, 1, __ATOMIC_SEQ_CST);
  return MPT_OK;
}

START_TEST(test_stream_wait_event_orders_work_across_streams) {
  mpt_stream *a, *b;
  mpt_event *ev;
  gate g;
  gate_init(&g);
  int pair[2] = {0, -1};
  OK(mpt_stream_init(&a, mpt_device_cpu(), MPT_STREAM_WORKER));
  OK(mpt_stream_init(&b, mpt_device_cpu(), MPT_STREAM_WORKER));
  OK(mpt_event_init(&ev, mpt_device_cpu()));
  OK(mpt_stream_launch_host(a, gate_wait, &g));
  OK(mpt_stream_launch_host(a, set_flag, &pair[0]));
  OK(mpt_event_record(ev, a));
  OK(mpt_stream_wait_event(b, ev, -1));
  OK(mpt_stream_launch_host(b, read_flag, pair));
  gate_open(&g);
  OK(mpt_stream_synchronize(b, -1));
  ck_assert_int_eq(pair[1], 1); /* b's work ran after a's flag was set */
  mpt_event_free(ev);
  mpt_stream_free(a);
  mpt_stream_free(b);
}
END_TEST

START_TEST(test_worker_wait_past_its_deadline_fails_the_stream) {
  mpt_stream *a, *b;
  mpt_event *ev;
  gate g;
  gate_init(&g);
  int pair[2] = {0, -1};
  OK(mpt_stream_init(&a, mpt_device_cpu(), MPT_STREAM_WORKER));
  OK(mpt_stream_init(&b, mpt_device_cpu(), MPT_STREAM_WORKER));
  OK(mpt_event_init(&ev, mpt_device_cpu()));
  OK(mpt_stream_launch_host(a, gate_wait, &g));
  OK(mpt_event_record(ev, a));
  OK(mpt_stream_wait_event(b, ev, 20)); /* the worker gives up after 20 ms */
  OK(mpt_stream_launch_host(b, read_flag, pair));
  ck_assert_int_eq(mpt_stream_synchronize(b, -1), MPT_ETIMEOUT);
  ck_assert_int_eq(mpt_stream_error(b), MPT_ETIMEOUT);
  ck_assert_int_eq(pair[1], -1); /* work after the failed wait was skipped */
  ck_assert_int_eq(mpt_stream_launch_host(b, read_flag, pair), MPT_ETIMEOUT);
  gate_open(&g);
  OK(mpt_stream_synchronize(a, -1));
  mpt_event_free(ev);
  mpt_stream_free(a);
  mpt_stream_free(b);
}
END_TEST

static mpt_status fail_io(void *arg) {
  (void)arg;
  return mpt_error_set(MPT_EIO, "disk on fire");
}

START_TEST(test_failing_host_function_makes_the_stream_sticky_failed) {
  mpt_stream *s;
  mpt_event *ev;
  OK(mpt_stream_init(&s, mpt_device_cpu(), MPT_STREAM_WORKER));
  OK(mpt_event_init(&ev, mpt_device_cpu()));
  int flag = 0;
  OK(mpt_stream_launch_host(s, fail_io, NULL));
  (void)mpt_stream_launch_host(s, set_flag, &flag); /* may see the failure already; either way */
  OK(mpt_event_record(ev, s));
  ck_assert_int_eq(mpt_stream_synchronize(s, -1), MPT_EIO);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "disk on fire"));
  ck_assert_int_eq(flag, 0); /* ... it never runs */
  ck_assert_int_eq(mpt_stream_error(s), MPT_EIO);
  ck_assert_int_eq(mpt_stream_launch_host(s, set_flag, &flag), MPT_EIO);
  ck_assert_int_eq(mpt_event_synchronize(ev, -1), MPT_EIO); /* events carry the failure */
  mpt_event_free(ev);
  mpt_stream_free(s);

  mpt_stream *in; /* an inline stream fails the same way */
  OK(mpt_stream_init(&in, mpt_device_cpu(), MPT_STREAM_INLINE));
  ck_assert_int_eq(mpt_stream_launch_host(in, fail_io, NULL), MPT_EIO);
  ck_assert_int_eq(mpt_stream_launch_host(in, set_flag, &flag), MPT_EIO);
  ck_assert_int_eq(flag, 0);
  ck_assert_int_eq(mpt_stream_synchronize(in, -1), MPT_EIO);
  mpt_stream_free(in);
}
END_TEST

/* A wait enqueued for another backend's event binds to the record current when it was
 * ENQUEUED (core/backend.h mpt__event_capture): after a re-record that cannot complete yet (the
 * host a step ahead), the captured wait still ends as soon as the earlier record did, while a
 * wait bound at run time (mpt_event_synchronize) waits for the new record until its deadline. */
START_TEST(test_captured_wait_binds_to_the_record_at_capture) {
  mpt_stream *inl, *w;
  mpt_event *ev;
  OK(mpt_stream_init(&inl, mpt_device_cpu(), MPT_STREAM_INLINE));
  OK(mpt_stream_init(&w, mpt_device_cpu(), MPT_STREAM_WORKER));
  OK(mpt_event_init(&ev, mpt_device_cpu()));
  OK(mpt_event_record(ev, inl)); /* record 1: complete */
  uint64_t token = 0;
  OK(mpt__event_capture(ev, &token));
  gate g;
  gate_init(&g);
  OK(mpt_stream_launch_host(w, gate_wait, &g));
  OK(mpt_event_record(ev, w)); /* record 2: behind the closed gate */
  const double t0 = mpt_time_ms();
  OK(mpt__event_wait_captured(ev, token, 5000));
  ck_assert_msg(mpt_time_ms() - t0 < 1000, "the captured wait took %g ms",
                mpt_time_ms() - t0);
  ck_assert_int_eq(mpt_event_synchronize(ev, 50), MPT_ETIMEOUT); /* bound at run time */
  uint64_t later = 0;
  OK(mpt__event_capture(ev, &later));
  ck_assert_int_eq(mpt__event_wait_captured(ev, later, 50), MPT_ETIMEOUT);
  gate_open(&g);
  OK(mpt__event_wait_captured(ev, later, 5000));
  mpt_event_free(ev);
  mpt_stream_free(w);
  mpt_stream_free(inl);
}
END_TEST

/* A keeper (src/core/keeper.h) whose work is due at `due_ms` (mpt_time_ms clock). */
typedef struct due {
  double due_ms;
  int asked;
} due;

static mpt_status keep_due(void *arg, double *left_ms) {
  due *d = arg;
  d->asked++;
  double now = mpt_time_ms();
  if (now < d->due_ms) {
    *left_ms = d->due_ms - now;
    return MPT_OK;
  }
  return mpt_error_set(MPT_ETIMEOUT, "kept work past its deadline (asked %d times)", d->asked);
}

/* Work that never completes (a closed gate) launched with a keeper due in 200 ms: every wait on
 * its stream or behind it ends with the keeper's error soon after, even with no deadline of its
 * own (-1): an event wait, a stream wait, and another worker stream's wait on its event (that
 * stream then fails with the keeper's error). The waiters do not fail the stream: once the gate
 * opens, the work completes and later waits succeed. Without the keeper each wait below would
 * block for ever (the test's timeout would fail it). */
START_TEST(test_kept_work_bounds_every_wait_without_a_deadline) {
  mpt_stream *s, *other;
  mpt_event *ev, *ev_other;
  gate g;
  gate_init(&g);
  OK(mpt_stream_init(&s, mpt_device_cpu(), MPT_STREAM_WORKER));
  OK(mpt_stream_init(&other, mpt_device_cpu(), MPT_STREAM_WORKER));
  OK(mpt_event_init(&ev, mpt_device_cpu()));
  OK(mpt_event_init(&ev_other, mpt_device_cpu()));
  double t0 = mpt_time_ms();
  due d = {t0 + 200.0, 0};
  OK(mpt__stream_launch_host_kept(s, gate_wait, &g, keep_due, &d));
  OK(mpt_event_record(ev, s));

  ck_assert_int_eq(mpt_event_synchronize(ev, -1), MPT_ETIMEOUT);
  double waited = mpt_time_ms() - t0;
  ck_assert_msg(strstr(mpt_last_error(), "kept work past its deadline"), "%s", mpt_last_error());
  ck_assert_msg(waited >= 199.0 && waited < 5000.0, "event wait ended after %.1f ms", waited);
  ck_assert_int_eq(mpt_event_query(ev), 0);

  t0 = mpt_time_ms();
  ck_assert_int_eq(mpt_stream_synchronize(s, -1), MPT_ETIMEOUT);
  ck_assert_msg(strstr(mpt_last_error(), "kept work past its deadline"), "%s", mpt_last_error());
  ck_assert_msg(mpt_time_ms() - t0 < 5000.0, "stream wait did not end by the keeper");
  ck_assert_int_eq(mpt_event_synchronize(ev, 60000), MPT_ETIMEOUT); /* long deadline: same */

  OK(mpt_stream_wait_event(other, ev, -1));
  OK(mpt_event_record(ev_other, other));
  ck_assert_int_eq(mpt_event_synchronize(ev_other, 10000), MPT_ETIMEOUT);
  ck_assert_msg(strstr(mpt_last_error(), "kept work past its deadline"), "%s", mpt_last_error());
  ck_assert_int_eq(mpt_stream_error(other), MPT_ETIMEOUT);

  ck_assert_int_eq(mpt_stream_error(s), MPT_OK);
  gate_open(&g); /* until the work has returned, waits still get the keeper's error */
  for (int i = 0; i < 20000 && !mpt_event_query(ev); i++) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  OK(mpt_event_synchronize(ev, -1));
  OK(mpt_stream_synchronize(s, -1));
  ck_assert_int_eq(g.passed, 1);
  /* with the work done, its keeper is out of the picture */
  OK(mpt_stream_launch_host(s, gate_wait, &g));
  OK(mpt_stream_synchronize(s, -1));
  ck_assert_int_eq(mpt__stream_launch_host_kept(s, NULL, &g, keep_due, &d), MPT_EINVAL);
  ck_assert_int_eq(mpt__stream_launch_host_kept(s, gate_wait, &g, NULL, &d), MPT_EINVAL);
  mpt_event_free(ev_other);
  mpt_event_free(ev);
  mpt_stream_free(other);
  mpt_stream_free(s);
}
END_TEST

int main(void) {
  Suite *suite = suite_create("stream");
  TCase *tc = tcase_create("cpu");
  tcase_set_timeout(tc, 30); /* a hang is a failure, not a stuck test run */
  tcase_add_test(tc, test_worker_stream_runs_host_functions_in_order);
  tcase_add_test(tc, test_inline_stream_runs_now_and_its_events_complete_at_once);
  tcase_add_test(tc, test_event_synchronize_times_out_when_never_completed);
  tcase_add_test(tc, test_stream_wait_event_orders_work_across_streams);
  tcase_add_test(tc, test_worker_wait_past_its_deadline_fails_the_stream);
  tcase_add_test(tc, test_failing_host_function_makes_the_stream_sticky_failed);
  tcase_add_test(tc, test_captured_wait_binds_to_the_record_at_capture);
  tcase_add_test(tc, test_kept_work_bounds_every_wait_without_a_deadline);
  suite_add_tcase(suite, tc);
  SRunner *sr = srunner_create(suite);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
