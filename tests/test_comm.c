/* Tests of the comm layer (include/mpitrain/comm.h) under mpirun: run by tests/test_comm_np2.mpi
 * and tests/test_comm_np3.mpi. Check runs without forking (CK_NOFORK: MPI and fork do not mix),
 * so the scripts bound the run with a timeout. The whole suite runs twice, in blocking mode (the
 * default) and in polling mode (config.blocking = 0), each pass with its own shared comm; the
 * cases whose outcome would leave a blocking-mode worker stuck inside MPI (mismatched counts
 * without checked mode, a missing peer) use polling mode explicitly and run in that pass only, and their blocking-mode
 * counterparts are in tests/test_comm_progress.c.
 *
 * Inputs are small integers so that every exact result is representable in float32 and the
 * expected values come from naive loops over the ranks. Every rank runs every test in the same
 * order: the tests themselves are collective. */
#include <check.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mpitrain/comm.h"

static mpt_comm *comm; /* the shared comm of the tests, timeout 60 s, in the pass's mode */
static int rank, world;
static int g_blocking; /* the progress mode of this pass (config.blocking) */

static const int64_t sizes[] = {1, 7, 1023, 3000000};
enum { NSIZES = sizeof sizes / sizeof sizes[0] };

/* Rank r's input element i: small integers. */
static float input_value(int r, int64_t i) { return (float)((r + 1) * (int)(i % 13 + 1)); }

static void *xmalloc(size_t nbytes) {
  void *p = malloc(nbytes ? nbytes : 1);
  ck_assert_ptr_nonnull(p);
  return p;
}

/* Waits for everything enqueued on `stream` and returns the status, printing the detail. */
static mpt_status sync_stream(mpt_stream *stream) {
  mpt_event *ev;
  ck_assert_int_eq(mpt_event_init(&ev, mpt_device_cpu()), MPT_OK);
  mpt_status st = mpt_event_record(ev, stream);
  if (st == MPT_OK) st = mpt_event_synchronize(ev, 120000.0);
  if (st != MPT_OK) fprintf(stderr, "rank %d: %s: %s\n", rank, mpt_status_name(st), mpt_last_error());
  mpt_event_free(ev);
  return st;
}

static mpt_comm *new_comm_mode(double timeout_ms, int checked, int blocking) {
  mpt_comm_config cfg = mpt_comm_config_default();
  cfg.timeout_ms = timeout_ms;
  cfg.check_collectives = checked;
  cfg.blocking = blocking;
  cfg.configure_log = 0;
  mpt_comm *c = NULL;
  mpt_status st = mpt_comm_init(&c, &cfg);
  if (st != MPT_OK) fprintf(stderr, "rank %d: %s\n", rank, mpt_last_error());
  ck_assert_int_eq(st, MPT_OK);
  ck_assert_int_eq(mpt_comm_blocking(c), blocking);
  return c;
}

static mpt_comm *new_comm(double timeout_ms, int checked) {
  return new_comm_mode(timeout_ms, checked, g_blocking);
}

START_TEST(test_comm_reports_rank_sizes_and_launcher) {
  ck_assert_int_ge(rank, 0);
  ck_assert_int_lt(rank, world);
  /* One host: every rank is local. */
  ck_assert_int_eq(mpt_comm_local_size(comm), world);
  ck_assert_int_eq(mpt_comm_local_rank(comm), rank);
  ck_assert_str_ne(mpt_comm_hostname(comm), "");
  const char *ompi = getenv("OMPI_COMM_WORLD_SIZE");
  if (ompi) { /* tests/mpirun.sh */
    ck_assert_int_eq(atoi(ompi), world);
    ck_assert_int_eq(mpt_comm_launcher(comm), MPT_LAUNCHER_MPIRUN);
  } else if (getenv("SLURM_STEP_ID")) {
    ck_assert_int_eq(mpt_comm_launcher(comm), MPT_LAUNCHER_SRUN);
  }
  ck_assert_int_eq(mpt_comm_backend_kind(comm), MPT_COMM_BACKEND_MPI);
  ck_assert_int_eq(mpt_comm_checked(comm), 0);
  ck_assert_int_eq(mpt_comm_blocking(comm), g_blocking);
  ck_assert_ptr_nonnull(mpt_comm_stream(comm));
}
END_TEST

