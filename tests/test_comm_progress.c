/* Tests of the comm layer's progress modes and deadlines (include/mpitrain/comm.h "Progress"):
 * the mode agreed across ranks, mpt_comm_describe_inflight, the deadline kept by the waiters (the
 * synchronous wrappers and mpt_comm_wait_event) in blocking mode, mpt_comm_wait_event in polling
 * mode, and mpt_stream_abandon (core.h) on which mpt_comm_free relies.
 *
 * Two ways to run it, both under mpirun (CK_NOFORK: MPI and fork do not mix):
 *   - no argument: the Check suite (tests/test_comm_progress_np2.mpi, _np3.mpi). Collectives
 *     that must stay pending on purpose are held by ranks > 0 waiting on a barrier of another
 *     comm, which rank 0 joins only after it has seen what it checks: no timing decides.
 *   - "missing-peer": the blocking-mode timeout that cannot end cleanly (tests/
 *     test_comm_abort.sh). Rank 1 never calls the all-reduce; rank 0's synchronous wrapper
 *     must return MPT_ETIMEOUT naming it, mpt_comm_free must return although the worker is
 *     stuck inside MPI, mpt_comm_finalize must refuse, and rank 0 then ends the job with
 *     mpt_comm_abort(…, 3). The script checks the exit status 3 and the printed lines. */
#include <check.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpitrain/comm.h"

static mpt_comm *g_comm; /* shared, blocking mode, timeout 60 s: the tests' signalling channel */
static int rank, world;

static mpt_comm *new_comm(double timeout_ms, int blocking, int confirm) {
  mpt_comm_config cfg = mpt_comm_config_default();
  cfg.timeout_ms = timeout_ms;
  cfg.blocking = blocking;
  cfg.confirm_collectives = confirm;
  cfg.configure_log = 0;
  mpt_comm *c = NULL;
  mpt_status st = mpt_comm_init(&c, &cfg);
  if (st != MPT_OK) fprintf(stderr, "rank %d: %s\n", rank, mpt_last_error());
  ck_assert_int_eq(st, MPT_OK);
  return c;
}

/* Waits for everything enqueued on `stream` (60 s at most) and returns the status. */
static mpt_status sync_stream(mpt_stream *stream) {
  mpt_event *ev;
  ck_assert_int_eq(mpt_event_init(&ev, mpt_device_cpu()), MPT_OK);
  mpt_status st = mpt_event_record(ev, stream);
  if (st == MPT_OK) st = mpt_event_synchronize(ev, 60000.0);
  if (st != MPT_OK) fprintf(stderr, "rank %d: %s: %s\n", rank, mpt_status_name(st), mpt_last_error());
  mpt_event_free(ev);
  return st;
}

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Polls describe_inflight until its text starts (want_busy) or stops (!want_busy) being "no
 * collective in flight", 60 s at most; leaves the last text in buf. */
static void await_inflight(mpt_comm *c, int want_busy, char *buf, size_t nbytes) {
  for (int i = 0; i < 60000; i++) {
    ck_assert_int_eq(mpt_comm_describe_inflight(c, buf, nbytes), MPT_OK);
    int busy = strcmp(buf, "no collective in flight") != 0;
    if (busy == want_busy) return;
    sleep_ms(1);
  }
  ck_abort_msg("rank %d: describe_inflight stayed '%s'", rank, buf);
}

/* "<prefix>R running for S s on rank K": checks the prefix and the rank, returns S. */
static double running_for(const char *text, const char *prefix) {
  size_t n = strlen(prefix);
  ck_assert_msg(strncmp(text, prefix, n) == 0, "'%s' does not start with '%s'", text, prefix);
  double s = -1;
  int r = -1;
  ck_assert_msg(sscanf(text + n, "%lf s on rank %d", &s, &r) == 2, "cannot parse '%s'", text);
  ck_assert_int_eq(r, rank);
  ck_assert(s >= 0);
  return s;
}

START_TEST(test_progress_default_is_blocking_and_polling_wins_when_any_rank_asks) {
  ck_assert_int_eq(mpt_comm_config_default().blocking, 1);
  ck_assert_int_eq(mpt_comm_blocking(g_comm), 1);
  /* Rank 0 asks for polling, the others for blocking: everyone polls, and it works. */
  mpt_comm *c = new_comm(30000, rank == 0 ? 0 : 1, 1);
  ck_assert_int_eq(mpt_comm_blocking(c), 0);
  float v[3] = {(float)rank, 1.0f, (float)(2 * rank)};
  ck_assert_int_eq(mpt_comm_allreduce_sync(c, v, v, 3, MPT_F32, MPT_REDUCE_SUM), MPT_OK);
  ck_assert_float_eq(v[0], (float)(world * (world - 1) / 2));
  ck_assert_float_eq(v[1], (float)world);
  ck_assert_float_eq(v[2], (float)(world * (world - 1)));
  mpt_comm_free(c);
}
END_TEST