/* Sum, in place and out of place, float32 and int32, every size. */
START_TEST(test_comm_allreduce_sum_is_exact) {
  for (int s = 0; s < NSIZES; s++) {
    int64_t n = sizes[s];
    float *x = xmalloc(sizeof(float) * n), *y = xmalloc(sizeof(float) * n);
    int32_t *xi = xmalloc(sizeof(int32_t) * n), *yi = xmalloc(sizeof(int32_t) * n);
    for (int in_place = 0; in_place < 2; in_place++) {
      for (int64_t i = 0; i < n; i++) {
        x[i] = input_value(rank, i);
        y[i] = -1.0f;
        xi[i] = (int32_t)(rank * 100000 + i % 1000);
        yi[i] = -1;
      }
      float *out = in_place ? x : y;
      int32_t *outi = in_place ? xi : yi;
      ck_assert_int_eq(mpt_comm_allreduce(comm, NULL, x, out, n, MPT_F32, MPT_REDUCE_SUM), MPT_OK);
      ck_assert_int_eq(mpt_comm_allreduce(comm, NULL, xi, outi, n, MPT_I32, MPT_REDUCE_SUM),
                       MPT_OK);
      ck_assert_int_eq(sync_stream(mpt_comm_stream(comm)), MPT_OK);
      for (int64_t i = 0; i < n; i++) {
        float want = 0;
        int32_t wanti = 0;
        for (int r = 0; r < world; r++) {
          want += input_value(r, i);
          wanti += (int32_t)(r * 100000 + i % 1000);
        }
        if (out[i] != want || outi[i] != wanti)
          ck_abort_msg("n %lld in_place %d i %lld: got %g / %d, want %g / %d", (long long)n,
                       in_place, (long long)i, out[i], outi[i], want, wanti);
      }
    }
    free(x);
    free(y);
    free(xi);
    free(yi);
  }
}
END_TEST

START_TEST(test_comm_allreduce_min_max_avg_are_exact) {
  for (int s = 0; s < NSIZES; s++) {
    int64_t n = sizes[s];
    float *x = xmalloc(sizeof(float) * n), *mn = xmalloc(sizeof(float) * n),
          *mx = xmalloc(sizeof(float) * n), *avg = xmalloc(sizeof(float) * n);
    /* Rank r's element i: (7r + i) % 11 - 5 moves the minimum and maximum between ranks and
     * gives sums (5, 7, ...) whose quotient by 3 differs from a product with 1/3f. */
    for (int64_t i = 0; i < n; i++) x[i] = (float)((7 * rank + i) % 11 - 5);
    ck_assert_int_eq(mpt_comm_allreduce(comm, NULL, x, mn, n, MPT_F32, MPT_REDUCE_MIN), MPT_OK);
    ck_assert_int_eq(mpt_comm_allreduce(comm, NULL, x, mx, n, MPT_F32, MPT_REDUCE_MAX), MPT_OK);
    ck_assert_int_eq(mpt_comm_allreduce(comm, NULL, x, avg, n, MPT_F32, MPT_REDUCE_AVG), MPT_OK);
    ck_assert_int_eq(sync_stream(mpt_comm_stream(comm)), MPT_OK);
    for (int64_t i = 0; i < n; i++) {
      float wmin = 1e9f, wmax = -1e9f, sum = 0;
      for (int r = 0; r < world; r++) {
        float v = (float)((7 * r + i) % 11 - 5);
        wmin = v < wmin ? v : wmin;
        wmax = v > wmax ? v : wmax;
        sum += v;
      }
      float wavg = sum / (float)world;
      if (mn[i] != wmin || mx[i] != wmax || avg[i] != wavg)
        ck_abort_msg("n %lld i %lld: min %g max %g avg %.9g, want %g %g %.9g", (long long)n,
                     (long long)i, mn[i], mx[i], avg[i], wmin, wmax, wavg);
    }
    free(x);
    free(mn);
    free(mx);
    free(avg);
  }
}
END_TEST