START_TEST(test_progress_describe_inflight_rejects_bad_arguments_and_cuts_long_text) {
  char buf[64];
  ck_assert_int_eq(mpt_comm_describe_inflight(NULL, buf, sizeof buf), MPT_EINVAL);
  ck_assert_int_eq(mpt_comm_describe_inflight(g_comm, NULL, 8), MPT_EINVAL);
  ck_assert_int_eq(mpt_comm_describe_inflight(g_comm, buf, 0), MPT_EINVAL);
  ck_assert_int_eq(mpt_comm_describe_inflight(g_comm, buf, sizeof buf), MPT_OK);
  ck_assert_str_eq(buf, "no collective in flight");
  ck_assert_int_eq(mpt_comm_describe_inflight(g_comm, buf, 8), MPT_OK);
  ck_assert_str_eq(buf, "no coll");
}
END_TEST

/* In both modes: while rank 0's all-reduce waits for the peers (held on a barrier of g_comm), it
 * is described with its sequence number, count, dtype, op and rank; once the peers come, it
 * completes with the exact sum and nothing is in flight any more. */
START_TEST(test_progress_describe_inflight_names_the_running_collective) {
  for (int blocking = 1; blocking >= 0; blocking--) {
    mpt_comm *c = new_comm(60000, blocking, 1);
    enum { N = 4096 };
    float *x = malloc(sizeof(float) * N);
    ck_assert_ptr_nonnull(x);
    for (int i = 0; i < N; i++) x[i] = (float)(rank + 1) * (float)(i % 7);
    char buf[256];
    ck_assert_int_eq(mpt_comm_describe_inflight(c, buf, sizeof buf), MPT_OK);
    ck_assert_str_eq(buf, "no collective in flight");
    if (rank == 0) {
      ck_assert_int_eq(mpt_comm_allreduce(c, NULL, x, x, N, MPT_F32, MPT_REDUCE_SUM), MPT_OK);
      await_inflight(c, 1, buf, sizeof buf);
      running_for(buf, "all-reduce #0 (count 4096 float32 sum) running for ");
      ck_assert_int_eq(mpt_comm_barrier_sync(g_comm), MPT_OK); /* release the peers */
    } else {
      ck_assert_int_eq(mpt_comm_barrier_sync(g_comm), MPT_OK);
      ck_assert_int_eq(mpt_comm_allreduce(c, NULL, x, x, N, MPT_F32, MPT_REDUCE_SUM), MPT_OK);
    }
    mpt_event *ev;
    ck_assert_int_eq(mpt_event_init(&ev, mpt_device_cpu()), MPT_OK);
    ck_assert_int_eq(mpt_event_record(ev, mpt_comm_stream(c)), MPT_OK);
    ck_assert_int_eq(mpt_comm_wait_event(c, ev), MPT_OK);
    mpt_event_free(ev);
    ck_assert_int_eq(mpt_comm_describe_inflight(c, buf, sizeof buf), MPT_OK);
    ck_assert_str_eq(buf, "no collective in flight");
    float scale = (float)(world * (world + 1) / 2);
    for (int i = 0; i < N; i++)
      if (x[i] != scale * (float)(i % 7))
        ck_abort_msg("blocking %d i %d: got %g want %g", blocking, i, x[i], scale * (i % 7));
    free(x);
    mpt_comm_free(c);
  }
}
END_TEST

/* Blocking mode, deadline 1 s: rank 0's all-reduce gets no peer in time. The waiter (not the
 * worker, which sits in MPI_Allreduce) returns MPT_ETIMEOUT with the polling mode's words, not
 * before the deadline and well before the test's own guards; the comm is unusable; the
 * collective is still described as running. The peers then come (without agreement, which rank
 * 0 no longer joins): their all-reduce completes with the exact sum, rank 0's worker leaves MPI
 * and stops, and the comm is freed normally (the final mpt_comm_finalize would refuse if it had
 * been abandoned). Every way to wait on comm work keeps the deadline (docs/comm.md), so the
 * waiters are: the synchronous wrapper; mpt_comm_wait_event on an event recorded after an
 * asynchronous all-reduce; mpt_event_synchronize on that event with no deadline (-1) and with a
 * deadline of its own longer than the comm's (60 s); mpt_stream_synchronize with no deadline on
 * the comm's stream, and on a worker stream of the caller's that carries the all-reduce. */
enum { WAIT_SYNC, WAIT_COMM_EVENT, WAIT_EVENT, WAIT_EVENT_LONG, WAIT_STREAM, WAIT_OWN_STREAM,
       WAITERS };
START_TEST(test_progress_blocking_waiters_keep_the_deadline_and_name_the_collective) {
  for (int waiter = 0; waiter < WAITERS; waiter++) {
    mpt_comm *c = new_comm(1000, 1, 0);
    ck_assert_int_eq(mpt_comm_blocking(c), 1);
    float x[4];
    for (int i = 0; i < 4; i++) x[i] = (float)(10 * rank + i);
    char buf[256];
    if (rank == 0) {
      mpt_event *ev;
      ck_assert_int_eq(mpt_event_init(&ev, mpt_device_cpu()), MPT_OK);
      mpt_stream *own = NULL, *stream = mpt_comm_stream(c);
      if (waiter == WAIT_OWN_STREAM) {
        ck_assert_int_eq(mpt_stream_init(&own, mpt_device_cpu(), MPT_STREAM_WORKER), MPT_OK);
        stream = own;
      }
      double t0 = mpt_time_ms();
      mpt_status st;
      if (waiter == WAIT_SYNC) {
        st = mpt_comm_allreduce_sync(c, x, x, 4, MPT_F32, MPT_REDUCE_SUM);
      } else {
        ck_assert_int_eq(mpt_comm_allreduce(c, stream, x, x, 4, MPT_F32, MPT_REDUCE_SUM), MPT_OK);
        ck_assert_int_eq(mpt_event_record(ev, stream), MPT_OK);
        if (waiter == WAIT_COMM_EVENT) st = mpt_comm_wait_event(c, ev);
        else if (waiter == WAIT_EVENT) st = mpt_event_synchronize(ev, -1.0);
        else if (waiter == WAIT_EVENT_LONG) st = mpt_event_synchronize(ev, 60000.0);
        else st = mpt_stream_synchronize(stream, -1.0);
      }
      double waited = mpt_time_ms() - t0;
      ck_assert_msg(st == MPT_ETIMEOUT, "waiter %d: %s: %s", waiter, mpt_status_name(st),
                    mpt_last_error());
      ck_assert_msg(strstr(mpt_last_error(), "all-reduce #0 (count 4 float32 sum) did not "
                                             "complete within 1 s on rank 0") != NULL,
                    "waiter %d: detail: %s", waiter, mpt_last_error());
      ck_assert_msg(waited >= 999.0, "returned after %.1f ms, before the 1 s deadline", waited);
      ck_assert_msg(waited < 5000.0, "waiter %d returned after %.1f ms, not by the 1 s deadline",
                    waiter, waited);
      ck_assert_int_eq(mpt_comm_error(c), MPT_ETIMEOUT);
      ck_assert_int_eq(mpt_comm_barrier(c, NULL), MPT_ETIMEOUT);
      ck_assert_ptr_nonnull(strstr(mpt_last_error(), "unusable"));
      ck_assert_int_eq(mpt_comm_describe_inflight(c, buf, sizeof buf), MPT_OK);
      double s = running_for(buf, "all-reduce #0 (count 4 float32 sum) running for ");
      ck_assert(s >= 0.9);
      ck_assert_int_eq(mpt_comm_barrier_sync(g_comm), MPT_OK); /* release the peers */
      await_inflight(c, 0, buf, sizeof buf);                    /* the worker left MPI */
      if (waiter != WAIT_SYNC) { /* the worker stopped at the failure: the event completes */
        ck_assert_int_eq(mpt_event_synchronize(ev, 60000), MPT_ETIMEOUT);
        ck_assert_ptr_nonnull(strstr(mpt_last_error(), "unusable"));
      }
      mpt_event_free(ev);
      mpt_stream_free(own);
    } else {
      ck_assert_int_eq(mpt_comm_barrier_sync(g_comm), MPT_OK);
      ck_assert_int_eq(mpt_comm_allreduce(c, NULL, x, x, 4, MPT_F32, MPT_REDUCE_SUM), MPT_OK);
      ck_assert_int_eq(sync_stream(mpt_comm_stream(c)), MPT_OK);
      for (int i = 0; i < 4; i++)
        ck_assert_float_eq(x[i], (float)(10 * world * (world - 1) / 2 + world * i));
    }
    mpt_comm_free(c);
  }
}
END_TEST