/* A NaN on any rank is NaN in MIN, MAX, SUM and AVG on every rank, whatever the world size
 * and the algorithm (MPI_MIN / MPI_MAX drop it depending on the order: at 3 ranks a NaN of rank
 * 1 vanished). Rank r holds NaN at the elements i with i % (W + 1) == r, so every rank is the
 * only NaN of some element in the same collective; elements with i % (W + 1) == W have none and
 * must be exact. Also -0 and +0: min is -0, max +0, the same bits on every rank. Run at 2, 3
 * and 4 ranks (test_comm_np4.mpi runs this case alone). */
START_TEST(test_comm_allreduce_propagates_nan_in_every_reduction) {
  static const int64_t ns[] = {1, 7, 1023, 100003};
  const mpt_reduce_op ops[4] = {MPT_REDUCE_MIN, MPT_REDUCE_MAX, MPT_REDUCE_SUM, MPT_REDUCE_AVG};
  for (int s = 0; s < 4; s++) {
    int64_t n = ns[s];
    float *x = xmalloc(sizeof(float) * n), *y[4];
    for (int k = 0; k < 4; k++) y[k] = xmalloc(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++)
      x[i] = i % (world + 1) == rank ? NAN : (float)((7 * rank + i) % 11 - 5);
    if (n == 7 && world > 1) x[6] = rank == 1 ? -0.0f : 0.0f; /* no NaN here: -0 and +0 */
    for (int k = 0; k < 4; k++)
      ck_assert_int_eq(mpt_comm_allreduce(comm, NULL, x, y[k], n, MPT_F32, ops[k]), MPT_OK);
    ck_assert_int_eq(sync_stream(mpt_comm_stream(comm)), MPT_OK);
    for (int64_t i = 0; i < n; i++) {
      int has_nan = i % (world + 1) < world && !(n == 7 && world > 1 && i == 6);
      float wmin = 1e9f, wmax = -1e9f, sum = 0;
      for (int r = 0; r < world; r++) {
        float v = (float)((7 * r + i) % 11 - 5);
        if (n == 7 && world > 1 && i == 6) v = r == 1 ? -0.0f : 0.0f;
        wmin = v < wmin || (v == wmin && signbit(v)) ? v : wmin;
        wmax = v > wmax || (v == wmax && !signbit(v)) ? v : wmax;
        sum += v;
      }
      const float want[4] = {wmin, wmax, sum, sum / (float)world};
      for (int k = 0; k < 4; k++) {
        float got = y[k][i];
        int good = has_nan ? isnan(got) : got == want[k] && signbit(got) == signbit(want[k]);
        if (!good)
          ck_abort_msg("%d ranks, n %lld, element %lld (NaN on rank %lld): %s gives %g on rank "
                       "%d, want %g", world, (long long)n, (long long)i,
                       has_nan ? (long long)(i % (world + 1)) : -1LL,
                       mpt_reduce_op_name(ops[k]), got, rank, has_nan ? NAN : want[k]);
      }
    }
    free(x);
    for (int k = 0; k < 4; k++) free(y[k]);
  }
}
END_TEST

START_TEST(test_comm_count_zero_returns_at_once) {
  uint64_t seq = mpt_comm_sequence(comm);
  ck_assert_int_eq(mpt_comm_allreduce(comm, NULL, NULL, NULL, 0, MPT_F32, MPT_REDUCE_SUM), MPT_OK);
  ck_assert_int_eq(mpt_comm_broadcast(comm, NULL, NULL, 0, MPT_F32, 0), MPT_OK);
  ck_assert_int_eq(mpt_comm_allgather(comm, NULL, NULL, NULL, 0, MPT_I32), MPT_OK);
  ck_assert_int_eq(mpt_comm_allreduce_sync(comm, NULL, NULL, 0, MPT_F32, MPT_REDUCE_AVG), MPT_OK);
  ck_assert_uint_eq(mpt_comm_sequence(comm), seq);
}
END_TEST