/* mpt_comm_wait_event in polling mode, deadline 1 s, rank 0 alone in an all-reduce: the worker
 * keeps the deadline, the event completes with its MPT_ETIMEOUT and the same words, and the
 * wait returns that. Without a timeout it returns the event's status (MPT_OK). */
START_TEST(test_progress_wait_event_in_polling_mode_returns_the_workers_timeout) {
  mpt_comm *c = new_comm(1000, 0, 1);
  ck_assert_int_eq(mpt_comm_blocking(c), 0);
  mpt_event *ev;
  ck_assert_int_eq(mpt_event_init(&ev, mpt_device_cpu()), MPT_OK);
  ck_assert_int_eq(mpt_comm_wait_event(NULL, ev), MPT_EINVAL);
  ck_assert_int_eq(mpt_comm_wait_event(c, NULL), MPT_EINVAL);
  int32_t v = rank + 1;
  ck_assert_int_eq(mpt_comm_allreduce(c, NULL, &v, &v, 1, MPT_I32, MPT_REDUCE_MAX), MPT_OK);
  ck_assert_int_eq(mpt_event_record(ev, mpt_comm_stream(c)), MPT_OK);
  ck_assert_int_eq(mpt_comm_wait_event(c, ev), MPT_OK);
  ck_assert_int_eq(v, world);
  if (rank == 0) {
    float x[4] = {1, 2, 3, 4};
    ck_assert_int_eq(mpt_comm_allreduce(c, NULL, x, x, 4, MPT_F32, MPT_REDUCE_SUM), MPT_OK);
    ck_assert_int_eq(mpt_event_record(ev, mpt_comm_stream(c)), MPT_OK);
    ck_assert_int_eq(mpt_comm_wait_event(c, ev), MPT_ETIMEOUT);
    ck_assert_msg(strstr(mpt_last_error(), "all-reduce #1 (count 4 float32 sum) did not complete "
                                           "within 1 s on rank 0") != NULL,
                  "detail: %s", mpt_last_error());
    ck_assert_int_eq(mpt_comm_error(c), MPT_ETIMEOUT);
  }
  mpt_event_free(ev);
  mpt_comm_free(c);
  ck_assert_int_eq(mpt_comm_barrier_sync(g_comm), MPT_OK);
}
END_TEST

/* core.h mpt_stream_abandon: a worker stream abandoned while its host function blocks runs
 * nothing queued behind it once the function returns, and completes no later event. */
static atomic_int gate_open, later_ran;
static mpt_status gate_fn(void *arg) {
  (void)arg;
  while (!atomic_load(&gate_open)) sleep_ms(1);
  return MPT_OK;
}
static mpt_status later_fn(void *arg) {
  (void)arg;
  atomic_store(&later_ran, 1);
  return MPT_OK;
}

START_TEST(test_progress_abandoned_stream_runs_nothing_more) {
  mpt_stream *s;
  mpt_event *ev; /* leaked with the stream: its queue still names it */
  ck_assert_int_eq(mpt_stream_init(&s, mpt_device_cpu(), MPT_STREAM_WORKER), MPT_OK);
  ck_assert_int_eq(mpt_event_init(&ev, mpt_device_cpu()), MPT_OK);
  atomic_store(&gate_open, 0);
  atomic_store(&later_ran, 0);
  ck_assert_int_eq(mpt_stream_launch_host(s, gate_fn, NULL), MPT_OK);
  ck_assert_int_eq(mpt_stream_launch_host(s, later_fn, NULL), MPT_OK);
  ck_assert_int_eq(mpt_event_record(ev, s), MPT_OK);
  mpt_stream_abandon(s);
  atomic_store(&gate_open, 1);
  ck_assert_int_eq(mpt_event_synchronize(ev, 300.0), MPT_ETIMEOUT);
  ck_assert_int_eq(mpt_event_query(ev), 0);
  ck_assert_int_eq(atomic_load(&later_ran), 0);
  mpt_stream_abandon(NULL); /* no-op */
}
END_TEST

/* ---- the case that must end by aborting (tests/test_comm_abort.sh) ------------------- */

#define REQUIRE(cond, ...)                                                       \
  do {                                                                           \
    if (!(cond)) {                                                               \
      fprintf(stderr, "test_comm_progress: missing peer: rank %d: FAIL: ", rank); \
      fprintf(stderr, __VA_ARGS__);                                              \
      fprintf(stderr, "\n");                                                     \
      mpt_comm_abort(NULL, 1);                                                   \
    }                                                                            \
  } while (0)

static int run_missing_peer(void) {
  mpt_comm_config cfg = mpt_comm_config_default();
  cfg.timeout_ms = 1000;
  cfg.configure_log = 0;
  mpt_comm *c = NULL;
  mpt_status st = mpt_comm_init(&c, &cfg);
  if (st != MPT_OK) {
    fprintf(stderr, "test_comm_progress: %s\n", mpt_last_error());
    mpt_comm_abort(NULL, 1);
  }
  rank = mpt_comm_rank(c);
  REQUIRE(mpt_comm_blocking(c) == 1, "the default mode is not blocking");
  if (rank != 0) {
    /* Never joins. Rank 0's mpt_comm_abort ends this process; if it does not come, fail. */
    for (int i = 0; i < 30000; i++) sleep_ms(1);
    REQUIRE(0, "rank 0 did not end the job within 30 s");
  }
  float x[4] = {1, 2, 3, 4};
  char buf[256];
  double t0 = mpt_time_ms();
  st = mpt_comm_allreduce_sync(c, x, x, 4, MPT_F32, MPT_REDUCE_SUM);
  double waited = mpt_time_ms() - t0;
  REQUIRE(st == MPT_ETIMEOUT, "the sync all-reduce returned %s", mpt_status_name(st));
  const char *want = "all-reduce #0 (count 4 float32 sum) did not complete within 1 s on rank 0";
  REQUIRE(strstr(mpt_last_error(), want), "detail '%s' lacks '%s'", mpt_last_error(), want);
  REQUIRE(waited >= 999.0, "returned after %.1f ms, before the deadline", waited);
  printf("rank 0: %s: %s\n", mpt_status_name(st), mpt_last_error());
  REQUIRE(mpt_comm_error(c) == MPT_ETIMEOUT, "the comm is not marked failed");
  REQUIRE(mpt_comm_describe_inflight(c, buf, sizeof buf) == MPT_OK, "describe failed");
  const char *busy = "all-reduce #0 (count 4 float32 sum) running for ";
  REQUIRE(strncmp(buf, busy, strlen(busy)) == 0, "in flight: '%s'", buf);
  printf("rank 0: in flight: %s\n", buf);
  mpt_comm_free(c); /* must return: the worker stays inside MPI_Allreduce */
  printf("rank 0: mpt_comm_free returned\n");
  st = mpt_comm_finalize();
  REQUIRE(st == MPT_ESTATE, "mpt_comm_finalize returned %s", mpt_status_name(st));
  REQUIRE(strstr(mpt_last_error(), "mpt_comm_abort"), "finalize detail: %s", mpt_last_error());
  printf("rank 0: mpt_comm_finalize refused: %s\n", mpt_last_error());
  printf("test_comm_progress: missing peer: rank 0 passed every check, aborting the job\n");
  mpt_comm_abort(NULL, 3);
  return 1; /* not reached */
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "missing-peer") == 0) return run_missing_peer();
  if (argc > 1) {
    fprintf(stderr, "usage: %s [missing-peer]\n", argv[0]);
    return 2;
  }
  mpt_comm_config cfg = mpt_comm_config_default();
  cfg.timeout_ms = 60000;
  mpt_status st = mpt_comm_init(&g_comm, &cfg);
  if (st != MPT_OK) {
    fprintf(stderr, "test_comm_progress: %s: %s\n", mpt_status_name(st), mpt_last_error());
    mpt_comm_abort(NULL, 1);
  }
  rank = mpt_comm_rank(g_comm);
  world = mpt_comm_world_size(g_comm);

  Suite *s = suite_create("comm progress");
  TCase *tc = tcase_create("progress");
  tcase_add_test(tc, test_progress_default_is_blocking_and_polling_wins_when_any_rank_asks);
  tcase_add_test(tc, test_progress_describe_inflight_rejects_bad_arguments_and_cuts_long_text);
  tcase_add_test(tc, test_progress_describe_inflight_names_the_running_collective);
  tcase_add_test(tc, test_progress_blocking_waiters_keep_the_deadline_and_name_the_collective);
  tcase_add_test(tc, test_progress_wait_event_in_polling_mode_returns_the_workers_timeout);
  tcase_add_test(tc, test_progress_abandoned_stream_runs_nothing_more);
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);

  mpt_comm_free(g_comm);
  st = mpt_comm_finalize();
  if (st != MPT_OK) fprintf(stderr, "test_comm_progress: %s\n", mpt_last_error());
  return failed == 0 && st == MPT_OK ? EXIT_SUCCESS : EXIT_FAILURE;
}