START_TEST(test_comm_bad_arguments_are_rejected_without_a_sequence_number) {
  uint64_t seq = mpt_comm_sequence(comm);
  float a[8] = {0}, b[8];
  int32_t ai[4] = {0};
  ck_assert_int_eq(mpt_comm_allreduce(comm, NULL, a, b, -1, MPT_F32, MPT_REDUCE_SUM), MPT_EINVAL);
  ck_assert_int_eq(mpt_comm_allreduce(comm, NULL, ai, ai, 4, MPT_I32, MPT_REDUCE_AVG), MPT_EINVAL);
  ck_assert_int_eq(mpt_comm_allreduce(comm, NULL, a, a + 2, 4, MPT_F32, MPT_REDUCE_SUM),
                   MPT_EINVAL);
  ck_assert_int_eq(mpt_comm_allreduce(comm, NULL, a, b, 4, MPT_F32, (mpt_reduce_op)9), MPT_EINVAL);
  ck_assert_int_eq(mpt_comm_allreduce(comm, NULL, NULL, b, 4, MPT_F32, MPT_REDUCE_SUM),
                   MPT_EINVAL);
  ck_assert_int_eq(mpt_comm_broadcast(comm, NULL, a, 4, MPT_F32, world), MPT_EINVAL);
  ck_assert_int_eq(mpt_comm_broadcast(comm, NULL, a, 4, MPT_F32, -1), MPT_EINVAL);
  ck_assert_int_eq(mpt_comm_broadcast(comm, NULL, a, 4, (mpt_dtype)42, 0), MPT_EINVAL);
  ck_assert_int_eq(mpt_comm_allreduce(NULL, NULL, a, b, 4, MPT_F32, MPT_REDUCE_SUM), MPT_EINVAL);
  ck_assert_uint_eq(mpt_comm_sequence(comm), seq);
}
END_TEST

START_TEST(test_comm_broadcast_from_last_rank) {
  int root = world - 1;
  for (int s = 0; s < NSIZES; s++) {
    int64_t n = sizes[s];
    float *x = xmalloc(sizeof(float) * n);
    int32_t *xi = xmalloc(sizeof(int32_t) * n);
    for (int64_t i = 0; i < n; i++) {
      x[i] = rank == root ? input_value(root, i) : -1.0f;
      xi[i] = rank == root ? (int32_t)(i % 100003) : -1;
    }
    ck_assert_int_eq(mpt_comm_broadcast(comm, NULL, x, n, MPT_F32, root), MPT_OK);
    ck_assert_int_eq(mpt_comm_broadcast(comm, NULL, xi, n, MPT_I32, root), MPT_OK);
    ck_assert_int_eq(sync_stream(mpt_comm_stream(comm)), MPT_OK);
    for (int64_t i = 0; i < n; i++)
      if (x[i] != input_value(root, i) || xi[i] != (int32_t)(i % 100003))
        ck_abort_msg("n %lld i %lld: got %g / %d", (long long)n, (long long)i, x[i], xi[i]);
    free(x);
    free(xi);
  }
}
END_TEST

START_TEST(test_comm_allgather_is_in_rank_order) {
  const int64_t counts[] = {1, 7, 1023, 100000};
  for (int s = 0; s < 4; s++) {
    int64_t n = counts[s];
    int32_t *send = xmalloc(sizeof(int32_t) * n), *recv = xmalloc(sizeof(int32_t) * n * world);
    for (int in_place = 0; in_place < 2; in_place++) {
      for (int64_t i = 0; i < n * world; i++) recv[i] = -1;
      for (int64_t i = 0; i < n; i++) send[i] = (int32_t)(rank * 1000000 + i);
      const int32_t *src = send;
      if (in_place) {
        memcpy(recv + rank * n, send, sizeof(int32_t) * n);
        src = recv + rank * n;
      }
      ck_assert_int_eq(mpt_comm_allgather(comm, NULL, src, recv, n, MPT_I32), MPT_OK);
      ck_assert_int_eq(sync_stream(mpt_comm_stream(comm)), MPT_OK);
      for (int r = 0; r < world; r++)
        for (int64_t i = 0; i < n; i++)
          if (recv[r * n + i] != (int32_t)(r * 1000000 + i))
            ck_abort_msg("n %lld in_place %d block %d i %lld: got %d", (long long)n, in_place, r,
                         (long long)i, recv[r * n + i]);
    }
    free(send);
    free(recv);
  }
}
END_TEST

/* A comm whose MPI calls take at most 1000 elements: each collective runs in several chunks
 * (the path that counts above INT_MAX / 2 take). */
START_TEST(test_comm_chunked_collectives_are_exact) {
  mpt_comm_config cfg = mpt_comm_config_default();
  cfg.max_chunk_count = 1000;
  cfg.timeout_ms = 60000;
  cfg.blocking = g_blocking;
  cfg.configure_log = 0;
  mpt_comm *c = NULL;
  ck_assert_int_eq(mpt_comm_init(&c, &cfg), MPT_OK);
  ck_assert_int_eq(mpt_comm_blocking(c), g_blocking);
  const int64_t n = 2500;
  float *x = xmalloc(sizeof(float) * n), *y = xmalloc(sizeof(float) * n);
  float *b = xmalloc(sizeof(float) * n), *g = xmalloc(sizeof(float) * n * world);
  for (int64_t i = 0; i < n; i++) {
    x[i] = input_value(rank, i);
    b[i] = rank == 1 % world ? (float)(i % 977) : -1.0f;
  }
  for (int64_t i = 0; i < n * world; i++) g[i] = -1.0f;
  ck_assert_int_eq(mpt_comm_allreduce(c, NULL, x, y, n, MPT_F32, MPT_REDUCE_SUM), MPT_OK);
  ck_assert_int_eq(mpt_comm_broadcast(c, NULL, b, n, MPT_F32, 1 % world), MPT_OK);
  ck_assert_int_eq(mpt_comm_allgather(c, NULL, x, g, n, MPT_F32), MPT_OK);
  ck_assert_int_eq(sync_stream(mpt_comm_stream(c)), MPT_OK);
  for (int64_t i = 0; i < n; i++) {
    float want = 0;
    for (int r = 0; r < world; r++) {
      want += input_value(r, i);
      if (g[r * n + i] != input_value(r, i))
        ck_abort_msg("all-gather block %d i %lld: got %g", r, (long long)i, g[r * n + i]);
    }
    if (y[i] != want) ck_abort_msg("all-reduce i %lld: got %g want %g", (long long)i, y[i], want);
    if (b[i] != (float)(i % 977)) ck_abort_msg("broadcast i %lld: got %g", (long long)i, b[i]);
  }
  free(x);
  free(y);
  free(b);
  free(g);
  mpt_comm_free(c);
}
END_TEST

START_TEST(test_comm_sequence_numbers_agree) {
  uint64_t before = mpt_comm_sequence(comm);
  float v = 1.0f;
  ck_assert_int_eq(mpt_comm_allreduce_sync(comm, &v, &v, 1, MPT_F32, MPT_REDUCE_SUM), MPT_OK);
  ck_assert_uint_eq(mpt_comm_sequence(comm), before + 1);
  ck_assert_int_eq(mpt_comm_barrier_sync(comm), MPT_OK);
  ck_assert_uint_eq(mpt_comm_sequence(comm), before + 2);
  uint64_t mine = mpt_comm_sequence(comm);
  uint64_t *all = xmalloc(sizeof(uint64_t) * world);
  ck_assert_int_eq(mpt_comm_allgather_sync(comm, &mine, all, sizeof mine, MPT_U8), MPT_OK);
  for (int r = 0; r < world; r++) ck_assert_uint_eq(all[r], mine);
  free(all);
}
END_TEST

/* Blocks a worker stream until released, so work queued behind it provably has not run. */
static atomic_int gate_open;
static mpt_status gate_fn(void *arg) {
  (void)arg;
  while (!atomic_load(&gate_open)) {
    struct timespec ts = {0, 1000000};
    nanosleep(&ts, NULL);
  }
  return MPT_OK;
}

/* Collectives are asynchronous: two all-reduces enqueued behind a closed gate have not run when
 * the call returns; once the gate opens, an event recorded after them completes with both
 * results. Also on a caller-owned stream. */
START_TEST(test_comm_collectives_are_asynchronous) {
  mpt_stream *gate_stream, *mine;
  mpt_event *gate_done, *done;
  ck_assert_int_eq(mpt_stream_init(&gate_stream, mpt_device_cpu(), MPT_STREAM_WORKER), MPT_OK);
  ck_assert_int_eq(mpt_stream_init(&mine, mpt_device_cpu(), MPT_STREAM_WORKER), MPT_OK);
  ck_assert_int_eq(mpt_event_init(&gate_done, mpt_device_cpu()), MPT_OK);
  ck_assert_int_eq(mpt_event_init(&done, mpt_device_cpu()), MPT_OK);
  for (int which = 0; which < 2; which++) {
    mpt_stream *s = which == 0 ? mpt_comm_stream(comm) : mine;
    atomic_store(&gate_open, 0);
    ck_assert_int_eq(mpt_stream_launch_host(gate_stream, gate_fn, NULL), MPT_OK);
    ck_assert_int_eq(mpt_event_record(gate_done, gate_stream), MPT_OK);
    ck_assert_int_eq(mpt_stream_wait_event(s, gate_done, 60000), MPT_OK);
    float a[5], b[3];
    for (int i = 0; i < 5; i++) a[i] = (float)(rank + i);
    for (int i = 0; i < 3; i++) b[i] = (float)(2 * rank);
    ck_assert_int_eq(mpt_comm_allreduce(comm, which ? s : NULL, a, a, 5, MPT_F32, MPT_REDUCE_SUM),
                     MPT_OK);
    ck_assert_int_eq(mpt_comm_allreduce(comm, which ? s : NULL, b, b, 3, MPT_F32, MPT_REDUCE_MAX),
                     MPT_OK);
    ck_assert_int_eq(mpt_event_record(done, s), MPT_OK);
    ck_assert_int_eq(mpt_event_query(done), 0);
    for (int i = 0; i < 5; i++) ck_assert_float_eq(a[i], (float)(rank + i)); /* untouched */
    atomic_store(&gate_open, 1);
    ck_assert_int_eq(mpt_event_synchronize(done, 120000), MPT_OK);
    for (int i = 0; i < 5; i++) ck_assert_float_eq(a[i], (float)(world * (world - 1) / 2 + world * i));
    for (int i = 0; i < 3; i++) ck_assert_float_eq(b[i], (float)(2 * (world - 1)));
  }
  mpt_event_free(done);
  mpt_event_free(gate_done);
  mpt_stream_free(mine);
  mpt_stream_free(gate_stream);
}
END_TEST

/* F09 in checked mode: rank 0 all-reduces 8 floats, the others 4. Every rank fails with
 * MPT_EMISMATCH naming the ranks and both signatures, no data moves, and the comm stays usable
 * (every rank skipped the same collective). */
START_TEST(test_comm_checked_mode_names_mismatched_counts) {
  mpt_comm *c = new_comm(20000, 1);
  ck_assert_int_eq(mpt_comm_checked(c), 1);
  mpt_stream *s;
  ck_assert_int_eq(mpt_stream_init(&s, mpt_device_cpu(), MPT_STREAM_WORKER), MPT_OK);
  float x[8], y[8];
  for (int i = 0; i < 8; i++) {
    x[i] = 1.0f;
    y[i] = -5.0f;
  }
  int n = rank == 0 ? 8 : 4;
  ck_assert_int_eq(mpt_comm_allreduce(c, s, x, y, n, MPT_F32, MPT_REDUCE_SUM), MPT_OK);
  mpt_status st = sync_stream(s);
  ck_assert_int_eq(st, MPT_EMISMATCH);
  const char *msg = mpt_last_error();
  ck_assert_ptr_nonnull(strstr(msg, "rank 0 all-reduces 8 float32"));
  ck_assert_ptr_nonnull(strstr(msg, "rank 1 all-reduces 4 float32"));
  if (world > 2) ck_assert_ptr_nonnull(strstr(msg, "rank 2 all-reduces 4 float32"));
  for (int i = 0; i < 8; i++) ck_assert_float_eq(y[i], -5.0f); /* no partial result */
  ck_assert_int_eq(mpt_comm_error(c), MPT_OK);
  mpt_stream_free(s);

  /* A count-0 collective on one rank against 4 elsewhere is caught too. */
  ck_assert_int_eq(mpt_stream_init(&s, mpt_device_cpu(), MPT_STREAM_WORKER), MPT_OK);
  ck_assert_int_eq(mpt_comm_broadcast(c, s, x, rank == 0 ? 0 : 4, MPT_F32, 0), MPT_OK);
  ck_assert_int_eq(sync_stream(s), MPT_EMISMATCH);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "rank 0 broadcasts 0 float32 from root 0"));
  mpt_stream_free(s);

  /* The comm still works, and matching collectives pass the check. */
  ck_assert_int_eq(mpt_comm_allreduce_sync(c, x, y, 8, MPT_F32, MPT_REDUCE_SUM), MPT_OK);
  for (int i = 0; i < 8; i++) ck_assert_float_eq(y[i], (float)world);
  mpt_comm_free(c);
}
END_TEST

/* F09 without checked mode, short deadline: the same mismatch ends in an error on every rank,
 * quickly, never a hang and never a silent partial result. (Open MPI 4.1 itself completes the
 * larger rank's all-reduce "successfully"; the agreement step turns that into an error.) Polling
 * mode in both passes: with 3 ranks the mismatched blocking MPI_Allreduce never returns on some
 * rank, and a blocking-mode timeout ends only by aborting the job (test_comm_progress.c). */
START_TEST(test_comm_unchecked_mismatch_fails_on_every_rank) {
  mpt_comm *c = new_comm_mode(3000, 0, 0);
  ck_assert_int_eq(mpt_comm_checked(c), 0);
  float x[8], y[8];
  for (int i = 0; i < 8; i++) x[i] = 1.0f;
  int n = rank == 0 ? 8 : 4;
  ck_assert_int_eq(mpt_comm_allreduce(c, NULL, x, y, n, MPT_F32, MPT_REDUCE_SUM), MPT_OK);
  mpt_status st = sync_stream(mpt_comm_stream(c));
  ck_assert_int_ne(st, MPT_OK);
  ck_assert(st == MPT_ECOMM || st == MPT_EMISMATCH || st == MPT_ETIMEOUT);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "all-reduce #0"));
  /* The comm is unusable now; later collectives fail at once. */
  ck_assert_int_eq(mpt_comm_error(c), st);
  ck_assert_int_eq(mpt_comm_barrier(c, NULL), st);
  mpt_comm_free(c);
}
END_TEST

/* A broadcast whose root sends fewer elements than the others expect completes without any MPI
 * error on every rank (the receivers simply get fewer bytes); the agreement still turns it into
 * MPT_EMISMATCH everywhere instead of a silent partial result. Polling mode: the blocking
 * MPI_Bcast of mismatched counts sometimes never returns with 3 ranks. */
START_TEST(test_comm_unchecked_short_broadcast_is_not_silent) {
  mpt_comm *c = new_comm_mode(3000, 0, 0);
  float x[8];
  for (int i = 0; i < 8; i++) x[i] = rank == 0 ? 3.0f : -1.0f;
  ck_assert_int_eq(mpt_comm_broadcast(c, NULL, x, rank == 0 ? 4 : 8, MPT_F32, 0), MPT_OK);
  ck_assert_int_eq(sync_stream(mpt_comm_stream(c)), MPT_EMISMATCH);
  ck_assert_ptr_nonnull(strstr(mpt_last_error(), "ranks disagree on broadcast #0"));
  mpt_comm_free(c);
}
END_TEST

/* Only rank 0 enters a collective: it fails at the deadline with a detail naming the collective,
 * its sequence number, the deadline and the rank. Polling mode (the worker keeps the deadline;
 * the blocking-mode cases are in test_comm_progress.c). Run in the polling pass only. */
START_TEST(test_comm_missing_peer_times_out_with_detail) {
  mpt_comm *c = new_comm_mode(1000, 0, 0);
  if (rank == 0) {
    float x[4] = {1, 2, 3, 4};
    ck_assert_int_eq(mpt_comm_allreduce(c, NULL, x, x, 4, MPT_F32, MPT_REDUCE_SUM), MPT_OK);
    ck_assert_int_eq(sync_stream(mpt_comm_stream(c)), MPT_ETIMEOUT);
    ck_assert_ptr_nonnull(strstr(mpt_last_error(),
                                 "all-reduce #0 (count 4 float32 sum) did not complete within 1 s "
                                 "on rank 0"));
    /* ... naming the ranks that never arrived (shared-memory progress records) */
    ck_assert_ptr_nonnull(strstr(mpt_last_error(),
                                 "holding it up: rank 1 (never started it; process running; no "
                                 "collective started yet)"));
    if (world == 3)
      ck_assert_ptr_nonnull(strstr(mpt_last_error(), "; rank 2 (never started it;"));
    ck_assert_ptr_nonnull(strstr(mpt_last_error(), "waiting in it: rank 0"));
    ck_assert_int_eq(mpt_comm_error(c), MPT_ETIMEOUT);
  }
  mpt_comm_free(c);
  ck_assert_int_eq(mpt_comm_barrier_sync(comm), MPT_OK); /* the shared comm is unaffected */
}
END_TEST

/* Runs the suite once with a shared comm in progress mode `blocking`; returns the failures
 * (-1 when the comm cannot be created). */
static int run_pass(int blocking) {
  g_blocking = blocking;
  mpt_comm_config cfg = mpt_comm_config_default();
  cfg.timeout_ms = 60000;
  cfg.blocking = blocking;
  mpt_status st = mpt_comm_init(&comm, &cfg);
  if (st != MPT_OK) {
    fprintf(stderr, "test_comm: %s: %s\n", mpt_status_name(st), mpt_last_error());
    mpt_comm_abort(NULL, 1);
  }
  rank = mpt_comm_rank(comm);
  world = mpt_comm_world_size(comm);

  Suite *s = suite_create(blocking ? "comm (blocking mode)" : "comm (polling mode)");
  TCase *tc = tcase_create("comm");
  tcase_add_test(tc, test_comm_reports_rank_sizes_and_launcher);
  tcase_add_test(tc, test_comm_allreduce_sum_is_exact);
  tcase_add_test(tc, test_comm_allreduce_min_max_avg_are_exact);
  tcase_add_test(tc, test_comm_count_zero_returns_at_once);
  TCase *nan = tcase_create("nan");
  tcase_add_test(nan, test_comm_allreduce_propagates_nan_in_every_reduction);
  suite_add_tcase(s, nan);
  tcase_add_test(tc, test_comm_bad_arguments_are_rejected_without_a_sequence_number);
  tcase_add_test(tc, test_comm_broadcast_from_last_rank);
  tcase_add_test(tc, test_comm_allgather_is_in_rank_order);
  tcase_add_test(tc, test_comm_chunked_collectives_are_exact);
  tcase_add_test(tc, test_comm_sequence_numbers_agree);
  tcase_add_test(tc, test_comm_collectives_are_asynchronous);
  tcase_add_test(tc, test_comm_checked_mode_names_mismatched_counts);
  if (!blocking) { /* polling-mode cases, run once */
    tcase_add_test(tc, test_comm_unchecked_short_broadcast_is_not_silent);
    tcase_add_test(tc, test_comm_unchecked_mismatch_fails_on_every_rank);
    tcase_add_test(tc, test_comm_missing_peer_times_out_with_detail);
  }
  suite_add_tcase(s, tc);
  SRunner *sr = srunner_create(s);
  srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  mpt_comm_free(comm);
  comm = NULL;
  return failed;
}

int main(void) {
  int failed = run_pass(1);
  failed += run_pass(0);
  mpt_status st = mpt_comm_finalize();
  if (st != MPT_OK) fprintf(stderr, "test_comm: %s\n", mpt_last_error());
  return failed == 0 && st == MPT_OK ? EXIT_SUCCESS : EXIT_FAILURE;
}
